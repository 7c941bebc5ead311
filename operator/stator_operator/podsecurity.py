"""The Pod Security Standard ``restricted`` profile, checked on the pod the operator would
create, after the user's ``podTemplate`` is merged in: a template cannot add what the
operator's own pod leaves out (an init container, a volume, a node). The API server's
admission enforces the same rules where the namespace is labelled
``pod-security.kubernetes.io/enforce: restricted``; checking here first gives an error that
names the spec field, and nothing is created.

Rules (https://kubernetes.io/docs/concepts/security/pod-security-standards/): no host
namespaces, ports or paths; volumes only of the restricted types; every container (init and
ephemeral ones too) unprivileged, without privilege escalation, as non-root, with all
capabilities dropped (only NET_BIND_SERVICE may be added), a RuntimeDefault or Localhost
seccomp profile, the default proc mount and only safe sysctls; no SELinux user or role, no
custom AppArmor profile, no Windows host process. Besides the profile: a template may set only
the pod's labels and annotations and an allow-list of pod spec fields (``TEMPLATE_SPEC``),
never its kind, namespace, name, owners, ``nodeName`` (nor a node by name through
``matchFields``), the service account, the operator's or Spark's labels, or its containers
(the driver container is the operator's; init containers may be added).
"""

from __future__ import annotations

from typing import Any

RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
# Set by the operator alone; a template that sets them is refused, not silently overridden.
OPERATOR_OWNED = {
    ("metadata", "namespace"): "the pod is created in the pipeline's namespace",
    ("metadata", "name"): "the operator names the pod",
    ("metadata", "ownerReferences"): "the pod is owned by the pipeline",
    ("spec", "nodeName"): "the scheduler places the pod (use nodeSelector or affinity)",
    ("spec", "serviceAccountName"): "the pipeline's service account runs the pod",
    ("spec", "serviceAccount"): "the pipeline's service account runs the pod",
    ("spec", "restartPolicy"): (
        "the driver's exit code tells the operator how the job ended (a restart in place "
        "would resume a stopped job)"
    ),
    ("spec", "automountServiceAccountToken"): "the driver needs its token for its Lease",
    ("spec", "activeDeadlineSeconds"): "a streaming driver runs until it is stopped",
    ("spec", "containers"): (
        "the operator writes the driver container (set its image in spec.image, its "
        "environment in spec.driver.env, its resources in spec.driver.resources; "
        "initContainers may be added)"
    ),
}


# Labels the operator selects its pods by (every stator.dev/ label is the operator's), and the
# prefix of the labels Spark's Kubernetes backend selects its pods by (a driver pod labelled
# spark-role=executor would be taken for an executor of another application).
OPERATOR_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/managed-by")
SPARK_LABEL_PREFIX = "spark-"
# All a pod template may set: the pod's labels and annotations, and these pod spec fields
# (placement, init containers, volumes, the pod's security context, DNS). Anything else
# (another kind, a Role's rules, a Service's externalIPs, priorityClassName, schedulerName,
# runtimeClassName, ...) is refused, never copied into what the operator creates.
TEMPLATE_METADATA = frozenset({"labels", "annotations"})
TEMPLATE_SPEC = frozenset(
    {
        "affinity",
        "dnsConfig",
        "dnsPolicy",
        "enableServiceLinks",
        "imagePullSecrets",
        "initContainers",
        "nodeSelector",
        "securityContext",
        "terminationGracePeriodSeconds",
        "tolerations",
        "topologySpreadConstraints",
        "volumes",
    }
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def template_violations(template: dict[str, Any], where: str) -> list[str]:
    """Fields of a user's pod template that only the operator may set, or that a pod
    template may not set at all."""
    if not isinstance(template, dict):
        return [f"{where}: must be an object with metadata and spec"]
    out = [
        f"{where}.{key}: not allowed, a pod template may set only metadata.labels, "
        f"metadata.annotations and spec; remove it"
        for key in template
        if key not in ("metadata", "spec")
    ]
    out += _fields(template, where)
    meta, spec = template.get("metadata"), template.get("spec")
    out += _labels_and_annotations(meta if isinstance(meta, dict) else {}, where)
    out += _node_by_name(spec if isinstance(spec, dict) else {}, where)
    return out


def _fields(template: dict[str, Any], where: str) -> list[str]:
    out = []
    for section, allowed in (("metadata", TEMPLATE_METADATA), ("spec", TEMPLATE_SPEC)):
        fields = template.get(section) or {}
        if not isinstance(fields, dict):
            out.append(f"{where}.{section}: must be an object")
            continue
        for key in fields:
            why = OPERATOR_OWNED.get((section, key))
            if why is not None:
                out.append(f"{where}.{section}.{key}: not allowed, {why}; remove it")
            elif key not in allowed:
                out.append(
                    f"{where}.{section}.{key}: not allowed in a pod template (it may set "
                    f"{section} fields {', '.join(sorted(allowed))}); remove it"
                )
    return out


def _labels_and_annotations(meta: dict[str, Any], where: str) -> list[str]:
    out = []
    for label in meta.get("labels") or {}:
        text = str(label)
        if text.startswith(("stator.dev/", SPARK_LABEL_PREFIX)) or text in OPERATOR_LABELS:
            out.append(
                f"{where}.metadata.labels.{label}: not allowed, the operator and Spark find "
                f"their pods by these labels; use a label of your own prefix"
            )
    for name, value in (meta.get("annotations") or {}).items():
        profile = str(value)
        if str(name).startswith(APPARMOR_ANNOTATION) and not (
            profile == "runtime/default" or profile.startswith("localhost/")
        ):
            out.append(
                f"{where}.metadata.annotations.{name}: AppArmor profile {profile!r} not allowed "
                f"(restricted allows runtime/default or localhost/<profile>)"
            )
    return out


def _node_by_name(spec: dict[str, Any], where: str) -> list[str]:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = list(required.get("nodeSelectorTerms") or [])
    terms += [
        p.get("preference") or {}
        for p in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    ]
    if any(t.get("matchFields") for t in terms):
        return [
            f"{where}.spec.affinity.nodeAffinity: matchFields pins the pod to a node by name "
            f"(as nodeName would); select nodes by label with matchExpressions or nodeSelector"
        ]
    return []


def pod_violations(pod: dict[str, Any], where: str) -> list[str]:
    """Every way ``pod`` breaks the restricted profile, as ``<field>: <rule>``; ``where`` is
    the spec field the user controls (e.g. ``spec.driver.podTemplate``)."""
    spec = pod.get("spec") or {}
    ctx = spec.get("securityContext") or {}
    out: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{where}.spec.{key}: host namespaces are not allowed; remove it")
    for volume in spec.get("volumes") or []:
        kinds = [k for k in volume if k != "name"]
        for kind in kinds:
            if kind not in RESTRICTED_VOLUMES:
                out.append(
                    f"{where}.spec.volumes[{volume.get('name')}].{kind}: volume type not "
                    f"allowed (restricted allows {', '.join(sorted(RESTRICTED_VOLUMES))})"
                )
    for sysctl in ctx.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"{where}.spec.securityContext.sysctls[{sysctl.get('name')}]: unsafe sysctl")
    out += _context(ctx, f"{where}.spec.securityContext", pod_level=True)
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(group) or []:
            out += _container(c, ctx, f"{where}.spec.{group}[{c.get('name')}]")
    return out


