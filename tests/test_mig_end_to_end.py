"""MIG end to end: the scheduler extender and the device plugin together, over the real wires.

What runs for real: the API server double (HTTP); `hami scheduler` in-process on a loopback
port (`tests/extender/cluster.py`), with a booking key file; the device-plugin daemon on a
thread, on a fake NVML GPU file, its settings resolved from HAMi's device ConfigMap
(`nvidia.migProfileAllowlist` as HAMi v2.10's chart ships it,
charts/hami/templates/scheduler/device-configmap.yaml:35-53) and a `nodeconfig` entry with
`operatingmode: mig`, sharing the scheduler's booking key file; the test kubelet over gRPC on a
unix socket. The test plays kube-scheduler (POST /filter, then /bind to the node returned) and
kubelet's admission (GetPreferredAllocation over the advertised IDs, then Allocate).

What is checked against what: the scheduler's reservation (`hami.io/vgpu-mig-allocations`, as
its /bind wrote it) against what the fake NVML holds afterwards (a second NVML session on the
same GPU file: profile, placement, UUID), the container's environment against that UUID, and
the scheduler's next decisions against the placements the live pods hold.

Dynamic MIG: two A100-SXM4-80GB in MIG mode. Static MIG (`--mig-strategy mixed`): one A100
pre-split (`mig_devices`) and one plain GPU; the extender lets a pod asking only
`nvidia.com/mig-1g.10gb` through to every node (HAMi scheduler.go:1080-1087), kube-scheduler
places it, and kubelet's Allocate on that resource's socket gets the MIG device's UUID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client as k8s

from hami_plugin.deviceplugin.api import api_pb2
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.mig.devices import MigDevice
from hami_plugin.deviceplugin.mig.nvml import NvmlMig
from hami_plugin.deviceplugin.settings import (
    DevicePluginSettings,
    add_arguments,
    resolve_settings,
)
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol import codec
from hami_plugin.protocol.mig import MigAllocation, decode_mig_allocations, encode_mig_allocations
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    MigPlacement,
)
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet
from tests.bookings import verify_pod
from tests.extender.cluster import FAST_RETRY, Scheduler, running_scheduler
from tests.extender.helpers import gpu_pod
from tests.extender.signing import KEYS, write_key_file, write_public_key_file
from tests.processes import wait_until

NODE = "mig-node-1"
OTHER_NODE = "cpu-node"
NODES = [NODE, OTHER_NODE]
NAMESPACE = "default"
CARD = "NVIDIA A100-SXM4-80GB"
GPUS = (
    "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448",
    "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4",
)
# HAMi v2.10's chart, device-configmap.yaml:35-53 (the A100-SXM4-80GB line is 40-41): names
# taken as written, looked up in NVML by their slice group (migmgr.go:23-31, 109-114).
CHART_ALLOWLIST: list[dict[str, list[str]]] = [
    {"models": ["A30"], "profiles": ["1g.6gb", "2g.12gb", "4g.24gb"]},
    {"models": ["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"],
     "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]},
    {"models": ["A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"],
     "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"]},
    {"models": ["H100-PCIE-80GB", "H100-SXM5-80GB"],
     "profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]},
]  # fmt: skip
# NVML's A100-SXM4-80GB values (fake NVML, as a real one reports them): memory MiB, cores
# (multiprocessors as a percentage of the 7g profile's 98, rounded up, register.go:241-243),
# placements.
PROFILES = {
    "1g.10gb": (9728, 15, tuple(MigPlacement(i, 1) for i in range(7))),
    "2g.20gb": (19968, 29, (MigPlacement(0, 2), MigPlacement(2, 2), MigPlacement(4, 2))),
    "3g.40gb": (40192, 43, (MigPlacement(0, 4), MigPlacement(4, 4))),
    "7g.79gb": (80640, 100, (MigPlacement(0, 8),)),
}
NVML_NAME = {"1g.10gb": "1g.10gb", "2g.20gb": "2g.20gb", "3g.40gb": "3g.40gb", "7g.79gb": "7g.80gb"}
"""The name NVML (go-nvlib) gives each allowlisted profile's instances: the chart's `7g.79gb` is
NVML's `7g.80gb`; HAMi matches instances by slice group and placement (migmgr.go:349-378,
445-490), so the reservation keeps the chart's name."""
MIG_MODE = {"nvidia.com/vgpu-mode": "mig"}


