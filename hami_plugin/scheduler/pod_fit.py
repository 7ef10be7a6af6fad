"""Fit every container of a pod onto one node, as HAMi v2.10's `fitInDevices` does
(`pkg/scheduler/score.go:226-331`, docs/hami-reference.md 3.7).

Init containers each fit on the node as it is (they run one after another); app containers
fit one after another on one copy of the node that books what the earlier ones took. As in
HAMi, where every container re-sorts the same device list in place, an app container's sort
starts from the order the previous GPU container left behind.

On a MIG node each container's MIG devices then become their profiles (HAMi's
`AddResourceUsage`): the profile chosen for the memory at a placement free in the phase, the
placement in use for the phase's later containers; `PodFit.mig` holds the reservations,
indexed as HAMi's `EncodeMigAllocations` indexes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hami_plugin.protocol.mig import MigAllocation
from hami_plugin.protocol.model import ContainerDevice, ContainerDevices, OperatingMode, PodDevices
from hami_plugin.scheduler.fit import ContainerFit, FitContext, FitFailure, fit_container
from hami_plugin.scheduler.mig import MigView, select_mig_candidate
from hami_plugin.scheduler.requests import PodRequests
from hami_plugin.scheduler.usage import NodeUsage

__all__ = ["PodFit", "fit_pod"]


@dataclass(frozen=True, slots=True)
class PodFit:
    """The GPUs each container gets on the node: one entry per container, init containers
    first, an empty entry for a container without a GPU request. `mig`: the MIG reservations
    (one per MIG device booked, in container and device order; `()` without MIG), what
    `hami.io/vgpu-mig-allocations` carries."""

    devices: PodDevices
    mig: tuple[MigAllocation, ...] = ()


def fit_pod(
    node: NodeUsage, requests: PodRequests, context: FitContext, *, screen: bool = True
) -> PodFit | FitFailure:
    """Fit every container of the pod on the node; the first failing container's failure is
    the node's. `screen` as for `fit_container`."""
    entries: list[ContainerDevices] = []
    reservations: list[MigAllocation] = []
    failure = None
    if requests.init_count:
        failure = _fit_init_containers(node, requests, context, screen, entries, reservations)
    if failure is None:
        failure = _fit_app_containers(node, requests, context, screen, entries, reservations)
    if failure is not None:
        return failure
    return PodFit(tuple(entries), tuple(reservations))


def _fit_init_containers(
    node: NodeUsage,
    requests: PodRequests,
    context: FitContext,
    screen: bool,
    entries: list[ContainerDevices],
    reservations: list[MigAllocation],
) -> FitFailure | None:
    """Each init container on its own copy of the node (score.go:226-233), appended to
    `entries` (and its MIG reservations to `reservations`). The quota check's phase (HAMi's
    `allocated`) is the earlier init containers with GPUs."""
    phase: list[ContainerDevices] = []
    for request in requests.init_requests:
        if request is None:
            entries.append(())
            continue
        mig = MigView(node) if node.has_mig else None
        fitted = fit_container(node, request, context, allocated=phase, mig=mig, screen=screen)
        if isinstance(fitted, FitFailure):
            return fitted
        devices = _mig_usage(node, fitted, mig, len(entries), reservations)
        if isinstance(devices, FitFailure):
            return devices
        entries.append(devices)
        phase.append(devices)
    return None


def _fit_app_containers(
    node: NodeUsage,
    requests: PodRequests,
    context: FitContext,
    screen: bool,
    entries: list[ContainerDevices],
    reservations: list[MigAllocation],
) -> FitFailure | None:
    """The app containers one after another on one copy of the node (HAMi's appNodeCopy,
    score.go:320), each seeing what the earlier ones took, each sorting from the GPU order the
    previous one left; appended as for `_fit_init_containers`."""
    phase: list[ContainerDevices] = []
    mig = MigView(node) if node.has_mig else None
    app = requests.app_requests
    remaining = sum(request is not None for request in app)
    base: Sequence[int] | None = None
    for request in app:
        if request is None:
            entries.append(())
            continue
        fitted = fit_container(
            node, request, context, base=base, allocated=phase, mig=mig, screen=screen
        )
        if isinstance(fitted, FitFailure):
            return fitted
        devices = _mig_usage(node, fitted, mig, len(entries), reservations)
        if isinstance(devices, FitFailure):
            return devices
        entries.append(devices)
        phase.append(devices)
        remaining -= 1
        if remaining:
            node = _with_booked(node, fitted.positions, devices)
        base = fitted.order
    return None


def _with_booked(node: NodeUsage, positions: Sequence[int], devices: ContainerDevices) -> NodeUsage:
    """The node as the next app container sees it: `devices` booked on the GPUs at
    `positions` (the node's score is left as it was: the fit does not read it)."""
    used = list(node.used)
    used_memory_mib = list(node.used_memory_mib)
    used_cores = list(node.used_cores)
    for position, device in zip(positions, devices, strict=True):
        used[position] += 1
        used_memory_mib[position] += device.used_mem_mib
        used_cores[position] += device.used_cores
    return replace(
        node,
        used=tuple(used),
        used_memory_mib=tuple(used_memory_mib),
        used_cores=tuple(used_cores),
    )


def _mig_usage(
    node: NodeUsage,
    fitted: ContainerFit,
    mig: MigView | None,
    container_index: int,
    reservations: list[MigAllocation],
) -> ContainerDevices | FitFailure:
    """HAMi's `AddResourceUsage` for one container's GPUs (device.go:645-664, called by
    fitInDevices, score.go:107-131): each MIG-mode GPU's device becomes the profile chosen for
    its memory at a placement free in `mig` (the placement then in use there), with the
    profile's memory and cores; the reservation is appended to `reservations`."""
    if mig is None:
        return fitted.devices
    devices = node.devices
    out: list[ContainerDevice] = []
    for device_index, (position, booked) in enumerate(
        zip(fitted.positions, fitted.devices, strict=True)
    ):
        device = devices[position]
        if device.mode != OperatingMode.MIG:
            out.append(booked)
            continue
        candidate = select_mig_candidate(
            device.mig_profiles, mig.occupied(position), booked.used_mem_mib
        )
        if candidate is None:
            return FitFailure(
                detail=f"AddResourceUsage failed for device {device.uuid}: "
                "MIG profile and placement allocation failed"
            )
        profile, placement = candidate
        mig.add(position, placement)
        out.append(ContainerDevice(device.uuid, booked.type, profile.memory_mib, profile.cores))
        reservations.append(
            MigAllocation(container_index, device_index, device.uuid, profile.name, placement)
        )
    return tuple(out)
