"""HAMi v2.10's own device-plugin MIG test cases, ported as tables (issue 18, "Done when").

Each test names the Go test it ports (`file:line` of tag v2.10.0) and keeps its intent, adapted
to our API. Where our behaviour differs from HAMi's on purpose (docs/differences.md,
docs/device-plugin.md "Static MIG" / "Dynamic MIG"), the test asserts ours and says so.
The dynamic MIG pods and stubs are those of tests/deviceplugin/test_mig_manager.py."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest

from hami_plugin.deviceplugin.allocate import AllocateFailure, FailureReason
from hami_plugin.deviceplugin.api import api_pb2
from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.cdi import build_cdi_spec, mig_device_nodes, read_mig_minors
from hami_plugin.deviceplugin.device_list import DeviceListConfig
from hami_plugin.deviceplugin.inventory import PhysicalGpu
from hami_plugin.deviceplugin.mig.devices import MigDevice
from hami_plugin.deviceplugin.mig.dynamic import DynamicMig, mig_allocation_container_name
from hami_plugin.deviceplugin.mig.manager import MigInstanceManager
from hami_plugin.deviceplugin.mig.nvml import MigNvmlError, NvmlMig
from hami_plugin.deviceplugin.mig.startup import (
    ReservationError,
    in_use_gpus,
    live_reservations,
    start_dynamic_mig,
)
from hami_plugin.deviceplugin.mig.static import (
    NO_INSTANCE,
    MigEvent,
    ServedMigDevice,
    plan_static_mig,
    unhealthy_mig_uuids,
)
from hami_plugin.deviceplugin.migserve import (
    MigDeviceService,
    mig_container_answer,
    mig_kubelet_devices,
)
from hami_plugin.deviceplugin.preferred import PreferredRequest, decide_preferred
from hami_plugin.protocol.mig import MigAllocation
from hami_plugin.protocol.model import ANNOTATION_VGPU_MIG_ALLOCATIONS, MigPlacement
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.testing.fakenvml.errors import nvml_error
from hami_plugin.testing.fakenvml.nvml import FakeNvml
from tests.deviceplugin.mig_stub import StubMigNvml
from tests.deviceplugin.test_mig_manager import (
    CARD,
    GPU0,
    KEYS,
    NODE,
    Listing,
    alloc,
    mig_pod,
)

HAMI_PLUGIN = "pkg/device-plugin/nvidiadevice/nvinternal"

# --- plugin/mig_startup_test.go ------------------------------------------------------------


@pytest.mark.parametrize(
    ("busy", "logged"),
    [
        ((3, 0, 1), "in-use GPUs [0, 1, 3], reset GPUs [2]"),
        ((), "in-use GPUs [], reset GPUs [0, 1, 2, 3]"),
    ],
)
def test_the_startup_layout_is_logged_in_ascending_gpu_order(
    busy: tuple[int, ...], logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    """plugin/mig_startup_test.go:24 TestSortedIntSetKeys: HAMi sorts the in-use set's keys so
    the start-up log line is stable (mig_startup.go:28-37, server.go:306-308). Ours logs the
    same line with the in-use GPUs sorted, an empty set as `[]`."""
    nvml = StubMigNvml(count=4)
    for index in busy:
        nvml.gpus[index].busy = True
    with caplog.at_level(logging.INFO, logger="hami_plugin.deviceplugin.mig.startup"):
        start_dynamic_mig(MigInstanceManager(nvml), nvml, 4, list, NODE, KEYS, lambda _: None)
    lines = [r.getMessage() for r in caplog.records if "resolved startup layout" in r.getMessage()]
    assert lines == [f"mig init: resolved startup layout: {logged}"]


UUIDS = {"GPU-live": 0, "GPU-pending": 1, "GPU-complete": 2, "GPU-deleting": 3, "GPU-failed": 4}


def _on(gpu: str, start: int = 0, size: int = 1, profile: str = "1g.10gb") -> list[MigAllocation]:
    return [MigAllocation(0, 0, gpu, profile, MigPlacement(start, size))]


@pytest.mark.parametrize("keys", [None, KEYS], ids=["trusted-as-hami", "signed"])
def test_only_live_pods_keep_their_gpus_from_being_reset(keys: Any) -> None:
    """plugin/mig_startup_test.go:35 TestActiveMigGPUUUIDs: the GPUs named by the reservations
    of pods that are not being deleted, Succeeded or Failed (mig_startup.go:73-91) are the ones
    start-up keeps; HAMi's four pods, plus a Failed one. Without booking keys every annotation
    counts, as in HAMi; with keys, the same when each is signed (`live_reservations`)."""
    pods = [
        mig_pod("live", _on("GPU-live", 6), phase="Running", keys=keys),
        mig_pod("pending", _on("GPU-pending", 0, 2, "2g.20gb"), phase="Pending", keys=keys),
        mig_pod("complete", _on("GPU-complete"), phase="Succeeded", keys=keys),
        mig_pod("deleting", _on("GPU-deleting"), phase="Running", deleting=True, keys=keys),
        mig_pod("failed", _on("GPU-failed"), phase="Failed", keys=keys),
    ]
    live = live_reservations(pods, NODE, keys)
    assert in_use_gpus(live, UUIDS.get) == {UUIDS["GPU-live"], UUIDS["GPU-pending"]}


def test_what_does_not_name_a_physical_gpu_keeps_none_and_an_unknown_gpu_keeps_all() -> None:
    """mig_startup.go:80-88 (the rest of TestActiveMigGPUUUIDs's function): an annotation that
    does not decode is skipped, a UUID without the `GPU-` prefix is not counted; and
    mig_startup.go:106-110: a GPU UUID NVML does not know fails the detection
    (`resolve GPU UUID ...`), so start-up keeps every GPU (server.go:292-301)."""
    garbage = mig_pod("garbage", _on("GPU-live"), keys=None)
    garbage = replace(
        garbage, annotations={**garbage.annotations, ANNOTATION_VGPU_MIG_ALLOCATIONS: "[{"}
    )
    pods = [garbage, mig_pod("odd", _on("MIG-not-a-gpu"), keys=None)]
    assert in_use_gpus(live_reservations(pods, NODE, None), UUIDS.get) == frozenset()
    unknown = live_reservations([mig_pod("x", _on("GPU-elsewhere"), keys=None)], NODE, None)
    with pytest.raises(ReservationError, match=r"^resolve GPU UUID GPU-elsewhere$"):
        in_use_gpus(unknown, UUIDS.get)
    nvml = StubMigNvml(count=2)
    MigInstanceManager(nvml).ensure(1, "1g.10gb", MigPlacement(0, 1))
    reset, kept = start_dynamic_mig(
        MigInstanceManager(nvml), nvml, 2, lambda: [mig_pod("x", _on("GPU-elsewhere"))], NODE,
        KEYS, lambda _: None,
    )  # fmt: skip
    assert (reset, kept) == ([], frozenset({0, 1}))
    assert len(nvml.mig_devices(1)) == 1


# --- cmd/vGPUmonitor/metrics_mig_test.go and metrics.go:526-585 ---------------------------

POD = PodInfo(
    namespace="default",
    name="p",
    uid="uid-p",
    annotations={},
    init_containers=(ContainerSpec(name="init"),),
    containers=(ContainerSpec(name="main-a"), ContainerSpec(name="main-b")),
)


@pytest.mark.parametrize(
    ("index", "name"),
    [(0, "init"), (1, "main-a"), (2, "main-b"), (3, None), (-1, None)],
)
def test_a_container_index_counts_init_containers_first(index: int, name: str | None) -> None:
    """cmd/vGPUmonitor/metrics_mig_test.go:25 TestMigAllocationContainerName, its table."""
    assert mig_allocation_container_name(POD, index) == name


def _mig_node(listing: Listing, *, signed: bool = True) -> DynamicMig:
    gpu = PhysicalGpu(GPU0, 0, CARD, 81920, -1, True, "0000:10:00.0", 0)
    return DynamicMig(
        StubMigNvml(), node_name=NODE, kube=listing, gpus=lambda: [gpu],
        device_list=DeviceListConfig(), keys=(lambda: KEYS) if signed else None,
    )  # fmt: skip


def test_hami_mig_device_info_names_the_container_and_skips_an_index_out_of_range(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """metrics.go:526-571 over a pod with an init container: one `hami_mig_device_info` row per
    realised reservation, its container named as migAllocationContainerName names it (the init
    container for index 0); an index out of range gives no row and HAMi's error line
    (metrics.go:547-551); an annotation that does not decode gives no row and, on a node
    without booking keys (every annotation trusted, as HAMi), is logged as HAMi logs it
    (metrics.go:538-542); with keys it no longer matches its signature, so it is not read.
    Ours logs each such line once (HAMi: at every scrape)."""
    listing = Listing()
    mig = _mig_node(listing)
    mig.manager.ensure(0, "1g.10gb", MigPlacement(6, 1))
    mig.manager.ensure(0, "1g.10gb", MigPlacement(5, 1))
    pod = mig_pod(
        "p", [alloc(6, container=0), alloc(5, container=3)], containers=("main-a", "main-b")
    )
    pod = replace(pod, init_containers=(ContainerSpec(name="init"),))
    garbage = mig_pod("q", [alloc(4)])
    garbage = replace(
        garbage, annotations={**garbage.annotations, ANNOTATION_VGPU_MIG_ALLOCATIONS: "[{"}
    )
    listing.pods = [pod]
    with caplog.at_level(logging.ERROR, logger="hami_plugin.deviceplugin.mig.dynamic"):
        (row,) = mig.device_info()
        assert len(mig.device_info()) == 1  # logged once, not at every scrape
    assert (row.namespace, row.pod, row.container, row.vdevice_index) == ("default", "p", "init", 0)
    assert (row.device_uuid, row.profile) == (GPU0, "1g.10gb")
    assert [r.getMessage() for r in caplog.records] == [
        "hami_mig_device_info: MIG allocation container index 3 out of range for Pod default/p"
    ]
    caplog.clear()
    listing.pods = [garbage]
    with caplog.at_level(logging.ERROR, logger="hami_plugin.deviceplugin.mig.dynamic"):
        assert mig.device_info() == []
        assert caplog.records == []
        assert _mig_node(listing, signed=False).device_info() == []
    assert [r.getMessage() for r in caplog.records] == [
        "hami_mig_device_info: failed to decode MIG allocations for pod default/q: "
        "unexpected end of JSON input"
    ]


def test_hami_mig_device_info_takes_the_identity_nvml_gave_not_the_pods_copy() -> None:
    """metrics.go:544-546 skips an allocation whose annotation lacks `migUUID` and the instance
    ids, and exports the ids the annotation carries. Ours (docs/device-plugin.md "Dynamic MIG",
    "Metrics"; the runtime identity is not signed) exports the identity of the instance the
    manager tracks for the reservation's placement: a row even before the identity is written
    back, NVML's ids over a forged copy, and no row once the instance is gone."""
    listing = Listing()
    mig = _mig_node(listing)
    real = mig.manager.ensure(0, "1g.10gb", MigPlacement(6, 1)).instance
    forged = alloc(6).with_runtime("MIG-forged", 99, 98)
    for allocation in (alloc(6), forged):
        listing.pods = [mig_pod("p", [allocation])]
        (row,) = mig.device_info()
        assert (row.mig_uuid, row.gpu_instance_id, row.compute_instance_id) == (
            real.mig_uuid,
            real.gpu_instance_id,
            real.compute_instance_id,
        )
    listing.pods = [mig_pod("p", [alloc(5).with_runtime("MIG-forged", 99, 98)])]
    assert mig.device_info() == []


# --- plugin/alloc_refactor_test.go: Allocate's MIG branch (server.go:774-794) --------------


def _served(uuid: str, mig_index: int = 0) -> ServedMigDevice:
    device = MigDevice(
        uuid=uuid, parent_uuid="GPU-aaa", parent_index=0, mig_index=mig_index,
        gpu_instance_id=7 + mig_index, compute_instance_id=0, profile="1g.10gb",
        placement=MigPlacement(mig_index, 1), memory_mib=9856,
    )  # fmt: skip
    return ServedMigDevice(device, numa_node=-1)


def _service(*uuids: str) -> MigDeviceService:
    served = [_served(uuid, i) for i, uuid in enumerate(uuids)]
    board = DeviceBoard(mig_kubelet_devices(served, ()))
    return MigDeviceService(
        board, "nvidia.com/gpu", DeviceListConfig(), new_response_id=lambda: "r"
    )


def _request(*ids: str) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
    )


