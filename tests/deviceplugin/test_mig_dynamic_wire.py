"""Dynamic MIG over real wires (issue 18, item 2, node side): the daemon with the fake NVML (an
A100-SXM4-80GB in MIG mode, its instances kept in the fake's state file), the test kubelet over
gRPC and the API server double. The register annotation, a signed MIG booking realised at
Allocate, forged and unsigned ones refused, a restart that adopts instead of re-creating, and the
instance destroyed once its pod is gone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest
import yaml

from hami_plugin.cli import main
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.mig.devices import MigDevice
from hami_plugin.deviceplugin.mig.nvml import NvmlMig
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol import codec
from hami_plugin.protocol.mig import MigAllocation, decode_mig_allocations, encode_mig_allocations
from hami_plugin.protocol.mig_allowlist import AllowedMigProfiles
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
    MigPlacement,
    OperatingMode,
)
from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    BookingKeys,
)
from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from hami_plugin.testing.kubelet import FakeKubelet
from tests.bookings import keys_from, public_key_file_text, signed_fields
from tests.deviceplugin.conftest import FAST_RETRY
from tests.deviceplugin.daemons import serving
from tests.deviceplugin.pods import NODE, pod_annotations, set_lock
from tests.deviceplugin.test_metrics_daemon import scrape, value
from tests.processes import wait_until

GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
IDLE = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"
CARD = "NVIDIA A100-SXM4-80GB"
KEY = "c2NoZWR1bGVyLWJvb2tpbmcta2V5LW9mLTMyLWJ5dGVzIQ=="
KEYS: BookingKeys = keys_from(KEY)
SPLIT = 7
ALLOWLIST = (AllowedMigProfiles(models=("A100",), profiles=("1g.10gb", "3g.40gb", "7g.80gb")),)
SLOT_6 = MigPlacement(6, 1)


def write_gpus(path: Path) -> None:
    """One A100 in MIG mode, one not yet, with a stale instance NVML kept from earlier."""
    gpus = [
        {"uuid": GPU, "name": CARD, "memory_mib": 81920, "mig": True},
        {"uuid": IDLE, "name": CARD, "memory_mib": 81920, "mig": True,
         "mig_devices": [{"profile": "1g.10gb", "start": 0}]},
    ]  # fmt: skip
    path.write_text(yaml.safe_dump({"gpus": gpus}), encoding="utf-8")


class Node:
    """The test's view of one node: the API server, a second NVML session on the same fake
    GPU file (its state file shows what the daemon did), and the daemon's settings."""

    def __init__(self, tmp_path: Path, sock_dir: str, apiserver: FakeApiServer) -> None:
        self.apiserver = apiserver
        self.gpus_file = tmp_path / "gpus.yaml"
        write_gpus(self.gpus_file)
        key_file = tmp_path / "booking-keys"
        key_file.write_text(public_key_file_text(KEY), encoding="utf-8")
        self.settings = DevicePluginSettings(
            node_name=NODE,
            device_plugin_path=sock_dir,
            nvml=NvmlSource.FAKE,
            fake_gpus=str(self.gpus_file),
            split_count=SPLIT,
            hook_path=str(tmp_path / "hook"),  # no HAMi-core: a MIG node does not need it
            register_interval_seconds=0.2,
            metrics_bind_address="127.0.0.1:0",
            booking_key_file=str(key_file),
            pod_resources_socket="",
            operating_mode=OperatingMode.MIG,
            mig_profile_allowlist=ALLOWLIST,
        )
        self.tmp_path = tmp_path
        self.sock_dir = sock_dir
        module = load_nvml_module("fake", str(self.gpus_file))
        module.nvmlInit()
        self.nvml = NvmlMig(module)

    def instances(self, index: int = 0) -> Sequence[MigDevice]:
        return tuple(self.nvml.mig_devices(index))

    @contextlib.contextmanager
    def daemon(self) -> Iterator[tuple[DevicePluginDaemon, FakeKubelet]]:
        kube = KubeClient(self.apiserver.api_client(), FAST_RETRY)
        daemon = DevicePluginDaemon(
            self.settings,
            load_nvml=load_nvml_module,
            kube=kube,
            vgpulock_path=str(self.tmp_path / "vgpulock"),
        )
        try:
            with serving(daemon, self.sock_dir) as kubelet:
                kubelet.wait_for_registrations(1)
                yield daemon, kubelet
        finally:
            kube.close()


