"""Which MIG reservations on this node are live, and what the daemon does about them at start
(HAMi v2.10 plugin/mig_startup.go, server.go:290-312 and 358-480).

The pods are tenant input, so a reservation counts only when the scheduler signed it: with
booking keys, a pod's `hami.io/vgpu-mig-allocations` is read only when its booking signature
verifies (the signature covers the annotation's scheduler part, `protocol.signature`) and names
this node; without keys every annotation is trusted, as HAMi trusts it. The runtime identity
(`migUUID`, instance ids) is not signed: it is adopted only when NVML shows exactly that
instance (`manager.MigInstanceManager.adopt`).

At start (`start_dynamic_mig`): the GPUs in use are those of live signed reservations and those
NVML shows running processes on (mig_startup.go:48-68); if the pods cannot be listed, every GPU
is kept (server.go:292-301). The idle GPUs are reset (MIG mode on, every instance destroyed),
then each live reservation's instance is adopted: by its annotated runtime identity, or, when
that was never written (the daemon stopped between creating it and patching the pod), by the
instance NVML lists at exactly its placement, if that one runs no process and no other
reservation claims it (`manager.MigInstanceManager.adopt_live`). One that cannot be adopted is
logged and left.

Then (our addition) the GPUs kept are swept (`manager.MigInstanceManager.sweep`): an untracked
instance no live signed reservation claims (`mig_claims`) is a gone pod's, left because
another pod holds its GPU; it is destroyed when it runs no process, else logged and left for
the reconciler's next rounds. HAMi leaves it, and its scheduler then books over it. The sweep
fails closed: it runs only when the pods were listed and every counted reservation was read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hami_plugin.deviceplugin.mig.devices import MigNvml
from hami_plugin.deviceplugin.mig.manager import MigError, MigInstanceManager
from hami_plugin.deviceplugin.mig.plan import AllocationKey, allocation_key
from hami_plugin.deviceplugin.nvml import NvmlError
from hami_plugin.protocol.mig import MigAllocation, MigAllocationError
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import BookingKeys

__all__ = [
    "LiveReservations",
    "active_allocation_keys",
    "in_use_gpus",
    "live_reservations",
    "mig_claims",
    "pod_is_live",
    "start_dynamic_mig",
]

logger = logging.getLogger(__name__)

GpuIndexOf = Callable[[str], int | None]
"""The NVML index of the GPU with this UUID on the node (None: not here)."""


def pod_is_live(pod: PodInfo) -> bool:
    """HAMi's test (server.go:361): not being deleted, not Succeeded or Failed."""
    return not pod.deleting and not pod.finished


@dataclass(frozen=True, slots=True)
class LiveReservations:
    """The signed MIG reservations of this node's live pods, and what was not read."""

    pods: tuple[tuple[PodInfo, tuple[MigAllocation, ...]], ...] = ()
    problems: tuple[str, ...] = ()
    """One line per pod whose signed (or, without keys, any) annotation does not decode."""
    unsigned: tuple[str, ...] = field(default=())
    """The pods (`namespace/name`) whose annotation was ignored: booking not signed for here."""


def live_reservations(
    pods: Sequence[PodInfo], node_name: str, keys: BookingKeys | None
) -> LiveReservations:
    """The MIG reservations of `pods` that count (module docstring). Pure."""
    found: list[tuple[PodInfo, tuple[MigAllocation, ...]]] = []
    problems: list[str] = []
    unsigned: list[str] = []
    for pod in pods:
        booking = pod.booking
        if booking is None or booking.mig_text is None or not pod_is_live(pod):
            continue
        if keys is not None and (booking.node != node_name or not booking.verifies(keys, pod.uid)):
            unsigned.append(pod.key)
            continue
        try:
            allocations = booking.mig or ()
        except MigAllocationError as error:
            problems.append(f"decode MIG allocations for pod {pod.key}: {error}")
            continue
        if allocations:
            found.append((pod, allocations))
    return LiveReservations(tuple(found), tuple(problems), tuple(unsigned))


class ReservationError(Exception):
    """The live reservations cannot be trusted to decide what to destroy (fail closed)."""


def active_allocation_keys(
    live: LiveReservations, gpu_index_of: GpuIndexOf
) -> frozenset[AllocationKey]:
    """HAMi's `activeMigAllocationKeys` (server.go:358-377) over the counted reservations.

    Raises ReservationError when a reservation does not decode or names a GPU that is not on
    the node: reconciliation destroys instances, so it does nothing then (server.go:492-497).
    """
    if live.problems:
        raise ReservationError(live.problems[0])
    active: set[AllocationKey] = set()
    for _, allocations in live.pods:
        for allocation in allocations:
            index = gpu_index_of(allocation.gpu_uuid)
            if index is None:
                raise ReservationError(f'resolve active MIG parent GPU "{allocation.gpu_uuid}"')
            active.add(allocation_key(index, allocation.profile, allocation.placement))
    return frozenset(active)


