"""End to end over real sockets, each daemon in its own process as in production.

The cluster: the API server double (HTTP, in this process); two GPU nodes, each with
`hami device-plugin --nvml fake` as a subprocess (2 fake A100s split 4 ways), registered with a
test kubelet over its unix socket, and a `PodAdmitter` playing kubelet's pod admission (it
lists the pods bound to its node and calls GetPreferredAllocation/Allocate over the socket);
`hami scheduler` as a subprocess on a loopback port, with its kubeconfig from the double.
The test plays kube-scheduler: POST /filter with `NodeNames` (Go field names, as kube-scheduler
sends them), then POST /bind for the node chosen.

`gpu-1` runs our allocate protocol (several pods in flight, no node lock); on `gpu-2` the
protocol annotation is taken away, as on a node running HAMi's own device plugin, so the
scheduler uses HAMi's node lock there (the plugin re-checks its annotations only once an hour
here, so the node stays that way).

Every scenario ends with the scheduler's bookings (read from its /metrics, per GPU) equal to
what the live pods hold (decoded from their annotations in the double), and no GPU
over-committed. Waits are bounded; nothing asserts on time.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hami_plugin.extender.leader import DEFAULT_LEASE_NAME, LABEL_SCHEDULER_ROLE, ROLE_LEADER
from hami_plugin.protocol import codec
from hami_plugin.protocol.inflight import ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_NODE,
)
from hami_plugin.testing.admission import PodAdmitter
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet
from tests.extender.helpers import gpu_pod
from tests.extender.test_ledger_invariant import held
from tests.processes import LoggedProcess, hami_command, wait_until

SPLIT = 4
GPU_MEMORY_MIB = 40960
GPUS_PER_NODE = 2
IN_FLIGHT_NODE = "gpu-1"
LOCK_NODE = "gpu-2"
NODES = (IN_FLIGHT_NODE, LOCK_NODE)
NAMESPACE = "default"
SCHEDULER_NAMESPACE = "hami-system"
CAPACITY = (SPLIT, GPU_MEMORY_MIB, 100)

# The module-scoped API server double serves daemon processes that keep their connections open
# from one test to the next: its per-connection handler threads end when it stops.
pytestmark = pytest.mark.leaves_threads("(process_request_thread)")


def uuids(node: str) -> tuple[str, ...]:
    """GPU UUIDs shaped as NVML's (five dashes: the plugin appends `-<slot>` to them)."""
    number = NODES.index(node) + 1
    return tuple(f"GPU-{number:08d}-0000-4000-8000-{index:012d}" for index in range(GPUS_PER_NODE))


# --- processes ------------------------------------------------------------------------------


