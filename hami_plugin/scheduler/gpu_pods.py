"""The rules a GPU pod's admission holds it to beyond HAMi's, where the webhook
(`scheduler.webhook`) and the ValidatingAdmissionPolicy `hami-gpu-pods`
(daemonset/admission-policy.yaml) share words: the labels they read and the container
environment only an admin namespace's GPU pods may set. Pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from hami_plugin.protocol import hostpaths
from hami_plugin.protocol.gpu_admin import ENV_DISABLE_CONTROL, LABEL_GPU_ADMIN

__all__ = [
    "ADMIN_NAMESPACE_LABEL",
    "CONTROL_ENV_NAMES",
    "CONTROL_ENV_PREFIXES",
    "CONTROL_ENV_SUMMARY",
    "ENV_DISABLE_CONTROL",
    "ENV_NVIDIA_VISIBLE_DEVICES",
    "HARMLESS_VISIBLE_DEVICES",
    "LABEL_WEBHOOK",
    "RESERVED_MOUNT_PATHS",
    "WEBHOOK_IGNORE",
    "control_env",
    "control_env_refusal",
    "reserved_mounts",
]

ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

CONTROL_ENV_NAMES = (
    ENV_DISABLE_CONTROL,
    ENV_NVIDIA_VISIBLE_DEVICES,
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
)
CONTROL_ENV_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT")
"""What only an admin namespace's GPU pods may set in a container: HAMi-core off, the GPU list
(but `none`, what `overwrite_env` writes), HAMi-core's shared region, and its limits
(`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_MEMORY_LIMIT_<i>`, `CUDA_DEVICE_SM_LIMIT`, and any
name these start): a pod's own value stands after Allocate's, as kubelet appends the spec's
environment to the device plugin's (kubelet_pods.go `GenerateRunContainerOptions`). Other
CUDA variables (`CUDA_DEVICE_ORDER`, `CUDA_DEVICE_MAX_CONNECTIONS`) are the workload's."""
CONTROL_ENV_SUMMARY = (
    "CUDA_DISABLE_CONTROL, NVIDIA_VISIBLE_DEVICES or HAMi-core's limits "
    "(CUDA_DEVICE_MEMORY_LIMIT*, CUDA_DEVICE_SM_LIMIT*, CUDA_DEVICE_MEMORY_SHARED_CACHE)"
)
HARMLESS_VISIBLE_DEVICES = "none"
LABEL_WEBHOOK = "hami.io/webhook"
WEBHOOK_IGNORE = "ignore"
"""HAMi's opt-out (`hami.io/webhook: ignore`; v2.10 chart templates/scheduler/webhook.yaml
32-36 on namespaces, 52-56 on pods). On a namespace the webhook configuration honours it; on a
pod only while the pod asks for no GPU resource (our own pods: left unchanged, as HAMi's
objectSelector leaves them), so a pod author cannot label a GPU pod past these rules."""
ADMIN_NAMESPACE_LABEL = LABEL_GPU_ADMIN
"""The namespace label (value `true`) whose GPU pods may set the control environment."""


def _controls(name: str) -> bool:
    return name in CONTROL_ENV_NAMES or name.startswith(CONTROL_ENV_PREFIXES)


def _prefix_can_make_control_name(prefix: str) -> bool:
    """An envFrom `prefix` that, with some key, names a control variable (an empty prefix may
    too, from keys we cannot see: the device plugin mounts the preload anyway)."""
    if not prefix:
        return False
    protected = (*CONTROL_ENV_NAMES, *CONTROL_ENV_PREFIXES)
    return any(name.startswith(prefix) for name in protected) or prefix.startswith(
        CONTROL_ENV_PREFIXES
    )


def control_env(env: Sequence[object], env_from: object) -> tuple[str, ...]:
    """The control variables a container sets (`CONTROL_ENV_NAMES`, `CONTROL_ENV_PREFIXES`), by
    value or valueFrom, and the envFrom prefixes that can make such a name. Items that are not
    objects with a string name are the API server's to refuse."""
    found = []
    for variable in env:
        if not isinstance(variable, Mapping) or not isinstance(variable.get("name"), str):
            continue
        name = variable["name"]
        if name == ENV_NVIDIA_VISIBLE_DEVICES and variable.get("value") == (
            HARMLESS_VISIBLE_DEVICES
        ):
            continue
        if _controls(name):
            found.append(name)
    for source in env_from if isinstance(env_from, list) else ():
        prefix = source.get("prefix") if isinstance(source, Mapping) else None
        if isinstance(prefix, str) and _prefix_can_make_control_name(prefix):
            found.append(f"envFrom prefix {prefix}")
    return tuple(found)


def control_env_refusal(container: str, variable: str) -> str:
    """The webhook's denial for a container that sets `variable` (one of `control_env`'s)."""
    return (
        f"container {container} sets {variable}: only pods in a namespace labelled "
        f"{ADMIN_NAMESPACE_LABEL}=true may set {CONTROL_ENV_SUMMARY}"
    )


RESERVED_MOUNT_PATHS = (
    hostpaths.LD_SO_PRELOAD_CONTAINER_PATH,
    hostpaths.VGPU_LOCK_CONTAINER_PATH,
    hostpaths.LICENSE_CONTAINER_PATH,
    hostpaths.VGPU_VALIDATOR_CONTAINER_PATH,
    hostpaths.vgpu_dir(hostpaths.DEFAULT_HOOK_PATH),
    hostpaths.libvgpu_path(hostpaths.DEFAULT_HOOK_PATH),
)
"""Where Allocate mounts HAMi-core's files into a GPU container (`protocol.hostpaths`, the
default hook path). A volume the pod mounts at one of them lands on top of the device
plugin's (kubelet appends the spec's mounts after the plugin's, and the runtime orders mounts
of one depth stably), so `/etc/ld.so.preload` mounted from a ConfigMap would keep HAMi-core
out without any variable."""


def reserved_mounts(volume_mounts: object) -> tuple[str, ...]:
    """The `mountPath`s of `volume_mounts` that are one of `RESERVED_MOUNT_PATHS` (compared as
    clean paths: `//`, `/./`, a trailing `/` do not hide one), or hold a `..` (which could)."""
    found = []
    for mount in volume_mounts if isinstance(volume_mounts, list) else ():
        path = mount.get("mountPath") if isinstance(mount, Mapping) else None
        if not isinstance(path, str):
            continue
        if ".." in path.split("/") or posixpath.normpath("/" + path.lstrip("/")) in (
            RESERVED_MOUNT_PATHS
        ):
            found.append(path)
    return tuple(found)