def resolve(argv: Sequence[str]) -> DevicePluginSettings:
    """The daemon's settings as `hami device-plugin <argv>` resolves them (no environment)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve_settings(parser.parse_args(list(argv)), {})


@dataclass
class MigNode:
    """One node's device plugin (not running until `daemon()`), and the test's own NVML session
    on the node's fake GPU file: the fake's state file shows what the daemon did."""

    apiserver: FakeApiServer
    settings: DevicePluginSettings
    tmp_path: Path
    nvml: NvmlMig

    def instances(self, index: int) -> tuple[MigDevice, ...]:
        return tuple(self.nvml.mig_devices(index))

    def all_instances(self) -> dict[str, MigDevice]:
        """MIG UUID -> instance, over both GPUs."""
        return {i.uuid: i for index in range(len(GPUS)) for i in self.instances(index)}

    @contextlib.contextmanager
    def daemon(self, resources: int = 1) -> Iterator[tuple[DevicePluginDaemon, FakeKubelet]]:
        """The daemon with a test kubelet, serving and registered when the block starts."""
        kube = KubeClient(self.apiserver.api_client(), FAST_RETRY)
        daemon = DevicePluginDaemon(
            self.settings,
            load_nvml=load_nvml_module,
            kube=kube,
            vgpulock_path=str(self.tmp_path / "vgpulock"),
        )
        sock_dir = self.settings.device_plugin_path
        kubelet = FakeKubelet(sock_dir).start()
        exit_codes: list[int] = []
        thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()), name="mig-dp")
        thread.start()
        try:
            assert daemon.started.wait(10)
            kubelet.wait_for_registrations(resources)
            yield daemon, kubelet
        finally:
            daemon.stop()
            thread.join(10)
            kubelet.stop()
            kube.close()
        assert exit_codes == [0]


@dataclass
class Cluster:
    apiserver: FakeApiServer
    scheduler: Scheduler
    node: MigNode
    given: dict[str, str] = field(default_factory=dict)
    """Pod name -> the device ID kubelet handed its container (it offers only the others)."""

    def pod(self, name: str) -> dict[str, Any]:
        pod = self.apiserver.get_pod(NAMESPACE, name)
        assert pod is not None
        return pod

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.pod(name)["metadata"].get("annotations", {}))

    def reservation(self, name: str) -> tuple[MigAllocation, ...]:
        return tuple(
            decode_mig_allocations(self.annotations(name)[ANNOTATION_VGPU_MIG_ALLOCATIONS])
        )

    def schedule(self, name: str, memory: int, annotations: Mapping[str, str] | None = None) -> str:
        """Create a pod asking one GPU of `memory` MiB and filter + bind it (kube-scheduler's
        part); the node it went to."""
        created = self.apiserver.add_object(gpu_pod(name, memory=memory, annotations=annotations))
        return self.scheduler.schedule(created, NODES)

    def admit(
        self, kubelet: FakeKubelet, name: str, *, signed: bool = True
    ) -> tuple[str, dict[str, str]]:
        """Kubelet admits pod `name`'s one GPU container: the ID it prefers among those still
        free (`signed`: one of the booked GPU's), then Allocate; the ID and the container's
        environment."""
        advertised = [s.id for s in kubelet.wait_for_list(lambda states: len(states) > 0)]
        free = [i for i in advertised if i not in self.given.values()]
        (chosen,) = kubelet.preferred(free, size=1)
        if signed:
            (booked,) = self.reservation(name)
            assert chosen.rpartition("-")[0] == booked.gpu_uuid, "kubelet accounts another GPU"
        answer = kubelet.allocate([chosen]).container_responses[0]
        self.given[name] = chosen
        assert ANNOTATION_BIND_PHASE in self.annotations(name)
        return chosen, dict(answer.envs)

    def occupied(self) -> dict[str, list[MigPlacement]]:
        """The placements in use per GPU, in the scheduler's ledger."""
        usage = self.scheduler.state.node_usage(NODE)
        assert usage is not None
        return {
            d.uuid: sorted(usage.occupied(i), key=lambda p: (p.start, p.size))
            for i, d in enumerate(usage.devices)
        }


def write_node(tmp_path: Path, sock_dir: str, gpus: list[dict[str, Any]], *extra: str) -> list[str]:
    """The fake GPU file, HAMi's device ConfigMap with the chart's allowlist, the booking key
    file; the daemon's command line."""
    gpus_file = tmp_path / "gpus.yaml"
    gpus_file.write_text(yaml.safe_dump({"gpus": gpus}), encoding="utf-8")
    config = tmp_path / "device-config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"nvidia": {"deviceSplitCount": 10, "migProfileAllowlist": CHART_ALLOWLIST}}
        ),
        encoding="utf-8",
    )
    return [
        "--node-name", NODE, "--device-plugin-path", sock_dir, "--nvml", "fake",
        "--fake-gpus", str(gpus_file), "--config-file", str(config),
        "--booking-key-file", str(tmp_path / "booking-public-keys"), "--hook-path",
        str(tmp_path / "hook"), "--register-interval-seconds", "0.2",
        "--metrics-bind-address", "0", "--pod-resources-socket", "", *extra,
    ]  # fmt: skip