def test_allocate_hands_out_an_advertised_mig_device() -> None:
    """plugin/alloc_refactor_test.go:599 TestAllocate_MIG_Success: one container, one response.
    Ours reads no pending pod for MIG devices (docs/differences.md, "Static MIG": HAMi's
    Allocate looks one up first)."""
    response = _service("MIG-aaa-0").allocate(_request("MIG-aaa-0"))
    (container,) = response.container_responses
    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-aaa-0"}


def test_allocate_of_shared_replicas_never_happens_as_mig_devices_are_not_time_sliced() -> None:
    """plugin/alloc_refactor_test.go:629 TestAllocate_MIG_FailRequestsGreaterThanOne: with
    `sharing.timeSlicing.failRequestsGreaterThanOne`, HAMi refuses more than one annotated
    replica (`MIG-...::<n>`) per request, `request for 'nvidia.com/gpu: 2' too large: ...`.
    Ours does not time-slice MIG devices (docs/device-plugin.md, "Static MIG"): each is one
    whole kubelet device under its MIG UUID, so no replica ID is ever advertised (a request for
    one is an unknown device), and two whole MIG devices in one request are both handed out,
    as NVIDIA's plugin does without sharing."""
    service = _service("MIG-gpu-uuid", "MIG-other")
    assert all("::" not in device.id for device in service.board.devices)
    with pytest.raises(AllocateFailure) as caught:
        service.allocate(_request("MIG-gpu-uuid::0", "MIG-gpu-uuid::1"))
    assert caught.value.reason is FailureReason.INVALID_REQUEST
    assert "unknown device: MIG-gpu-uuid::0" in str(caught.value)
    (both,) = service.allocate(_request("MIG-gpu-uuid", "MIG-other")).container_responses
    assert dict(both.envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-gpu-uuid,MIG-other"}


def test_allocate_refuses_an_unknown_mig_device() -> None:
    """plugin/alloc_refactor_test.go:668 TestAllocate_MIG_UnknownDevice, in server.go:785's
    words."""
    with pytest.raises(AllocateFailure) as caught:
        _service().allocate(_request("MIG-unknown-0"))
    assert caught.value.reason is FailureReason.INVALID_REQUEST
    assert str(caught.value) == (
        "invalid allocation request for 'nvidia.com/gpu': unknown device: MIG-unknown-0"
    )
    with pytest.raises(AllocateFailure, match="unknown device: MIG-unknown-0"):
        mig_container_answer(
            "nvidia.com/gpu", ["MIG-aaa-0", "MIG-unknown-0"], {"MIG-aaa-0"}, DeviceListConfig(), "r"
        )


# --- plugin/server_test.go: GetPreferredAllocation with MIG reservations -------------------

G_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
G_B = "GPU-03f69c50-207a-2038-9b45-23cac89cb67b"
G_C = "GPU-03f69c50-207a-2038-9b45-23cac89cb67c"
AVAILABLE = (f"{G_A}-0", f"{G_A}-1", f"{G_B}-0", f"{G_C}-0")


@pytest.mark.parametrize(
    ("must_include", "chosen"),
    [
        ((), (f"{G_A}-0", f"{G_B}-0", f"{G_C}-0")),
        ((f"{G_A}-1",), (f"{G_A}-1", f"{G_B}-0", f"{G_C}-0")),
    ],
)
def test_the_preferred_allocation_takes_one_slot_on_each_reserved_gpu(
    must_include: tuple[str, ...], chosen: tuple[str, ...]
) -> None:
    """plugin/server_test.go:528 TestSelectPreferredDeviceIDsWithPhysicalMIGReservations: a pod
    whose MIG reservations are on three GPUs steers kubelet to one slot ID of each
    (server.go:671-713), a must-include ID counting for its GPU. Ours answers the same on a
    dynamic-MIG node (`preferred.decide_preferred` does not depend on the operating mode)."""
    pod = mig_pod(
        "p",
        [alloc(6, gpu=G_A), alloc(6, gpu=G_B, device=1), alloc(6, gpu=G_C, device=2)],
        devices=[[G_A, G_B, G_C]],
    )
    (answer,) = decide_preferred(pod, [PreferredRequest(AVAILABLE, must_include, 3)])
    assert answer.device_ids == chosen
    assert answer.fallback_note is None


# --- rm/health_test.go and rm/nvml_devices_test.go: a MIG device as NVML describes it -------

PARENT = "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f"
LEGACY = f"MIG-{PARENT}/9/9"
"""The legacy MIG UUID format (`MIG-GPU-<parent>/<gi>/<ci>`), with ids NVML does not give it."""
OPAQUE = "MIG-30d00c09-8a98-59b8-8c1a-1d64b4ec3ad2"
RENAMED = "MIG-11111111-2222-3333-4444-555555555555"
"""The fake NVML takes opaque UUIDs only: `_LegacyUuid` reports this one as `LEGACY`."""

FILE = f"""gpus:
  - uuid: {PARENT}
    name: NVIDIA A100-SXM4-80GB
    mig: true
    mig_devices:
      - {{profile: 1g.10gb, start: 0, uuid: "{RENAMED}"}}
      - {{profile: 3g.40gb, start: 4, uuid: "{OPAQUE}"}}
"""


@pytest.fixture
def fake(tmp_path: Path) -> FakeNvml:
    path = tmp_path / "gpus.yaml"
    path.write_text(FILE)
    module = FakeNvml(str(path))
    module.nvmlInit()
    return module


class _LegacyUuid:
    """The fake NVML, but the MIG device `RENAMED` has a legacy-format UUID (older drivers)."""

    def __init__(self, inner: FakeNvml) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        uuid = str(self._inner.nvmlDeviceGetUUID(handle))
        return LEGACY if uuid == RENAMED else uuid


def test_a_mig_devices_placement_comes_from_nvml_whatever_its_uuid_format(fake: FakeNvml) -> None:
    """rm/health_test.go:244 TestParseMigDeviceUUID and :302 TestGetMigDeviceParts: HAMi finds
    a MIG device's <parent, GI, CI> through NVML, falling back to parsing the legacy UUID
    (health.go:311-375). Ours never parses a UUID: the MIG devices are walked from their parent
    by index and NVML gives each its ids (`NvmlMig.mig_devices`), so the legacy and the opaque
    format alike get NVML's parent and ids (never the `/9/9` written in the legacy UUID), and an
    Xid with instance ids marks exactly that device; one without them (`0xFFFFFFFF`, "full
    device") is about the whole GPU."""
    devices = NvmlMig(_LegacyUuid(fake)).mig_devices(0)
    assert [(d.uuid, d.parent_uuid) for d in devices] == [(LEGACY, PARENT), (OPAQUE, PARENT)]
    handle = fake.nvmlDeviceGetMigDeviceHandleByIndex(fake.nvmlDeviceGetHandleByIndex(0), 0)
    nvml_ids = (
        fake.nvmlDeviceGetGpuInstanceId(handle),
        fake.nvmlDeviceGetComputeInstanceId(handle),
    )
    assert (devices[0].gpu_instance_id, devices[0].compute_instance_id) == nvml_ids != (9, 9)
    served = tuple(ServedMigDevice(d, numa_node=-1) for d in devices)
    for device in devices:
        event = MigEvent(PARENT, device.gpu_instance_id, device.compute_instance_id)
        assert unhealthy_mig_uuids(served, (), [event]) == {device.uuid}
    assert unhealthy_mig_uuids(served, (), [MigEvent(PARENT, NO_INSTANCE, NO_INSTANCE)]) == {
        LEGACY,
        OPAQUE,
    }
    assert unhealthy_mig_uuids(served, (), [MigEvent(PARENT, 9, 9)]) == frozenset()


class _Failing:
    """The fake NVML, but `call` fails with `code` when asked about a MIG device handle."""

    def __init__(self, inner: FakeNvml, call: str, code: int) -> None:
        self._inner = inner
        self._call = call
        self._code = code

    def __getattr__(self, name: str) -> Any:
        function = getattr(self._inner, name)
        if name != self._call:
            return function

        def failing(handle: Any, *args: Any) -> Any:
            if self._inner.nvmlDeviceIsMigDeviceHandle(handle):
                raise nvml_error(self._code)
            return function(handle, *args)

        return failing


@pytest.mark.parametrize(
    ("call", "message"),
    [
        # nvml_devices_test.go:201 TestNvmlMigDevice_GetUUID, "Error retrieving UUID"
        ("nvmlDeviceGetUUID", "get MIG UUID: Unknown Error"),
        # :313 TestNvmlMigDevice_GetPaths, "fails to get GPU instance ID"
        ("nvmlDeviceGetGpuInstanceId", "MIG device 0 of gpu 0: get GPU instance id: Unknown Error"),
        # :313, "fails to get compute instance ID"
        (
            "nvmlDeviceGetComputeInstanceId",
            "MIG device 0 of gpu 0: get compute instance id: Unknown Error",
        ),
        # :476 TestNvmlMigDevice_GetTotalMemory, "Error retrieving memory"
        ("nvmlDeviceGetMemoryInfo", "MIG device 0 of gpu 0: get memory info: Unknown Error"),
    ],
)
def test_an_nvml_failure_on_a_mig_device_is_an_error_naming_the_call(
    fake: FakeNvml, call: str, message: str
) -> None:
    """rm/nvml_devices_test.go's error rows for a MIG device (HAMi's `nvmlMigDevice` methods
    return NVML's error, nvml_devices.go:87-219): ours fails the listing with a `MigNvmlError`
    naming the call and carrying NVML's code (static MIG then refuses to start, one line)."""
    with pytest.raises(MigNvmlError) as caught:
        NvmlMig(_Failing(fake, call, pynvml.NVML_ERROR_UNKNOWN)).mig_devices(0)
    assert str(caught.value) == message
    assert caught.value.code == pynvml.NVML_ERROR_UNKNOWN


def test_a_mig_devices_uuid_and_memory_are_nvmls(fake: FakeNvml) -> None:
    """rm/nvml_devices_test.go:201 TestNvmlMigDevice_GetUUID and :476
    TestNvmlMigDevice_GetTotalMemory, their success rows: the MIG device's own UUID and memory
    (`nvmlDeviceGetMemoryInfo` on the MIG handle), not its parent's."""
    devices = NvmlMig(fake).mig_devices(0)
    module = fake
    parent = module.nvmlDeviceGetHandleByIndex(0)
    for device in devices:
        handle = module.nvmlDeviceGetMigDeviceHandleByIndex(parent, device.mig_index)
        assert device.uuid == module.nvmlDeviceGetUUID(handle)
        assert device.memory_mib == int(module.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
    assert [d.memory_mib for d in devices] == [9728, 40192]


def test_a_mig_devices_index_and_numa_node_are_its_parents() -> None:
    """rm/nvml_devices_test.go:195 TestNewMigDevice (index `<gpu>:<mig>`, "1:4") and :405
    TestNvmlMigDevice_GetNumaNode (a MIG device's NUMA node is its parent's; none when the
    parent has none)."""
    served = _served("MIG-x", mig_index=4)
    served = replace(served, device=replace(served.device, parent_index=1))
    assert served.index == "1:4"
    for numa, expected in ((1, 1), (-1, None)):
        parent = PhysicalGpu("GPU-aaa", 0, CARD, 81920, numa, True, "0000:ff:00.0", 0)
        plan = plan_static_mig("mixed", [parent], {0: [_served("MIG-x").device]})
        assert [d.numa_node for d in mig_kubelet_devices(plan.devices, ())] == [expected]


# --- mig/mig_test.go and nvml_devices.go:121-164: the capability nodes ---------------------


def test_no_mig_minors_file_means_no_capability_nodes(tmp_path: Path) -> None:
    """mig/mig_test.go:24 TestGetMigCapabilityDevicePaths_noFile: without the driver's
    `mig-minors` file there is nothing, and no error (mig.go:59-62); with one, its GI and CI
    access lines (mig.go:69-84)."""
    assert read_mig_minors(str(tmp_path / "absent")) == {}
    minors = tmp_path / "mig-minors"
    minors.write_text("config 1\nmonitor 2\ngpu0/gi1/access 21\ngpu0/gi1/ci0/access 22\n")
    assert read_mig_minors(str(minors)) == {
        "config": 1,
        "monitor": 2,
        "gpu0/gi1/access": 21,
        "gpu0/gi1/ci0/access": 22,
    }


def test_a_mig_device_missing_from_mig_minors_gets_its_parents_node_only() -> None:
    """rm/nvml_devices_test.go:313 TestNvmlMigDevice_GetPaths, "missing MIG capability device
    paths" and "fails to get parent minor number": HAMi's GetPaths fails then. Ours (cdi.py, the
    module docstring: capability nodes "where mig-minors lists them"; `gpu_device_node`: the
    NVML index when NVML gave no minor) lists the parent's node and the capability nodes the
    driver lists."""
    device = _served("MIG-x").device
    parent = PhysicalGpu("GPU-aaa", 0, CARD, 81920, -1, True, "0000:10:00.0", 3)
    assert mig_device_nodes(device, parent, {}) == ["/dev/nvidia3"]
    listed = {"gpu3/gi7/access": 40, "gpu3/gi7/ci0/access": 41}
    assert mig_device_nodes(device, parent, listed) == [
        "/dev/nvidia3",
        "/dev/nvidia-caps/nvidia-cap40",
        "/dev/nvidia-caps/nvidia-cap41",
    ]
    no_minor = replace(parent, minor_number=None)
    assert mig_device_nodes(device, no_minor, {}) == ["/dev/nvidia0"]


def test_a_mig_device_without_capability_nodes_is_said_when_the_cdi_spec_is_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """rm/nvml_devices.go:147-155 (TestNvmlMigDevice_GetPaths, "missing MIG capability device
    paths"): where HAMi refuses the device, ours writes the spec and logs one line per MIG device
    whose capability nodes the driver does not list, in HAMi's words."""
    device = _served("MIG-x").device
    parent = PhysicalGpu("GPU-aaa", 0, CARD, 81920, -1, True, "0000:10:00.0", 3)
    with caplog.at_level(logging.WARNING, logger="hami_plugin.deviceplugin.cdi"):
        build_cdi_spec([parent], [device], {"gpu3/gi7/access": 40, "gpu3/gi7/ci0/access": 41})
        assert caplog.records == []
        build_cdi_spec([parent], [device], {"gpu3/gi7/access": 40})
    assert [r.getMessage() for r in caplog.records] == [
        "MIG device MIG-x: missing MIG GPU instance capability path (gi7/ci0 of /dev/nvidia3 not "
        "in /proc/driver/nvidia-caps/mig-minors): its CDI device holds only /dev/nvidia3, "
        "/dev/nvidia-caps/nvidia-cap40"
    ]
