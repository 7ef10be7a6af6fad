"""Static MIG decisions (pure): NVIDIA's device map for `--mig-strategy none|single|mixed`
(HAMi v2.10 rm/device_map.go:89-214, rm/rm.go:112-157), MIG health (rm/health.go:175-190), the
whole-device Allocate answer (rm/rm.go:80-86, TestValidateRequest in rm/rm_test.go:43-70) and the
CDI spec's MIG devices. HAMi's rm/device_map_test.go tests only the map's mechanics (insert,
merge, replicas); the strategy cases below follow device_map.go's branches, each citing its
line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.config import ConfigError
from hami_plugin.deviceplugin.allocate import AllocateFailure, FailureReason
from hami_plugin.deviceplugin.cdi import build_cdi_spec, parse_mig_minors
from hami_plugin.deviceplugin.device_list import DeviceListConfig, DeviceListStrategy
from hami_plugin.deviceplugin.inventory import PhysicalGpu
from hami_plugin.deviceplugin.mig.devices import MigDevice
from hami_plugin.deviceplugin.mig.static import (
    NO_INSTANCE,
    MigEvent,
    StaticMigError,
    mig_resource_name,
    mig_socket_name,
    plan_static_mig,
    unhealthy_mig_uuids,
)
from hami_plugin.deviceplugin.migserve import mig_container_answer, mig_kubelet_devices
from hami_plugin.deviceplugin.settings import DevicePluginSettings, add_arguments, resolve_settings
from hami_plugin.protocol.model import MigPlacement

PREFIX = "error building device map: error building device map from config.resources: "


def gpu(index: int, *, mig: bool, numa: int = -1) -> PhysicalGpu:
    return PhysicalGpu(
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        index=index,
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        numa_node=numa,
        mig_enabled=mig,
        pci_bus_id=f"00000000:{index:02X}:00.0",
        minor_number=index,
    )


_MEMORY = {"1g.10gb": 9856, "2g.20gb": 19968, "3g.40gb": 40192, "7g.80gb": 80896}


def mig(parent: int, mig_index: int, profile: str = "1g.10gb", gi: int | None = None) -> MigDevice:
    size = int(profile.split("g.")[0].split(".")[-1])
    return MigDevice(
        uuid=f"MIG-{parent:04d}{mig_index:04d}-0000-0000-0000-000000000000",
        parent_uuid=gpu(parent, mig=True).uuid,
        parent_index=parent,
        mig_index=mig_index,
        gpu_instance_id=gi if gi is not None else 7 + mig_index,
        compute_instance_id=0,
        profile=profile,
        placement=MigPlacement(start=mig_index * size, size=size),
        memory_mib=_MEMORY.get(profile.split("+")[0].split("c.")[-1], 9856),
    )


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "resource"),
    [
        ("1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("3g.40gb", "nvidia.com/mig-3g.40gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),  # rm.go:152: "+" becomes "."
        ("7g.80gb", "nvidia.com/mig-7g.80gb"),
        ("1c.2g.20gb", None),  # rm.go:149-151: C != G gets no resource
        ("2c.2g.20gb", "nvidia.com/mig-2c.2g.20gb"),
        ("not-a-profile", None),
    ],
)
def test_mixed_resource_names_follow_add_default_resources(profile: str, resource: str) -> None:
    assert mig_resource_name(profile) == resource


def test_mig_sockets_are_named_as_nvidia_names_them() -> None:
    # plugin/server.go:211: nvidia-<name>.sock
    assert mig_socket_name("nvidia.com/mig-1g.10gb") == "nvidia-mig-1g.10gb.sock"


# --- the device map per strategy (rm/device_map.go) -------------------------------------------


def test_none_serves_no_mig_devices() -> None:
    # device_map.go:95-97: with none, the GPU map only.
    plan = plan_static_mig("none", [gpu(0, mig=True)], {0: [mig(0, 0)]})
    assert plan.mig_resources == {} and plan.vgpu_served


def test_mixed_groups_mig_devices_by_profile_next_to_plain_gpus() -> None:
    # device_map.go:118 merges the GPU map (plain GPUs) and the MIG map.
    gpus = [gpu(0, mig=False), gpu(1, mig=True, numa=1), gpu(2, mig=True)]
    devices = {
        1: [mig(1, 0, "3g.40gb"), mig(1, 1, "1g.10gb"), mig(1, 2, "1g.10gb")],
        2: [mig(2, 0, "1g.10gb")],
    }
    plan = plan_static_mig("mixed", gpus, devices)
    assert plan.vgpu_served
    assert list(plan.mig_resources) == ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]
    assert [d.index for d in plan.mig_resources["nvidia.com/mig-1g.10gb"]] == ["1:1", "1:2", "2:0"]
    (big,) = plan.mig_resources["nvidia.com/mig-3g.40gb"]
    assert big.id == mig(1, 0, "3g.40gb").uuid and big.numa_node == 1


def test_mixed_warns_about_a_mig_gpu_without_mig_devices(caplog: pytest.LogCaptureFixture) -> None:
    # device_map.go:187-189: a warning, not an error, when not uniform.
    plan = plan_static_mig("mixed", [gpu(0, mig=True), gpu(1, mig=True)], {1: [mig(1, 0)]})
    assert [d.index for d in plan.devices] == ["1:0"]
    assert "device 0 has no MIG devices configured" in caplog.text


def test_mixed_refuses_a_profile_no_resource_pattern_matches() -> None:
    # device_map.go:164 via :100 and :79.
    with pytest.raises(StaticMigError) as caught:
        plan_static_mig("mixed", [gpu(0, mig=True)], {0: [mig(0, 0, "1c.2g.20gb")]})
    assert str(caught.value) == (
        PREFIX + "error building MIG device map: MIG profile '1c.2g.20gb' does not match any "
        "resource patterns"
    )


def test_single_puts_uniform_mig_devices_under_nvidia_com_gpu() -> None:
    # rm.go:124 AddMIGResource("*", "gpu").
    plan = plan_static_mig(
        "single", [gpu(0, mig=True), gpu(1, mig=True)], {0: [mig(0, 0)], 1: [mig(1, 0)]}
    )
    assert list(plan.mig_resources) == ["nvidia.com/gpu"]
    assert [d.index for d in plan.mig_resources["nvidia.com/gpu"]] == ["0:0", "1:0"]
    assert not plan.vgpu_served


def test_single_without_mig_gpus_keeps_the_gpus() -> None:
    # device_map.go:114: the mix check needs both maps non-empty.
    plan = plan_static_mig("single", [gpu(0, mig=False)], {})
    assert plan.mig_resources == {} and plan.vgpu_served


@pytest.mark.parametrize(
    ("gpus", "devices", "message"),
    [
        pytest.param(
            [gpu(0, mig=False), gpu(1, mig=True)],
            {1: [mig(1, 0)]},
            PREFIX + "all devices on the node must be configured with the same migEnabled value",
            id="device_map.go:114-116 mixed MIG and non-MIG GPUs",
        ),
        pytest.param(
            [gpu(0, mig=True), gpu(1, mig=True)],
            {0: [mig(0, 0)]},
            PREFIX + "invalid MIG configuration: at least one device with migEnabled=true was "
            "not configured correctly: device 1 has no MIG devices configured",
            id="device_map.go:184-186 a MIG GPU without MIG devices",
        ),
        pytest.param(
            [gpu(0, mig=True)],
            {0: [mig(0, 0, "1g.10gb"), mig(0, 1, "2g.20gb")]},
            PREFIX + "invalid MIG configuration: more than one MIG device type present on node",
            id="device_map.go:208-210 two kinds of MIG devices",
        ),
    ],
)
def test_single_refuses_what_nvidia_refuses(
    gpus: list[PhysicalGpu], devices: dict[int, list[MigDevice]], message: str
) -> None:
    with pytest.raises(StaticMigError) as caught:
        plan_static_mig("single", gpus, devices)
    assert str(caught.value) == message


def test_filtered_mig_uuids_are_dropped_and_empty_resources_not_served() -> None:
    # nvml_manager.go:73-82: FilterDeviceToRegister by device ID; empty resources skipped.
    devices = {0: [mig(0, 0, "3g.40gb"), mig(0, 1, "1g.10gb")]}
    plan = plan_static_mig(
        "mixed", [gpu(0, mig=True)], devices, filter_uuids={mig(0, 0, "3g.40gb").uuid}
    )
    assert list(plan.mig_resources) == ["nvidia.com/mig-1g.10gb"]


def test_an_unknown_strategy_is_nvidias_error() -> None:
    with pytest.raises(StaticMigError, match=r"^unknown MIG strategy: half$"):
        plan_static_mig("half", [], {})


@given(
    layout=st.lists(
        st.lists(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]), max_size=4),
        min_size=1,
        max_size=4,
    )
)
def test_mixed_serves_every_mig_device_once_under_its_profile(layout: list[list[str]]) -> None:
    gpus = [gpu(i, mig=True) for i in range(len(layout))]
    devices = {
        i: [mig(i, j, profile) for j, profile in enumerate(profiles)]
        for i, profiles in enumerate(layout)
    }
    plan = plan_static_mig("mixed", gpus, devices)
    served = [d.id for d in plan.devices]
    assert sorted(served) == sorted(d.uuid for ds in devices.values() for d in ds)
    for name, listed in plan.mig_resources.items():
        assert all(mig_resource_name(d.device.profile) == name for d in listed)


# --- health (rm/health.go:175-190) -------------------------------------------------------------


def test_a_lost_parent_marks_its_mig_devices_unhealthy() -> None:
    plan = plan_static_mig(
        "mixed", [gpu(0, mig=True), gpu(1, mig=True)], {0: [mig(0, 0), mig(0, 1)], 1: [mig(1, 0)]}
    )
    assert unhealthy_mig_uuids(plan.devices, {gpu(0, mig=True).uuid}) == {
        mig(0, 0).uuid,
        mig(0, 1).uuid,
    }


def test_an_xid_with_instance_ids_marks_only_that_mig_device() -> None:
    plan = plan_static_mig("mixed", [gpu(0, mig=True)], {0: [mig(0, 0, gi=7), mig(0, 1, gi=8)]})
    parent = gpu(0, mig=True).uuid
    only = unhealthy_mig_uuids(plan.devices, (), [MigEvent(parent, 8, 0)])
    assert only == {mig(0, 1).uuid}
    other_ci = unhealthy_mig_uuids(plan.devices, (), [MigEvent(parent, 8, 1)])
    assert other_ci == frozenset()
    whole = unhealthy_mig_uuids(plan.devices, (), [MigEvent(parent, NO_INSTANCE, NO_INSTANCE)])
    assert whole == {mig(0, 0).uuid, mig(0, 1).uuid}


def test_kubelet_devices_are_whole_mig_devices_with_the_parents_numa_node() -> None:
    plan = plan_static_mig("mixed", [gpu(0, mig=True, numa=1)], {0: [mig(0, 0), mig(0, 1)]})
    # devices.go:217-221: a MIG device's own topology, with or without --enable-numa-topology
    listed = mig_kubelet_devices(plan.devices, {mig(0, 1).uuid})
    assert [(d.id, d.healthy, d.numa_node) for d in listed] == [
        (mig(0, 0).uuid, True, 1),
        (mig(0, 1).uuid, False, 1),
    ]
    unknown = plan_static_mig("mixed", [gpu(0, mig=True)], {0: [mig(0, 0)]})
    assert [d.numa_node for d in mig_kubelet_devices(unknown.devices, ())] == [None]


# --- Allocate (plugin/server.go:774-794; rm_test.go:53-68's cases) -----------------------------


def test_allocate_names_the_mig_uuids_in_nvidia_visible_devices() -> None:
    # rm_test.go:53 "valid device IDs -- no sharing"
    ids = [mig(0, 0).uuid, mig(0, 1).uuid]
    answer = mig_container_answer("nvidia.com/mig-1g.10gb", ids, set(ids), DeviceListConfig(), "r")
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}
    assert not answer.mount_paths and not answer.annotations and not answer.cdi_devices


def test_allocate_refuses_an_unknown_device_in_hamis_words() -> None:
    # rm_test.go:61 "invalid device IDs -- no sharing"; the words of server.go:785
    with pytest.raises(AllocateFailure) as caught:
        mig_container_answer(
            "nvidia.com/gpu", ["MIG-a", "MIG-b"], {"MIG-a"}, DeviceListConfig(), "r"
        )
    assert caught.value.reason is FailureReason.INVALID_REQUEST
    assert str(caught.value) == (
        "invalid allocation request for 'nvidia.com/gpu': unknown device: MIG-b"
    )


def test_allocate_under_cdi_cri_names_the_mig_devices() -> None:
    config = DeviceListConfig(strategies=frozenset({DeviceListStrategy.CDI_CRI}))
    answer = mig_container_answer("nvidia.com/gpu", [mig(0, 0).uuid], {mig(0, 0).uuid}, config, "r")
    assert answer.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={mig(0, 0).uuid}",)
    assert answer.envs == {}


# --- CDI ------------------------------------------------------------------------------------


def test_the_cdi_spec_names_mig_devices_by_uuid_and_index_with_their_capability_nodes() -> None:
    minors = parse_mig_minors(
        "config 1\nmonitor 2\ngpu1/gi7/access 66\ngpu1/gi7/ci0/access 67\nbad line here\n"
    )
    assert minors == {"config": 1, "monitor": 2, "gpu1/gi7/access": 66, "gpu1/gi7/ci0/access": 67}
    device = mig(1, 0, gi=7)
    spec = build_cdi_spec([gpu(0, mig=False), gpu(1, mig=True)], [device], minors)
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    expected = [
        {"path": "/dev/nvidia1"},
        {"path": "/dev/nvidia-caps/nvidia-cap66"},
        {"path": "/dev/nvidia-caps/nvidia-cap67"},
    ]
    assert by_name[device.uuid] == expected
    assert by_name["1:0"] == expected
    assert gpu(1, mig=True).uuid not in by_name
    assert by_name["all"] == [{"path": "/dev/nvidia0"}, *expected]


# --- settings: the node entry's migstrategy ---------------------------------------------------


def _resolve(tmp_path: Path, entry: dict[str, object], *argv: str) -> DevicePluginSettings:
    node_file = tmp_path / "config.json"
    node_file.write_text(json.dumps({"nodeconfig": [{"name": "n", **entry}]}), encoding="utf-8")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--node-name", "n", "--node-config-file", str(node_file), *argv])
    return resolve_settings(args, {})


def test_the_node_entrys_migstrategy_sets_the_strategy_below_the_flag(tmp_path: Path) -> None:
    assert _resolve(tmp_path, {"migstrategy": "mixed"}).mig_strategy == "mixed"
    assert _resolve(tmp_path, {"migStrategy": "single"}).mig_strategy == "single"
    assert _resolve(tmp_path, {"migstrategy": "mixed"}, "--mig-strategy=none").mig_strategy == (
        "none"
    )
    with pytest.raises(ConfigError, match="migstrategy: unknown MIG strategy: half"):
        _resolve(tmp_path, {"migstrategy": "half"})


def test_static_mig_is_refused_on_a_dynamic_mig_node(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"--mig-strategy mixed \(static MIG\) cannot be combined"
    ):
        _resolve(tmp_path, {"operatingmode": "mig"}, "--mig-strategy=mixed")
    assert _resolve(tmp_path, {"operatingmode": "mig"}).mig_strategy == "none"