@pytest.fixture
def sock_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="hami-mig-", dir="/tmp")  # unix socket paths stay short
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def nvml_session(settings: DevicePluginSettings) -> NvmlMig:
    """The test's own NVML session on the daemon's fake GPU file."""
    assert settings.fake_gpus is not None
    module = load_nvml_module("fake", settings.fake_gpus)
    module.nvmlInit()
    return NvmlMig(module)


@pytest.fixture
def cluster(apiserver: FakeApiServer, tmp_path: Path, sock_dir: str) -> Iterator[Cluster]:
    apiserver.add_node(NODE)
    apiserver.add_node(OTHER_NODE)
    key_file = write_key_file(tmp_path / "booking-keys")  # the scheduler's private key
    write_public_key_file(tmp_path / "booking-public-keys")  # the node's public key
    argv = write_node(
        tmp_path,
        sock_dir,
        [{"uuid": uuid, "name": CARD, "memory_mib": 81920, "mig": True} for uuid in GPUS],
    )
    node_config = tmp_path / "node-config.json"
    node_config.write_text(
        json.dumps({"nodeconfig": [{"name": NODE, "operatingmode": "mig"}]}), encoding="utf-8"
    )
    settings = resolve([*argv, "--node-config-file", str(node_config)])
    assert settings.operating_mode == "mig"
    node = MigNode(apiserver, settings, tmp_path, nvml_session(settings))
    with running_scheduler(apiserver, booking_key_file=str(key_file)) as scheduler:
        yield Cluster(apiserver, scheduler, node)


def register_of(apiserver: FakeApiServer) -> str | None:
    stored = apiserver.get_node(NODE)
    assert stored is not None
    value = stored["metadata"].get("annotations", {}).get(ANNOTATION_NODE_REGISTER)
    return None if value is None else str(value)


def check_registered(cluster: Cluster) -> None:
    """The daemon's register annotation, and the scheduler's view of it."""
    wait_until(lambda: register_of(cluster.apiserver) is not None, "the register annotation")
    value = register_of(cluster.apiserver)
    assert value is not None
    devices = codec.decode_node_devices(value)
    assert [(d.uuid, d.index, d.mode, d.split_count, d.memory_mib, d.healthy) for d in devices] == [
        (uuid, index, "mig", 7, 81920, True) for index, uuid in enumerate(GPUS)
    ]
    for device in devices:
        assert {
            p.name: (p.memory_mib, p.cores, p.placements) for p in device.mig_profiles
        } == PROFILES
        assert [p.name for p in device.mig_profiles] == list(PROFILES)  # the chart's order

    def scheduler_sees() -> bool:
        usage = cluster.scheduler.state.node_usage(NODE)
        return usage is not None and len(usage.devices) == len(GPUS)

    wait_until(scheduler_sees, "the scheduler's node watch has the register annotation")
    usage = cluster.scheduler.state.node_usage(NODE)
    assert usage is not None
    assert [(d.uuid, d.mode, d.mig_profiles) for d in usage.devices] == [
        (d.uuid, "mig", d.mig_profiles) for d in devices
    ]


def scheduled(cluster: Cluster, name: str) -> MigAllocation:
    """Pod `name`'s one reservation as the scheduler's bind wrote it (not realised yet)."""
    (booked,) = cluster.reservation(name)
    assert not booked.runtime_ready
    return booked


