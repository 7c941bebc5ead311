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
custom AppArmor profile, no Windows host process. Besides the profile: a template may not set
the pod's namespace, name, owners, ``nodeName``, the service account, or its containers (the
driver container is the operator's; init containers may be added).
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


# Labels the operator selects its pods by (every stator.dev/ label is the operator's).
OPERATOR_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/managed-by")


def template_violations(template: dict[str, Any], where: str) -> list[str]:
    """Fields of a user's pod template that only the operator may set."""
    out = []
    for (section, key), why in OPERATOR_OWNED.items():
        if key in (template.get(section) or {}):
            out.append(f"{where}.{section}.{key}: not allowed, {why}; remove it")
    for label in (template.get("metadata") or {}).get("labels") or {}:
        if str(label).startswith("stator.dev/") or label in OPERATOR_LABELS:
            out.append(
                f"{where}.metadata.labels.{label}: not allowed, the operator finds its pods by "
                f"these labels; use a label of your own prefix"
            )
    return out


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
