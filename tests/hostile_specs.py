"""Hostile StatefulPipeline specs: each is a change to a good spec and the words its refusal
must contain. Used by the unit test of the operator's checks and by the end-to-end test that
applies them with kubectl."""

from __future__ import annotations

from typing import Any

ROOT_INIT = {
    "name": "setup",
    "image": "busybox",
    "securityContext": {"privileged": True, "runAsUser": 0},
}
SAFE = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


def _pod(**spec: Any) -> dict[str, Any]:
    return {"driver": {"podTemplate": {"spec": spec}}}


def _container(**ctx: Any) -> dict[str, Any]:
    return _pod(initContainers=[{"name": "init", "image": "busybox", "securityContext": ctx}])


T = "spec.driver.podTemplate"
ALIAS_BOMB = "\n".join(
    [
        "a: &a [x, x, x, x, x, x, x, x, x, x]",
        *(
            f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]"
            for i in range(6)
        ),
    ]
)
HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "privileged root init container": (
        _pod(initContainers=[ROOT_INIT]),
        f"{T}.spec.initContainers[setup].securityContext.privileged",
    ),
    "privileged flag alone": (
        _container(**SAFE, privileged=True),
        f"{T}.spec.initContainers[init].securityContext.privileged",
    ),
    "privilege escalation": (
        _container(**{**SAFE, "allowPrivilegeEscalation": True}),
        f"{T}.spec.initContainers[init].securityContext.allowPrivilegeEscalation",
    ),
    "added capability": (
        _container(**{**SAFE, "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}),
        "capabilities.add: SYS_ADMIN not allowed",
    ),
    "capabilities not dropped": (
        _container(**{**SAFE, "capabilities": {}}),
        "capabilities.drop: must include ALL",
    ),
    "root user": (_pod(securityContext={"runAsUser": 0}), f"{T}.spec.securityContext.runAsUser"),
    "runAsNonRoot false": (
        _pod(securityContext={"runAsNonRoot": False}),
        f"{T}.spec.securityContext.runAsNonRoot",
    ),
    "hostPath volume": (
        _pod(volumes=[{"name": "state", "hostPath": {"path": "/"}}]),
        f"{T}.spec.volumes[state].hostPath: volume type not allowed",
    ),
    "hostNetwork": (_pod(hostNetwork=True), f"{T}.spec.hostNetwork"),
    "hostPID": (_pod(hostPID=True), f"{T}.spec.hostPID"),
    "hostIPC": (_pod(hostIPC=True), f"{T}.spec.hostIPC"),
    "nodeName": (_pod(nodeName="node-0"), f"{T}.spec.nodeName: not allowed"),
    "foreign namespace": (
        {"driver": {"podTemplate": {"metadata": {"namespace": "kube-system"}}}},
        f"{T}.metadata.namespace: not allowed",
    ),
    "other owner": (
        {"driver": {"podTemplate": {"metadata": {"ownerReferences": []}}}},
        f"{T}.metadata.ownerReferences: not allowed",
    ),
    "seccomp unconfined": (
        _pod(securityContext={"seccompProfile": {"type": "Unconfined"}}),
        f"{T}.spec.securityContext.seccompProfile.type",
    ),
    "unsafe sysctl": (
        _pod(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
        "sysctls[kernel.msgmax]: unsafe sysctl",
    ),
    "host port": (
        _pod(
            initContainers=[
                {
                    "name": "init",
                    "image": "busybox",
                    "securityContext": SAFE,
                    "ports": [{"containerPort": 80, "hostPort": 80}],
                }
            ]
        ),
        "ports.hostPort: host ports are not allowed",
    ),
    # Issue 38: a template that is not a pod's would make the operator create that object.
    "RoleBinding through the pod template": (
        {
            "driver": {
                "podTemplate": {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "stator-operator",
                    },
                    "subjects": [{"kind": "User", "name": "mallory"}],
                }
            }
        },
        f"{T}.kind: not allowed, a pod template may set only metadata.labels, "
        "metadata.annotations and spec",
    ),
    "Service with externalIPs through the pod template": (
        {"driver": {"podTemplate": {"kind": "Service", "spec": {"externalIPs": ["192.0.2.10"]}}}},
        f"{T}.spec.externalIPs: not allowed in a pod template",
    ),
    "service-account token Secret through the pod template": (
        {
            "driver": {
                "podTemplate": {
                    "kind": "Secret",
                    "type": "kubernetes.io/service-account-token",
                    "metadata": {"annotations": {"kubernetes.io/service-account.name": "default"}},
                }
            }
        },
        f"{T}.type: not allowed, a pod template may set only",
    ),
    "allow-all NetworkPolicy through the pod template": (
        {
            "driver": {
                "podTemplate": {
                    "kind": "NetworkPolicy",
                    "spec": {"podSelector": {}, "ingress": [{}]},
                }
            }
        },
        f"{T}.spec.podSelector: not allowed in a pod template",
    ),
    "priorityClassName": (
        _pod(priorityClassName="system-cluster-critical"),
        f"{T}.spec.priorityClassName: not allowed in a pod template",
    ),
    "runtimeClassName": (
        _pod(runtimeClassName="unsandboxed"),
        f"{T}.spec.runtimeClassName: not allowed in a pod template",
    ),
    "schedulerName": (
        _pod(schedulerName="my-scheduler"),
        f"{T}.spec.schedulerName: not allowed in a pod template",
    ),
    "node pinned by matchFields": (
        _pod(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {
                                        "key": "metadata.name",
                                        "operator": "In",
                                        "values": ["node-0"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        ),
        f"{T}.spec.affinity.nodeAffinity: matchFields pins the pod to a node by name",
    ),
    "unconfined AppArmor annotation": (
        {
            "driver": {
                "podTemplate": {
                    "metadata": {
                        "annotations": {
                            "container.apparmor.security.beta.kubernetes.io/driver": "unconfined"
                        }
                    }
                }
            }
        },
        "AppArmor profile 'unconfined' not allowed",
    ),
    "Spark's executor label on the driver": (
        {"driver": {"podTemplate": {"metadata": {"labels": {"spark-role": "executor"}}}}},
        f"{T}.metadata.labels.spark-role: not allowed",
    ),
    "driver container replaced": (
        _pod(containers=[{"name": "driver", "image": "busybox", "command": ["sh"]}]),
        f"{T}.spec.containers: not allowed, the operator writes the driver container",
    ),
    "operator volume shadowed": (
        _pod(volumes=[{"name": "control", "emptyDir": {}}]),
        f"{T}.spec.volumes[control]: the name is one of the operator's volumes",
    ),
    "credentials in driver env": (
        {"driver": {"env": [{"name": "AWS_ACCESS_KEY_ID", "value": "AKIA"}]}},
        "spec.driver.env[AWS_ACCESS_KEY_ID]: set by the operator (credentials come from",
    ),
    "reserved executor env": (
        {"executor": {"env": [{"name": "STATOR_STATE_DIR", "value": "/tmp"}]}},
        "spec.executor.env[STATOR_STATE_DIR]: set by the operator (executors keep their state",
    ),
    "executor pod template in sparkConf": (
        {"sparkConf": {"spark.kubernetes.executor.podTemplateFile": "/tmp/pod.yaml"}},
        "spec.sparkConf.spark.kubernetes.executor.podTemplateFile: set by the operator (its",
    ),
    "speculation in sparkConf": (
        {"sparkConf": {"spark.speculation": "true"}},
        "spec.sparkConf: spark.conf.spark.speculation: Stator runs with spark.speculation=false",
    ),
    "spark settings in config": (
        {"config": {"spark.conf.spark.sql.shuffle.partitions": "4"}},
        "spec.config.spark.conf.spark.sql.shuffle.partitions is set by the operator; use "
        "spec.sparkConf",
    ),
    "checkpoint section in config": (
        {"config": {"checkpoint": "{storage: 'file:///tmp/elsewhere'}"}},
        "spec.config.checkpoint: a whole section would replace checkpoint.storage",
    ),
    "restart delay in config": (
        {"config": {"restart.delay_ms": "500"}},
        "spec.config.restart.delay_ms is set by the operator; use "
        "spec.failover.restartDelaySeconds",
    ),
    "savepoint dir in config": (
        {"config": {"savepoint.dir": "file:///tmp/elsewhere"}},
        "spec.config.savepoint.dir is set by the operator; use spec.savepoints.directory",
    ),
    # Issue 38: ~300 bytes that expand a million-fold when loaded, in the shared operator.
    "YAML alias bomb in config": (
        {"config": {"epoch.max_records": ALIAS_BOMB}},
        "spec.config.epoch.max_records: YAML anchors and aliases (&name, *name) are not allowed",
    ),
    # Issue 38: an upper-case scheme is S3 all the same, and needs the pipeline's Secret.
    "S3 in upper case without a Secret": (
        {
            "checkpointing": {"storage": "file:///tmp/checkpoints"},
            "savepoints": {"directory": "file:///tmp/savepoints"},
            "restore": {"initialSavepoint": "S3://other-bucket/savepoint-1"},
        },
        "spec.restore.initialSavepoint is on s3 (S3://other-bucket/savepoint-1): "
        "spec.checkpointing.credentialsSecret is required",
    ),
    # Issue 38: a template of the wrong shape is refused once, not an exception every tick.
    "malformed pod template": (
        _pod(initContainers="not-a-list"),
        f"{T} or spec.driver.env is malformed",
    ),
    "plain-text secret key": (
        {"config": {"s3.secret_access_key": "hunter2"}},
        "spec.config.s3.secret_access_key: credentials are not accepted in plain text",
    ),
    "plain-text access key": (
        {"config": {"s3.access_key_id": "AKIA"}},
        "spec.config.s3.access_key_id: credentials are not accepted in plain text",
    ),
}