def check_realised(
    cluster: Cluster, name: str, booked: MigAllocation, envs: Mapping[str, str]
) -> MigDevice:
    """Pod `name`'s reservation `booked` (as the scheduler wrote it) realised: NVML's instance
    at exactly its placement and of its profile, the container given that instance's UUID, the
    runtime identity recorded next to the scheduler's part, the signature still good."""
    position = GPUS.index(booked.gpu_uuid)
    (instance,) = [i for i in cluster.node.instances(position) if i.placement == booked.placement]
    assert instance.profile == NVML_NAME[booked.profile]
    assert envs == {"NVIDIA_VISIBLE_DEVICES": instance.uuid}
    annotations = cluster.annotations(name)
    assert annotations[ANNOTATION_BIND_PHASE] == "success"
    assert cluster.reservation(name) == (
        booked.with_runtime(instance.uuid, instance.gpu_instance_id, instance.compute_instance_id),
    )
    assert verify_pod(KEYS, cluster.pod(name)["metadata"]["uid"], annotations)
    memory, cores, _ = PROFILES[booked.profile]  # booked at the profile's memory and cores
    assert (
        annotations[ANNOTATION_DEVICES_ALLOCATED] == f"{booked.gpu_uuid},NVIDIA,{memory},{cores}:;"
    )
    return instance


def check_instance(cluster: Cluster, name: str) -> MigDevice:
    """The instance NVML holds for pod `name`'s realised reservation (by its recorded UUID)."""
    (booked,) = cluster.reservation(name)
    assert booked.runtime_ready
    instance = cluster.node.all_instances()[booked.mig_uuid]
    assert (instance.profile, instance.placement) == (NVML_NAME[booked.profile], booked.placement)
    return instance


def instance_changes(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the daemon's MIG instance manager logged creating or releasing since the last
    `caplog.clear()` (NVML's state alone cannot tell an adopted instance from one re-created at
    the same place: the fake derives MIG UUIDs from the instance IDs, which NVML reuses)."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "hami_plugin.deviceplugin.mig.manager"
        and record.getMessage().startswith(("created ", "released "))
    ]


