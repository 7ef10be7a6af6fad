"""Pods and container directories for the metrics tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from hami_plugin.protocol import hostpaths
from hami_plugin.protocol.booking import PodBooking
from hami_plugin.protocol.codec import encode_pod_devices
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
    LABEL_VGPU_NODE,
    ContainerDevice,
)
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE, BookingKeys
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
    booked: Mapping[str, Sequence[str]] | None = None,
    env: Mapping[str, Mapping[str, str]] | None = None,
    keys: BookingKeys | None = None,
) -> PodInfo:
    """A running pod on NODE. `booked`: container name -> GPU UUIDs, written as the scheduler's
    booking (signed with `keys` when given); `env`: container name -> its literal env."""
    names = [*init_containers, *containers]
    annotations: dict[str, str] = {}
    if booked is not None:
        devices = tuple(
            tuple(ContainerDevice(u, "NVIDIA", 1000, 10) for u in booked.get(c, ())) for c in names
        )
        text = encode_pod_devices(devices, ANNOTATION_DEVICES_ALLOCATED)
        annotations = {
            ANNOTATION_VGPU_NODE: NODE,
            ANNOTATION_BIND_TIME: "1700000000",
            ANNOTATION_DEVICES_ALLOCATED: text,
            ANNOTATION_DEVICES_TO_ALLOCATE: ";",
        }
        fields = PodBooking(annotations).signed_fields(uid)
        if keys is not None and fields is not None:
            annotations[ANNOTATION_BOOKING_SIGNATURE] = keys.sign(fields)

    def spec(name: str) -> ContainerSpec:
        return ContainerSpec(name=name, env=dict((env or {}).get(name, {})))

    return PodInfo(
        namespace=namespace,
        name=name,
        uid=uid,
        phase="Running",
        node_name=NODE,
        annotations=annotations,
        labels={} if node_label is None else {LABEL_VGPU_NODE: node_label},
        init_containers=tuple(spec(c) for c in init_containers),
        containers=tuple(spec(c) for c in containers),
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
