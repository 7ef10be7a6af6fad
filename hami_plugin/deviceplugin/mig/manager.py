"""The dynamic MIG instance manager: the one authority over live GPU + compute instances on a
MIG-mode node (HAMi v2.10 `MigInstanceManager`, pkg/device-plugin/nvidiadevice/nvinternal/
plugin/migmgr.go).

Each scheduler reservation (`plan.AllocationKey`: GPU index, profile, placement) maps to the
instance realising it. Work on one GPU holds that GPU's lock (migmgr.go:98-107), the maps a
short lock of their own, so two GPUs are worked on at once and an NVML call never waits on
the maps. The decisions are `deviceplugin.mig.plan`'s; this module carries them out over the
`MigNvml` calls (`mig.nvml.NvmlMig`, or the fake NVML in tests). Every failure is a `MigError`
with HAMi's message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from hami_plugin.deviceplugin.mig.devices import MigDevice, MigNvml
from hami_plugin.deviceplugin.mig.plan import (
    GI_PROFILE_IDS,
    Adopt,
    AllocationKey,
    Claims,
    Create,
    Invalid,
    MigInstance,
    Reuse,
    adoption_error,
    allocation_key,
    busy_instance_error,
    claim_holds,
    claimed_instance_error,
    find_live_instance,
    instance_of,
    plan_ensure,
    plan_reconcile,
    plan_sweep,
    profile_slice_key,
    verify_adoption,
)
from hami_plugin.deviceplugin.nvml import NvmlError
from hami_plugin.protocol.model import MigPlacement

__all__ = ["EnsureResult", "MigError", "MigInstanceManager"]

logger = logging.getLogger(__name__)


class MigError(Exception):
    """A MIG operation failed; the message is HAMi's (with NVML's error text)."""


@dataclass(frozen=True, slots=True)
class EnsureResult:
    """What `ensure` handed out: the instance, and whether this call created it (only those
    are rolled back when the Allocate fails later, util.go:337-348)."""

    instance: MigInstance
    created: bool

    @property
    def mig_uuid(self) -> str:
        return self.instance.mig_uuid


class MigInstanceManager:
    """HAMi's `MigInstanceManager` over `nvml`. Thread-safe."""

    def __init__(self, nvml: MigNvml) -> None:
        self._nvml = nvml
        self._mu = threading.Lock()
        self._gpu_locks: dict[int, threading.Lock] = {}
        self._by_allocation: dict[AllocationKey, MigInstance] = {}
        self._by_mig_uuid: dict[str, AllocationKey] = {}
        self._left: set[str] = set()
        """What the sweep logged as left (MIG UUIDs, GPUs), so each is logged once."""

    # --- state ------------------------------------------------------------------------------

    def _gpu_lock(self, gpu_index: int) -> threading.Lock:
        with self._mu:
            lock = self._gpu_locks.get(gpu_index)
            if lock is None:
                lock = self._gpu_locks[gpu_index] = threading.Lock()
            return lock

    def _track(self, key: AllocationKey, instance: MigInstance) -> None:
        with self._mu:
            self._by_allocation[key] = instance
            self._by_mig_uuid[instance.mig_uuid] = key

    def _forget(self, key: AllocationKey) -> None:
        with self._mu:
            instance = self._by_allocation.pop(key, None)
            if instance is not None and self._by_mig_uuid.get(instance.mig_uuid) == key:
                del self._by_mig_uuid[instance.mig_uuid]

    def tracked(self) -> dict[AllocationKey, MigInstance]:
        """A snapshot of every tracked reservation and its instance."""
        with self._mu:
            return dict(self._by_allocation)

    # --- MIG mode ---------------------------------------------------------------------------

    def _ensure_mig_mode(self, gpu_index: int) -> None:
        """HAMi's `ensureMigModeEnabled` (migmgr.go:175-220); a no-op on a GPU without MIG."""
        try:
            mode = self._nvml.mig_mode(gpu_index)
        except NvmlError as error:
            raise MigError(str(error)) from error
        if not mode.supported:
            return
        if mode.current:
            if mode.pending:
                return
            raise MigError(
                f"gpu {gpu_index} mig mode disable is pending (current=enable pending=0)"
            )
        if mode.pending:
            raise MigError(f"gpu {gpu_index} mig mode enable is pending; GPU reset required")
        try:
            self._nvml.set_mig_mode(gpu_index, True)
        except NvmlError as error:
            raise MigError(str(error)) from error
        try:
            mode = self._nvml.mig_mode(gpu_index)
        except NvmlError as error:
            raise MigError(str(error)) from error
        if mode.current:
            return
        if mode.pending:
            raise MigError(
                f"gpu {gpu_index} mig mode enable is pending after set; GPU reset required"
            )
        raise MigError(
            f"gpu {gpu_index} mig mode is not enabled after set "
            f"(current={int(mode.current)} pending={int(mode.pending)})"
        )

    # --- operations -------------------------------------------------------------------------

    def _busy(self, gpu_index: int, device: MigDevice) -> bool:
        """Whether a process runs on `device`; a query that fails counts as busy (as HAMi's
        `deviceHasProcesses`, mig_startup.go:173-186), so nothing in doubt is handed out or
        destroyed."""
        try:
            return self._nvml.mig_device_has_processes(gpu_index, device.mig_index)
        except NvmlError as error:
            logger.warning(
                "MIG instance %s on gpu %d: process query failed, counted as busy: %s",
                device.uuid,
                gpu_index,
                error,
            )
            return True

    def _untracked_busy(
        self, gpu_index: int, live: Sequence[MigDevice], profile: str, placement: MigPlacement
    ) -> frozenset[str]:
        """The MIG UUID of the untracked instance at `placement` when it runs processes."""
        device = find_live_instance(live, profile, placement)
        if device is None:
            return frozenset()
        with self._mu:
            if device.uuid in self._by_mig_uuid:
                return frozenset()
        return frozenset({device.uuid}) if self._busy(gpu_index, device) else frozenset()

    def ensure(
        self,
        gpu_index: int,
        profile: str,
        placement: MigPlacement,
        *,
        claims: Claims | None = None,
    ) -> EnsureResult:
        """HAMi's `EnsureAllocation` (migmgr.go:332-418): realise exactly this reservation, or
        reuse the instance already realising it (tracked, or an untracked one NVML lists at
        that exact placement that runs no process and that no other live reservation claims,
        `claims`: `plan.plan_ensure`). Never another placement. Raises MigError."""
        key = allocation_key(gpu_index, profile, placement)
        with self._gpu_lock(gpu_index):
            with self._mu:
                known = self._by_allocation.get(key)
            if known is not None:
                return EnsureResult(known, created=False)
            self._ensure_mig_mode(gpu_index)
            try:
                profiles = self._nvml.profiles(gpu_index)
                live = self._nvml.mig_devices(gpu_index)
            except NvmlError as error:
                raise MigError(str(error)) from error
            busy = self._untracked_busy(gpu_index, live, profile, placement)
            step = plan_ensure(self.tracked(), key, profiles, live, busy=busy, claims=claims)
            if isinstance(step, Invalid):
                raise MigError(step.message)
            if isinstance(step, Reuse):
                return EnsureResult(step.instance, created=False)
            if isinstance(step, Adopt):
                self._track(key, step.instance)
                logger.info(
                    "adopted live MIG instance %s for gpu %d profile %s placement %d+%d",
                    step.instance.mig_uuid,
                    gpu_index,
                    profile,
                    placement.start,
                    placement.size,
                )
                return EnsureResult(step.instance, created=False)
            assert isinstance(step, Create)
            try:
                device = self._nvml.create_instance(gpu_index, step.profile, step.placement)
            except NvmlError as error:
                raise MigError(str(error)) from error
            instance = instance_of(device, profile)
            self._track(key, instance)
        logger.info(
            "created scheduler-reserved MIG allocation %s on gpu %d: profile %s start %d size %d "
            "gpuInstanceID %d computeInstanceID %d",
            instance.mig_uuid,
            gpu_index,
            profile,
            placement.start,
            placement.size,
            instance.gpu_instance_id,
            instance.compute_instance_id,
        )
        return EnsureResult(instance, created=True)

    def runtime_info(
        self, gpu_index: int, profile: str, placement: MigPlacement
    ) -> MigInstance | None:
        """HAMi's `AllocationRuntimeInfo` (migmgr.go:420-435)."""
        with self._mu:
            return self._by_allocation.get(allocation_key(gpu_index, profile, placement))

    def adopt(
        self,
        gpu_index: int,
        profile: str,
        mig_uuid: str,
        placement: MigPlacement,
        gpu_instance_id: int,
        compute_instance_id: int,
    ) -> MigInstance:
        """HAMi's `AdoptAllocation` (migmgr.go:437-491): track an annotated runtime identity
        only when NVML shows exactly that instance live. Raises MigError."""
        if GI_PROFILE_IDS.get(profile_slice_key(profile)) is None:
            raise MigError(f'unsupported MIG profile "{profile}"')
        with self._gpu_lock(gpu_index):
            try:
                live = self._nvml.mig_devices(gpu_index)
            except NvmlError as error:
                raise MigError(str(error)) from error
            instance = verify_adoption(
                live, profile, mig_uuid, placement, gpu_instance_id, compute_instance_id
            )
            if instance is None:
                raise MigError(adoption_error(mig_uuid, profile, placement))
            self._track(allocation_key(gpu_index, profile, placement), instance)
            return instance

    def adopt_live(
        self,
        gpu_index: int,
        profile: str,
        placement: MigPlacement,
        *,
        claims: Claims | None = None,
    ) -> MigInstance | None:
        """Track the instance NVML lists at exactly this profile and placement, if any (for
        a reservation whose runtime identity never reached the pod), under the rule of
        `ensure`: not one that runs processes (a gone pod's) or that another tracked key or
        another live reservation (`claims`) holds (raises MigError with the reason). Creates
        nothing; raises MigError when NVML cannot list."""
        key = allocation_key(gpu_index, profile, placement)
        with self._gpu_lock(gpu_index):
            try:
                live = self._nvml.mig_devices(gpu_index)
            except NvmlError as error:
                raise MigError(str(error)) from error
            device = find_live_instance(live, profile, placement)
            if device is None:
                return None
            with self._mu:
                held = device.uuid in self._by_mig_uuid
            if held or claim_holds(claims, device):
                raise MigError(claimed_instance_error(gpu_index, device.uuid, placement))
            if self._busy(gpu_index, device):
                raise MigError(busy_instance_error(gpu_index, device.uuid, placement))
            instance = instance_of(device, profile)
            self._track(key, instance)
            return instance

    def _destroy(self, key: AllocationKey, instance: MigInstance) -> None:
        try:
            self._nvml.destroy_instance(
                key.gpu_index, instance.gpu_instance_id, instance.compute_instance_id
            )
        except NvmlError as error:
            raise MigError(str(error)) from error
        self._forget(key)

    def release(self, mig_uuid: str) -> None:
        """HAMi's `Release` (migmgr.go:297-323): destroy the instance bound to `mig_uuid`;
        an unknown UUID is nothing to do. Raises MigError."""
        with self._mu:
            key = self._by_mig_uuid.get(mig_uuid)
        if key is None:
            logger.debug("release: unknown MIG UUID %s, skipping", mig_uuid)
            return
        with self._gpu_lock(key.gpu_index):
            with self._mu:
                instance = self._by_allocation.get(key)
            if instance is None:
                return
            self._destroy(key, instance)
        logger.info(
            "released MIG allocation %s on gpu %d: profile %s start %d",
            mig_uuid,
            key.gpu_index,
            key.profile,
            key.start,
        )

    def reconcile(self, active: Collection[AllocationKey]) -> tuple[AllocationKey, ...]:
        """HAMi's `ReconcileActiveAllocations` (migmgr.go:493-523): destroy every tracked
        instance whose reservation is not in `active`. Returns the keys released; raises
        MigError at the first destruction that fails (the rest wait for the next round)."""
        released: list[AllocationKey] = []
        for key in plan_reconcile(self.tracked(), active):
            with self._gpu_lock(key.gpu_index):
                with self._mu:
                    instance = self._by_allocation.get(key)
                if instance is None:
                    continue
                self._destroy(key, instance)
            logger.info(
                "released MIG allocation %s on gpu %d (profile %s start %d): its pod is gone",
                instance.mig_uuid,
                key.gpu_index,
                key.profile,
                key.start,
            )
            released.append(key)
        return tuple(released)

    def sweep(self, gpu_indexes: Iterable[int], claims: Claims) -> tuple[str, ...]:
        """Destroy each untracked instance on these GPUs that no live reservation claims
        (`claims`) and that runs no process (`plan.plan_sweep`): a pod's that is gone,
        left on a GPU that was not reset (our addition, module `plan`). One that runs
        processes, or whose destruction fails, is logged (once) and left for the next round.
        Returns the MIG UUIDs destroyed; never raises."""
        destroyed: list[str] = []
        for gpu_index in gpu_indexes:
            with self._gpu_lock(gpu_index):
                try:
                    live = self._nvml.mig_devices(gpu_index)
                except NvmlError as error:
                    self._tell_left(f"gpu {gpu_index}", f"cannot list MIG devices: {error}")
                    continue
                for device in plan_sweep(self.tracked(), live, claims):
                    if self._busy(gpu_index, device):
                        self._tell_left(
                            device.uuid,
                            f"left MIG instance {device.uuid} on gpu {gpu_index} "
                            f"(placement {device.placement.start}+{device.placement.size}): no "
                            "live reservation claims it, but it still runs processes",
                        )
                        continue
                    try:
                        self._nvml.destroy_instance(
                            gpu_index, device.gpu_instance_id, device.compute_instance_id
                        )
                    except NvmlError as error:
                        self._tell_left(
                            device.uuid,
                            f"failed to destroy unclaimed MIG instance {device.uuid} on gpu "
                            f"{gpu_index}: {error}",
                        )
                        continue
                    with self._mu:
                        self._left.discard(device.uuid)
                    logger.info(
                        "destroyed MIG instance %s on gpu %d (profile %s placement %d+%d): "
                        "no live reservation claims it and it runs no process",
                        device.uuid,
                        gpu_index,
                        device.profile,
                        device.placement.start,
                        device.placement.size,
                    )
                    destroyed.append(device.uuid)
        return tuple(destroyed)

    def _tell_left(self, what: str, message: str) -> None:
        """Log `message` once per `what` (the sweep runs every reconciliation round)."""
        with self._mu:
            if what in self._left:
                return
            self._left.add(what)
        logger.warning("%s", message)

    def reset_idle_gpus(self, device_count: int, in_use: Collection[int]) -> list[int]:
        """HAMi's `ResetIdleGPUs` (migmgr.go:119-159): every GPU not `in_use` gets MIG mode on
        and all its instances destroyed. Returns the GPUs reset; raises MigError at the first
        failure (the GPUs reset until then stay reset)."""
        reset: list[int] = []
        for gpu_index in range(device_count):
            if gpu_index in in_use:
                continue
            with self._gpu_lock(gpu_index):
                self._ensure_mig_mode(gpu_index)
                try:
                    self._nvml.destroy_all(gpu_index)
                except NvmlError as error:
                    raise MigError(str(error)) from error
                with self._mu:
                    for key in [k for k in self._by_allocation if k.gpu_index == gpu_index]:
                        instance = self._by_allocation.pop(key)
                        self._by_mig_uuid.pop(instance.mig_uuid, None)
            reset.append(gpu_index)
        return sorted(reset)