def test_mig_pods_are_placed_realised_and_released_end_to_end(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hami_plugin.deviceplugin.mig")
    node = cluster.node
    with node.daemon() as (daemon, kubelet):
        check_registered(cluster)
        assert node.all_instances() == {}

        placed: dict[str, MigAllocation] = {}
        for name, memory, annotations in (
            ("small", 9000, None),
            ("medium", 30000, None),
            ("strict", 9000, MIG_MODE),
        ):
            assert cluster.schedule(name, memory, annotations) == NODE
            placed[name] = scheduled(cluster, name)
            _, envs = cluster.admit(kubelet, name)
            check_realised(cluster, name, placed[name], envs)
        # Spread (HAMi's default GPU policy) takes the higher index first among equal GPUs;
        # mig_topology.go's placement choice fills 1g slices from the top.
        assert [(placed[n].gpu_uuid, placed[n].profile, placed[n].placement) for n in placed] == [
            (GPUS[1], "1g.10gb", MigPlacement(6, 1)),
            (GPUS[0], "3g.40gb", MigPlacement(4, 4)),
            (GPUS[1], "1g.10gb", MigPlacement(5, 1)),
        ]
        assert sorted((i.profile, i.placement.start) for i in node.all_instances().values()) == [
            ("1g.10gb", 5),
            ("1g.10gb", 6),
            ("3g.40gb", 4),
        ]
        # The scheduler's next decision sees the placements taken: 60000 MiB is the 7g profile
        # (the whole GPU); GPU 0 lacks the memory, GPU 1 has it but not the slices.
        assert cluster.occupied() == {
            GPUS[0]: [MigPlacement(4, 4)],
            GPUS[1]: [MigPlacement(5, 1), MigPlacement(6, 1)],
        }
        whole = cluster.apiserver.add_object(gpu_pod("whole", memory=60000))
        answer = cluster.scheduler.filter(whole, NODES)
        assert not answer["NodeNames"]
        assert answer["FailedNodes"] == {
            NODE: "1/2 CardInsufficientMemory, 1/2 CardMigTopologyInfeasible",
            OTHER_NODE: "node unregistered",
        }

        # --- a pod goes: its instance is destroyed, its placement free for the next pod ---
        by_pod = {name: check_instance(cluster, name) for name in placed}
        cluster.apiserver.delete_pod(NAMESPACE, "small")
        cluster.given.pop("small")
        mig = daemon.dynamic_mig
        assert mig is not None

        def released() -> bool:
            mig.reconcile()  # as its thread does every 5 s (HAMi's period), without the wait
            return by_pod["small"].uuid not in node.all_instances()

        wait_until(released, "the device plugin destroys the deleted pod's instance")
        assert set(node.all_instances()) == {by_pod["medium"].uuid, by_pod["strict"].uuid}
        wait_until(
            lambda: cluster.occupied()[GPUS[1]] == [MigPlacement(5, 1)],
            "the scheduler's ledger frees the deleted pod's placement",
        )
        assert cluster.schedule("again", 9000) == NODE
        again = scheduled(cluster, "again")
        assert (again.gpu_uuid, again.profile, again.placement) == (
            GPUS[1],
            "1g.10gb",
            MigPlacement(6, 1),
        )
        _, envs = cluster.admit(kubelet, "again")
        by_pod["again"] = check_realised(cluster, "again", again, envs)

    # --- the daemon restarts: live instances adopted, the instance of a gone pod destroyed ---
    # While no device plugin runs, GPU 0's only pod goes, and one of GPU 1's two.
    for name in ("medium", "strict"):
        cluster.apiserver.delete_pod(NAMESPACE, name)
        cluster.given.pop(name)
    assert any(m.startswith("created ") for m in instance_changes(caplog))  # the log is read
    caplog.clear()
    with node.daemon() as (daemon, kubelet):
        # GPU 1 is in use ("again"): not reset, its instance adopted, the same UUID (not
        # re-created). HAMi's start resets idle GPUs only (server.go:290-311, migmgr.go:116-119)
        # and its reconciler releases tracked allocations only (server.go:485-505), so HAMi
        # leaves the gone pod's instance on a GPU still in use; ours destroys it, idle and
        # claimed by no live reservation (mig.startup's sweep, docs/differences.md).
        assert set(node.instances(1)) == {by_pod["again"]}
        assert by_pod["strict"].uuid in caplog.text  # "destroyed MIG instance ...", logged
        assert daemon.dynamic_mig is not None
        tracked = daemon.dynamic_mig.manager.tracked().values()
        assert [i.mig_uuid for i in tracked] == [by_pod["again"].uuid]
        assert check_instance(cluster, "again") == by_pod["again"]
        assert instance_changes(caplog) == []  # adopted: neither released nor created again
        # GPU 0 is idle: reset at start, the gone pod's instance destroyed.
        assert node.instances(0) == ()

        # The whole-GPU pod fits GPU 0 now (GPU 1 still lacks the slices), and is realised.
        wait_until(lambda: cluster.occupied()[GPUS[0]] == [], "GPU 0 free in the ledger")
        assert cluster.scheduler.schedule(whole, NODES) == NODE
        booked = scheduled(cluster, "whole")
        assert (booked.gpu_uuid, booked.profile, booked.placement) == (
            GPUS[0],
            "7g.79gb",
            MigPlacement(0, 8),
        )
        _, envs = cluster.admit(kubelet, "whole")
        whole_instance = check_realised(cluster, "whole", booked, envs)

    # Restarted again: the 7g instance (NVML's `7g.80gb`) is adopted for the `7g.79gb` booking.
    caplog.clear()
    with node.daemon() as (daemon, _):
        assert node.instances(0) == (whole_instance,)
        assert instance_changes(caplog) == []
        assert daemon.dynamic_mig is not None
        assert sorted(i.mig_uuid for i in daemon.dynamic_mig.manager.tracked().values()) == sorted(
            (by_pod["again"].uuid, whole_instance.uuid)
        )


NOT_SIGNED = "booking not signed by the scheduler"


def test_a_reservation_a_tenant_moved_or_forged_gets_no_instance(cluster: Cluster) -> None:
    node = cluster.node
    with node.daemon() as (_, kubelet):
        check_registered(cluster)

        # Bound and signed by the scheduler; the tenant moves the placement before Allocate.
        assert cluster.schedule("victim", 9000) == NODE
        booked = scheduled(cluster, "victim")
        assert (booked.gpu_uuid, booked.placement) == (GPUS[1], MigPlacement(6, 1))
        assert cluster.occupied() == {GPUS[0]: [], GPUS[1]: [MigPlacement(6, 1)]}
        moved = MigAllocation(0, 0, booked.gpu_uuid, booked.profile, MigPlacement(0, 1))
        cluster.apiserver.update_object(
            "pods",
            NAMESPACE,
            "victim",
            lambda pod: pod["metadata"]["annotations"].update(
                {ANNOTATION_VGPU_MIG_ALLOCATIONS: encode_mig_allocations([moved])}
            ),
        )
        with pytest.raises(grpc.RpcError) as caught:
            cluster.admit(kubelet, "victim", signed=False)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert NOT_SIGNED in caught.value.details()
        assert node.all_instances() == {}  # nothing created, at either placement
        annotations = cluster.annotations("victim")
        assert annotations[ANNOTATION_BIND_PHASE] == "failed"
        assert ANNOTATION_BOOKING_SIGNATURE in annotations  # the scheduler's, for the old value
        assert not verify_pod(KEYS, cluster.pod("victim")["metadata"]["uid"], annotations)
        (event,) = [
            e
            for e in cluster.apiserver.events(NAMESPACE)
            if e["involvedObject"]["name"] == "victim" and e["reason"] == "AllocateFailed"
        ]
        assert event["type"] == "Warning"
        assert NOT_SIGNED in event["message"]
        # The scheduler books neither the moved placement nor, once the booking no longer
        # verifies, the one it signed.
        wait_until(
            lambda: cluster.occupied() == {GPUS[0]: [], GPUS[1]: []},
            "the scheduler drops the booking that no longer verifies",
        )

        # A pod created with a reservation of the tenant's own (the 3g slices 0-3 of GPU 1):
        # the scheduler's bind replaces it with its own, signed, and that is what is realised.
        forged = MigAllocation(0, 0, GPUS[1], "3g.40gb", MigPlacement(0, 4))
        created = cluster.apiserver.add_object(
            gpu_pod(
                "forger",
                memory=9000,
                annotations={ANNOTATION_VGPU_MIG_ALLOCATIONS: encode_mig_allocations([forged])},
            )
        )
        assert cluster.scheduler.schedule(created, NODES) == NODE
        booked = scheduled(cluster, "forger")
        assert (booked.gpu_uuid, booked.profile, booked.placement) == (
            GPUS[1],
            "1g.10gb",
            MigPlacement(6, 1),
        )
        _, envs = cluster.admit(kubelet, "forger")
        instance = check_realised(cluster, "forger", booked, envs)
        assert node.all_instances() == {instance.uuid: instance}

        # A pod the tenant binds to the node itself, with a copy of that signed booking (the
        # reservation as the scheduler wrote it, bind-phase allocating): the signature is over
        # the other pod's UID, so nothing is created for it.
        copied = {
            key: value
            for key, value in cluster.annotations("forger").items()
            if key.startswith(("hami.io/", "hami-plugin.io/"))
        }
        copied[ANNOTATION_VGPU_MIG_ALLOCATIONS] = encode_mig_allocations([booked])
        copied[ANNOTATION_BIND_PHASE] = "allocating"
        copied[ANNOTATION_DEVICES_TO_ALLOCATE] = copied[ANNOTATION_DEVICES_ALLOCATED]
        cluster.apiserver.add_pod(
            make_pod(
                "replay",
                node_name=NODE,
                annotations=copied,
                containers=[make_container("c0", limits={"nvidia.com/gpu": "1"})],
            )
        )
        with pytest.raises(grpc.RpcError) as caught:
            cluster.admit(kubelet, "replay", signed=False)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert NOT_SIGNED in caught.value.details()
        assert node.all_instances() == {instance.uuid: instance}
        assert cluster.annotations("replay")[ANNOTATION_BIND_PHASE] == "failed"
        assert [
            e["type"]
            for e in cluster.apiserver.events(NAMESPACE)
            if e["involvedObject"]["name"] == "replay" and e["reason"] == "AllocateFailed"
        ] == ["Warning"]
        # Nor does the scheduler book it: its watch has the pod, its ledger not the booking.
        cluster.scheduler.sees_pod(NAMESPACE, "replay", lambda pod: True)
        assert cluster.scheduler.state.tracked(f"{NAMESPACE}/replay") is None
        assert cluster.scheduler.state.tracked(f"{NAMESPACE}/forger") is not None


# --- static MIG: pre-split devices, `--mig-strategy mixed` ------------------------------------

PLAIN = "GPU-03f69c50-207a-2038-9b45-23cac89cb67a"
SPLIT_GPU = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
MIG_A = "MIG-11111111-1111-1111-1111-111111111111"
MIG_B = "MIG-22222222-2222-2222-2222-222222222222"
SMALL = "nvidia.com/mig-1g.10gb"


def test_a_static_mig_device_is_placed_by_kube_scheduler_and_allocated(
    apiserver: FakeApiServer, tmp_path: Path, sock_dir: str
) -> None:
    apiserver.add_node(NODE)
    apiserver.add_node(OTHER_NODE)
    key_file = write_key_file(tmp_path / "booking-keys")  # the scheduler's private key
    write_public_key_file(tmp_path / "booking-public-keys")  # the node's public key
    install_fake_hamicore(str(tmp_path / "hook"))
    gpus = [
        {"uuid": PLAIN, "name": CARD, "memory_mib": 81920},
        {"uuid": SPLIT_GPU, "name": CARD, "mig": True, "mig_devices": [
            {"profile": "1g.10gb", "start": 0, "uuid": MIG_A},
            {"profile": "1g.10gb", "start": 1, "uuid": MIG_B},
        ]},
    ]  # fmt: skip
    settings = resolve(write_node(tmp_path, sock_dir, gpus, "--mig-strategy", "mixed"))
    assert (settings.mig_strategy, settings.operating_mode) == ("mixed", "hami-core")
    node = MigNode(apiserver, settings, tmp_path, nvml_session(settings))
    api_client = apiserver.api_client()
    try:
        with (
            running_scheduler(apiserver, booking_key_file=str(key_file)) as scheduler,
            node.daemon(resources=2) as (_, kubelet),
        ):
            by_resource = {c.request.resource_name: c for c in kubelet.connections}
            assert sorted(by_resource) == ["nvidia.com/gpu", SMALL]
            small = kubelet.wait_for_list(
                lambda states: len(states) == 2, connection=by_resource[SMALL]
            )
            assert [(s.id, s.health) for s in small] == [(MIG_A, "Healthy"), (MIG_B, "Healthy")]
            shared = kubelet.wait_for_list(
                lambda states: len(states) == 10, connection=by_resource["nvidia.com/gpu"]
            )
            assert {s.id.rpartition("-")[0] for s in shared} == {PLAIN}
            # The register annotation, what the extender schedules, holds the plain GPU only.
            wait_until(lambda: register_of(apiserver) is not None, "the register annotation")
            value = register_of(apiserver)
            assert value is not None
            assert [(d.uuid, d.mode) for d in codec.decode_node_devices(value)] == [
                (PLAIN, "hami-core")
            ]

            # A pod asking only the MIG resource asks nothing the extender manages: every node
            # passes (HAMi scheduler.go:1080-1087), and nothing is written to the pod.
            pod = apiserver.add_pod(
                make_pod("static", containers=[make_container("cuda", limits={SMALL: "1"})])
            )
            answer = scheduler.filter(pod, NODES)
            assert (answer["NodeNames"], answer.get("FailedNodes"), answer["Error"]) == (
                NODES,
                None,
                "",
            )
            # kube-scheduler places it on its own (the node advertising the resource) and binds.
            binding = k8s.V1Binding(
                metadata=k8s.V1ObjectMeta(name="static", namespace=NAMESPACE),
                target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=NODE),
            )
            k8s.CoreV1Api(api_client).create_namespaced_pod_binding(
                "static", NAMESPACE, binding, _preload_content=False
            )
            stored = apiserver.get_pod(NAMESPACE, "static")
            assert stored is not None and stored["spec"]["nodeName"] == NODE
            assert stored["metadata"].get("annotations", {}) == {}
            assert scheduler.state.tracked(f"{NAMESPACE}/static") is None

            # Kubelet's Allocate on the resource's own socket: the MIG device's UUID.
            request = api_pb2.AllocateRequest()
            request.container_requests.add(devices_ids=[MIG_B])
            response = by_resource[SMALL].stub.Allocate(request, timeout=10)
            (container,) = response.container_responses
            assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": MIG_B}
            # The pre-split layout is NVML's, untouched.
            assert [(d.uuid, d.profile, d.placement) for d in node.instances(1)] == [
                (MIG_A, "1g.10gb", MigPlacement(0, 1)),
                (MIG_B, "1g.10gb", MigPlacement(1, 1)),
            ]
    finally:
        api_client.rest_client.close()
        api_client.close()  # type: ignore[no-untyped-call]