def in_use_gpus(live: LiveReservations, gpu_index_of: GpuIndexOf) -> frozenset[int]:
    """The GPU indexes live reservations name (HAMi `kubernetesAllocatedMigGPUs`,
    mig_startup.go:93-114; only `GPU-` UUIDs, as `activeMigGPUUUIDs`). Raises
    ReservationError for a GPU that is not on the node (the caller then keeps every GPU)."""
    out: set[int] = set()
    for _, allocations in live.pods:
        for allocation in allocations:
            if not allocation.gpu_uuid.startswith("GPU-"):
                continue
            index = gpu_index_of(allocation.gpu_uuid)
            if index is None:
                raise ReservationError(f"resolve GPU UUID {allocation.gpu_uuid}")
            out.add(index)
    return frozenset(out)


def mig_claims(
    live: LiveReservations, gpu_index_of: GpuIndexOf, *, except_uid: str | None = None
) -> dict[str, AllocationKey]:
    """MIG UUID -> reservation key, for each counted reservation with a runtime identity (of a
    pod other than `except_uid`) whose GPU is on the node: the instances live pods hold
    (`plan.claim_holds` checks each against what NVML shows)."""
    claims: dict[str, AllocationKey] = {}
    for pod, allocations in live.pods:
        if pod.uid == except_uid:
            continue
        for allocation in allocations:
            if not allocation.runtime_ready:
                continue
            index = gpu_index_of(allocation.gpu_uuid)
            if index is not None:
                claims[allocation.mig_uuid] = allocation_key(
                    index, allocation.profile, allocation.placement
                )
    return claims


def _busy_gpus(nvml: MigNvml, device_count: int) -> frozenset[int]:
    """HAMi's `nvmlBusyGPUs` (mig_startup.go:131-171): a GPU whose process query fails counts
    as busy, so it is never reset."""
    busy: set[int] = set()
    for index in range(device_count):
        try:
            if nvml.has_processes(index):
                busy.add(index)
        except NvmlError:
            busy.add(index)
    return frozenset(busy)


def _adopt(
    manager: MigInstanceManager,
    pod: PodInfo,
    allocation: MigAllocation,
    index: int,
    live: LiveReservations,
    gpu_index_of: GpuIndexOf,
) -> None:
    if allocation.runtime_ready:
        assert allocation.gpu_instance_id is not None
        assert allocation.compute_instance_id is not None
        manager.adopt(
            index,
            allocation.profile,
            allocation.mig_uuid,
            allocation.placement,
            allocation.gpu_instance_id,
            allocation.compute_instance_id,
        )
        return
    # Created but never recorded on the pod: the instance NVML lists at that placement.
    claims = mig_claims(live, gpu_index_of, except_uid=pod.uid)
    if manager.adopt_live(index, allocation.profile, allocation.placement, claims=claims) is None:
        raise MigError(f"active pod {pod.key} MIG allocation lacks runtime identity")


def start_dynamic_mig(
    manager: MigInstanceManager,
    nvml: MigNvml,
    device_count: int,
    list_pods: Callable[[], Sequence[PodInfo]],
    node_name: str,
    keys: BookingKeys | None,
    gpu_index_of: GpuIndexOf,
) -> tuple[list[int], frozenset[int]]:
    """HAMi's MIG start (server.go:290-312): reset the idle GPUs, adopt the live reservations.
    Returns the GPUs reset and those kept as in use; never raises (each problem is a log
    line: a GPU that cannot be reset stays as it is, a reservation not adopted stays on it)."""
    in_use: frozenset[int]
    live = LiveReservations()
    known = False
    try:
        live = live_reservations(list_pods(), node_name, keys)
        in_use = in_use_gpus(live, gpu_index_of)
        known = not live.problems
    except Exception as error:
        # Reset is destructive: without the allocation state, keep every GPU.
        logger.warning("mig init: allocation detection failed; preserving all GPUs: %s", error)
        in_use = frozenset(range(device_count))
    in_use |= _busy_gpus(nvml, device_count)
    for line in live.unsigned:
        logger.warning(
            "mig init: pod %s: MIG allocations not signed by the scheduler for this node: ignored",
            line,
        )
    try:
        reset = manager.reset_idle_gpus(device_count, in_use)
    except MigError as error:
        logger.warning("mig init: failed to reset idle GPUs: %s", error)
        reset = []
    logger.info(
        "mig init: resolved startup layout: in-use GPUs %s, reset GPUs %s",
        sorted(in_use),
        reset,
    )
    for line in live.problems:
        logger.warning("mig init: %s: not adopted", line)
    for pod, allocations in live.pods:
        for allocation in allocations:
            index = gpu_index_of(allocation.gpu_uuid)
            if index is None:
                logger.warning(
                    'mig init: pod %s: resolve active MIG parent GPU "%s": not adopted',
                    pod.key,
                    allocation.gpu_uuid,
                )
                continue
            try:
                _adopt(manager, pod, allocation, index, live, gpu_index_of)
            except MigError as error:
                logger.warning(
                    "mig init: failed to adopt pod %s MIG allocation: %s", pod.key, error
                )
    if known:
        kept = sorted(set(range(device_count)) - set(reset))
        manager.sweep(kept, mig_claims(live, gpu_index_of))
    else:
        logger.warning("mig init: reservations not all read; no leftover MIG instance destroyed")
    return reset, in_use
