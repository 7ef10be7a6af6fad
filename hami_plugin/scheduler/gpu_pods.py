"""The rules a GPU pod's admission holds it to beyond HAMi's, where the webhook
(`scheduler.webhook`) and the ValidatingAdmissionPolicy `hami-gpu-pods`
(daemonset/admission-policy.yaml) share words: the labels they read and the container
environment only an admin namespace's GPU pods may set. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hami_plugin.protocol.gpu_admin import ENV_DISABLE_CONTROL, LABEL_GPU_ADMIN

__all__ = [
    "ADMIN_NAMESPACE_LABEL",
    "CONTROL_ENV_NAMES",
    "CONTROL_ENV_PREFIX",
    "ENV_DISABLE_CONTROL",
    "LABEL_WEBHOOK",
    "WEBHOOK_IGNORE",
    "control_env",
    "control_env_refusal",
]

ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

CONTROL_ENV_NAMES = (ENV_DISABLE_CONTROL, ENV_NVIDIA_VISIBLE_DEVICES)
CONTROL_ENV_PREFIX = "CUDA_DEVICE_"
"""What only an admin namespace's GPU pods may set in a container: HAMi-core off, the GPU list
(but `none`, what `overwrite_env` writes) and HAMi-core's limits (CUDA_DEVICE_MEMORY_LIMIT_*,
CUDA_DEVICE_SM_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE)."""
_HARMLESS_VISIBLE_DEVICES = "none"
LABEL_WEBHOOK = "hami.io/webhook"
WEBHOOK_IGNORE = "ignore"
"""HAMi's opt-out (`hami.io/webhook: ignore`; v2.10 chart templates/scheduler/webhook.yaml
32-36 on namespaces, 52-56 on pods). On a namespace the webhook configuration honours it; on a
pod only while the pod asks for no GPU resource (our own pods: left unchanged, as HAMi's
objectSelector leaves them), so a pod author cannot label a GPU pod past these rules."""
ADMIN_NAMESPACE_LABEL = LABEL_GPU_ADMIN
"""The namespace label (value `true`) whose GPU pods may set the control environment."""


def control_env(env: Sequence[object], env_from: object) -> tuple[str, ...]:
    """The control variables a container sets (`CONTROL_ENV_NAMES`, `CONTROL_ENV_PREFIX`), by
    value or valueFrom, and the envFrom prefixes that can only make such names (an envFrom
    without one may too, from keys we cannot see: the device plugin mounts the preload anyway).
    Items that are not objects with a string name are the API server's to refuse."""
    found = []
    for variable in env:
        if not isinstance(variable, Mapping) or not isinstance(variable.get("name"), str):
            continue
        name = variable["name"]
        if name == ENV_NVIDIA_VISIBLE_DEVICES and variable.get("value") == (
            _HARMLESS_VISIBLE_DEVICES
        ):
            continue
        if name in CONTROL_ENV_NAMES or name.startswith(CONTROL_ENV_PREFIX):
            found.append(name)
    for source in env_from if isinstance(env_from, list) else ():
        prefix = source.get("prefix") if isinstance(source, Mapping) else None
        if isinstance(prefix, str) and prefix.startswith(CONTROL_ENV_PREFIX):
            found.append(f"envFrom prefix {prefix}")
    return tuple(found)


def control_env_refusal(container: str, variable: str) -> str:
    """The webhook's denial for a container that sets `variable` (one of `control_env`'s)."""
    return (
        f"container {container} sets {variable}: only pods in a namespace labelled "
        f"{ADMIN_NAMESPACE_LABEL}=true may set CUDA_DISABLE_CONTROL, {CONTROL_ENV_PREFIX}* or "
        f"{ENV_NVIDIA_VISIBLE_DEVICES}"
    )
