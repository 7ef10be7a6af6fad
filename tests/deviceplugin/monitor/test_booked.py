"""What a region may claim: its container's booked GPUs and the priority its spec sets."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from hami_plugin.deviceplugin.monitor.booked import (
    BookedContainer,
    NotBooked,
    booked_container,
    task_priority,
)
from hami_plugin.protocol.mig import MigAllocation, encode_mig_allocations
from hami_plugin.protocol.model import ANNOTATION_VGPU_MIG_ALLOCATIONS, MigPlacement
from hami_plugin.protocol.objects import ContainerSpec
from hami_plugin.protocol.signature import BookingKeys
from tests.bookings import keys_from
from tests.deviceplugin.monitor.helpers import pod, region_file
from tests.deviceplugin.monitor.test_containers import (
    LOGGER,
    UUID,
    Pods,
    read_i32,
    scanner_for,
    spec,
    warnings_for,
)

KEYS = keys_from(b"k" * 32)
OTHER_KEYS = keys_from(b"o" * 32)
GPU_A, GPU_B = "GPU-aaaa", "GPU-bbbb"


@pytest.mark.parametrize(
    ("value", "priority"),
    [
        (None, 1),  # HAMi-core's default
        ("0", 0),
        ("  7abc", 7),  # atoi: leading blanks, stops at the first non-digit
        ("-2", -2),
        ("+3", 3),
        ("high", 0),
        ("", 0),
        ("99999999999", (1 << 31) - 1),
    ],
)
def test_priority_is_atoi_of_the_spec_env(value: str | None, priority: int) -> None:
    env = {} if value is None else {"CUDA_TASK_PRIORITY": value}
    assert task_priority(ContainerSpec(name="main", env=env)) == priority


def test_the_containers_own_entry_init_containers_first() -> None:
    booked = pod(
        "uid-1",
        "p",
        ["main", "side"],
        init_containers=["init"],
        booked={"init": [GPU_A], "side": [GPU_A, GPU_B]},
        env={"side": {"CUDA_TASK_PRIORITY": "0"}},
    )
    assert booked_container(booked, "side", None) == BookedContainer(frozenset({GPU_A, GPU_B}), 0)
    assert booked_container(booked, "init", None) == BookedContainer(frozenset({GPU_A}), 1)
    assert isinstance(no_gpu := booked_container(booked, "main", None), NotBooked)
    assert no_gpu.reason == "no-gpus"


@pytest.mark.parametrize(
    ("target", "container", "keys", "reason"),
    [
        (None, "main", None, "unknown-pod"),
        (pod("uid-1", "p"), "main", None, "no-booking"),
        (pod("uid-1", "p", booked={"main": [GPU_A]}), "other", None, "unknown-container"),
        (pod("uid-1", "p", booked={"main": [GPU_A]}), "main", KEYS, "not-signed"),
        (pod("uid-1", "p", booked={"main": [GPU_A]}, keys=OTHER_KEYS), "main", KEYS, "not-signed"),
    ],
)
def test_nothing_is_booked_without_a_trusted_booking(
    target: object, container: str, keys: BookingKeys | None, reason: str
) -> None:
    result = booked_container(target, container, keys)  # type: ignore[arg-type]
    assert isinstance(result, NotBooked) and result.reason == reason


def test_the_mig_instances_made_for_the_container_on_its_gpus_are_booked_too() -> None:
    """HAMi-core inside a MIG instance names the instance's UUID: the runtime identity the
    device plugin wrote for this container on its own GPUs counts, no other."""
    booked = pod("uid-1", "p", ["main", "side"], booked={"main": [GPU_A], "side": [GPU_B]})
    mine, other_container, other_gpu = (
        MigAllocation(0, 0, GPU_A, "1g.10gb", MigPlacement(0, 1), "MIG-mine", 7, 0),
        MigAllocation(1, 0, GPU_B, "1g.10gb", MigPlacement(1, 1), "MIG-side", 8, 0),
        MigAllocation(0, 1, GPU_B, "1g.10gb", MigPlacement(2, 1), "MIG-not-mine", 9, 0),
    )
    annotations = {
        **booked.annotations,
        ANNOTATION_VGPU_MIG_ALLOCATIONS: encode_mig_allocations([mine, other_container, other_gpu]),
    }
    with_mig = dataclasses.replace(booked, annotations=annotations)
    assert booked_container(with_mig, "main", None) == BookedContainer(
        frozenset({GPU_A, "MIG-mine"}), 1
    )
    broken = dataclasses.replace(
        booked, annotations={**booked.annotations, ANNOTATION_VGPU_MIG_ALLOCATIONS: "[{"}
    )
    assert booked_container(broken, "main", None) == BookedContainer(frozenset({GPU_A}), 1)


def test_a_signed_booking_is_trusted_with_keys() -> None:
    signed = pod("uid-1", "p", booked={"main": [GPU_A]}, keys=KEYS)
    assert booked_container(signed, "main", KEYS) == BookedContainer(frozenset({GPU_A}), 1)


def test_unknown_and_unsigned_regions_are_left_alone_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An active priority-0 region of a pod the node does not run, and one of a pod whose
    # booking is not signed, both naming the victim's GPU: neither takes part.
    region_file(tmp_path, "uid-ghost", "main", spec(priority=0, recent_kernel=50))
    region_file(tmp_path, "uid-forged", "main", spec(priority=0, recent_kernel=50))
    victim = region_file(tmp_path, "uid-victim", "main", spec(recent_kernel=50))
    pods = Pods(
        [
            pod(
                "uid-forged",
                "forged",
                booked={"main": [UUID]},
                env={"main": {"CUDA_TASK_PRIORITY": "0"}},
            ),
            pod("uid-victim", "victim", booked={"main": [UUID]}, keys=KEYS),
        ]
    )
    scanner = scanner_for(tmp_path, pods, keys=KEYS)
    caplog.set_level(logging.WARNING, LOGGER)
    for _ in range(3):
        scanner.apply_feedback()
        assert [u.pod_uid for u in scanner.scan() if u.booked is not None] == ["uid-victim"]
    assert read_i32(victim, 1, "recent_kernel") == 47  # counted down, never blocked
    assert read_i32(victim, 1, "utilization_switch") == 0
    assert len(warnings_for(caplog, "uid-ghost_main")) == 1
    assert len(warnings_for(caplog, "uid-forged_main")) == 1
    assert "no pod with this UID" in warnings_for(caplog, "uid-ghost_main")[0]
    assert "not signed" in warnings_for(caplog, "uid-forged_main")[0]
    scanner.close()


def test_foreign_gpu_identities_are_ignored_by_the_feedback(tmp_path: Path) -> None:
    # The attacker is booked on another GPU but names the victim's, with priority 0 in the file.
    attacker = region_file(
        tmp_path,
        "uid-attacker",
        "main",
        spec(uuids=["GPU-other", UUID], priority=0, recent_kernel=50),
    )
    victim = region_file(tmp_path, "uid-victim", "main", spec(recent_kernel=50))
    pods = Pods(
        [
            pod("uid-attacker", "a", booked={"main": ["GPU-other"]}),
            pod("uid-victim", "v", booked={"main": [UUID]}),
        ]
    )
    scanner = scanner_for(tmp_path, pods)
    scanner.apply_feedback()
    assert read_i32(victim, 1, "recent_kernel") == 49
    assert read_i32(victim, 1, "utilization_switch") == 0
    assert read_i32(attacker, 1, "recent_kernel") == 49
    scanner.close()


def test_a_region_file_name_forges_no_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The workload names its own region file; the daemon logs its path.
    forged = "x\n2026-12-06 08:00:00,000 INFO hami_plugin.extender.bind: pod a-b bound.cache"
    region_file(tmp_path, "uid-ghost", "main", spec(), name=forged)
    caplog.set_level(logging.WARNING, LOGGER)
    scanner = scanner_for(tmp_path, Pods())
    scanner.scan()
    [message] = warnings_for(caplog, "uid-ghost_main")
    assert "\n" not in message and "x\\n2026-12-06" in message
    scanner.close()
