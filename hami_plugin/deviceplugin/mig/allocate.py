"""Allocate on a dynamic-MIG node: the container's MIG reservations realised as instances and
handed to the runtime (HAMi v2.10 plugin/util.go:291-369 `GetContainerDeviceStrArray`,
server.go:815-832 and `annotateMigRuntimeInfo`, server.go:380-423).

`decide_allocation` has already picked the pod (its booking verified, so with booking keys the
scheduler's part of `hami.io/vgpu-mig-allocations` is what the scheduler signed) and the
to-allocate entry of each container. Here, per container (index = its entry's position, init
containers first, as HAMi's `containerIndex`):

1. its reservations are the allocations of that container index, by device index; their number
   must equal the entry's devices, the i-th on the i-th device's GPU (HAMi's messages:
   "container %s has %d MIG reservations, requested %d devices", "MIG reservation GPU %s does
   not match allocated GPU %s"), checked before NVML is touched;
2. the node's instances are reconciled with the live reservations first (util.go:334);
3. each instance is ensured (`MigInstanceManager.ensure`); when one fails, the instances this
   call created are destroyed again, newest first (util.go:337-348);
4. the container gets `NVIDIA_VISIBLE_DEVICES=<MIG-uuid,...>` through the device list
   strategies, and nothing of HAMi-core: HAMi skips its limits, cache and mounts for a MIG
   device (server.go:832: `operatingMode != "mig"`), since MIG isolates in hardware;
5. the runtime identity of every realised reservation of the pod is written back into the
   annotation (with the call's other annotation writes, `MigRealised.annotations`).

Errors are `AllocateFailure(MIG_ALLOCATION_FAILED)` with HAMi's wrapped text; the caller fails
the pod as for any Allocate failure and calls `rollback` when a later step fails.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from hami_plugin.deviceplugin.allocate import (
    AllocateFailure,
    AllocationDecision,
    ContainerAllocation,
    FailureReason,
    MountSpec,
)
from hami_plugin.deviceplugin.device_list import (
    VOLUME_MOUNTS_HOST_PATH,
    DeviceListConfig,
    DeviceListStrategy,
    device_list_answer,
)
from hami_plugin.deviceplugin.mig.manager import MigError, MigInstanceManager
from hami_plugin.deviceplugin.mig.plan import AllocationKey, Claims, allocation_key
from hami_plugin.protocol.mig import (
    MigAllocation,
    MigAllocationError,
    encode_mig_allocations,
)
from hami_plugin.protocol.model import ANNOTATION_VGPU_MIG_ALLOCATIONS, ContainerDevices
from hami_plugin.protocol.objects import PodInfo

__all__ = ["MigAllocateStep", "MigRealised", "container_reservations", "mig_container"]

logger = logging.getLogger(__name__)

_RESOLVE = "resolve allocated NVIDIA devices: "
"""HAMi's wrapping of `GetContainerDeviceStrArray`'s errors (server.go:818)."""
_RECORD = "record MIG runtime placement: "
"""HAMi's wrapping of `annotateMigRuntimeInfo`'s errors (server.go:823)."""


def _failure(message: str) -> AllocateFailure:
    return AllocateFailure(FailureReason.MIG_ALLOCATION_FAILED, message)


def decode_reservations(pod: PodInfo) -> tuple[MigAllocation, ...]:
    """The pod's MIG allocations; raises AllocateFailure as HAMi (util.go:320-323)."""
    try:
        return (pod.booking.mig if pod.booking is not None else None) or ()
    except MigAllocationError as error:
        raise _failure(f"{_RESOLVE}decode scheduler MIG allocations: {error}") from error


def container_reservations(
    allocations: Sequence[MigAllocation],
    container_index: int,
    container_name: str,
    devices: ContainerDevices,
) -> tuple[MigAllocation, ...]:
    """The container's reservations in device order, checked against its booked devices
    (util.go:324-353). Raises AllocateFailure with HAMi's message. Pure."""
    mine = sorted(
        (a for a in allocations if a.container_index == container_index),
        key=lambda allocation: allocation.device_index,
    )
    if len(mine) != len(devices):
        raise _failure(
            f"{_RESOLVE}container {container_name} has {len(mine)} MIG reservations, "
            f"requested {len(devices)} devices"
        )
    for reservation, device in zip(mine, devices, strict=True):
        if reservation.gpu_uuid != device.uuid:
            raise _failure(
                f"{_RESOLVE}MIG reservation GPU {reservation.gpu_uuid} does not match "
                f"allocated GPU {device.uuid}"
            )
    return tuple(mine)


def mig_container(
    container: ContainerAllocation,
    mig_uuids: Sequence[str],
    device_list: DeviceListConfig,
    response_id: str,
) -> ContainerAllocation:
    """The container's answer with its MIG devices: the device list strategies' part only
    (no HAMi-core environment, mounts or host directory, server.go:832). Pure."""
    answer = device_list_answer(mig_uuids, device_list, response_id)
    mounts = tuple(
        MountSpec(container_path=path, host_path=VOLUME_MOUNTS_HOST_PATH, read_only=False)
        for path in answer.mount_paths
    )
    return replace(
        container,
        envs=dict(answer.envs),
        mounts=mounts,
        host_dir="",
        annotations=answer.annotations,
        cdi_devices=answer.cdi_devices,
    )


@dataclass(frozen=True, slots=True)
class MigRealised:
    """An Allocate's MIG part done: the answer with MIG devices, the annotation carrying the
    runtime identity, the instances this call created (`MigAllocateStep.rollback`) and the
    reservations it realised."""

    decision: AllocationDecision
    annotations: dict[str, str]
    created: tuple[str, ...]
    keys: tuple[AllocationKey, ...]


