"""Issue 27, 1: pods running on bookings made before the key (HAMi's scheduler, or ours keyless)
keep their GPUs counted once the scheduler has one; the forged-booking attacks stay closed.
Over the wire: the API server double, the real `kubernetes` client, `/filter` over HTTP,
`/metrics` parsed with the Prometheus text parser (docs/design.md 8.6)."""

from __future__ import annotations

import copy
import json
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from tests.extender.cluster import Scheduler, running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.extender.signing import booking, write_key_file
from tests.processes import LoggedProcess, wait_until

FIXTURES = Path(__file__).parent.parent / "fixtures" / "scheduler"
A100_NODE = "gpu-a100x8-0"
MIB = 2**20
# `hami schedule` of the four-GPU pod on the fixture without a key (docs/scheduling.md)
WITHOUT_A_KEY = "3/8 AllocatedCardsInsufficientRequest, 5/8 CardInsufficientMemory"
STARTED = "2026-01-01T00:00:05Z"


def kubelet_started(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod with the status kubelet writes once it admitted it and started its containers
    (`status.startTime` with its first status, then each container's `running` state)."""
    running = {"running": {"startedAt": STARTED}}
    pod["status"] = {
        "phase": "Running",
        "startTime": STARTED,
        "containerStatuses": [
            {"name": c["name"], "ready": True, "restartCount": 0, "state": running}
            for c in pod["spec"]["containers"]
        ],
    }
    return pod


def load_fixture(apiserver: FakeApiServer) -> None:
    """tests/fixtures/scheduler/a100-numa.yaml: the A100 node and the pod HAMi's scheduler
    booked on it (unsigned, 50,000 MiB on five GPUs), running as kubelet reports it."""
    document = yaml.safe_load((FIXTURES / "a100-numa.yaml").read_text(encoding="utf-8"))
    for item in document["items"]:
        apiserver.add_object(kubelet_started(item) if item["kind"] == "Pod" else item)


def four_gpu_pod() -> dict[str, Any]:
    document = yaml.safe_load((FIXTURES / "pod-a100-four.yaml").read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def _post(url: str, document: object) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(document).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        result = json.loads(response.read())
    assert isinstance(result, dict)
    return result


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def allocated_bytes(metrics_url: str) -> float:
    """The sum of `hami_gpu_memory_allocated_bytes` over the node's GPUs."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "hami_gpu_memory_allocated_bytes"
    )


@contextmanager
def scheduler_process(
    apiserver: FakeApiServer, tmp_path: Path, *extra: str
) -> Iterator[tuple[str, str, LoggedProcess]]:
    """`hami scheduler` as a subprocess: its extender URL, its metrics URL, the process."""
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    argv = [
        str(Path(sys.executable).with_name("hami")), "scheduler",
        "--kubeconfig", str(kubeconfig), "--http-bind", "127.0.0.1:0",
        "--metrics-bind-address", "127.0.0.1:0", *extra,
    ]  # fmt: skip
    process = LoggedProcess("scheduler", argv, tmp_path)
    try:
        url = process.wait_for_log(r"serving on (https?://\S+)", timeout=30).group(1)
        metrics = process.wait_for_log(r"serving metrics on (http://\S+)", timeout=30).group(1)
        wait_until(lambda: _ready(url), timeout=30, what="readyz")
        yield url, metrics, process
        assert process.stop() == 0
    finally:
        process.kill()


@pytest.mark.parametrize("keyed", [True, False], ids=["with-a-key", "without-a-key"])
def test_the_issues_measurement_answers_as_without_a_key(
    apiserver: FakeApiServer, tmp_path: Path, keyed: bool
) -> None:
    """The scheduler starts (as after a restart with a key) on a cluster where HAMi's scheduler
    booked 50,000 MiB on five A100s: the four-GPU pod of 40,000 MiB each fits beside them only
    on the three free GPUs, so the node is refused for the same reasons with and without a key,
    and the metrics show the booking."""
    load_fixture(apiserver)
    pod = apiserver.add_object(four_gpu_pod())
    extra = ("--booking-key-file", str(write_key_file(tmp_path / "keys"))) if keyed else ()
    with scheduler_process(apiserver, tmp_path, *extra) as (url, metrics, process):
        answer = _post(f"{url}/filter", {"Pod": pod, "NodeNames": [A100_NODE]})
        assert answer["NodeNames"] is None, answer
        assert answer["FailedNodes"] == {A100_NODE: WITHOUT_A_KEY}
        assert allocated_bytes(metrics) == 5 * 50000 * MIB
    log = process.log()
    assert ("pod inference/batch-infer-0: its GPU booking is counted although" in log) is keyed
    assert "its GPU booking is ignored" not in log


FREE_GPUS = {
    "GPU-9531985d-5d9d-49f8-9818-e811892f902b",
    "GPU-36f675cc-81e7-4ef5-a8e2-5d940ed90475",
    "GPU-a170b338-3926-4059-b28c-105d1fb17c23",
}
"""The fixture node's GPUs the running (unsigned) pod does not hold."""


def test_a_pod_that_fits_beside_the_counted_bookings_is_bound_on_the_free_gpus(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """With a key, the three-GPU pod of 40,000 MiB each fits: on the three GPUs the unsigned
    booking leaves free, never beside its 50,000 MiB."""
    load_fixture(apiserver)
    document = four_gpu_pod()
    document["metadata"]["name"] = "train-three"
    document["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"
    pod = apiserver.add_object(document)
    keys = str(write_key_file(tmp_path / "keys"))
    with scheduler_process(apiserver, tmp_path, "--booking-key-file", keys) as (url, _, _):
        answer = _post(f"{url}/filter", {"Pod": pod, "NodeNames": [A100_NODE]})
        assert answer["NodeNames"] == [A100_NODE], answer
        bind = {
            "PodName": "train-three",
            "PodNamespace": "ml",
            "PodUID": pod["metadata"]["uid"],
            "Node": A100_NODE,
        }
        assert _post(f"{url}/bind", bind) == {"Error": ""}
    bound = apiserver.get_pod("ml", "train-three")
    assert bound is not None and bound["spec"]["nodeName"] == A100_NODE
    allocated = bound["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    assert {entry.split(",")[0] for entry in allocated.strip(";:").split(":")} == FREE_GPUS


# --- with the scheduler in process: what counts nothing, and how a counted booking ends -------


def unsigned_pod(
    name: str,
    *,
    node: str = "n1",
    bound_to: str = "n1",
    gpus: int | None = 2,
    started: bool = True,
) -> dict[str, Any]:
    """A pod with an unsigned whole-GPU booking of both GPUs of `node`, asking `gpus` GPUs
    (None: none), bound to `bound_to`; started by kubelet, or Pending and never admitted."""
    every_gpu = [(f"GPU-{node}-{i}", 32768, 100) for i in range(2)]
    if gpus is None:
        pod = make_pod(name, annotations=booking(node, every_gpu, phase="success"))
    else:
        pod = gpu_pod(name, gpus=gpus, memory=32768, annotations=booking(node, every_gpu))
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["spec"]["nodeName"] = bound_to
    return kubelet_started(pod) if started else pod


@contextmanager
def keyed_cluster(apiserver: FakeApiServer, tmp_path: Path) -> Iterator[Scheduler]:
    for node in ("n1", "n2"):
        apiserver.add_object(gpu_node(node, 2, split=1, protocol=True))
    key_file = str(write_key_file(tmp_path / "keys"))
    with running_scheduler(apiserver, booking_key_file=key_file) as scheduler:
        yield scheduler


def whole_gpus(
    scheduler: Scheduler, name: str, count: int = 1, node: str = "n1"
) -> list[str] | None:
    pod = gpu_pod(name, gpus=count, memory=32768)
    nodes = scheduler.filter(pod, [node])["NodeNames"]
    return None if nodes is None else list(nodes)


def used(scheduler: Scheduler, node: str = "n1") -> int:
    usage = scheduler.state.node_usage(node)
    assert usage is not None
    return sum(usage.used)


@pytest.mark.parametrize(
    "pod",
    [
        # asks for no GPU, started, its whole-GPU booking written by hand
        unsigned_pod("gpu-less", gpus=None),
        # never admitted: Pending, no start time, no container started
        unsigned_pod("pending", started=False),
        # running on n1, its booking names n2 (and n2 counts nothing either)
        unsigned_pod("elsewhere", node="n2"),
        # books both GPUs, asks for one: kubelet gave it no more
        unsigned_pod("greedy", gpus=1),
    ],
    ids=lambda pod: pod["metadata"]["name"],
)
def test_a_forged_unsigned_booking_still_counts_nothing(
    apiserver: FakeApiServer, tmp_path: Path, pod: dict[str, Any]
) -> None:
    with keyed_cluster(apiserver, tmp_path) as scheduler:
        apiserver.add_object(pod)
        name = pod["metadata"]["name"]
        scheduler.sees_pod("default", name, lambda p: p.booking is not None)
        assert (used(scheduler, "n1"), used(scheduler, "n2")) == (0, 0)
        for node in ("n1", "n2"):
            assert whole_gpus(scheduler, f"next-{node}", 2, node) == [node]


@pytest.mark.parametrize("end", ["Succeeded", "Failed", "deleted"])
def test_a_counted_unsigned_booking_ends_with_its_pod(
    apiserver: FakeApiServer, tmp_path: Path, end: str
) -> None:
    """Counted from the moment kubelet reports it started (not while Pending), until it is
    Succeeded, Failed or deleted."""
    with keyed_cluster(apiserver, tmp_path) as scheduler:
        apiserver.add_object(unsigned_pod("trainer", started=False))
        scheduler.sees_pod("default", "trainer", lambda p: p.booking is not None)
        assert used(scheduler) == 0
        apiserver.update_object("pods", "default", "trainer", _started)
        scheduler.sees_pod("default", "trainer", lambda p: p.start_time is not None)
        assert used(scheduler) == 2
        assert whole_gpus(scheduler, "late") is None  # both GPUs are the trainer's
        if end == "deleted":
            apiserver.delete_pod("default", "trainer")
            wait_until(lambda: scheduler.state.pod("default", "trainer") is None, what="deleted")
        else:
            apiserver.update_object("pods", "default", "trainer", _phase(end))
            scheduler.sees_pod("default", "trainer", lambda p: p.phase == end)
        assert used(scheduler) == 0
        assert whole_gpus(scheduler, "after", 2) == ["n1"]


def _started(pod: dict[str, Any]) -> None:
    pod["status"] = kubelet_started(copy.deepcopy(pod))["status"]


def _phase(phase: str) -> Callable[[dict[str, Any]], None]:
    def update(pod: dict[str, Any]) -> None:
        pod["status"]["phase"] = phase

    return update


def test_an_admitted_pod_asking_another_resource_counts_nothing(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """A started pod asking another resource than the configured one counts nothing."""
    with keyed_cluster(apiserver, tmp_path) as scheduler:
        pod = unsigned_pod("other", gpus=None)
        pod["spec"]["containers"] = [
            make_container("main", limits={"example.com/gpu": "2"}),
        ]
        apiserver.add_object(kubelet_started(pod))
        scheduler.sees_pod("default", "other", lambda p: p.booking is not None)
        assert used(scheduler) == 0
