"""Only signed bookings get GPUs, over real wires (issue 14, attack 1).

`hami device-plugin --nvml fake --booking-key-file ...` runs as a sub-process against the API
server double; the test kubelet registers it and its `PodAdmitter` admits pods as kubelet does
(GetPreferredAllocation, then Allocate over gRPC, pod status Running or Failed). A tenant's pod
is signed here with `BookingKeys.sign`, as the scheduler's bind signs it. The attacker's pod is
created the way the issue describes: `spec.nodeName` set, the label `hami.io/webhook: ignore`
(so the admission webhook never strips its annotations) and a hand-written booking naming all
four GPUs at 81920 MiB.
"""

from __future__ import annotations

import base64
import contextlib
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_VGPU_NODE,
    LABEL_VGPU_NODE,
    ContainerDevice,
    PodDevices,
)
from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    ANNOTATION_BOOKING_SIGNATURES,
    BookingFields,
)
from hami_plugin.testing.admission import PodAdmitter
from hami_plugin.testing.apiserver import FakeApiServer, JsonObject, make_container, make_pod
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet, ListedPod
from tests.bookings import (
    hmac_signature,
    keys_from,
    private_key_file_text,
    public_key_file_text,
)
from tests.processes import LoggedProcess, hami_command, wait_until

NODE = "gpu-node-1"
GPUS = [
    "GPU-03f69c50-207a-2038-9b45-23cac89cb67a",
    "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae",
    "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76",
    "GPU-d2b1c9e4-6a5f-4f0e-9b8d-3c7a1e2f4b60",
]
SPLIT = 4
EPOCH = datetime(2026, 3, 1, tzinfo=UTC)
KEY = "booking-key-for-the-wire-test-0123456789"
KEYS = keys_from(KEY.encode())
NOT_SIGNED = "booking not signed by the scheduler"
NO_KEY_WARNING = "no --booking-key-file"

FORGED = ("default", "forged")
TENANT = ("default", "tenant")
HOG = ("default", "hog")


@dataclass
class Node:
    apiserver: FakeApiServer
    kube: KubeClient
    kubelet: FakeKubelet
    plugin: LoggedProcess
    metrics_url: str


