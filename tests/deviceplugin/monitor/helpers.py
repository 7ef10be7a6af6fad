"""Pods and container directories for the metrics tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hami_plugin.protocol import hostpaths
from hami_plugin.protocol.model import LABEL_VGPU_NODE
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from tests.deviceplugin.monitor.region_writer import RegionSpec, write_region

NODE = "gpu-node-1"


def pod(
    uid: str,
    name: str,
    containers: Sequence[str] = ("main",),
    *,
    namespace: str = "default",
    init_containers: Sequence[str] = (),
    node_label: str | None = NODE,
) -> PodInfo:
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=uid,
        phase="Running",
        node_name=NODE,
        annotations={},
        labels={} if node_label is None else {LABEL_VGPU_NODE: node_label},
        init_containers=tuple(ContainerSpec(name=c) for c in init_containers),
        containers=tuple(ContainerSpec(name=c) for c in containers),
        resource_version="1",
        creation_timestamp=None,
    )


def container_dir(hook: Path, pod_uid: str, container: str) -> Path:
    """Created exactly where Allocate creates it."""
    path = Path(hostpaths.container_dir(str(hook), pod_uid, container))
    path.mkdir(parents=True, exist_ok=True)
    return path


def region_file(
    hook: Path, pod_uid: str, container: str, spec: RegionSpec, name: str = "a1b2.cache"
) -> Path:
    directory = container_dir(hook, pod_uid, container)
    (directory / "libvgpu.so").touch()  # the bind-mount point of the library
    return write_region(directory / name, spec)
