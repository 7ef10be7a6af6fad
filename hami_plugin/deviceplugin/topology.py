"""Measure the GPU pair links through pynvml the way HAMi v2.10's `pkg/device/nvidia/links.go` does.

`measure_links(nvml, uuids)` takes the pynvml module (or the fake NVML) already initialised and
returns `protocol.topology.GpuLinks` for the listed GPUs, ready for `calculate_gpu_scores`. For
each ordered pair (calculate_score.go `build`): the PCIe common-ancestor level (`GetP2PLink`),
then the NVLink lane count (`GetNVLink`: lanes whose remote PCI address is the peer; failing that,
when both GPUs reach NVSwitches, the smaller of their switch lane counts). NVML NotSupported and
InvalidArgument on a lane skip it; any other NVML error fails the whole measurement, as in HAMi.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hami_plugin.protocol.topology import TOPOLOGY_LEVEL_LINKS, GpuLinks, nvlink_type

DEFAULT_NVLINK_MAX_LINKS = 18
"""Lanes probed when the binding has no NVML_NVLINK_MAX_LINKS (HAMi loops over go-nvml's)."""
_NOT_SUPPORTED = 3
_INVALID_ARGUMENT = 2
_FEATURE_ENABLED = 1
_DEVICE_TYPE_SWITCH = 2


class TopologyError(Exception):
    """A pair could not be measured (HAMi: `error getting P2PLink/NVLink for devices`)."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def bus_id(raw: object) -> str:
    """links.go `PciInfo.BusID`: up to the first NUL, lower-cased, a leading "0000" dropped."""
    text = _text(raw).split("\x00", 1)[0].lower()
    if text != "0000" and text.startswith("0000"):
        text = text[4:]
    return text


def _skippable(nvml: Any, error: BaseException) -> bool:
    return isinstance(error, nvml.NVMLError) and getattr(error, "value", None) in (
        _NOT_SUPPORTED,
        _INVALID_ARGUMENT,
    )


def _enabled_lanes(nvml: Any, handle: Any) -> list[int]:
    lanes = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", DEFAULT_NVLINK_MAX_LINKS)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as error:
            if _skippable(nvml, error):
                continue
            raise TopologyError(f"failed to get nvlink state: {error}") from error
        if state == _FEATURE_ENABLED:
            lanes.append(link)
    return lanes


def remote_bus_ids(nvml: Any, handle: Any) -> list[str]:
    """links.go `getAllNvLinkRemotePciInfo`: the remote PCI address of every enabled lane."""
    result = []
    for link in _enabled_lanes(nvml, handle):
        try:
            info = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
        except nvml.NVMLError as error:
            if _skippable(nvml, error):
                continue
            raise TopologyError(f"failed to get remote pci info: {error}") from error
        result.append(bus_id(info.busId))
    return result


def switch_lanes(nvml: Any, handle: Any) -> int:
    """links.go `countNvSwitchLinks`: enabled lanes whose far end is an NVSwitch."""
    count = 0
    for link in _enabled_lanes(nvml, handle):
        try:
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except nvml.NVMLError as error:
            if _skippable(nvml, error):
                continue
            raise TopologyError(f"failed to get nvlink remote device type: {error}") from error
        if kind == _DEVICE_TYPE_SWITCH:
            count += 1
    return count


def p2p_link(nvml: Any, first: Any, second: Any) -> int:
    """links.go `GetP2PLink`: the PCIe link type value of the pair."""
    try:
        level = nvml.nvmlDeviceGetTopologyCommonAncestor(first, second)
    except nvml.NVMLError as error:
        raise TopologyError(f"failed to get common ancestor: {error}") from error
    if level not in TOPOLOGY_LEVEL_LINKS:
        raise TopologyError(f"unknown topology level: {level}")
    return TOPOLOGY_LEVEL_LINKS[level]


def nvlink(nvml: Any, first: Any, second: Any) -> int:
    """links.go `GetNVLink`: the NVLink link type value of the pair (0: none)."""
    remotes = remote_bus_ids(nvml, first)
    try:
        peer = bus_id(nvml.nvmlDeviceGetPciInfo(second).busId)
    except nvml.NVMLError as error:
        raise TopologyError(f"failed to get pci info: {error}") from error
    direct = nvlink_type(sum(1 for remote in remotes if remote == peer))
    if direct:
        return direct
    if not remotes:
        return 0
    first_switch = switch_lanes(nvml, first)
    second_switch = switch_lanes(nvml, second)
    if first_switch > 0 and second_switch > 0:
        return nvlink_type(min(first_switch, second_switch))
    return 0


def measure_links(nvml: Any, uuids: Sequence[str]) -> list[GpuLinks]:
    """calculate_score.go `NewDevices` + `Filter`: every GPU's links to every other GPU of the
    node, for the GPUs in `uuids` (in that order). Raises TopologyError as HAMi's build does."""
    count = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    node_uuids = [_text(nvml.nvmlDeviceGetUUID(handle)) for handle in handles]
    links: list[dict[int, list[int]]] = [{} for _ in handles]
    for i, first in enumerate(handles):
        for j, second in enumerate(handles):
            if i == j:
                continue
            for value in (p2p_link(nvml, first, second), nvlink(nvml, first, second)):
                if value:
                    links[i].setdefault(j, []).append(value)
    result = []
    for uuid in uuids:
        if uuid not in node_uuids:
            raise TopologyError(f"no device with uuid: {uuid}")
        index = node_uuids.index(uuid)
        result.append(GpuLinks(uuid=uuid, index=index, links=links[index]))
    return result
