"""The dynamic MIG manager's decisions, pure: what to reuse, adopt, create or destroy, given
the scheduler's reservations and what NVML lists on a GPU.

HAMi v2.10's `MigInstanceManager` (pkg/device-plugin/nvidiadevice/nvinternal/plugin/
migmgr.go) keeps one map from the scheduler-reserved key (GPU index, profile, placement start
and size; migmgr.go:43-48) to the live GPU instance + compute instance realising it. The
choices it makes are here, so they are property-tested apart from NVML:

* `plan_ensure`: a key already tracked is reused (migmgr.go:338-343); an untracked instance NVML
  lists at exactly that profile and placement is adopted rather than created again only when it
  runs no process and no other live reservation claims it (our addition: HAMi never adopts here
  and fails on NVML's "in use", for good, after losing its map, e.g. a restart before the
  runtime identity reached the pod; an empty instance is as good as a new one). One that runs
  processes is a gone pod's and is never handed over: the Allocate fails, and the sweep
  destroys it once idle. Otherwise the placement must be one NVML offers for the profile
  (migmgr.go:366-379, "scheduler selected invalid placement ...") and is created.
* `plan_reconcile`: every tracked key outside the active set is destroyed, no active one ever
  (ReconcileActiveAllocations, migmgr.go:493-523).
* `plan_sweep`: the untracked instances no live reservation claims, which the start and every
  reconciliation round destroy when they run no process (our addition: HAMi leaves a gone
  pod's instance on a GPU another pod uses, mig_startup.go:48-68, and books over it).
* `verify_adoption`: an annotated runtime identity is adopted only when NVML shows a live
  instance with that GPU instance id, placement, MIG UUID and compute instance id
  (AdoptAllocation, migmgr.go:437-491).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hami_plugin.deviceplugin.mig.devices import MigDevice, MigProfileInfo
from hami_plugin.protocol.model import MigPlacement

__all__ = [
    "GI_PROFILE_IDS",
    "Adopt",
    "AllocationKey",
    "Claims",
    "Create",
    "EnsureStep",
    "Invalid",
    "MigInstance",
    "Reuse",
    "adoption_error",
    "allocation_key",
    "busy_instance_error",
    "claim_holds",
    "claimed_instance_error",
    "find_live_instance",
    "gi_profile_for",
    "instance_of",
    "plan_ensure",
    "plan_reconcile",
    "plan_sweep",
    "profile_slice_key",
    "verify_adoption",
]

GI_PROFILE_IDS: Mapping[str, int] = {
    "1g": 0,  # NVML_GPU_INSTANCE_PROFILE_1_SLICE
    "2g": 1,  # NVML_GPU_INSTANCE_PROFILE_2_SLICE
    "3g": 2,  # NVML_GPU_INSTANCE_PROFILE_3_SLICE
    "4g": 3,  # NVML_GPU_INSTANCE_PROFILE_4_SLICE
    "6g": 6,  # NVML_GPU_INSTANCE_PROFILE_6_SLICE
    "7g": 4,  # NVML_GPU_INSTANCE_PROFILE_7_SLICE
    "8g": 5,  # NVML_GPU_INSTANCE_PROFILE_8_SLICE
}
"""HAMi's `profileNameToGIProfileID` (migmgr.go:23-31): a profile is looked up by its slice
group (`1g` of `1g.10gb`), so `1g.20gb` names the same NVML profile as `1g.10gb`."""


@dataclass(frozen=True, slots=True, order=True)
class AllocationKey:
    """HAMi's `migAllocationKey` (migmgr.go:43-48): a scheduler reservation on this node."""

    gpu_index: int
    profile: str
    start: int
    size: int

    @property
    def placement(self) -> MigPlacement:
        return MigPlacement(start=self.start, size=self.size)


