"""A laptop cluster for the demo: the API server double, fake GPU nodes, the real daemons.

`DemoCluster` runs, for one node policy: the API server double (`FakeApiServer`, a thread of
this process), per node a test kubelet (`FakeKubelet`, its Registration socket) and its pod
admission (`PodAdmitter`, GetPreferredAllocation + Allocate over the plugin's socket), per
node `hami device-plugin --nvml fake` as a subprocess, and `hami scheduler` as a subprocess on
a loopback port. Daemon output goes to log files under the cluster's directory.

`submit` walks one pod the way a cluster would: the admission webhook (POST /webhook, patch
applied), create, POST /filter (Go field names, every node), POST /bind, kubelet's admission,
until the device plugin wrote `bind-phase: success`.

`ProcessGroup` owns the subprocesses: each in a session (process group) of its own, so a
terminal's Ctrl-C reaches only the demo, which stops them in order; `stop_all` sends SIGTERM to
each group, waits, then SIGKILLs what is left.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami_plugin.certs.booking_key import new_key
from hami_plugin.demo.workload import (
    NODE_LABELS,
    NODES,
    DemoNode,
    SamplePod,
    fake_gpus_document,
)
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_NODE_REGISTER,
    RESOURCE_GPU,
    ContainerDevice,
)
from hami_plugin.testing.admission import PodAdmitter
from hami_plugin.testing.apiserver import FakeApiServer, json_patch, make_node
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet

__all__ = [
    "ContainerResult",
    "DemoCluster",
    "DemoError",
    "PodResult",
    "ProcessGroup",
    "signals_deferred",
]

logger = logging.getLogger(__name__)

SPLIT_COUNT = 10
"""vGPU slots per GPU (the device plugin's default)."""
_STOP_SECONDS = 15.0
_HTTP_TIMEOUT_SECONDS = 40.0  # above the scheduler's 28 s node-lock retry
_POLL_SECONDS = 0.02
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux
_CHILD_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


class DemoError(Exception):
    """The demo cannot go on; the message says what failed and where its log is."""


# --- subprocesses -----------------------------------------------------------------------------


@dataclass
class Daemon:
    """One subprocess: its name, command line, log file and process."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def log_text(self) -> str:
        """The log so far ("" before the process wrote anything)."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def check_alive(self) -> None:
        """Raise DemoError when the process has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise DemoError(
                f"{self.name} exited with status {self.process.returncode}; log: {self.log_path}"
            )

    def wait_for_log(self, pattern: str, deadline: float) -> re.Match[str]:
        """The first match of `pattern` in the log, waiting for it until `deadline`."""
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.log_text())
            if match is not None:
                return match
            self.check_alive()
            if time.monotonic() > deadline:
                raise DemoError(
                    f"{self.name} did not log {pattern!r} in time; log: {self.log_path}"
                )
            time.sleep(_POLL_SECONDS * 2)


class ProcessGroup:
    """The demo's subprocesses, each in a process group of its own; stopped all together."""

    def __init__(self) -> None:
        self._daemons: list[Daemon] = []

    @property
    def daemons(self) -> list[Daemon]:
        return list(self._daemons)

    def start(self, name: str, args: Sequence[str], log_path: Path) -> Daemon:
        """Start `hami <args>` (this interpreter, `-m hami_plugin`) with output to `log_path`."""
        argv = [sys.executable, "-m", "hami_plugin", *args]
        env = {key: os.environ[key] for key in _CHILD_ENV if key in os.environ}
        env["PYTHONUNBUFFERED"] = "1"
        daemon = Daemon(name, argv, log_path)
        # A Ctrl-C between the child's exec and its entry here would leave it running: the
        # signal waits until the daemon is listed (stop_all then stops it with the others).
        with signals_deferred(), log_path.open("wb") as log:
            daemon.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: killpg reaches all of it
            )
            self._daemons.append(daemon)
        logger.debug("started %s (pid %d): %s", name, daemon.process.pid, " ".join(argv))
        return daemon

    def stop_all(self, timeout_seconds: float = _STOP_SECONDS) -> list[str]:
        """SIGTERM every process group, wait up to `timeout_seconds`, SIGKILL the rest.

        Returns one line per daemon that did not exit cleanly (status != 0 or killed)."""
        running = [d for d in self._daemons if d.process is not None]
        for daemon in running:
            _signal_group(daemon, signal.SIGTERM)
        deadline = time.monotonic() + timeout_seconds
        problems = []
        for daemon in running:
            assert daemon.process is not None
            try:
                status = daemon.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(daemon, signal.SIGKILL)
                daemon.process.wait()
                problems.append(
                    f"{daemon.name} did not stop on SIGTERM, killed; log: {daemon.log_path}"
                )
                continue
            # The group may hold children of the daemon; none must outlive the demo.
            _signal_group(daemon, signal.SIGKILL)
            if status != 0:
                problems.append(
                    f"{daemon.name} exited with status {status}; log: {daemon.log_path}"
                )
        self._daemons.clear()
        return problems


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside are delivered on the way out (main thread only;
    the handler is a Python function, so a child started inside gets the default action)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def record(signum: int, frame: object) -> None:
        arrived.append(signum)

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