@pytest.fixture
def node(tmp_path: Path, sock_dir: str, apiserver: FakeApiServer) -> Node:
    apiserver.add_node(NODE)
    return Node(tmp_path, sock_dir, apiserver)


def bind_mig_pod(
    node: Node,
    name: str,
    allocations: Sequence[MigAllocation],
    *,
    sign: bool = True,
    tamper: str | None = None,
) -> None:
    """A pod as the scheduler binds it to a MIG-mode GPU: its booking (one 1g.10gb device of
    GPU 0) and MIG allocations, signed over its UID; `tamper` replaces the allocation annotation
    after signing (what a tenant could write)."""
    containers = [make_container("cuda", limits={"nvidia.com/gpu": "1"})]
    uid = str(node.apiserver.add_pod(make_pod(name, node_name=NODE, containers=containers))[
        "metadata"]["uid"])  # fmt: skip
    booked = codec.encode_pod_devices(((ContainerDevice(GPU, "NVIDIA", 9728, 15),),))
    annotations = {
        ANNOTATION_DEVICES_TO_ALLOCATE: booked,
        ANNOTATION_DEVICES_ALLOCATED: booked,
        ANNOTATION_VGPU_NODE: NODE,
        ANNOTATION_BIND_TIME: "1705054797",
        ANNOTATION_BIND_PHASE: "allocating",
        ANNOTATION_VGPU_MIG_ALLOCATIONS: encode_mig_allocations(allocations),
    }
    if sign:
        fields = signed_fields(uid, annotations)
        assert fields is not None and fields.mig is not None
        annotations[ANNOTATION_BOOKING_SIGNATURE] = KEYS.sign(fields)
    if tamper is not None:
        annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS] = tamper
    node.apiserver.update_object(
        "pods", "default", name, lambda pod: pod["metadata"]["annotations"].update(annotations)
    )
    set_lock(node.apiserver, f"2026-01-01T00:00:00Z,default,{name}")


def reservation(start: int = 6, size: int = 1, profile: str = "1g.10gb") -> MigAllocation:
    return MigAllocation(0, 0, GPU, profile, MigPlacement(start, size))


def registered(apiserver: FakeApiServer) -> str | None:
    got = apiserver.get_node(NODE)
    assert got is not None
    value = got["metadata"]["annotations"].get(ANNOTATION_NODE_REGISTER)
    return None if value is None else str(value)


def test_the_node_registers_its_mig_profiles_and_resets_the_idle_gpu(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    with node.daemon():
        wait_until(lambda: registered(node.apiserver) is not None, "the register annotation")
        value = registered(node.apiserver)
        assert value is not None
        devices = codec.decode_node_devices(value)
        shape = [(d.uuid, d.mode, d.split_count, d.memory_mib, d.cores_percent) for d in devices]
        assert shape == [(GPU, "mig", 7, 81920, 100), (IDLE, "mig", 7, 81920, 100)]
        # NVML's values for the allowlisted profiles (fake NVML: an A100-SXM4-80GB).
        profiles = {p.name: p for p in devices[0].mig_profiles}
        assert list(profiles) == ["1g.10gb", "3g.40gb", "7g.80gb"]
        assert (profiles["1g.10gb"].memory_mib, profiles["1g.10gb"].cores) == (9728, 15)
        assert profiles["3g.40gb"].placements == (MigPlacement(0, 4), MigPlacement(4, 4))
        assert profiles["7g.80gb"].placements == (MigPlacement(0, 8),)
        # No pod holds either GPU, so both were reset: GPU 1's stale instance is gone.
        assert node.instances(1) == ()
    capsys.readouterr()
    assert main(["decode", ANNOTATION_NODE_REGISTER, value]) == 0
    shown = capsys.readouterr().out
    assert '"mode": "mig"' in shown and '"name": "3g.40gb"' in shown


def test_a_signed_reservation_is_realised_adopted_after_a_restart_and_removed_with_its_pod(
    node: Node,
) -> None:
    with node.daemon() as (daemon, kubelet):
        bind_mig_pod(node, "mig-pod", [reservation()])
        answer = kubelet.allocate([f"{GPU}-0"]).container_responses[0]
        (instance,) = node.instances(0)
        assert instance.placement == SLOT_6 and instance.profile == "1g.10gb"
        assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": instance.uuid}
        assert list(answer.mounts) == []  # no HAMi-core on a MIG device
        annotations = pod_annotations(node.apiserver, "mig-pod")
        assert annotations[ANNOTATION_BIND_PHASE] == "success"
        (recorded,) = decode_mig_allocations(annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS])
        assert recorded == reservation().with_runtime(
            instance.uuid, instance.gpu_instance_id, instance.compute_instance_id
        )
        # HAMi's hami_mig_device_info, with the identity NVML gave the instance.
        assert daemon.metrics is not None
        sample = value(
            scrape(daemon.metrics.url),
            "hami_mig_device_info",
            pod="mig-pod",
            container="cuda",
            vdevice_index="0",
            device_uuid=GPU,
            mig_uuid=instance.uuid,
            profile="1g.10gb",
            gpu_instance_id=str(instance.gpu_instance_id),
            compute_instance_id=str(instance.compute_instance_id),
        )
        assert sample == 1

    # A new daemon: the pod still runs, so GPU 0 is not reset and its instance is adopted.
    with node.daemon() as (daemon, _):
        assert node.instances(0) == (instance,)
        assert daemon.dynamic_mig is not None
        assert [i.mig_uuid for i in daemon.dynamic_mig.manager.tracked().values()] == [
            instance.uuid
        ]
        node.apiserver.delete_pod("default", "mig-pod")
        mig = daemon.dynamic_mig

        def released() -> bool:
            mig.reconcile()
            return node.instances(0) == ()

        wait_until(released, "the instance of the deleted pod destroyed")
        assert mig.manager.tracked() == {}