class MigAllocateStep:
    """The MIG part of Allocate on a dynamic-MIG node (module docstring).

    `gpu_index_of` maps a GPU UUID to its NVML index (None: not on the node); `reconcile`
    releases the instances of reservations no longer live (raises on failure: then nothing is
    created, as HAMi). `on_realised` is told the pod UID and the keys about to be realised for
    it. `guard` is held from the reconciliation to the last instance (the daemon's reconciler
    holds it too, so it never sees an instance between its creation and its owner's record).
    `claims` gives, for the pod's UID, the instances other live reservations hold (as of that
    reconciliation), which `ensure` never adopts for this pod.
    """

    def __init__(
        self,
        manager: MigInstanceManager,
        gpu_index_of: Callable[[str], int | None],
        device_list: DeviceListConfig,
        *,
        reconcile: Callable[[], object] | None = None,
        on_realised: Callable[[str, Sequence[AllocationKey]], None] | None = None,
        new_response_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        guard: contextlib.AbstractContextManager[object] | None = None,
        claims: Callable[[str], Claims] | None = None,
    ) -> None:
        self._guard = guard if guard is not None else contextlib.nullcontext()
        self._manager = manager
        self._gpu_index_of = gpu_index_of
        self._device_list = device_list
        self._reconcile = reconcile
        self._on_realised = on_realised
        self._new_response_id = new_response_id
        self._claims = claims

    def realise(self, pod: PodInfo, decision: AllocationDecision) -> MigRealised:
        """Ensure the instances of every container of `decision`; raises AllocateFailure
        (after rolling back what it created)."""
        allocations = decode_reservations(pod)
        planned = [
            (
                container,
                container_reservations(
                    allocations, container.entry_index, container.container_name, container.devices
                ),
            )
            for container in decision.containers
        ]
        indexes: dict[str, int] = {}
        for _, reservations in planned:
            for reservation in reservations:
                index = self._gpu_index_of(reservation.gpu_uuid)
                if index is None:
                    raise _failure(f"{_RESOLVE}resolve parent GPU {reservation.gpu_uuid}")
                indexes[reservation.gpu_uuid] = index
        with self._guard:
            return self._realise(pod, decision, allocations, planned, indexes)

    def _realise(
        self,
        pod: PodInfo,
        decision: AllocationDecision,
        allocations: Sequence[MigAllocation],
        planned: Sequence[tuple[ContainerAllocation, tuple[MigAllocation, ...]]],
        indexes: Mapping[str, int],
    ) -> MigRealised:
        keys = [
            allocation_key(indexes[r.gpu_uuid], r.profile, r.placement)
            for _, reservations in planned
            for r in reservations
        ]
        if self._on_realised is not None:
            # Before anything exists: a reconciliation never sees the new instances unowned.
            self._on_realised(pod.uid, keys)
        if self._reconcile is not None:
            try:
                self._reconcile()
            except Exception as error:
                raise _failure(
                    f"{_RESOLVE}reconcile MIG allocations before allocation: {error}"
                ) from error
        claims = self._claims(pod.uid) if self._claims is not None else None
        created: list[str] = []
        containers: list[ContainerAllocation] = []
        try:
            for container, reservations in planned:
                uuids = []
                for reservation in reservations:
                    index = indexes[reservation.gpu_uuid]
                    result = self._manager.ensure(
                        index, reservation.profile, reservation.placement, claims=claims
                    )
                    if result.created:
                        created.append(result.mig_uuid)
                    uuids.append(result.mig_uuid)
                response_id = (
                    self._new_response_id()
                    if DeviceListStrategy.CDI_ANNOTATIONS in self._device_list.strategies
                    else ""
                )
                containers.append(mig_container(container, uuids, self._device_list, response_id))
            annotation = self._runtime_annotation(allocations)
        except MigError as error:
            self.rollback(created)
            raise _failure(f"{_RESOLVE}{error}") from error
        except AllocateFailure:
            self.rollback(created)
            raise
        return MigRealised(
            decision=replace(decision, containers=tuple(containers)),
            annotations={ANNOTATION_VGPU_MIG_ALLOCATIONS: annotation},
            created=tuple(created),
            keys=tuple(keys),
        )

    def _runtime_annotation(self, allocations: Sequence[MigAllocation]) -> str:
        """HAMi's `annotateMigRuntimeInfo` value: every allocation the manager has realised
        gets its runtime identity (server.go:385-403)."""
        updated = []
        realised = False
        for allocation in allocations:
            index = self._gpu_index_of(allocation.gpu_uuid)
            if index is None:
                raise _failure(f'{_RECORD}resolve MIG parent GPU "{allocation.gpu_uuid}"')
            info = self._manager.runtime_info(index, allocation.profile, allocation.placement)
            if info is None:
                updated.append(allocation)  # a later Allocate may own it
                continue
            updated.append(
                allocation.with_runtime(
                    info.mig_uuid, info.gpu_instance_id, info.compute_instance_id
                )
            )
            realised = True
        if not realised:
            raise _failure(f"{_RECORD}no realised MIG allocation found for pod")
        return encode_mig_allocations(updated)

    def rollback(self, created: Sequence[str]) -> None:
        """Destroy the instances an Allocate created, newest first; failures are logged."""
        for mig_uuid in reversed(created):
            try:
                self._manager.release(mig_uuid)
            except MigError as error:
                logger.error("failed to roll back partial MIG allocation %s: %s", mig_uuid, error)