def stamp(seconds: int) -> str:
    return datetime.fromtimestamp(EPOCH.timestamp() + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def start_plugin(
    tmp_path: Path, sock_dir: str, apiserver: FakeApiServer, *args: str
) -> tuple[LoggedProcess, str]:
    """`hami device-plugin` on four fake A100s; the process and its /metrics URL."""
    gpus_file = tmp_path / "gpus.yaml"
    gpus = [
        {"uuid": uuid, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa_node": 0}
        for uuid in GPUS
    ]
    gpus_file.write_text(yaml.safe_dump({"gpus": gpus}), encoding="utf-8")
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    install_fake_hamicore(tmp_path / "hook")
    argv = hami_command(
        "device-plugin", "--nvml", "fake", "--fake-gpus", str(gpus_file), "--node-name", NODE,
        "--kubeconfig", str(kubeconfig), "--device-plugin-path", sock_dir,
        "--hook-path", str(tmp_path / "hook"), "--device-split-count", str(SPLIT),
        "--metrics-bind-address", "127.0.0.1:0", *args,
    )  # fmt: skip
    plugin = LoggedProcess("device-plugin", argv, tmp_path)
    try:
        url = plugin.wait_for_log(r"serving metrics on (http://\S+/metrics)").group(1)
    except BaseException:
        plugin.kill()
        raise
    return plugin, url


def key_file_args(tmp_path: Path) -> tuple[str, str]:
    """`--booking-key-file` naming a file of the one key the tests sign with."""
    key_file = tmp_path / "booking-keys"
    key_file.write_text(public_key_file_text(KEY), encoding="utf-8")
    return "--booking-key-file", str(key_file)


@pytest.fixture
def signed_node(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    """The device plugin with a booking key (a file of one key), registered with the kubelet."""
    yield from _running(sock_dir, tmp_path, apiserver, kube, *key_file_args(tmp_path))


@pytest.fixture
def open_node(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[Node]:
    """The device plugin without a booking key: HAMi's behaviour."""
    yield from _running(sock_dir, tmp_path, apiserver, kube)


def _running(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient, *args: str
) -> Iterator[Node]:
    apiserver.add_node(NODE)
    with FakeKubelet(sock_dir) as kubelet:
        socket = ("--pod-resources-socket", kubelet.pod_resources_socket)
        plugin, url = start_plugin(tmp_path, sock_dir, apiserver, *socket, *args)
        try:
            kubelet.wait_for_registrations(1, timeout=15)
            kubelet.wait_for_list(lambda states: len(states) == len(GPUS) * SPLIT, timeout=30.0)
            yield Node(apiserver, kube, kubelet, plugin, url)
            code = plugin.stop(15)
        finally:
            plugin.kill()  # only when something above failed: the exit status is kept
        assert code == 0, plugin.log()


# --- the pods ------------------------------------------------------------------------------------


def entries(*devices: tuple[int, int]) -> PodDevices:
    """One container's booking: (GPU index, MiB) per device, all the SMs."""
    return ((*(ContainerDevice(GPUS[i], "NVIDIA", mib, 100) for i, mib in devices),),)


ALL_FOUR = entries((0, 81920), (1, 81920), (2, 81920), (3, 81920))


def gpu_container(count: int, resource: str = "nvidia.com/gpu", name: str = "cuda") -> JsonObject:
    return make_container(name, limits={resource: str(count)})


def create_forged(
    apiserver: FakeApiServer,
    *,
    signature: str | None = None,
    booking: PodDevices = ALL_FOUR,
    asks_for: str | None = "nvidia.com/gpu",
) -> None:
    """The attacker's pod: bound by its author, webhook skipped, a booking of its own making;
    its container asks for as many `asks_for` as the booking names (nothing when None)."""
    value = codec.encode_pod_devices(booking)
    annotations = {
        ANNOTATION_BIND_PHASE: "allocating",
        ANNOTATION_BIND_TIME: str(int(EPOCH.timestamp())),
        ANNOTATION_VGPU_NODE: NODE,
        ANNOTATION_DEVICES_TO_ALLOCATE: value,
    }
    if signature is not None:
        annotations[ANNOTATION_DEVICES_ALLOCATED] = value
        annotations[ANNOTATION_BOOKING_SIGNATURE] = signature
    pod = make_pod(
        FORGED[1],
        node_name=NODE,
        labels={"hami.io/webhook": "ignore"},
        annotations=annotations,
        containers=[
            gpu_container(len(booking[0]), asks_for) if asks_for else make_container("cuda")
        ],
        creation_timestamp=stamp(0),
    )
    apiserver.add_pod(pod)


def create_and_bind_tenant(node: Node, booking: PodDevices) -> None:
    """A tenant's pod with one container per booked entry, then what the scheduler's bind
    writes: one annotation patch with the booking signed over the pod's UID, then the Binding."""
    apiserver = node.apiserver
    containers = [
        gpu_container(len(entry), name="cuda" if index == 0 else f"cuda-{index}")
        for index, entry in enumerate(booking)
    ]
    pod = make_pod(TENANT[1], containers=containers, creation_timestamp=stamp(5))
    uid = str(apiserver.add_pod(pod)["metadata"]["uid"])
    value = codec.encode_pod_devices(booking)
    bind_time = str(int(EPOCH.timestamp()) + 6)
    signature = KEYS.sign(BookingFields(uid=uid, node=NODE, devices=value, bind_time=bind_time))
    node.kube.patch_pod_metadata(
        *TENANT,
        {
            ANNOTATION_DEVICES_TO_ALLOCATE: value,
            ANNOTATION_DEVICES_ALLOCATED: value,
            ANNOTATION_VGPU_NODE: NODE,
            ANNOTATION_BIND_PHASE: "allocating",
            ANNOTATION_BIND_TIME: bind_time,
            ANNOTATION_BOOKING_SIGNATURE: signature,
        },
        {LABEL_VGPU_NODE: NODE},
    )
    node.kube.bind_pod(*TENANT, uid, NODE)


def create_hog(apiserver: FakeApiServer) -> None:
    """A pod that asks for no GPU but carries a booking of every GPU (ledger poisoning)."""
    value = codec.encode_pod_devices(ALL_FOUR)
    pod = make_pod(
        HOG[1],
        node_name=NODE,
        labels={"hami.io/webhook": "ignore", LABEL_VGPU_NODE: NODE},
        annotations={ANNOTATION_VGPU_NODE: NODE, ANNOTATION_DEVICES_ALLOCATED: value},
        creation_timestamp=stamp(1),
    )
    apiserver.add_pod(pod)


def stored(apiserver: FakeApiServer, key: tuple[str, str]) -> JsonObject:
    pod = apiserver.get_pod(*key)
    assert pod is not None
    return pod


def admit_all(node: Node) -> PodAdmitter:
    with PodAdmitter(node.kubelet, node.apiserver.url, NODE, poll_interval_seconds=0.02) as kubelet:
        kubelet.wait_for([FORGED, TENANT, HOG], timeout=30)
    return kubelet


def slots_allocated(node: Node) -> dict[str, float]:
    with urllib.request.urlopen(node.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["device_uuid"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "hami_host_gpu_vgpu_slots_allocated"
        for sample in family.samples
    }


# --- the tests -----------------------------------------------------------------------------------

_WRONG_SIGNATURE = "v1:" + base64.b64encode(bytes(32)).decode()


@pytest.mark.parametrize(
    "signature", [None, _WRONG_SIGNATURE], ids=["as-in-the-issue", "made-up-signature"]
)
def test_a_forged_booking_gets_no_gpu_and_the_signed_tenant_is_served(
    signed_node: Node, signature: str | None
) -> None:
    node = signed_node
    create_forged(node.apiserver, signature=signature)
    create_and_bind_tenant(node, entries((3, 81920)))  # the whole of GPU 3: the victim
    create_hog(node.apiserver)
    kubelet = admit_all(node)

    # The forged pod: its Allocate failed, no container of it got a device.
    assert kubelet.failures[FORGED].startswith("Allocate failed due to rpc error: ")
    assert NOT_SIGNED in kubelet.failures[FORGED]
    assert [key for key in kubelet.responses if key[:2] == FORGED] == []
    forged = stored(node.apiserver, FORGED)
    assert forged["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "failed"
    assert forged["status"]["phase"] == "Failed"
    (event,) = [
        e for e in node.apiserver.events("default") if e["involvedObject"]["name"] == "forged"
    ]
    assert event["type"] == "Warning"
    assert event["reason"] == "AllocateFailed"
    assert NOT_SIGNED in event["message"]

    # The tenant signed by the scheduler: served with GPU 3, as booked.
    assert sorted(kubelet.admitted) == [HOG, TENANT]
    (container,) = [r for key, r in kubelet.responses.items() if key[:2] == TENANT]
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[3]
    assert container.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "81920m"
    tenant = stored(node.apiserver, TENANT)
    assert tenant["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "success"
    assert tenant["status"]["phase"] == "Running"

    # Nothing double-booked: GPU 3 went to the tenant alone, and the node's own count of
    # allocated slots holds the tenant's booking only (not the hog's, which runs without GPUs).
    assert stored(node.apiserver, HOG)["status"]["phase"] == "Running"
    expected = {GPUS[0]: 0, GPUS[1]: 0, GPUS[2]: 0, GPUS[3]: 1}
    wait_until(lambda: slots_allocated(node) == expected, "the signed booking alone counted")
    assert NO_KEY_WARNING not in node.plugin.log()


def test_kubelets_calls_for_a_forged_booking_neither_follow_it_nor_serve_it(
    signed_node: Node,
) -> None:
    node = signed_node
    create_forged(node.apiserver, booking=entries((2, 81920)))
    lock = "2026-03-01T00:00:00Z,default,forged"  # HAMi's node lock naming the forged pod
    node.apiserver.update_object(
        "nodes",
        "",
        NODE,
        lambda n: n["metadata"]["annotations"].update({ANNOTATION_NODE_LOCK: lock}),
    )
    node.kubelet.install_pod_resources(lambda: [ListedPod(*FORGED)])  # kubelet admits it
    # GetPreferredAllocation does not follow the forged booking to GPU 2: it falls back to the
    # first offered GPU, and marks nothing (kubelet's Allocate tells the pod).
    offered = [f"{GPUS[0]}-0", f"{GPUS[2]}-0"]
    assert node.kubelet.preferred(offered, size=1) == [f"{GPUS[0]}-0"]
    assert stored(node.apiserver, FORGED)["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == (
        "allocating"
    )
    with pytest.raises(grpc.RpcError) as caught:
        node.kubelet.allocate([f"{GPUS[2]}-0"])
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.details() == (
        f"pod default/forged: {NOT_SIGNED}: the pod has no {ANNOTATION_BOOKING_SIGNATURE}"
    )
    forged = stored(node.apiserver, FORGED)
    assert forged["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "failed"
    assert forged["metadata"]["annotations"][ANNOTATION_DEVICES_TO_ALLOCATE] == (
        codec.encode_pod_devices(entries((2, 81920)))
    )
    stored_node = node.apiserver.get_node(NODE)
    assert stored_node is not None
    assert ANNOTATION_NODE_LOCK not in stored_node["metadata"]["annotations"]  # released


@pytest.mark.parametrize(
    ("resource_args", "asks_for"),
    [
        ((), None),  # the forged pod asks for no GPU: kubelet never calls for it
        (("--resource-name", "example.com/vgpu"), "nvidia.com/gpu"),  # not our resource
        ((), "nvidia.com/gpu"),  # it could be what kubelet admits, but kubelet lists the tenant
    ],
    ids=["asks-for-nothing", "asks-for-another-resource", "asks-for-the-gpu"],
)
def test_an_older_forged_pod_does_not_take_the_tenants_call(
    sock_dir: str,
    tmp_path: Path,
    apiserver: FakeApiServer,
    kube: KubeClient,
    resource_args: tuple[str, ...],
    asks_for: str | None,
) -> None:
    """The forged pod is created first, with a one-GPU booking like the tenant's: as the
    in-flight wildcard it took the tenant's Allocate and failed it when it asked for the
    resource (a denial of service by pod creation). With a key every call asks kubelet's
    PodResources list, which shows the tenant being admitted, so the forged pod is no
    candidate (issue 25)."""
    args = (*key_file_args(tmp_path), *resource_args)
    with contextlib.contextmanager(_running)(sock_dir, tmp_path, apiserver, kube, *args) as node:
        create_forged(apiserver, booking=entries((2, 81920)), asks_for=asks_for)
        create_and_bind_tenant(node, entries((3, 81920)))
        node.kubelet.install_pod_resources(lambda: [ListedPod(*TENANT)])
        call = [f"{GPUS[3]}-0"]  # kubelet admitting the tenant (its preferred GPU)
        (container,) = node.kubelet.allocate(call).container_responses
        assert container.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[3]
        assert annotations_of(apiserver, TENANT)[ANNOTATION_BIND_PHASE] == "success"
        # The forged pod is not touched: it is nobody's answer.
        assert annotations_of(apiserver, FORGED)[ANNOTATION_BIND_PHASE] == "allocating"
        assert apiserver.events("default") == []


def test_an_entry_its_author_writes_back_is_not_served_twice(signed_node: Node) -> None:
    """Between a signed pod's two containers its author restores the consumed entry (the
    signed booking again): the second container still gets its own entry, GPU 1."""
    node = signed_node
    booking = (*entries((0, 40960)), *entries((1, 40960)))
    create_and_bind_tenant(node, booking)
    node.kubelet.install_pod_resources(lambda: [ListedPod(*TENANT)])  # kubelet admits it
    (first,) = node.kubelet.allocate([f"{GPUS[0]}-0"]).container_responses
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[0]
    restored = codec.encode_pod_devices(booking)
    node.apiserver.update_object(
        "pods",
        *TENANT,
        lambda pod: pod["metadata"]["annotations"].update(
            {ANNOTATION_DEVICES_TO_ALLOCATE: restored}
        ),
    )
    (second,) = node.kubelet.allocate([f"{GPUS[0]}-1"]).container_responses
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[1]
    assert second.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40960m"
    assert annotations_of(node.apiserver, TENANT)[ANNOTATION_BIND_PHASE] == "success"
    assert "which were served already: read as consumed" in node.plugin.log()


def annotations_of(apiserver: FakeApiServer, key: tuple[str, str]) -> dict[str, str]:
    return dict(stored(apiserver, key)["metadata"]["annotations"])


def test_without_a_key_the_forged_booking_is_served_as_hami_serves_it(open_node: Node) -> None:
    """What the key changes: the same pods on a node without one (HAMi-compatible)."""
    node = open_node
    create_forged(node.apiserver)
    create_and_bind_tenant(node, entries((3, 81920)))
    create_hog(node.apiserver)
    kubelet = admit_all(node)
    (forged,) = [r for key, r in kubelet.responses.items() if key[:2] == FORGED]
    assert forged.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(GPUS)
    assert forged.envs["CUDA_DEVICE_MEMORY_LIMIT_3"] == "81920m"
    assert stored(node.apiserver, FORGED)["status"]["phase"] == "Running"
    (tenant,) = [r for key, r in kubelet.responses.items() if key[:2] == TENANT]
    assert tenant.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[3]  # GPU 3 twice over
    # The hog's booking counts; the forged pod wrote no `-devices-allocated`, so it runs on
    # four GPUs that no count shows.
    expected = {GPUS[0]: 1, GPUS[1]: 1, GPUS[2]: 1, GPUS[3]: 2}
    wait_until(lambda: slots_allocated(node) == expected, "every booking counted, as in HAMi")
    assert node.plugin.log().count(NO_KEY_WARNING) == 1


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file or directory"),
        ("# no key yet\n\n", "no booking key in the file"),
        ("k" * 44 + "\n", "an HMAC key of the old scheme (v1) is accepted only in"),
        (private_key_file_text(KEY), "a node must hold only the public keys"),
    ],
    ids=["missing", "empty", "hmac-key", "private-key"],
)
def test_an_unusable_key_file_is_one_line_and_exit_two(
    tmp_path: Path, sock_dir: str, content: str | None, reason: str
) -> None:
    key_file = tmp_path / "booking-keys"
    if content is not None:
        key_file.write_text(content, encoding="utf-8")
    argv = hami_command(
        "device-plugin", "--nvml", "fake", "--fake-gpus", str(tmp_path / "gpus.yaml"),
        "--node-name", NODE, "--device-plugin-path", sock_dir, "--booking-key-file", str(key_file),
    )  # fmt: skip
    plugin = LoggedProcess("device-plugin", argv, tmp_path)
    code, output = plugin.wait(), plugin.log()
    assert code == 2, output
    (line,) = output.strip().splitlines()
    assert "ERROR" in line
    assert f"--booking-key-file {key_file}: " in line
    assert reason in line


# --- issue 25 item 3: a node holds only the public keys --------------------------------------

LEGACY_KEY = "the-hmac-booking-key-of-before-0123456789"


def sign_forged(node: Node, sign: Callable[[BookingFields], str]) -> str:
    """Sign the forged pod's booking for the UID the API server gave it, as an author who can
    compute `sign` would; the signature written."""
    pod = stored(node.apiserver, FORGED)
    annotations = pod["metadata"]["annotations"]
    value = annotations[ANNOTATION_DEVICES_TO_ALLOCATE]
    fields = BookingFields(
        uid=pod["metadata"]["uid"],
        node=NODE,
        devices=value,
        bind_time=annotations[ANNOTATION_BIND_TIME],
    )
    signature = sign(fields)
    node.kube.patch_pod_metadata(
        *FORGED,
        {ANNOTATION_DEVICES_ALLOCATED: value, ANNOTATION_BOOKING_SIGNATURE: signature},
        {},
    )
    return signature


def mounted_key(tmp_path: Path) -> bytes:
    """What a compromised node reads from its mounted key file: the first key line."""
    text = (tmp_path / "booking-keys").read_text(encoding="utf-8")
    return next(line for line in text.splitlines() if line and line[0] != "#").encode()


@pytest.mark.parametrize(
    "forge",
    [
        lambda key: lambda fields: hmac_signature(key, fields),
        lambda key: keys_from(key).sign,
    ],
    ids=["hmac-with-the-node-key", "ed25519-pair-of-its-own"],
)
def test_a_booking_signed_with_what_the_node_mounts_is_refused(
    signed_node: Node,
    tmp_path: Path,
    forge: Callable[[bytes], Callable[[BookingFields], str]],
) -> None:
    """Before: the node's key file held the one HMAC key, a booking signed with it verified
    and kubelet's Allocate served the forged pod's GPU. Now the file holds public keys only."""
    node = signed_node
    create_forged(node.apiserver, booking=entries((2, 81920)))
    sign_forged(node, forge(mounted_key(tmp_path)))
    node.kubelet.install_pod_resources(lambda: [ListedPod(*FORGED)])  # kubelet admits it
    with pytest.raises(grpc.RpcError) as caught:
        node.kubelet.allocate([f"{GPUS[2]}-0"])
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert f"{NOT_SIGNED}: {ANNOTATION_BOOKING_SIGNATURE} does not verify" in (
        caught.value.details() or ""
    )
    assert stored(node.apiserver, FORGED)["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == (
        "failed"
    )


@pytest.mark.parametrize("window", [True, False], ids=["legacy-file-given", "no-legacy-file"])
def test_a_booking_signed_with_hmac_before_the_upgrade_is_served_only_in_the_window(
    sock_dir: str,
    tmp_path: Path,
    apiserver: FakeApiServer,
    kube: KubeClient,
    window: bool,
) -> None:
    """A pod the scheduler bound before the upgrade (a v1 HMAC signature) that kubelet admits
    after it: served while --legacy-booking-key-file names the old key, refused without."""
    legacy = tmp_path / "legacy-keys"
    legacy.write_text(f"# the HMAC key of before\n{LEGACY_KEY}\n", encoding="utf-8")
    args = (*key_file_args(tmp_path), *(("--legacy-booking-key-file", str(legacy)) * window))
    for node in _running(sock_dir, tmp_path, apiserver, kube, *args):
        create_forged(node.apiserver, booking=entries((2, 81920)))
        sign_forged(node, lambda fields: hmac_signature(LEGACY_KEY.encode(), fields))
        node.kubelet.install_pod_resources(lambda: [ListedPod(*FORGED)])  # kubelet admits it
        # the node says what it checks, so the scheduler signs v1 for it only mid-upgrade
        wait_until(
            lambda: _announced(apiserver) == ("v2,v1" if window else "v2"),
            what="the node's booking-signatures annotation",
        )
        if window:
            response = node.kubelet.allocate([f"{GPUS[2]}-0"])
            (container,) = response.container_responses
            assert container.envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[2]
        else:
            with pytest.raises(grpc.RpcError) as caught:
                node.kubelet.allocate([f"{GPUS[2]}-0"])
            assert "does not verify" in (caught.value.details() or "")


def _announced(apiserver: FakeApiServer) -> str | None:
    stored = apiserver.get_node(NODE) or {}
    annotations = stored.get("metadata", {}).get("annotations") or {}
    value = annotations.get(ANNOTATION_BOOKING_SIGNATURES)
    return value if isinstance(value, str) else None