@pytest.mark.parametrize(
    ("sign", "tamper"),
    [
        (False, None),
        # Signed for placement 6; the tenant moves it onto slices another pod may hold.
        (True, encode_mig_allocations([reservation(start=4, size=4, profile="3g.40gb")])),
    ],
    ids=["unsigned", "moved-after-signing"],
)
def test_a_forged_or_unsigned_reservation_gets_no_instance(
    node: Node, sign: bool, tamper: str | None
) -> None:
    with node.daemon() as (_, kubelet):
        bind_mig_pod(node, "forged", [reservation()], sign=sign, tamper=tamper)
        with pytest.raises(grpc.RpcError) as caught:
            kubelet.allocate([f"{GPU}-0"])
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "booking not signed by the scheduler" in caught.value.details()
        assert node.instances(0) == ()
        assert pod_annotations(node.apiserver, "forged")[ANNOTATION_BIND_PHASE] == "failed"


def test_a_reservation_nvml_refuses_fails_the_pod_with_hamis_message(node: Node) -> None:
    with node.daemon() as (_, kubelet):
        # Signed, but at a placement the 3g.40gb profile does not have.
        bind_mig_pod(node, "odd", [reservation(start=2, size=4, profile="3g.40gb")])
        with pytest.raises(grpc.RpcError) as caught:
            kubelet.allocate([f"{GPU}-0"])
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert caught.value.details() == (
            "pod default/odd: resolve allocated NVIDIA devices: scheduler selected invalid "
            "placement {Start:2 Size:4} for profile 3g.40gb"
        )
        assert node.instances(0) == ()
        assert pod_annotations(node.apiserver, "odd")[ANNOTATION_BIND_PHASE] == "failed"
        (event,) = node.apiserver.events("default")
        assert (event["reason"], event["type"]) == ("AllocateFailed", "Warning")


def test_an_allocate_whose_write_is_refused_destroys_what_it_created(node: Node) -> None:
    with node.daemon() as (_, kubelet):
        bind_mig_pod(node, "refused", [reservation()])
        # The API server refuses the write that consumes the entry and records the identity.
        node.apiserver.inject_fault("PATCH", "/api/v1/namespaces/default/pods/refused", status=403)
        with pytest.raises(grpc.RpcError):
            kubelet.allocate([f"{GPU}-0"])
        assert node.instances(0) == ()
        annotations = pod_annotations(node.apiserver, "refused")
        assert annotations[ANNOTATION_BIND_PHASE] == "failed"
        (stored,) = decode_mig_allocations(annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS])
        assert not stored.runtime_ready