def allocation_key(gpu_index: int, profile: str, placement: MigPlacement) -> AllocationKey:
    """HAMi's `allocationKey` (migmgr.go:324-326)."""
    return AllocationKey(gpu_index, profile, placement.start, placement.size)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """HAMi's `migInstance` (migmgr.go:50-58): the live GI + CI realising a reservation."""

    profile: str
    placement: MigPlacement
    gpu_instance_id: int
    compute_instance_id: int
    mig_uuid: str


def profile_slice_key(profile: str) -> str:
    """HAMi's `profileSliceKey` (migmgr.go:109-114): `1g.10gb` -> `1g`."""
    head, dot, _ = profile.partition(".")
    return head if dot and head else profile


def gi_profile_for(profiles: Sequence[MigProfileInfo], profile: str) -> MigProfileInfo | None:
    """The NVML GPU instance profile HAMi uses for `profile`: the one with the NVML constant of
    its slice group (`GI_PROFILE_IDS`); None when the group is unknown or the GPU lacks it."""
    wanted = GI_PROFILE_IDS.get(profile_slice_key(profile))
    if wanted is None:
        return None
    return next((info for info in profiles if info.gi_profile_id == wanted), None)


def _same_profile(device: MigDevice, profile: str) -> bool:
    # NVML names a MIG device by its own profile (`1g.10gb`); HAMi keys by slice group.
    return device.profile == profile or profile_slice_key(device.profile) == profile_slice_key(
        profile
    )


def find_live_instance(
    devices: Iterable[MigDevice], profile: str, placement: MigPlacement
) -> MigDevice | None:
    """The MIG device NVML lists at exactly `placement` with `profile`'s slice group."""
    for device in devices:
        if device.placement == placement and _same_profile(device, profile):
            return device
    return None


def instance_of(device: MigDevice, profile: str) -> MigInstance:
    """The tracked record of the live MIG device `device`, realising `profile`."""
    return MigInstance(
        profile=profile,
        placement=device.placement,
        gpu_instance_id=device.gpu_instance_id,
        compute_instance_id=device.compute_instance_id,
        mig_uuid=device.uuid,
    )


@dataclass(frozen=True, slots=True)
class Reuse:
    """The key is tracked already: hand out its instance (created False)."""

    instance: MigInstance


@dataclass(frozen=True, slots=True)
class Adopt:
    """NVML lists an instance at exactly this profile and placement: track it, create none."""

    instance: MigInstance


@dataclass(frozen=True, slots=True)
class Create:
    """Create a GPU instance of `profile` at `placement`, then its compute instance."""

    profile: str
    placement: MigPlacement


@dataclass(frozen=True, slots=True)
class Invalid:
    """Nothing can be created: `message` is HAMi's error text."""

    message: str


EnsureStep = Reuse | Adopt | Create | Invalid


def _go_placement(placement: MigPlacement) -> str:
    # Go's %+v of nvml.GpuInstancePlacement.
    return f"{{Start:{placement.start} Size:{placement.size}}}"


Claims = Mapping[str, AllocationKey]
"""MIG UUID -> the key of the live reservation whose (unsigned) runtime identity names it."""


def claim_holds(claims: Claims | None, device: MigDevice) -> bool:
    """Whether a live reservation claims `device`: its runtime identity names the device's MIG
    UUID and its (signed) key is the device's GPU, placement and slice group. The identity is
    tenant input, so a claim of an instance at another placement counts for nothing."""
    key = None if claims is None else claims.get(device.uuid)
    return (
        key is not None
        and key.gpu_index == device.parent_index
        and key.placement == device.placement
        and _same_profile(device, key.profile)
    )


def busy_instance_error(gpu_index: int, mig_uuid: str, placement: MigPlacement) -> str:
    """Why an Allocate is refused the untracked instance at its placement: it runs processes."""
    return (
        f"MIG instance {mig_uuid} at placement {_go_placement(placement)} on GPU {gpu_index} "
        "still runs processes of a pod that is gone"
    )