def _signal_group(daemon: Daemon, signum: int) -> None:
    assert daemon.process is not None
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(daemon.process.pid, signum)


# --- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerResult:
    """What a container got: the booked GPUs and the environment Allocate answered."""

    name: str
    devices: tuple[ContainerDevice, ...]
    env: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class PodResult:
    """One pod's way through the cluster. `node` is "" when it found no node; then
    `failed_nodes` holds the filter's reasons (node -> HAMi's reason string)."""

    sample: SamplePod
    node: str = ""
    containers: tuple[ContainerResult, ...] = ()
    failed_nodes: Mapping[str, str] = field(default_factory=dict)
    error: str = ""


# --- the cluster --------------------------------------------------------------------------------


class DemoCluster:
    """The API server double, one fake node per `NODES` entry and the two daemons, for one node
    policy. `launch()` starts everything without waiting; `wait_ready()` waits; `close()` stops
    what runs in this process (the subprocesses belong to the `ProcessGroup`)."""

    def __init__(
        self,
        policy: str,
        directory: Path,
        processes: ProcessGroup,
        *,
        nodes: Sequence[DemoNode] = NODES,
    ) -> None:
        self.policy = policy
        self.nodes = tuple(nodes)
        self._dir = directory
        self._processes = processes
        self.api = FakeApiServer()
        self._kubelets: dict[str, FakeKubelet] = {}
        self._admitters: dict[str, PodAdmitter] = {}
        self._plugins: dict[str, Daemon] = {}
        self._scheduler: Daemon | None = None
        self.scheduler_url = ""
        self.scheduler_metrics_url = ""
        self.plugin_metrics_urls: dict[str, str] = {}

    # --- lifecycle ------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the API server, the kubelets and the daemons; returns without waiting."""
        self._dir.mkdir(parents=True, exist_ok=True)
        self.api.start()
        kubeconfig = self.api.write_kubeconfig(self._dir / "kubeconfig")
        # signed bookings, as the manifests configure them: one key both daemons share
        booking_keys = self._dir / "booking-keys"
        booking_keys.write_text(new_key() + "\n", encoding="utf-8")
        # what the DaemonSet's hami-core initContainer leaves in the hook directory
        install_fake_hamicore(self._dir / "hook")
        for node in self.nodes:
            self.api.add_object(
                make_node(node.name, labels={"kubernetes.io/hostname": node.name, **NODE_LABELS})
            )
            sockets = self._dir / node.short
            if len(str(sockets / "nvidia-gpu.sock")) > _MAX_SOCKET_PATH:
                raise DemoError(f"{sockets} is too long for a unix socket; set a shorter TMPDIR")
            gpus_file = self._dir / f"{node.short}-gpus.yaml"
            gpus_file.write_text(yaml.safe_dump(fake_gpus_document(node)), encoding="utf-8")
            kubelet = self._kubelets[node.name] = FakeKubelet(str(sockets)).start()
            self._plugins[node.name] = self._processes.start(
                f"device plugin {node.name} ({self.policy})",
                [
                    "device-plugin", "--nvml", "fake", "--fake-gpus", str(gpus_file),
                    "--node-name", node.name, "--kubeconfig", str(kubeconfig),
                    "--device-plugin-path", str(sockets), "--hook-path", str(self._dir / "hook"),
                    "--device-split-count", str(SPLIT_COUNT),
                    "--metrics-bind-address", "127.0.0.1:0",
                    "--booking-key-file", str(booking_keys),
                    # kubelet's PodResources API (in-flight/v2): the test kubelet serves it
                    "--pod-resources-socket", kubelet.pod_resources_socket,
                ],
                self._dir / f"device-plugin-{node.short}.log",
            )  # fmt: skip
        self._scheduler = self._processes.start(
            f"scheduler ({self.policy})",
            [
                "scheduler", "--kubeconfig", str(kubeconfig), "--http-bind", "127.0.0.1:0",
                "--metrics-bind-address", "127.0.0.1:0", "--node-scheduler-policy", self.policy,
                "--node-label-selector", ",".join(f"{k}={v}" for k, v in NODE_LABELS.items()),
                "--booking-key-file", str(booking_keys),
            ],
            self._dir / "scheduler.log",
        )  # fmt: skip

    def wait_ready(self, deadline: float) -> None:
        """Wait (until the monotonic `deadline`) for every plugin to register with its kubelet
        and publish its GPUs, advertise the slots on the Node as kubelet does, wait for the
        scheduler to serve and to see every node's GPUs, then start admitting pods."""
        for node in self.nodes:
            plugin = self._plugins[node.name]
            slots = SPLIT_COUNT * len(node.gpus)
            _wait(
                functools.partial(self._kubelet_lists, node.name, slots),
                deadline,
                f"{plugin.name} to register {slots} devices with kubelet",
                plugin,
            )
            _wait(
                functools.partial(self._node_registered, node.name),
                deadline,
                f"{plugin.name} to publish its GPUs on the Node",
                plugin,
            )
            self.api.update_object("nodes", "", node.name, _advertise(slots))
            match = plugin.wait_for_log(r"serving metrics on (http://\S+)", deadline)
            self.plugin_metrics_urls[node.name] = match.group(1)
        assert self._scheduler is not None
        scheduler = self._scheduler
        self.scheduler_url = scheduler.wait_for_log(r"serving on (http://\S+)", deadline).group(1)
        self.scheduler_metrics_url = scheduler.wait_for_log(
            r"serving metrics on (http://\S+)", deadline
        ).group(1)
        _wait(lambda: _http_status(self.scheduler_url + "/readyz") == 200, deadline,
              "the scheduler to be ready", scheduler)  # fmt: skip
        _wait(self._scheduler_sees_every_gpu, deadline, "the scheduler to register the nodes",
              scheduler)  # fmt: skip
        for node in self.nodes:
            admitter = PodAdmitter(
                self._kubelets[node.name], self.api.url, node.name, poll_interval_seconds=0.02
            )
            self._admitters[node.name] = admitter.start()

    def close(self) -> None:
        """Stop the pod admitters; `close_after_processes` stops the rest."""
        for admitter in self._admitters.values():
            admitter.stop()
        self._admitters.clear()

    def close_after_processes(self) -> None:
        """Stop the kubelets and the API server (after the daemons that talk to them)."""
        for kubelet in self._kubelets.values():
            kubelet.stop()
        self._kubelets.clear()
        self.api.stop()

    # --- driving pods -----------------------------------------------------------------------

    def submit(self, sample: SamplePod, timeout_seconds: float = 30.0) -> PodResult:
        """Admission webhook, create, filter, bind, kubelet admission, `bind-phase: success`."""
        deadline = time.monotonic() + timeout_seconds
        pod = sample.to_pod()
        review = _post(self.scheduler_url + "/webhook", _admission_review(pod))
        response = review.get("response") or {}
        if not response.get("allowed"):
            message = (response.get("status") or {}).get("message", "")
            return PodResult(sample, error=f"admission denied: {message}")
        if response.get("patch"):
            pod = json_patch(pod, json.loads(base64.b64decode(response["patch"])))
        stored = self.api.add_object(pod)
        answer = _post(
            self.scheduler_url + "/filter",
            {"Pod": stored, "NodeNames": [node.name for node in self.nodes]},
        )
        if answer.get("Error"):
            return PodResult(sample, error=f"filter: {answer['Error']}")
        chosen = answer.get("NodeNames") or []
        if not chosen:
            return PodResult(sample, failed_nodes=dict(answer.get("FailedNodes") or {}))
        node = str(chosen[0])
        metadata = stored["metadata"]
        bound = _post(
            self.scheduler_url + "/bind",
            {
                "PodName": metadata["name"],
                "PodNamespace": metadata["namespace"],
                "PodUID": metadata["uid"],
                "Node": node,
            },
        )
        if bound.get("Error"):
            return PodResult(sample, node=node, error=f"bind: {bound['Error']}")
        key = (metadata["namespace"], metadata["name"])
        admitter = self._admitters[node]
        try:
            admitter.wait_for([key], timeout=max(0.1, deadline - time.monotonic()))
        except AssertionError as error:  # PodAdmitter's way of saying "timed out"
            raise DemoError(
                f"kubelet on {node}: {error}; log: {self._plugins[node].log_path}"
            ) from error
        if key in admitter.failures:
            return PodResult(sample, node=node, error=f"kubelet: {admitter.failures[key]}")
        _wait(
            lambda: self._annotations(*key).get(ANNOTATION_BIND_PHASE) == "success",
            deadline,
            f"pod {key[1]} to reach bind-phase success",
            self._plugins[node],
        )
        return PodResult(sample, node=node, containers=self._containers(stored, node))

    def _containers(self, stored: Mapping[str, Any], node: str) -> tuple[ContainerResult, ...]:
        namespace, name = stored["metadata"]["namespace"], stored["metadata"]["name"]
        booked = codec.decode_pod_devices(
            self._annotations(namespace, name)[ANNOTATION_DEVICES_ALLOCATED],
            ANNOTATION_DEVICES_ALLOCATED,
        )
        spec = stored["spec"]
        names = [c["name"] for c in (*spec.get("initContainers", ()), *spec["containers"])]
        responses = self._admitters[node].responses
        results = []
        for container, devices in zip(names, booked, strict=False):
            if not devices:
                continue
            response = responses.get((namespace, name, container))
            env = dict(response.envs) if response is not None else {}
            results.append(ContainerResult(container, tuple(devices), env))
        return tuple(results)

    # --- reading state ----------------------------------------------------------------------

    def scrape(self) -> dict[str, str]:
        """One scrape of every /metrics: name ("scheduler", a node name) -> exposition text."""
        texts = {"scheduler": _get_text(self.scheduler_metrics_url)}
        for node, url in sorted(self.plugin_metrics_urls.items()):
            texts[node] = _get_text(url)
        return texts

    def _node(self, name: str) -> dict[str, Any]:
        node = self.api.get_node(name)
        if node is None:
            raise DemoError(f"node {name} disappeared from the API server")
        return node

    def _annotations(self, namespace: str, name: str) -> dict[str, str]:
        pod = self.api.get_pod(namespace, name)
        return dict((pod or {}).get("metadata", {}).get("annotations") or {})

    def _kubelet_lists(self, node: str, slots: int) -> bool:
        """The node's kubelet has a registration whose latest list holds `slots` devices."""
        current = self._kubelets[node].current()
        return current is not None and len(current[1]) == slots

    def _node_registered(self, node: str) -> bool:
        """The device plugin wrote its register annotation on the Node."""
        return ANNOTATION_NODE_REGISTER in (self._node(node)["metadata"].get("annotations") or {})

    def _scheduler_sees_every_gpu(self) -> bool:
        """The scheduler's /metrics has a memory limit series for every GPU of every node."""
        text = _get_text(self.scheduler_metrics_url)
        return all(f'device_uuid="{gpu.uuid}"' in text for node in self.nodes for gpu in node.gpus)


