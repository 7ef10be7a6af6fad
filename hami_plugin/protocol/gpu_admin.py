"""The namespace label that lets a namespace's GPU pods control HAMi-core themselves.

`hami-plugin.io/gpu-admin: "true"` on a namespace (set by a cluster admin: pod authors cannot
label namespaces): the admission webhook and the policy `hami-gpu-pods` let its GPU pods set
`CUDA_DISABLE_CONTROL`, `CUDA_DEVICE_*` and `NVIDIA_VISIBLE_DEVICES`, and the device plugin
leaves HAMi-core's preload out of a container there that sets `CUDA_DISABLE_CONTROL=true`
(HAMi's behaviour everywhere; ours only there). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ENV_DISABLE_CONTROL", "LABEL_GPU_ADMIN", "LABEL_GPU_ADMIN_VALUE", "is_gpu_admin"]

LABEL_GPU_ADMIN = "hami-plugin.io/gpu-admin"
LABEL_GPU_ADMIN_VALUE = "true"
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"


def is_gpu_admin(namespace_labels: Mapping[str, str]) -> bool:
    """The namespace carries the label with exactly its value."""
    return namespace_labels.get(LABEL_GPU_ADMIN) == LABEL_GPU_ADMIN_VALUE
