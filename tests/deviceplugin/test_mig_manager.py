"""Dynamic MIG on the node: the manager's pure decisions (`mig.plan`), the register profiles
(`mig.profiles`), the manager over a stub NVML (`mig.manager`), the start-up reading of the
pods (`mig.startup`) and the Allocate step (`mig.allocate`), as HAMi v2.10's migmgr.go,
mig_startup.go, register.go and util.go do them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.deviceplugin.allocate import (
    AllocateConfig,
    AllocateFailure,
    FailureReason,
    decide_allocation,
)
from hami_plugin.deviceplugin.device_list import DeviceListConfig
from hami_plugin.deviceplugin.inventory import PhysicalGpu
from hami_plugin.deviceplugin.mig.allocate import MigAllocateStep, container_reservations
from hami_plugin.deviceplugin.mig.devices import MigDevice, MigModeState
from hami_plugin.deviceplugin.mig.dynamic import DynamicMig
from hami_plugin.deviceplugin.mig.manager import MigError, MigInstanceManager
from hami_plugin.deviceplugin.mig.plan import (
    Adopt,
    AllocationKey,
    Create,
    Invalid,
    MigInstance,
    Reuse,
    plan_ensure,
    plan_reconcile,
    verify_adoption,
)
from hami_plugin.deviceplugin.mig.profiles import (
    mig_device_count,
    mig_register_device,
    register_mig_profiles,
)
from hami_plugin.deviceplugin.mig.startup import (
    ReservationError,
    active_allocation_keys,
    live_reservations,
    start_dynamic_mig,
)
from hami_plugin.protocol import codec
from hami_plugin.protocol.mig import MigAllocation, decode_mig_allocations, encode_mig_allocations
from hami_plugin.protocol.mig_allowlist import AllowedMigProfiles, parse_mig_profile_allowlist
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
    MigPlacement,
    MigProfile,
)
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE, BookingKeys
from tests.bookings import keys_from, signed_fields
from tests.deviceplugin.mig_stub import A100_80GB, StubMigNvml, overlaps

NODE = "mig-node"
CARD = "NVIDIA A100-SXM4-80GB"
ALLOW = (AllowedMigProfiles(models=("A100",), profiles=("1g.10gb", "3g.40gb", "7g.80gb")),)
KEYS = keys_from(b"k" * 32)
P = MigPlacement


def key(start: int, size: int, profile: str = "1g.10gb", gpu: int = 0) -> AllocationKey:
    return AllocationKey(gpu, profile, start, size)


def live_device(start: int, size: int, gi: int, profile: str = "1g.10gb") -> MigDevice:
    return MigDevice(
        uuid=f"MIG-{gi}",
        parent_uuid="GPU-0",
        parent_index=0,
        mig_index=0,
        gpu_instance_id=gi,
        compute_instance_id=0,
        profile=profile,
        placement=P(start, size),
        memory_mib=9856,
    )


# --- pure decisions ---------------------------------------------------------------------------


def test_plan_ensure_reuses_adopts_creates_or_refuses_as_hami() -> None:
    tracked = {key(6, 1): MigInstance("1g.10gb", P(6, 1), 3, 0, "MIG-3")}
    assert plan_ensure(tracked, key(6, 1), A100_80GB, ()) == Reuse(tracked[key(6, 1)])
    live = (live_device(5, 1, gi=7),)
    # An idle untracked instance no one else claims is as good as a new one.
    assert plan_ensure({}, key(5, 1), A100_80GB, live, busy={"MIG-other"}) == Adopt(
        MigInstance("1g.10gb", P(5, 1), 7, 0, "MIG-7")
    )
    # One that runs processes is a gone pod's: never handed over.
    assert plan_ensure({}, key(5, 1), A100_80GB, live, busy={"MIG-7"}) == Invalid(
        "MIG instance MIG-7 at placement {Start:5 Size:1} on GPU 0 still runs processes of a "
        "pod that is gone"
    )
    # One another live reservation names at exactly this key, or another tracked key holds.
    claimed = Invalid(
        "MIG instance MIG-7 at placement {Start:5 Size:1} on GPU 0 is claimed by another live "
        "reservation"
    )
    assert plan_ensure({}, key(5, 1), A100_80GB, live, claims={"MIG-7": key(5, 1)}) == claimed
    other = {key(5, 1, "1g.20gb"): MigInstance("1g.20gb", P(5, 1), 7, 0, "MIG-7")}
    assert plan_ensure(other, key(5, 1), A100_80GB, live) == claimed
    # A claim naming the UUID at another placement or GPU (tenant-written) counts for nothing.
    for elsewhere in (key(4, 1), key(5, 1, gpu=1)):
        assert isinstance(
            plan_ensure({}, key(5, 1), A100_80GB, live, claims={"MIG-7": elsewhere}), Adopt
        )
    # A live instance of another size at that start is not this reservation.
    assert plan_ensure({}, key(4, 4, "3g.40gb"), A100_80GB, (live_device(4, 1, 2),)) == Create(
        "3g.40gb", P(4, 4)
    )
    assert plan_ensure({}, key(3, 1), A100_80GB, ()) == Create("1g.10gb", P(3, 1))
    assert plan_ensure({}, key(1, 4, "3g.40gb"), A100_80GB, ()) == Invalid(
        "scheduler selected invalid placement {Start:1 Size:4} for profile 3g.40gb"
    )
    assert plan_ensure({}, key(0, 1, "5g.50gb"), A100_80GB, ()) == Invalid(
        'unsupported MIG profile "5g.50gb"'
    )


def test_plan_reconcile_destroys_exactly_the_keys_not_active() -> None:
    tracked = {k: MigInstance(k.profile, k.placement, i, 0, f"MIG-{i}") for i, k in enumerate(
        (key(0, 1), key(1, 1), key(4, 4, "3g.40gb"))
    )}  # fmt: skip
    assert plan_reconcile(tracked, {key(1, 1)}) == (key(0, 1), key(4, 4, "3g.40gb"))
    assert plan_reconcile(tracked, set(tracked)) == ()


def test_verify_adoption_needs_every_runtime_field_to_match_nvml() -> None:
    live = (live_device(6, 1, gi=9),)
    assert verify_adoption(live, "1g.10gb", "MIG-9", P(6, 1), 9, 0) is not None
    assert verify_adoption(live, "1g.10gb", "MIG-9", P(6, 1), 8, 0) is None  # GI id
    assert verify_adoption(live, "1g.10gb", "MIG-8", P(6, 1), 9, 0) is None  # UUID
    assert verify_adoption(live, "1g.10gb", "MIG-9", P(5, 1), 9, 0) is None  # placement
    assert verify_adoption(live, "1g.10gb", "MIG-9", P(6, 1), 9, 1) is None  # CI id


_KEYS = st.sampled_from(
    [key(s, 1) for s in range(7)] + [key(s, 2, "2g.20gb") for s in (0, 2, 4)]
    + [key(0, 4, "3g.40gb"), key(4, 4, "3g.40gb")]
)  # fmt: skip


@given(st.dictionaries(_KEYS, st.integers(0, 50), max_size=8), st.sets(_KEYS, max_size=8))
def test_plan_reconcile_never_touches_an_active_key(
    ids: dict[AllocationKey, int], active: set[AllocationKey]
) -> None:
    tracked = {k: MigInstance(k.profile, k.placement, i, 0, f"MIG-{k}") for k, i in ids.items()}
    destroyed = set(plan_reconcile(tracked, active))
    assert destroyed.isdisjoint(active)
    assert destroyed == set(tracked) - active


def _non_overlapping(keys: Sequence[AllocationKey]) -> list[AllocationKey]:
    chosen: list[AllocationKey] = []
    for candidate in keys:
        if all(not overlaps(candidate.placement, k.placement) for k in chosen):
            chosen.append(candidate)
    return chosen


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_KEYS, max_size=6), min_size=1, max_size=6))
def test_any_sequence_of_desired_sets_converges_without_destroying_a_needed_instance(
    rounds: list[list[AllocationKey]],
) -> None:
    """As the daemon runs: each round reconciles against the desired set, then ensures each
    desired reservation. After every round exactly the desired ones are tracked and live, and no
    instance a desired reservation already had was destroyed or re-created."""
    nvml = StubMigNvml()
    manager = MigInstanceManager(nvml)
    for wanted in rounds:
        desired = _non_overlapping(wanted)
        before = {k: i.mig_uuid for k, i in manager.tracked().items() if k in desired}
        destroyed_before = len(nvml.destroyed)
        manager.reconcile(set(desired))
        for k in desired:
            manager.ensure(k.gpu_index, k.profile, k.placement)
        gone = {placement for _, placement in nvml.destroyed[destroyed_before:]}
        assert gone.isdisjoint({k.placement for k in before})
        tracked = manager.tracked()
        assert set(tracked) == set(desired)
        assert {k: tracked[k].mig_uuid for k in before} == before
        live = {d.placement for d in nvml.mig_devices(0)}
        assert live == {k.placement for k in desired}


# --- register profiles ------------------------------------------------------------------------


def test_register_profiles_follow_the_first_matching_allowlist_entry() -> None:
    allow = (
        AllowedMigProfiles(models=("H100",), profiles=("1g.10gb",)),
        AllowedMigProfiles(models=("A100",), profiles=("3g.40gb", "1g.10gb", "9g.90gb")),
        AllowedMigProfiles(models=("A100-SXM4",), profiles=("7g.80gb",)),
    )
    profiles = register_mig_profiles(CARD, A100_80GB, allow)
    # 9g has no NVML profile: skipped; cores are SMs over the largest profile's, rounded up.
    assert profiles == (
        MigProfile("3g.40gb", 40192, 43, 3, (P(0, 4), P(4, 4))),
        MigProfile("1g.10gb", 9856, 15, 1, tuple(P(s, 1) for s in range(7))),
    )
    assert mig_device_count(CARD, A100_80GB, allow) == 7
    assert register_mig_profiles("NVIDIA H200", A100_80GB, allow[1:]) == ()


def test_a_mig_gpu_registers_mode_mig_unscaled_or_not_at_all() -> None:
    device = mig_register_device(
        uuid="GPU-1", index=2, card_type=CARD, memory_mib=81920, numa_node=1, healthy=True,
        profiles=A100_80GB, allowlist=ALLOW,
    )  # fmt: skip
    assert device is not None
    encoded = codec.encode_node_devices([device])
    assert encoded.startswith(
        '[{"id":"GPU-1","index":2,"count":7,"devmem":81920,"devcore":100,'
        '"type":"NVIDIA A100-SXM4-80GB","numa":1,"mode":"mig","migProfiles":[{"name":"1g.10gb",'
        '"memoryMB":9856,"core":15,"sliceCount":1,"placements":[{"start":0,"size":1},'
    )
    assert codec.decode_node_devices(encoded)[0].mig_profiles == device.mig_profiles
    assert mig_register_device(
        uuid="GPU-1", index=2, card_type="NVIDIA L4", memory_mib=1, numa_node=0, healthy=True,
        profiles=A100_80GB, allowlist=ALLOW,
    ) is None  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([{"models": ["A100"]}], "MIG profile allowlist must define models and profiles"),
        ([{"models": ["A100"], "profiles": ["10gb"]}], 'invalid MIG profile "10gb"'),
        ([{"models": ["A100"], "profiles": ["g.10gb"]}], 'invalid MIG profile "g.10gb"'),
        ({"models": ["A100"]}, "migProfileAllowlist must be a list"),
    ],
)
def test_the_allowlist_is_validated_at_load_with_hamis_messages(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mig_profile_allowlist(raw)


def test_the_allowlist_reads_hamis_yaml_shape() -> None:
    assert parse_mig_profile_allowlist([{"Models": ["A100"], "profiles": ["1g.10gb"]}]) == (
        AllowedMigProfiles(("A100",), ("1g.10gb",)),
    )


# --- the manager over a stub NVML -------------------------------------------------------------


def test_ensure_creates_once_and_a_new_manager_adopts_instead_of_creating() -> None:
    nvml = StubMigNvml()
    first = MigInstanceManager(nvml)
    made = first.ensure(0, "1g.10gb", P(6, 1))
    assert made.created and nvml.created == [(0, P(6, 1))]
    again = first.ensure(0, "1g.10gb", P(6, 1))
    assert (again.created, again.mig_uuid) == (False, made.mig_uuid)
    # The daemon restarted (its map is empty) with the instance idle: a half-finished
    # Allocate of the same pod, adopted rather than failing on NVML's "in use".
    restarted = MigInstanceManager(nvml)
    adopted = restarted.ensure(0, "1g.10gb", P(6, 1))
    assert (adopted.created, adopted.mig_uuid) == (False, made.mig_uuid)
    assert nvml.created == [(0, P(6, 1))]
    assert restarted.runtime_info(0, "1g.10gb", P(6, 1)) == made.instance


def test_a_new_manager_never_hands_over_an_instance_that_runs_processes() -> None:
    nvml = StubMigNvml()
    gone = MigInstanceManager(nvml).ensure(0, "1g.10gb", P(6, 1))
    nvml.running.add(gone.mig_uuid)  # the gone pod's process still runs in it
    restarted = MigInstanceManager(nvml)
    message = (
        f"MIG instance {gone.mig_uuid} at placement {{Start:6 Size:1}} on GPU 0 still runs "
        "processes of a pod that is gone"
    )
    with pytest.raises(MigError) as caught:
        restarted.ensure(0, "1g.10gb", P(6, 1))
    assert str(caught.value) == message
    assert restarted.tracked() == {} and nvml.created == [(0, P(6, 1))]
    # Nor does a claim by another live reservation let it through, nor adopt_live.
    with pytest.raises(MigError, match="is claimed by another live reservation"):
        restarted.ensure(0, "1g.10gb", P(6, 1), claims={gone.mig_uuid: key(6, 1)})
    with pytest.raises(MigError, match="still runs processes of a pod that is gone"):
        restarted.adopt_live(0, "1g.10gb", P(6, 1))
    # The sweep leaves it while it runs, destroys it once idle; then a fresh one is created.
    assert restarted.sweep([0], {}) == ()
    nvml.running.clear()
    assert restarted.sweep([0], {}) == (gone.mig_uuid,)
    fresh = restarted.ensure(0, "1g.10gb", P(6, 1))
    assert fresh.created and fresh.mig_uuid != gone.mig_uuid


def test_the_sweep_keeps_what_is_tracked_or_claimed_at_its_own_placement() -> None:
    nvml = StubMigNvml(count=2)
    earlier = MigInstanceManager(nvml)
    kept = earlier.ensure(0, "1g.10gb", P(6, 1)).instance
    claimed = earlier.ensure(0, "1g.10gb", P(5, 1)).instance
    misclaimed = earlier.ensure(0, "1g.10gb", P(4, 1)).instance
    other_gpu = earlier.ensure(1, "1g.10gb", P(0, 1)).instance
    manager = MigInstanceManager(nvml)
    manager.adopt(0, "1g.10gb", kept.mig_uuid, P(6, 1), kept.gpu_instance_id, 0)
    claims = {claimed.mig_uuid: key(5, 1), misclaimed.mig_uuid: key(3, 1)}
    assert manager.sweep([0], claims) == (misclaimed.mig_uuid,)
    assert [d.uuid for d in nvml.mig_devices(0)] == [kept.mig_uuid, claimed.mig_uuid]
    assert [d.uuid for d in nvml.mig_devices(1)] == [other_gpu.mig_uuid]  # not swept
    # A process query that fails counts as busy: nothing in doubt is destroyed.
    original = nvml.mig_device_has_processes

    def failing(gpu: int, mig: int) -> bool:
        from hami_plugin.deviceplugin.nvml import NvmlError

        raise NvmlError("get MIG device 0 of gpu 1: Unknown Error")

    nvml.mig_device_has_processes = failing  # type: ignore[method-assign,assignment]
    assert manager.sweep([1], {}) == ()
    nvml.mig_device_has_processes = original  # type: ignore[method-assign]
    assert manager.sweep([1], {}) == (other_gpu.mig_uuid,)


def test_ensure_failures_carry_hamis_messages() -> None:
    nvml = StubMigNvml()
    manager = MigInstanceManager(nvml)
    with pytest.raises(MigError, match=r"scheduler selected invalid placement \{Start:2 Size:4\}"):
        manager.ensure(0, "3g.40gb", P(2, 4))
    manager.ensure(0, "1g.10gb", P(4, 1))
    with pytest.raises(
        MigError,
        match=r"^create GI profile=3g.40gb placement=\{Start:4 Size:4\}: Insufficient Resources$",
    ):
        manager.ensure(0, "3g.40gb", P(4, 4))
    nvml.gpus[0].mig_current = False
    with pytest.raises(MigError, match="gpu 0 mig mode enable is pending; GPU reset required"):
        manager.ensure(0, "1g.10gb", P(0, 1))
    nvml.gpus[0].mig_current, nvml.gpus[0].mig_pending = True, False
    with pytest.raises(MigError, match=r"gpu 0 mig mode disable is pending"):
        manager.ensure(0, "1g.10gb", P(0, 1))


def test_ensure_turns_mig_mode_on_for_a_gpu_without_it() -> None:
    nvml = StubMigNvml()
    nvml.gpus[0].mig_current = nvml.gpus[0].mig_pending = False
    MigInstanceManager(nvml).ensure(0, "1g.10gb", P(0, 1))
    assert nvml.set_mode_calls == 1 and nvml.mig_mode(0) == MigModeState(True, True)


def test_release_and_reconcile_destroy_only_what_they_should() -> None:
    nvml = StubMigNvml()
    manager = MigInstanceManager(nvml)
    a = manager.ensure(0, "1g.10gb", P(6, 1))
    manager.ensure(0, "1g.10gb", P(5, 1))
    manager.release("MIG-unknown")  # nothing
    assert nvml.destroyed == []
    manager.release(a.mig_uuid)
    assert nvml.destroyed == [(0, P(6, 1))]
    manager.ensure(0, "3g.40gb", P(0, 4))
    assert manager.reconcile({key(0, 4, "3g.40gb")}) == (key(5, 1),)
    assert [d.placement for d in nvml.mig_devices(0)] == [P(0, 4)]


def test_reset_idle_gpus_skips_the_busy_and_forgets_what_it_destroyed() -> None:
    nvml = StubMigNvml(count=3)
    manager = MigInstanceManager(nvml)
    for gpu in range(3):
        manager.ensure(gpu, "1g.10gb", P(0, 1))
    nvml.gpus[2].mig_current = nvml.gpus[2].mig_pending = False  # a GPU not yet in MIG mode
    nvml.gpus[2].devices.clear()
    assert manager.reset_idle_gpus(3, {1}) == [0, 2]
    assert [len(nvml.mig_devices(g)) for g in range(3)] == [0, 1, 0]
    assert nvml.mig_mode(2).current
    assert set(manager.tracked()) == {key(0, 1, gpu=1)}


def test_adopt_tracks_only_what_nvml_shows() -> None:
    nvml = StubMigNvml()
    live = MigInstanceManager(nvml).ensure(0, "1g.10gb", P(6, 1)).instance
    manager = MigInstanceManager(nvml)
    with pytest.raises(
        MigError,
        match=r"annotated MIG allocation MIG-forged profile=1g.10gb placement=\{Start:6 Size:1\} "
        "is not live",
    ):
        manager.adopt(0, "1g.10gb", "MIG-forged", P(6, 1), live.gpu_instance_id, 0)
    assert manager.tracked() == {}
    manager.adopt(0, "1g.10gb", live.mig_uuid, P(6, 1), live.gpu_instance_id, 0)
    assert manager.tracked() == {key(6, 1): live}


# --- the pods: signed reservations ------------------------------------------------------------


def mig_pod(
    name: str,
    allocations: Sequence[MigAllocation],
    *,
    keys: BookingKeys | None = KEYS,
    containers: Sequence[str] = ("main",),
    devices: Sequence[Sequence[str]] = (),
    phase: str = "Pending",
    deleting: bool = False,
    node: str = NODE,
) -> PodInfo:
    booked = codec.encode_pod_devices(
        tuple(tuple(ContainerDevice(u, "NVIDIA", 9856, 100) for u in entry) for entry in devices)
    )
    annotations = {
        ANNOTATION_VGPU_NODE: node,
        ANNOTATION_DEVICES_ALLOCATED: booked,
        ANNOTATION_DEVICES_TO_ALLOCATE: booked,
        ANNOTATION_BIND_TIME: "100",
        ANNOTATION_VGPU_MIG_ALLOCATIONS: encode_mig_allocations(allocations),
    }
    uid = f"uid-{name}"
    if keys is not None:
        annotations[ANNOTATION_BOOKING_SIGNATURE] = keys.sign(
            signed_fields(uid, annotations)  # type: ignore[arg-type]
        )
    return PodInfo(
        namespace="default", name=name, uid=uid, annotations=annotations,
        containers=tuple(ContainerSpec(name=c) for c in containers), phase=phase,
        deleting=deleting, node_name=NODE,
    )  # fmt: skip


GPU0 = StubMigNvml().gpus[0].uuid


def alloc(start: int, size: int = 1, profile: str = "1g.10gb", container: int = 0, device: int = 0,
          gpu: str = GPU0) -> MigAllocation:  # fmt: skip
    return MigAllocation(container, device, gpu, profile, P(start, size))


def index_of(uuid: str) -> int | None:
    return 0 if uuid == GPU0 else None


def test_only_signed_reservations_of_live_pods_count() -> None:
    pods = [
        mig_pod("signed", [alloc(6)]),
        mig_pod("forged", [alloc(5)], keys=keys_from(b"x" * 32)),
        mig_pod("unsigned", [alloc(4)], keys=None),
        mig_pod("elsewhere", [alloc(3)], node="other-node"),
        mig_pod("done", [alloc(2)], phase="Succeeded"),
        mig_pod("leaving", [alloc(1)], deleting=True),
    ]
    live = live_reservations(pods, NODE, KEYS)
    assert [pod.name for pod, _ in live.pods] == ["signed"]
    assert live.unsigned == ("default/forged", "default/unsigned", "default/elsewhere")
    assert active_allocation_keys(live, index_of) == {key(6, 1)}
    # Without keys every live annotation is trusted, as HAMi trusts it.
    trusted = live_reservations(pods, NODE, None)
    assert [pod.name for pod, _ in trusted.pods] == ["signed", "forged", "unsigned", "elsewhere"]


def test_an_unreadable_or_foreign_reservation_makes_reconciliation_fail_closed() -> None:
    bad = mig_pod("bad", [alloc(6)], keys=None)
    incomplete = '[{"containerIndex":0}]'
    bad = replace(bad, annotations={**bad.annotations, ANNOTATION_VGPU_MIG_ALLOCATIONS: incomplete})
    live = live_reservations([bad], NODE, None)
    with pytest.raises(ReservationError, match="MIG allocation 0 is incomplete"):
        active_allocation_keys(live, index_of)
    other = live_reservations([mig_pod("x", [alloc(6, gpu="GPU-elsewhere")])], NODE, KEYS)
    with pytest.raises(ReservationError, match='resolve active MIG parent GPU "GPU-elsewhere"'):
        active_allocation_keys(other, index_of)


def test_startup_resets_idle_gpus_and_adopts_signed_reservations_only() -> None:
    nvml = StubMigNvml(count=2)
    earlier = MigInstanceManager(nvml)
    signed = earlier.ensure(0, "1g.10gb", P(6, 1)).instance
    forged = earlier.ensure(0, "1g.10gb", P(5, 1)).instance
    unrecorded = earlier.ensure(0, "1g.10gb", P(4, 1)).instance
    earlier.ensure(1, "1g.10gb", P(0, 1))  # GPU 1: no live reservation, so it is reset
    runtime = alloc(6).with_runtime(signed.mig_uuid, signed.gpu_instance_id, 0)
    pods = [
        mig_pod("signed", [runtime]),
        mig_pod("no-runtime", [alloc(4)]),
        mig_pod(
            "forged", [alloc(5).with_runtime(forged.mig_uuid, forged.gpu_instance_id, 0)], keys=None
        ),
    ]
    manager = MigInstanceManager(nvml)
    reset, in_use = start_dynamic_mig(
        manager, nvml, 2, lambda: pods, NODE, KEYS,
        lambda u: {GPU0: 0, nvml.gpus[1].uuid: 1}.get(u),
    )  # fmt: skip
    assert (reset, in_use) == ([1], frozenset({0}))
    assert nvml.mig_devices(1) == ()
    assert manager.tracked() == {key(6, 1): signed, key(4, 1): unrecorded}
    # The forged pod's instance is never tracked (so never handed out): no signed reservation
    # claims it and it runs no process, so the start destroys it though GPU 0 is in use.
    assert [d.uuid for d in nvml.mig_devices(0)] == [signed.mig_uuid, unrecorded.mig_uuid]
    assert forged.mig_uuid not in [d.uuid for d in nvml.mig_devices(0)]


def test_startup_destroys_a_gone_pods_idle_instance_on_a_gpu_in_use_and_leaves_a_busy_one() -> None:
    nvml = StubMigNvml()
    earlier = MigInstanceManager(nvml)
    live = earlier.ensure(0, "1g.10gb", P(6, 1)).instance
    idle = earlier.ensure(0, "1g.10gb", P(5, 1)).instance
    busy = earlier.ensure(0, "1g.10gb", P(4, 1)).instance
    nvml.running.update({live.mig_uuid, busy.mig_uuid})
    # Only the pod at slice 6 is still there; the pods at 5 and 4 were deleted meanwhile.
    pods = [mig_pod("live", [alloc(6).with_runtime(live.mig_uuid, live.gpu_instance_id, 0)])]
    manager = MigInstanceManager(nvml)
    reset, in_use = start_dynamic_mig(manager, nvml, 1, lambda: pods, NODE, KEYS, index_of)
    assert (reset, in_use) == ([], frozenset({0}))
    assert [d.uuid for d in nvml.mig_devices(0)] == [live.mig_uuid, busy.mig_uuid]
    assert idle.mig_uuid not in [d.uuid for d in nvml.mig_devices(0)]
    assert list(manager.tracked()) == [key(6, 1)]
    # A new pod booked onto the busy slice is not given it (a no-runtime reservation claims
    # nothing), and the reconciler's sweep destroys it once its processes end.
    with pytest.raises(MigError, match="still runs processes of a pod that is gone"):
        manager.ensure(0, "1g.10gb", P(4, 1))
    nvml.running.discard(busy.mig_uuid)
    assert manager.sweep([0], {}) == (busy.mig_uuid,)


def test_startup_sweeps_nothing_when_a_reservation_cannot_be_read() -> None:
    nvml = StubMigNvml()
    MigInstanceManager(nvml).ensure(0, "1g.10gb", P(5, 1))
    held = mig_pod("held", [alloc(6)])
    bad = replace(held, annotations={**held.annotations, ANNOTATION_VGPU_MIG_ALLOCATIONS: "[{"})
    nvml.gpus[0].busy = True  # so the GPU is not reset
    start_dynamic_mig(MigInstanceManager(nvml), nvml, 1, lambda: [bad], NODE, None, index_of)
    assert len(nvml.mig_devices(0)) == 1


def test_startup_keeps_every_gpu_when_the_pods_cannot_be_listed() -> None:
    nvml = StubMigNvml(count=2)
    MigInstanceManager(nvml).ensure(1, "1g.10gb", P(0, 1))

    def fail() -> list[PodInfo]:
        raise OSError("connection refused")

    reset, in_use = start_dynamic_mig(MigInstanceManager(nvml), nvml, 2, fail, NODE, KEYS, index_of)
    assert (reset, in_use) == ([], frozenset({0, 1}))
    assert len(nvml.mig_devices(1)) == 1


def test_startup_keeps_a_gpu_nvml_shows_processes_on() -> None:
    nvml = StubMigNvml(count=2)
    busy = MigInstanceManager(nvml).ensure(1, "1g.10gb", P(0, 1))
    nvml.running.add(busy.mig_uuid)  # a process no pod accounts for
    reset, _ = start_dynamic_mig(MigInstanceManager(nvml), nvml, 2, list, NODE, KEYS, index_of)
    assert reset == [0] and len(nvml.mig_devices(1)) == 1


# --- the Allocate step ------------------------------------------------------------------------


def test_container_reservations_are_checked_against_the_booking_as_hami() -> None:
    devices = (ContainerDevice(GPU0, "NVIDIA", 9856, 100),)
    two = [alloc(6, device=1), alloc(5, device=0)]
    with pytest.raises(AllocateFailure, match=(
        r"^resolve allocated NVIDIA devices: container main has 2 MIG reservations, "
        r"requested 1 devices$"
    )):  # fmt: skip
        container_reservations(two, 0, "main", devices)
    with pytest.raises(AllocateFailure, match=(
        f"MIG reservation GPU GPU-other does not match allocated GPU {GPU0}"
    )):  # fmt: skip
        container_reservations([alloc(6, gpu="GPU-other")], 0, "main", devices)
    both = (devices[0], devices[0])
    assert [a.device_index for a in container_reservations(two, 0, "main", both)] == [0, 1]


def _decision(pod: PodInfo):  # type: ignore[no-untyped-def]
    return decide_allocation(
        pod, [[f"{GPU0}-0"] * 1], AllocateConfig(mig_mode=True), lambda: "cache-id"
    )


def test_the_step_creates_the_instances_and_answers_mig_uuids_without_hami_core() -> None:
    nvml = StubMigNvml()
    manager = MigInstanceManager(nvml)
    step = MigAllocateStep(manager, index_of, DeviceListConfig())
    pod = mig_pod("p", [alloc(6)], devices=[[GPU0]])
    realised = step.realise(pod, _decision(pod))
    (container,) = realised.decision.containers
    (instance,) = manager.tracked().values()
    assert container.envs == {"NVIDIA_VISIBLE_DEVICES": instance.mig_uuid}
    assert (container.mounts, container.host_dir) == ((), "")
    assert realised.created == (instance.mig_uuid,)
    (recorded,) = decode_mig_allocations(realised.annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS])
    assert recorded == alloc(6).with_runtime(instance.mig_uuid, instance.gpu_instance_id, 0)
    assert recorded.scheduler_part() == alloc(6)


def test_a_failed_instance_rolls_back_what_the_call_created() -> None:
    nvml = StubMigNvml()
    manager = MigInstanceManager(nvml)
    step = MigAllocateStep(manager, index_of, DeviceListConfig())
    both = [alloc(6, device=0), alloc(5, device=1)]
    pod = mig_pod("p", both, devices=[[GPU0, GPU0]])
    decision = decide_allocation(
        pod, [[f"{GPU0}-0", f"{GPU0}-1"]], AllocateConfig(mig_mode=True), lambda: "c"
    )
    original = nvml.create_instance
    calls = []

    def second_fails(gpu: int, profile: str, placement: MigPlacement) -> MigDevice:
        calls.append(placement)
        if len(calls) == 2:
            from hami_plugin.deviceplugin.nvml import NvmlError

            raise NvmlError(
                "create GI profile=1g.10gb placement={Start:5 Size:1}: Insufficient Resources"
            )
        return original(gpu, profile, placement)

    nvml.create_instance = second_fails  # type: ignore[method-assign,assignment]
    with pytest.raises(AllocateFailure) as caught:
        step.realise(pod, decision)
    assert caught.value.reason is FailureReason.MIG_ALLOCATION_FAILED
    assert str(caught.value) == (
        "resolve allocated NVIDIA devices: create GI profile=1g.10gb placement="
        "{Start:5 Size:1}: Insufficient Resources"
    )
    assert nvml.mig_devices(0) == () and manager.tracked() == {}
    assert nvml.destroyed == [(0, P(6, 1))]


def test_a_container_without_reservations_is_refused_before_nvml_is_touched() -> None:
    nvml = StubMigNvml()
    step = MigAllocateStep(MigInstanceManager(nvml), index_of, DeviceListConfig())
    pod = mig_pod("p", [alloc(6, container=1)], devices=[[GPU0]], containers=("a", "b"))
    with pytest.raises(AllocateFailure, match="container a has 0 MIG reservations, requested 1"):
        step.realise(pod, _decision(pod))
    assert nvml.created == []


# --- the node service: reconciliation against a lagging watch ---------------------------------


class Listing:
    """`list_pods_on_node` answering whatever the test sets."""

    def __init__(self) -> None:
        self.pods: list[PodInfo] = []

    def list_pods_on_node(self, node_name: str) -> list[PodInfo]:
        assert node_name == NODE
        return list(self.pods)


def test_an_instance_is_kept_until_a_listing_has_shown_its_pod_then_released_with_it() -> None:
    nvml = StubMigNvml()
    listing = Listing()
    gpu = PhysicalGpu(GPU0, 0, CARD, 81920, -1, True, "0000:10:00.0", 0)
    mig = DynamicMig(
        nvml, node_name=NODE, kube=listing, gpus=lambda: [gpu], device_list=DeviceListConfig(),
        keys=lambda: KEYS,
    )  # fmt: skip
    pod = mig_pod("p", [alloc(6)], devices=[[GPU0]])
    mig.step.realise(pod, _decision(pod))  # served from an API listing the watch lags behind
    assert mig.reconcile() == () and len(nvml.mig_devices(0)) == 1
    listing.pods = [pod]
    assert mig.reconcile() == () and len(nvml.mig_devices(0)) == 1
    (row,) = mig.device_info()
    assert (row.pod, row.container, row.profile) == ("p", "main", "1g.10gb")
    assert row.mig_uuid == nvml.mig_devices(0)[0].uuid
    listing.pods = [replace(pod, phase="Succeeded")]
    assert mig.reconcile() == (key(6, 1),) and nvml.mig_devices(0) == ()
    assert mig.device_info() == []


def test_an_unsigned_pods_garbage_does_not_stop_cleanup_but_without_keys_it_fails_closed() -> None:
    nvml = StubMigNvml()
    listing = Listing()
    gpu = PhysicalGpu(GPU0, 0, CARD, 81920, -1, True, "0000:10:00.0", 0)
    mig = DynamicMig(
        nvml, node_name=NODE, kube=listing, gpus=lambda: [gpu], device_list=DeviceListConfig(),
        keys=lambda: KEYS,
    )  # fmt: skip
    pod = mig_pod("p", [alloc(6)], devices=[[GPU0]])
    mig.step.realise(pod, _decision(pod))
    tenant = mig_pod("q", [alloc(5)], keys=None)
    garbage = replace(
        tenant, annotations={**tenant.annotations, ANNOTATION_VGPU_MIG_ALLOCATIONS: "[{"}
    )
    listing.pods = [pod, garbage]  # an unsigned pod's annotation that does not decode
    assert mig.reconcile() == () and len(nvml.mig_devices(0)) == 1
    listing.pods = [garbage]  # the signed pod is gone: its instance goes all the same
    assert mig.reconcile() == (key(6, 1),) and nvml.mig_devices(0) == ()
    # Without keys every annotation is trusted, so one that does not decode stops the round.
    trusting = DynamicMig(
        nvml, node_name=NODE, kube=listing, gpus=lambda: [gpu], device_list=DeviceListConfig(),
    )  # fmt: skip
    trusting.manager.ensure(0, "1g.10gb", P(6, 1))
    with pytest.raises(
        ReservationError,
        match=r"^decode MIG allocations for pod default/q: unexpected end of JSON input$",
    ):
        trusting.reconcile()
    assert len(nvml.mig_devices(0)) == 1


@pytest.mark.parametrize(("models", "reset"), [(("A100",), True), (("H100",), False)])
def test_the_start_resets_only_when_the_allowlist_names_every_gpu(
    models: tuple[str, ...], reset: bool
) -> None:
    """HAMi server.go:276-290: a GPU whose model no allowlist entry names skips the start."""
    nvml = StubMigNvml()
    MigInstanceManager(nvml).ensure(0, "1g.10gb", P(6, 1))  # left from an earlier daemon
    gpu = PhysicalGpu(GPU0, 0, CARD, 81920, -1, True, "0000:10:00.0", 0)
    mig = DynamicMig(
        nvml, node_name=NODE, kube=Listing(), gpus=lambda: [gpu], device_list=DeviceListConfig(),
        keys=lambda: KEYS, allowlist=(AllowedMigProfiles(models, ("1g.10gb",)),),
    )  # fmt: skip
    stop = threading.Event()
    stop.set()
    mig.start(stop)
    assert (nvml.mig_devices(0) == ()) is reset
    # Without the start nothing on the node is known to be ours: the rounds sweep nothing.
    mig.reconcile()
    assert (nvml.mig_devices(0) == ()) is reset


def test_allocate_never_adopts_an_instance_another_live_pod_holds_but_its_own_pod_may() -> None:
    nvml = StubMigNvml()
    earlier = MigInstanceManager(nvml).ensure(0, "1g.10gb", P(6, 1)).instance
    listing = Listing()
    gpu = PhysicalGpu(GPU0, 0, CARD, 81920, -1, True, "0000:10:00.0", 0)
    mig = DynamicMig(
        nvml, node_name=NODE, kube=listing, gpus=lambda: [gpu], device_list=DeviceListConfig(),
        keys=lambda: KEYS,
    )  # fmt: skip
    holder = mig_pod(
        "holder",
        [alloc(6).with_runtime(earlier.mig_uuid, earlier.gpu_instance_id, 0)],
        devices=[[GPU0]],
    )
    intruder = mig_pod("intruder", [alloc(6)], devices=[[GPU0]])  # booked onto the same slice
    listing.pods = [holder, intruder]
    with pytest.raises(AllocateFailure) as caught:
        mig.step.realise(intruder, _decision(intruder))
    assert str(caught.value) == (
        f"resolve allocated NVIDIA devices: MIG instance {earlier.mig_uuid} at placement "
        "{Start:6 Size:1} on GPU 0 is claimed by another live reservation"
    )
    assert [d.uuid for d in nvml.mig_devices(0)] == [earlier.mig_uuid]  # kept: it is claimed
    assert mig.manager.tracked() == {}
    # The pod that holds it (an Allocate of it retried after a restart) gets it back.
    listing.pods = [holder]
    realised = mig.step.realise(holder, _decision(holder))
    (container,) = realised.decision.containers
    assert container.envs == {"NVIDIA_VISIBLE_DEVICES": earlier.mig_uuid}
    assert realised.created == () and nvml.created == [(0, P(6, 1))]