def _context(ctx: dict[str, Any], field: str, pod_level: bool) -> list[str]:
    out = []
    if ctx.get("runAsNonRoot") is False:
        out.append(f"{field}.runAsNonRoot: must not be false (Stator pods run as non-root)")
    if ctx.get("runAsUser") == 0:
        out.append(f"{field}.runAsUser: 0 (root) is not allowed")
    if ctx.get("windowsOptions", {}).get("hostProcess"):
        out.append(f"{field}.windowsOptions.hostProcess: not allowed")
    selinux = ctx.get("seLinuxOptions") or {}
    if selinux.get("user") or selinux.get("role"):
        out.append(f"{field}.seLinuxOptions: user and role may not be set")
    if selinux.get("type") not in (None, "", "container_t", "container_init_t", "container_kvm_t"):
        out.append(f"{field}.seLinuxOptions.type: {selinux.get('type')!r} is not allowed")
    seccomp = (ctx.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in SECCOMP_TYPES:
        out.append(f"{field}.seccompProfile.type: must be RuntimeDefault or Localhost")
    apparmor = (ctx.get("appArmorProfile") or {}).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"{field}.appArmorProfile.type: must be RuntimeDefault or Localhost")
    if not pod_level and ctx.get("procMount") not in (None, "Default"):
        out.append(f"{field}.procMount: must be Default")
    return out


def _container(c: dict[str, Any], pod_ctx: dict[str, Any], field: str) -> list[str]:
    ctx = c.get("securityContext") or {}
    out = _context(ctx, f"{field}.securityContext", pod_level=False)
    if ctx.get("privileged"):
        out.append(f"{field}.securityContext.privileged: privileged containers are not allowed")
    if ctx.get("allowPrivilegeEscalation") is not False:
        out.append(f"{field}.securityContext.allowPrivilegeEscalation: must be false")
    if not (ctx.get("runAsNonRoot") or pod_ctx.get("runAsNonRoot")):
        out.append(f"{field}.securityContext.runAsNonRoot: must be true (here or for the pod)")
    caps = ctx.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        out.append(f"{field}.securityContext.capabilities.drop: must include ALL")
    added = [a for a in caps.get("add") or [] if a != "NET_BIND_SERVICE"]
    if added:
        out.append(
            f"{field}.securityContext.capabilities.add: {', '.join(added)} not allowed "
            f"(only NET_BIND_SERVICE)"
        )
    seccomp = (ctx.get("seccompProfile") or {}).get("type") or (
        pod_ctx.get("seccompProfile") or {}
    ).get("type")
    if seccomp not in SECCOMP_TYPES:
        out.append(
            f"{field}.securityContext.seccompProfile: RuntimeDefault or Localhost is "
            f"required (here or for the pod)"
        )
    for port in c.get("ports") or []:
        if port.get("hostPort"):
            out.append(f"{field}.ports.hostPort: host ports are not allowed")
    return out