def claimed_instance_error(gpu_index: int, mig_uuid: str, placement: MigPlacement) -> str:
    """Why an Allocate is refused the untracked instance at its placement: another live
    reservation (or another tracked key) holds it."""
    return (
        f"MIG instance {mig_uuid} at placement {_go_placement(placement)} on GPU {gpu_index} "
        "is claimed by another live reservation"
    )


def plan_ensure(
    tracked: Mapping[AllocationKey, MigInstance],
    key: AllocationKey,
    profiles: Sequence[MigProfileInfo],
    live: Sequence[MigDevice],
    *,
    busy: Collection[str] = (),
    claims: Claims | None = None,
) -> EnsureStep:
    """What `EnsureAllocation` (migmgr.go:332-418) does for `key` on a GPU offering `profiles`
    with the MIG devices `live`. It never picks another placement.

    `busy`: the MIG UUIDs NVML shows running processes on (or whose query failed); `claims`:
    those other live reservations name (`claim_holds`). The untracked instance at the placement
    is adopted only when it is neither busy, claimed nor held by another tracked key (module
    docstring)."""
    instance = tracked.get(key)
    if instance is not None:
        return Reuse(instance)
    if GI_PROFILE_IDS.get(profile_slice_key(key.profile)) is None:
        return Invalid(f'unsupported MIG profile "{key.profile}"')
    existing = find_live_instance(live, key.profile, key.placement)
    if existing is not None:
        held = {held.mig_uuid for held in tracked.values()}
        if existing.uuid in held or claim_holds(claims, existing):
            return Invalid(claimed_instance_error(key.gpu_index, existing.uuid, key.placement))
        if existing.uuid in busy:
            return Invalid(busy_instance_error(key.gpu_index, existing.uuid, key.placement))
        return Adopt(instance_of(existing, key.profile))
    info = gi_profile_for(profiles, key.profile)
    if info is None:
        return Invalid(f"get GI profile {key.profile}: Not Supported")
    if key.placement not in info.placements:
        return Invalid(
            f"scheduler selected invalid placement {_go_placement(key.placement)} "
            f"for profile {key.profile}"
        )
    return Create(key.profile, key.placement)


def plan_reconcile(
    tracked: Mapping[AllocationKey, MigInstance], active: Collection[AllocationKey]
) -> tuple[AllocationKey, ...]:
    """The tracked keys `ReconcileActiveAllocations` destroys: those not active, in key order."""
    return tuple(sorted(key for key in tracked if key not in active))


def plan_sweep(
    tracked: Mapping[AllocationKey, MigInstance],
    live: Iterable[MigDevice],
    claims: Claims | None,
) -> tuple[MigDevice, ...]:
    """The MIG devices of `live` that no tracked key holds and no live reservation claims
    (`claim_holds`), in NVML's order: left by a pod that is gone. The caller destroys each that
    runs no process."""
    held = {instance.mig_uuid for instance in tracked.values()}
    return tuple(d for d in live if d.uuid not in held and not claim_holds(claims, d))


def verify_adoption(
    live: Sequence[MigDevice],
    profile: str,
    mig_uuid: str,
    placement: MigPlacement,
    gpu_instance_id: int,
    compute_instance_id: int,
) -> MigInstance | None:
    """The instance an annotated runtime identity names, when NVML shows it live with that GPU
    instance id, placement, MIG UUID and compute instance id (migmgr.go:462-482); else None."""
    for device in live:
        if (
            device.placement == placement
            and device.gpu_instance_id == gpu_instance_id
            and device.uuid == mig_uuid
            and device.compute_instance_id == compute_instance_id
            and _same_profile(device, profile)
        ):
            return instance_of(device, profile)
    return None


def adoption_error(mig_uuid: str, profile: str, placement: MigPlacement) -> str:
    """HAMi's message for an annotated allocation NVML does not show (migmgr.go:490)."""
    return (
        f"annotated MIG allocation {mig_uuid} profile={profile} "
        f"placement={_go_placement(placement)} is not live"
    )
