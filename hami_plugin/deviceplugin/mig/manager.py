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
from collections.abc import Collection
from dataclasses import dataclass

from hami_plugin.deviceplugin.mig.devices import MigNvml
from hami_plugin.deviceplugin.mig.plan import (
    GI_PROFILE_IDS,
    Adopt,
    AllocationKey,
    Create,
    Invalid,
    MigInstance,
    Reuse,
    adoption_error,
    allocation_key,
    find_live_instance,
    plan_ensure,
    plan_reconcile,
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

    def ensure(self, gpu_index: int, profile: str, placement: MigPlacement) -> EnsureResult:
        """HAMi's `EnsureAllocation` (migmgr.go:332-418): realise exactly this reservation, or
        reuse the instance already realising it (tracked, or listed by NVML at that exact
        placement). Never another placement. Raises MigError."""
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
            step = plan_ensure(self.tracked(), key, profiles, live)
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
            instance = MigInstance(
                profile=profile,
                placement=placement,
                gpu_instance_id=device.gpu_instance_id,
                compute_instance_id=device.compute_instance_id,
                mig_uuid=device.uuid,
            )
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
        self, gpu_index: int, profile: str, placement: MigPlacement
    ) -> MigInstance | None:
        """Track the instance NVML lists at exactly this profile and placement, if any (for
        a reservation whose runtime identity never reached the pod). Creates nothing; raises
        MigError when NVML cannot list."""
        key = allocation_key(gpu_index, profile, placement)
        with self._gpu_lock(gpu_index):
            try:
                live = self._nvml.mig_devices(gpu_index)
            except NvmlError as error:
                raise MigError(str(error)) from error
            device = find_live_instance(live, profile, placement)
            if device is None:
                return None
            instance = MigInstance(
                profile=profile,
                placement=placement,
                gpu_instance_id=device.gpu_instance_id,
                compute_instance_id=device.compute_instance_id,
                mig_uuid=device.uuid,
            )
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