# --- helpers ------------------------------------------------------------------------------------


def _advertise(slots: int) -> Callable[[dict[str, Any]], None]:
    """kubelet's node status update: the plugin's devices as capacity and allocatable."""

    def change(node: dict[str, Any]) -> None:
        status = node.setdefault("status", {})
        for part in ("capacity", "allocatable"):
            status.setdefault(part, {})[RESOURCE_GPU] = str(slots)

    return change


def _wait(predicate: Callable[[], object], deadline: float, what: str, daemon: Daemon) -> None:
    """Poll `predicate` until true; DemoError naming `what` and the daemon's log otherwise."""
    while True:
        try:
            if predicate():
                return
        except (OSError, ValueError):
            pass  # not serving yet
        daemon.check_alive()
        if time.monotonic() > deadline:
            raise DemoError(f"timed out waiting for {what}; log: {daemon.log_path}")
        time.sleep(_POLL_SECONDS)


def _admission_review(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The AdmissionReview kube-apiserver sends for a pod CREATE."""
    metadata = pod["metadata"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"demo-{metadata['namespace']}-{metadata['name']}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": metadata["namespace"],
            "name": metadata["name"],
            "operation": "CREATE",
            "userInfo": {"username": "demo"},
            "object": pod,
            "dryRun": False,
        },
    }


def _post(url: str, document: Any) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(document).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_SECONDS) as response:
            answer = json.loads(response.read())
    except (OSError, ValueError) as error:
        raise DemoError(f"POST {url}: {error}") from error
    if not isinstance(answer, dict):
        raise DemoError(f"POST {url}: the answer is not a JSON object")
    return answer


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_SECONDS) as response:
        body: bytes = response.read()
    return body.decode()


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
