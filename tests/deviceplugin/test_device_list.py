"""The device list strategies and the GDRCopy/GDS/MOFED envs, as HAMi v2.10's
`getAllocateResponse` answers them (plugin/server.go:914-1081), and their place in Allocate."""

from __future__ import annotations

import pytest

from hami_plugin.deviceplugin.allocate import (
    AllocateConfig,
    ContainerAllocation,
    decide_allocation,
)
from hami_plugin.deviceplugin.device_list import (
    DeviceListConfig,
    DeviceListStrategy,
    cdi_annotations,
    cdi_qualified_name,
    device_list_answer,
    parse_device_list_strategies,
)
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import ANNOTATION_DEVICES_TO_ALLOCATE, ContainerDevice
from hami_plugin.protocol.objects import ContainerSpec, PodInfo

GPU_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
GPU_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
RESPONSE_ID = "6f1c2b0e-8e43-4a4b-9d3e-2f1f3f0a9c11"
S = DeviceListStrategy


def config(
    *strategies: DeviceListStrategy,
    gdrcopy_enabled: bool = False,
    gds_enabled: bool = False,
    mofed_enabled: bool = False,
) -> DeviceListConfig:
    return DeviceListConfig(
        strategies=frozenset(strategies),
        gdrcopy_enabled=gdrcopy_enabled,
        gds_enabled=gds_enabled,
        mofed_enabled=mofed_enabled,
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("envvar", {S.ENVVAR}),
        ("envvar,cdi-cri", {S.ENVVAR, S.CDI_CRI}),
        (" volume-mounts , cdi-annotations ", {S.VOLUME_MOUNTS, S.CDI_ANNOTATIONS}),
        (["cdi-annotations", "cdi-cri"], {S.CDI_ANNOTATIONS, S.CDI_CRI}),
        ("envvar,envvar", {S.ENVVAR}),
    ],
)
def test_strategies_parse_as_nvidias_comma_list(raw: object, expected: set[S]) -> None:
    assert parse_device_list_strategies(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("envvar,cdi", "invalid strategy: cdi"),
        ("Envvar", "invalid strategy: Envvar"),
        ("", "no device list strategy given"),
        (" , ", "no device list strategy given"),
    ],
)
def test_unknown_or_no_strategy_is_refused(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_device_list_strategies(raw)


def test_envvar_lists_the_uuids_once_in_order() -> None:
    answer = device_list_answer([GPU_B, GPU_A, GPU_B], config(S.ENVVAR), RESPONSE_ID)
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": f"{GPU_B},{GPU_A}"}
    assert (answer.mount_paths, answer.annotations, answer.cdi_devices) == ((), {}, ())


def test_volume_mounts_point_the_env_at_the_mount_root() -> None:
    answer = device_list_answer([GPU_A, GPU_B], config(S.VOLUME_MOUNTS), RESPONSE_ID)
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert answer.mount_paths == (
        f"/var/run/nvidia-container-devices/{GPU_A}",
        f"/var/run/nvidia-container-devices/{GPU_B}",
    )


def test_volume_mounts_win_over_envvar_for_the_env_as_in_hami() -> None:
    # HAMi sets the envvar value, then the volume-mounts one over it (server.go:933-939).
    answer = device_list_answer([GPU_A], config(S.ENVVAR, S.VOLUME_MOUNTS), RESPONSE_ID)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert len(answer.mount_paths) == 1


def test_cdi_annotations_name_the_gpus_under_the_response_id() -> None:
    answer = device_list_answer([GPU_A, GPU_B], config(S.CDI_ANNOTATIONS), RESPONSE_ID)
    assert answer.annotations == {
        f"cdi.k8s.io/nvidia-device-plugin_{RESPONSE_ID}": (
            f"k8s.device-plugin.nvidia.com/gpu={GPU_A},k8s.device-plugin.nvidia.com/gpu={GPU_B}"
        )
    }
    # Only CDI strategies: no device list env and no mounts at all.
    assert (answer.envs, answer.mount_paths, answer.cdi_devices) == ({}, (), ())


def test_a_custom_annotation_prefix_replaces_cdi_k8s_io() -> None:
    answer = device_list_answer(
        [GPU_A],
        DeviceListConfig(
            strategies=frozenset({S.CDI_ANNOTATIONS}), cdi_annotation_prefix="nvidia.cdi.k8s.io/"
        ),
        RESPONSE_ID,
    )
    assert list(answer.annotations) == [f"nvidia.cdi.k8s.io/nvidia-device-plugin_{RESPONSE_ID}"]


def test_cdi_cri_lists_the_names_in_cdi_devices() -> None:
    answer = device_list_answer([GPU_A, GPU_B], config(S.CDI_CRI), RESPONSE_ID)
    assert answer.cdi_devices == (cdi_qualified_name(GPU_A), cdi_qualified_name(GPU_B))
    assert (answer.envs, answer.annotations) == ({}, {})


def test_cdi_with_envvar_gives_both() -> None:
    answer = device_list_answer([GPU_A], config(S.CDI_CRI, S.ENVVAR), RESPONSE_ID)
    assert answer.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={GPU_A}",)
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": GPU_A}


def test_gdrcopy_gds_mofed_envs_come_with_a_non_cdi_strategy() -> None:
    every = config(S.ENVVAR, gdrcopy_enabled=True, gds_enabled=True, mofed_enabled=True)
    answer = device_list_answer([GPU_A], every, RESPONSE_ID)
    assert answer.envs == {
        "NVIDIA_VISIBLE_DEVICES": GPU_A,
        "NVIDIA_GDRCOPY": "enabled",
        "NVIDIA_GDS": "enabled",
        "NVIDIA_MOFED": "enabled",
    }
    only_gds = device_list_answer([GPU_A], config(S.ENVVAR, gds_enabled=True), RESPONSE_ID)
    assert "NVIDIA_GDS" in only_gds.envs
    assert "NVIDIA_GDRCOPY" not in only_gds.envs and "NVIDIA_MOFED" not in only_gds.envs


def test_gdrcopy_gds_mofed_envs_are_not_set_in_cdi_only_mode() -> None:
    # HAMi returns before them when every strategy is a CDI one (server.go:928-930).
    every = config(S.CDI_CRI, gdrcopy_enabled=True, gds_enabled=True, mofed_enabled=True)
    answer = device_list_answer([GPU_A], every, RESPONSE_ID)
    assert answer.envs == {}


def test_an_annotation_name_over_63_characters_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than 63"):
        cdi_annotations("x" * 43, ["k8s.device-plugin.nvidia.com/gpu=all"])
    assert cdi_annotations("x" * 42, ["d"])  # 21 + 42 = 63: allowed


# --- in Allocate ---------------------------------------------------------------------------


def pod() -> PodInfo:
    value = codec.encode_pod_devices(
        ((ContainerDevice(GPU_A, "NVIDIA", 4000, 30), ContainerDevice(GPU_B, "NVIDIA", 2000, 30)),)
    )
    return PodInfo(
        namespace="default",
        name="trainer",
        uid="0b7d1c5e-uid",
        annotations={ANNOTATION_DEVICES_TO_ALLOCATE: value},
        containers=(ContainerSpec(name="cuda"),),
    )


def decide(device_list: DeviceListConfig) -> tuple[ContainerAllocation, list[str]]:
    ids = iter(["uuid-1", "uuid-2", "uuid-3"])
    issued: list[str] = []

    def new_id() -> str:
        issued.append(next(ids))
        return issued[-1]

    decision = decide_allocation(
        pod(),
        [[f"{GPU_A}-0", f"{GPU_B}-0"]],
        AllocateConfig(hook_path="/usr/local", device_list=device_list),
        new_id,
    )
    return decision.containers[0], issued


def test_allocate_keeps_hami_core_envs_and_mounts_with_cdi_only() -> None:
    container, issued = decide(config(S.CDI_ANNOTATIONS, S.CDI_CRI))
    assert issued == ["uuid-1", "uuid-2"]  # HAMi: the response id, then the cache id
    assert container.annotations == {
        "cdi.k8s.io/nvidia-device-plugin_uuid-1": (
            f"k8s.device-plugin.nvidia.com/gpu={GPU_A},k8s.device-plugin.nvidia.com/gpu={GPU_B}"
        )
    }
    assert container.cdi_devices == (
        cdi_qualified_name(GPU_A),
        cdi_qualified_name(GPU_B),
    )
    envs = container.envs
    assert "NVIDIA_VISIBLE_DEVICES" not in envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/usr/local/vgpu/uuid-2.cache"
    assert [m.container_path for m in container.mounts] == [
        "/usr/local/vgpu/libvgpu.so",
        "/usr/local/vgpu",
        "/tmp/vgpulock",
        "/etc/ld.so.preload",
    ]
    assert container.gpu_list == f"{GPU_A},{GPU_B}"


def test_allocate_puts_the_volume_mounts_before_hami_cores() -> None:
    container, issued = decide(config(S.VOLUME_MOUNTS, gds_enabled=True))
    assert issued == ["uuid-1"]  # no CDI annotation: only the cache id
    mounts = container.mounts
    assert [(m.container_path, m.host_path, m.read_only) for m in mounts[:2]] == [
        (f"/var/run/nvidia-container-devices/{GPU_A}", "/dev/null", False),
        (f"/var/run/nvidia-container-devices/{GPU_B}", "/dev/null", False),
    ]
    assert mounts[2].container_path == "/usr/local/vgpu/libvgpu.so"
    envs = container.envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert envs["NVIDIA_GDS"] == "enabled"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "2000m"


def test_allocate_default_is_envvar_as_before() -> None:
    container, _ = decide(DeviceListConfig())
    envs = container.envs
    assert next(iter(envs)) == "NVIDIA_VISIBLE_DEVICES"
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"
    assert container.annotations == {}
    assert container.cdi_devices == ()