class Daemon(LoggedProcess):
    """A `hami` sub-command in its own process; its output goes to a log file."""

    def __init__(
        self, name: str, args: list[str], log_dir: Path, env: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(name, hami_command(*args), log_dir, env)


class Scheduler(Daemon):
    """`hami scheduler` on 127.0.0.1:<free port>, with its metrics on another free port."""

    def __init__(
        self,
        name: str,
        kubeconfig: Path,
        log_dir: Path,
        *extra: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        args = [
            "scheduler", "--kubeconfig", str(kubeconfig), "--http-bind", "127.0.0.1:0",
            "--metrics-bind-address", "127.0.0.1:0", *extra,
        ]  # fmt: skip
        super().__init__(name, args, log_dir, env)
        self.url = self.wait_for_log(r"serving on (http://\S+)").group(1)
        self.metrics_url = self.wait_for_log(r"serving metrics on (http://\S+)").group(1)

    def post(self, path: str, document: object, timeout: float = 60.0) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path, json.dumps(document).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
        assert isinstance(answer, dict)
        return answer

    def filter(self, pod: Mapping[str, Any], nodes: tuple[str, ...] = NODES) -> dict[str, Any]:
        """kube-scheduler's filter call (nodeCacheCapable: node names only)."""
        answer = self.post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": list(nodes)})
        assert set(answer) >= {"NodeNames", "FailedNodes", "Error"}, answer
        return answer

    def bind(self, pod: Mapping[str, Any], node: str) -> str:
        metadata = pod["metadata"]
        answer = self.post(
            "/bind",
            {
                "PodName": metadata["name"],
                "PodNamespace": metadata["namespace"],
                "PodUID": metadata["uid"],
                "Node": node,
            },
        )
        return str(answer["Error"])

    def schedule(self, pod: Mapping[str, Any], nodes: tuple[str, ...] = NODES) -> str:
        """Filter, then bind to the one node it returns; the node."""
        answer = self.filter(pod, nodes)
        assert not answer["Error"] and answer["NodeNames"], answer
        (node,) = answer["NodeNames"]
        error = self.bind(pod, node)
        assert error == "", error
        return str(node)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=10) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def bookings(self) -> dict[str, tuple[int, int, int]]:
        """Slots, MiB and cores booked per GPU, as the scheduler's /metrics report them."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        numbers: dict[str, list[int]] = {}
        wanted = {
            "hami_gpu_shared_count": (0, 1),
            "hami_gpu_memory_allocated_bytes": (1, 2**20),
            "hami_gpu_core_allocated_ratio": (2, 1),
        }
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    position, unit = wanted[sample.name]
                    entry = numbers.setdefault(sample.labels["device_uuid"], [0, 0, 0])
                    entry[position] = int(sample.value) // unit
        return {uuid: (n[0], n[1], n[2]) for uuid, n in numbers.items() if any(n)}

    def registered(self) -> set[str]:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        return {
            sample.labels["node"]
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "hami_gpu_memory_limit_bytes"
        }


@dataclass
class GpuNode:
    name: str
    kubelet: FakeKubelet
    admitter: PodAdmitter
    plugin: Daemon
    sock_dir: str


@dataclass
class Cluster:
    api: FakeApiServer
    kubeconfig: Path
    log_dir: Path
    nodes: dict[str, GpuNode]

    def live_pods(self) -> dict[str, dict[str, Any]]:
        return {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
            for p in self.api.objects("pods")
        }

    def annotations(self, name: str) -> dict[str, str]:
        pod = self.api.get_pod(NAMESPACE, name)
        assert pod is not None, name
        return dict(pod["metadata"].get("annotations") or {})

    def node_annotations(self, name: str) -> dict[str, str]:
        node = self.api.get_node(name)
        assert node is not None
        return dict(node["metadata"].get("annotations") or {})

    def add_pod(self, name: str, **kwargs: Any) -> dict[str, Any]:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return self.api.add_object(gpu_pod(name, uid=f"uid-{name}", created=created, **kwargs))

    def delete_pods(self, *names: str) -> None:
        for name in names:
            self.api.delete_pod(NAMESPACE, name)

    def check_consistent(self, scheduler: Scheduler, timeout: float = 20.0) -> None:
        """No GPU over-committed by the live pods, and the scheduler books exactly that."""
        holding = held(self.live_pods())
        for uuid, numbers in holding.items():
            assert all(n <= c for n, c in zip(numbers, CAPACITY, strict=True)), (uuid, numbers)
        last: list[object] = []

        def same() -> bool:
            booked = scheduler.bookings()
            last[:] = [booked, held(self.live_pods())]
            return booked == last[1]

        try:
            wait_until(same, "the scheduler books what the live pods hold", timeout)
        except AssertionError:
            raise AssertionError(f"booked {last[0]} != held {last[1]}") from None

    def allocated(self, name: str, node: str, memory_mib: int) -> None:
        """The pod was admitted on `node` with its own booking, and ends bind-phase success."""
        gpu_node = self.nodes[node]
        gpu_node.admitter.wait_for([(NAMESPACE, name)], timeout=30)
        assert gpu_node.admitter.failures == {}
        envs = dict(gpu_node.admitter.responses[(NAMESPACE, name, "c0")].envs)
        booked = codec.decode_pod_devices(
            self.annotations(name)[ANNOTATION_DEVICES_ALLOCATED], ANNOTATION_DEVICES_ALLOCATED
        )[0]
        assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.uuid for d in booked)
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{memory_mib}m"
        wait_until(
            lambda: self.annotations(name).get(ANNOTATION_BIND_PHASE) == "success",
            f"{name} ends bind-phase success",
        )


def _write_gpus(path: Path, node: str) -> None:
    document = {
        "gpus": [
            {"uuid": uuid, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": GPU_MEMORY_MIB}
            for uuid in uuids(node)
        ]
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")


def _start_node(api: FakeApiServer, kubeconfig: Path, log_dir: Path, name: str) -> GpuNode:
    api.add_node(name)
    gpus_file = log_dir / f"{name}-gpus.yaml"
    _write_gpus(gpus_file, name)
    sock_dir = tempfile.mkdtemp(prefix=f"hami-e2e-{name}-", dir="/tmp")  # short socket paths
    kubelet = FakeKubelet(sock_dir).start()
    install_fake_hamicore(log_dir / f"{name}-hook")
    interval = "3600" if name == LOCK_NODE else "2"
    plugin = Daemon(
        f"device-plugin-{name}",
        [
            "device-plugin", "--nvml", "fake", "--fake-gpus", str(gpus_file),
            "--node-name", name, "--kubeconfig", str(kubeconfig),
            "--device-plugin-path", sock_dir, "--device-split-count", str(SPLIT),
            "--hook-path", str(log_dir / f"{name}-hook"), "--metrics-bind-address", "0",
            "--register-interval-seconds", interval,
        ],
        log_dir,
    )  # fmt: skip
    kubelet.wait_for_registrations(1, timeout=30)
    wait_until(
        lambda: ANNOTATION_NODE_REGISTER in (api.get_node(name) or {})["metadata"]["annotations"],
        f"{name}'s plugin registers its GPUs",
    )

    def kubelet_status(node: dict[str, Any]) -> None:
        # kubelet advertises what ListAndWatch lists (the double does not do it by itself)
        node["status"]["allocatable"]["nvidia.com/gpu"] = str(GPUS_PER_NODE * SPLIT)
        if name == LOCK_NODE:
            node["metadata"]["annotations"].pop(ANNOTATION_ALLOCATE_PROTOCOL, None)

    api.update_object("nodes", "", name, kubelet_status)
    admitter = PodAdmitter(kubelet, api.url, name).start()
    return GpuNode(name, kubelet, admitter, plugin, sock_dir)


@contextmanager
def running_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """The API server double and both GPU nodes, for one test; the plugins must exit 0."""
    api = FakeApiServer().start()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    nodes: dict[str, GpuNode] = {}
    try:
        for name in NODES:
            nodes[name] = _start_node(api, kubeconfig, tmp_path, name)
        yield Cluster(api, kubeconfig, tmp_path, nodes)
    finally:
        for node in nodes.values():
            node.admitter.stop()
            code = node.plugin.stop()
            node.kubelet.stop()
            shutil.rmtree(node.sock_dir, ignore_errors=True)
            assert code == 0, node.plugin.log()[-3000:]
        api.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("e2e")) as running:
        yield running


@pytest.fixture(scope="class")
def scheduler(cluster: Cluster) -> Iterator[Scheduler]:
    process = Scheduler("scheduler", cluster.kubeconfig, cluster.log_dir)
    try:
        wait_until(process.ready, "the scheduler is ready")
        wait_until(lambda: process.registered() == set(NODES), "both nodes are registered")
        yield process
    finally:
        code = process.stop()
        assert code == 0, process.log()[-3000:]
        assert "hami scheduler stopped" in process.log()


# --- one scheduler ----------------------------------------------------------------------------


class TestOneScheduler:
    @pytest.mark.parametrize("node", NODES)
    def test_a_pod_goes_through_filter_bind_and_allocate(
        self, cluster: Cluster, scheduler: Scheduler, node: str
    ) -> None:
        name = f"train-{node}"
        pod = cluster.add_pod(name, memory=3000)
        # NodeNames as kube-scheduler narrowed them (a nodeSelector, say) to one node
        assert scheduler.schedule(pod, (node,)) == node
        cluster.allocated(name, node, 3000)
        assert ANNOTATION_NODE_LOCK not in cluster.node_annotations(node)
        cluster.check_consistent(scheduler)
        cluster.delete_pods(name)
        cluster.check_consistent(scheduler)

    def test_two_pods_race_for_the_last_gpu_of_a_node(
        self, cluster: Cluster, scheduler: Scheduler
    ) -> None:
        node = IN_FLIGHT_NODE
        whole = GPU_MEMORY_MIB  # each pod takes a whole GPU
        filler = cluster.add_pod("filler", memory=whole)
        assert scheduler.schedule(filler, (node,)) == node
        racers = [cluster.add_pod(f"racer-{i}", memory=whole) for i in range(2)]
        answers: dict[str, dict[str, Any]] = {}

        def filter_one(pod: dict[str, Any]) -> None:
            answers[pod["metadata"]["name"]] = scheduler.filter(pod, (node,))

        threads = [threading.Thread(target=filter_one, args=(pod,)) for pod in racers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        winners = [name for name, answer in answers.items() if answer["NodeNames"] == [node]]
        losers = [name for name, answer in answers.items() if answer["NodeNames"] is None]
        assert len(winners) == 1 and len(losers) == 1, answers
        refused = answers[losers[0]]
        assert not refused["Error"] and node in refused["FailedNodes"], refused
        assert "CardInsufficientMemory" in refused["FailedNodes"][node], refused
        (winner,) = (pod for pod in racers if pod["metadata"]["name"] == winners[0])
        assert scheduler.bind(winner, node) == ""
        for name in ("filler", winners[0]):
            cluster.allocated(name, node, whole)
        assert ANNOTATION_VGPU_NODE not in cluster.annotations(losers[0])
        cluster.check_consistent(scheduler)  # two whole GPUs booked, nothing over-committed
        cluster.delete_pods("filler", "racer-0", "racer-1")
        cluster.check_consistent(scheduler)

    @pytest.mark.parametrize("node", NODES)
    @pytest.mark.leaves_threads("pod-admitter")  # restarts the module-scoped node's admitter
    def test_a_pod_deleted_between_bind_and_allocate_leaves_nothing(
        self, cluster: Cluster, scheduler: Scheduler, node: str
    ) -> None:
        name = f"gone-{node}"
        admitter = cluster.nodes[node].admitter
        admitter.stop()  # kubelet has not seen the pod yet
        try:
            pod = cluster.add_pod(name, memory=5000)
            assert scheduler.schedule(pod, (node,)) == node
            if node == LOCK_NODE:
                lock = cluster.node_annotations(node).get(ANNOTATION_NODE_LOCK, "")
                assert lock.endswith(f",{NAMESPACE},{name}"), lock
            cluster.check_consistent(scheduler)
            cluster.delete_pods(name)
            wait_until(
                lambda: ANNOTATION_NODE_LOCK not in cluster.node_annotations(node),
                "the node lock is released",
            )
            cluster.check_consistent(scheduler)
        finally:
            admitter.start()
        # the node serves the next pod as usual
        after = cluster.add_pod(f"after-{node}", memory=5000)
        assert scheduler.schedule(after, (node,)) == node
        cluster.allocated(f"after-{node}", node, 5000)
        cluster.delete_pods(f"after-{node}")
        cluster.check_consistent(scheduler)

    def test_the_api_server_answering_500_for_a_while_loses_nothing(
        self, cluster: Cluster, scheduler: Scheduler
    ) -> None:
        api = cluster.api
        running = cluster.add_pod("steady", memory=2000)
        assert scheduler.schedule(running, (IN_FLIGHT_NODE,)) == IN_FLIGHT_NODE
        cluster.allocated("steady", IN_FLIGHT_NODE, 2000)
        doomed = cluster.add_pod("doomed", memory=2000)
        assert scheduler.schedule(doomed, (IN_FLIGHT_NODE,)) == IN_FLIGHT_NODE
        cluster.allocated("doomed", IN_FLIGHT_NODE, 2000)

        outage = api.inject_fault(".*", ".*", times=None, status=500)
        api.drop_watches()  # every reconnect now meets the 500s
        start = len(api.requests)
        newcomer = cluster.add_pod("newcomer", memory=2000)
        cluster.delete_pods("doomed")  # happens while nobody can watch
        # filter works from memory; bind needs the API server: an Error, rolled back
        answer = scheduler.filter(newcomer, (IN_FLIGHT_NODE,))
        assert answer["NodeNames"] == [IN_FLIGHT_NODE], answer
        assert scheduler.bind(newcomer, IN_FLIGHT_NODE) != ""

        def refused(path: str) -> bool:
            return any(
                r.path == path and r.query.get("watch") == ["true"] for r in api.requests[start:]
            )

        wait_until(
            lambda: refused("/api/v1/pods") and refused("/api/v1/nodes"),
            "the scheduler's watches were refused at least once",
        )
        api.clear_faults()
        assert outage.fired > 0

        # both daemons recover: kube-scheduler retries the pod and it goes through
        assert ANNOTATION_VGPU_NODE not in cluster.annotations("newcomer")
        assert scheduler.schedule(newcomer, (IN_FLIGHT_NODE,)) == IN_FLIGHT_NODE
        cluster.allocated("newcomer", IN_FLIGHT_NODE, 2000)
        assert ANNOTATION_NODE_REGISTER in cluster.node_annotations(IN_FLIGHT_NODE)
        cluster.check_consistent(scheduler)  # doomed's GPUs were given back
        cluster.delete_pods("steady", "newcomer")
        cluster.check_consistent(scheduler)

    def test_a_dropped_watch_and_an_expired_history_lose_nothing(
        self, cluster: Cluster, scheduler: Scheduler
    ) -> None:
        api = cluster.api
        names = [f"watched-{i}" for i in range(3)]
        for name in names:
            pod = cluster.add_pod(name, memory=4000)
            assert scheduler.schedule(pod, NODES) in NODES
        for name in names:
            node = cluster.annotations(name)[ANNOTATION_VGPU_NODE]
            cluster.allocated(name, node, 4000)
        api.drop_watches()
        cluster.delete_pods(names[0])
        api.expire_history()  # the watch resumes from a version etcd compacted: 410, relist
        cluster.delete_pods(names[1])
        api.drop_watches()
        cluster.check_consistent(scheduler)
        fresh = cluster.add_pod("watched-fresh", memory=4000)
        node = scheduler.schedule(fresh, NODES)
        cluster.allocated("watched-fresh", node, 4000)
        cluster.delete_pods(names[2], "watched-fresh")
        cluster.check_consistent(scheduler)


# --- two replicas ---------------------------------------------------------------------------


def test_two_replicas_elect_one_leader_and_the_follower_takes_over_a_killed_leader(
    cluster: Cluster,
) -> None:
    api = cluster.api
    replicas: dict[str, Scheduler] = {}
    for name in ("scheduler-a", "scheduler-b"):
        api.add_pod(name, SCHEDULER_NAMESPACE)
    with contextlib.ExitStack() as stack:
        for name in ("scheduler-a", "scheduler-b"):
            env = {"POD_NAME": name, "POD_NAMESPACE": SCHEDULER_NAMESPACE}
            replica = Scheduler(
                name,
                cluster.kubeconfig,
                cluster.log_dir,
                "--leader-elect",
                # kube-scheduler's flags, shortened so that the failover takes seconds
                "--leader-elect-lease-duration=4s",
                "--leader-elect-renew-deadline=3s",
                "--leader-elect-retry-period=500ms",
                env=env,
            )
            replicas[name] = replica
            stack.callback(_stop_quietly, replica)

        def leaders() -> list[str]:
            return [n for n, r in replicas.items() if r.process.poll() is None and r.ready()]

        wait_until(lambda: len(leaders()) == 1, "one replica leads", 40)
        (leader,) = leaders()
        (follower,) = set(replicas) - {leader}
        refused = replicas[follower].filter(cluster.add_pod("to-follower", memory=1000))
        assert refused["Error"], refused  # a follower refuses kube-scheduler's calls
        wait_until(
            lambda: _role(api, leader) == ROLE_LEADER and _role(api, follower) != ROLE_LEADER,
            "the pods are labelled by role",
        )

        replicas[leader].kill()  # SIGKILL: no release, the lease must expire
        wait_until(lambda: replicas[follower].ready(), "the follower takes over", 45)
        lease = api.get_lease(SCHEDULER_NAMESPACE, DEFAULT_LEASE_NAME)
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == follower
        assert lease["spec"]["leaseTransitions"] >= 1
        wait_until(lambda: _role(api, follower) == ROLE_LEADER, "the new leader is labelled")
        wait_until(lambda: _role(api, leader) != ROLE_LEADER, "the dead leader's label is fixed")

        survivor = replicas[follower]
        wait_until(lambda: survivor.registered() == set(NODES), "the new leader knows the nodes")
        pod = cluster.add_pod("after-failover", memory=1000)
        node = survivor.schedule(pod, NODES)
        cluster.allocated("after-failover", node, 1000)
        cluster.check_consistent(survivor)
        cluster.delete_pods("after-failover", "to-follower")
        cluster.check_consistent(survivor)
        assert survivor.stop() == 0
        released = api.get_lease(SCHEDULER_NAMESPACE, DEFAULT_LEASE_NAME)
        assert released is not None and released["spec"]["holderIdentity"] == ""


def _role(api: FakeApiServer, pod: str) -> object:
    stored = api.get_pod(SCHEDULER_NAMESPACE, pod)
    return (
        None
        if stored is None
        else (stored["metadata"].get("labels") or {}).get(LABEL_SCHEDULER_ROLE)
    )


def _stop_quietly(daemon: Daemon) -> None:
    if daemon.process.poll() is None:
        with contextlib.suppress(AssertionError):
            daemon.stop()
