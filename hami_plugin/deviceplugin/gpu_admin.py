"""Whether a pod's namespace is a gpu-admin namespace (`protocol.gpu_admin`), read from the API
server for Allocate (`AllocateConfig.gpu_admin_namespace`).

Asked only for a container that sets `CUDA_DISABLE_CONTROL=true`, a rare path, so each answer
is a fresh GET of the namespace, inside Allocate's time budget. It fails closed: a client that
cannot read namespaces, or a read that fails, answers no, and the container gets HAMi-core's
preload (one warning line says why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from hami_plugin.kube.errors import KubeError
from hami_plugin.protocol.gpu_admin import LABEL_GPU_ADMIN, is_gpu_admin

__all__ = ["NamespaceApi", "gpu_admin_reader"]

logger = logging.getLogger(__name__)


@runtime_checkable
class NamespaceApi(Protocol):
    """A namespace's labels (`KubeClient.get_namespace_labels`)."""

    def get_namespace_labels(self, name: str) -> Mapping[str, str]: ...


def gpu_admin_reader(kube: object) -> Callable[[str], bool] | None:
    """The namespace check for `kube`; None when it cannot read namespaces."""
    if not isinstance(kube, NamespaceApi):
        return None
    reader: NamespaceApi = kube

    def is_admin(namespace: str) -> bool:
        try:
            labels = reader.get_namespace_labels(namespace)
        except KubeError as error:
            logger.warning(
                "cannot read namespace %s to see whether it is labelled %s (%s): "
                "CUDA_DISABLE_CONTROL is ignored, HAMi-core's preload is mounted",
                namespace,
                LABEL_GPU_ADMIN,
                error,
            )
            return False
        return is_gpu_admin(labels)

    return is_admin
