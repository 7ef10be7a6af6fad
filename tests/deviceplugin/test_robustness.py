"""Bad input and misbehaving peers, over real wire: the daemon reports, keeps serving, never dies.

Every test drives the plugin through the test kubelet (real unix sockets, kubelet's dial-back)
with the API server double behind it (real HTTP through the `kubernetes` client), and checks
three things: the caller gets a clear error in bounded time (a gRPC deadline on the call bounds
it, no test measures time), the user can see the failure (pod event, `hami.io/bind-phase`), and
the next good request is served.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.allocate import AllocateConfig
from hami_plugin.deviceplugin.allocator import AllocateBudgets, PodAllocator
from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.hamicore import HamiCoreWatch
from hami_plugin.deviceplugin.inventory import VgpuDevice
from hami_plugin.deviceplugin.kubelet import KubeletRegistrar
from hami_plugin.deviceplugin.register import RegisterPublisher
from hami_plugin.deviceplugin.server import DevicePluginService
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import Retryable
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_NODE_REGISTER,
    RESOURCE_GPU,
)
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import DeviceState, FakeKubelet
from tests.deviceplugin.pods import (
    GPU_A,
    GPU_B,
    NODE,
    add_pending_pod,
    dev,
    node_annotations,
    pod_annotations,
    vgpus,
)
from tests.processes import wait_until

GPU_ELSEWHERE = "GPU-77777777-7777-7777-7777-777777777777"
SOCKET = "nvidia-gpu.sock"
CACHE_ID = "00000000-0000-4000-8000-000000000000"
# Two short attempts per call: a hanging API server costs about a second, not minutes.
QUICK = RetryPolicy(
    attempts=2, initial_backoff_seconds=0.01, max_backoff_seconds=0.02, timeout_seconds=0.4
)
CALL_BOUND = 5.0
"""gRPC deadline of every call: a plugin that does not answer within it fails the test."""
WAIT = 5.0
"""Bound for an expected change to show up (tests never measure time)."""


# --- the stack: test kubelet -> registrar -> server -> allocator -> API server double ------------


@dataclass
class Stack:
    apiserver: FakeApiServer
    kubelet: FakeKubelet
    registrar: KubeletRegistrar
    board: DeviceBoard
    hook: str
    sock_dir: str

    def stub(self) -> api_pb2_grpc.DevicePluginStub:
        return self.kubelet.latest().stub

    def allocate(self, *requests: Sequence[str]) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest()
        for ids in requests:
            request.container_requests.add(devices_ids=list(ids))
        response: api_pb2.AllocateResponse = self.stub().Allocate(request, timeout=CALL_BOUND)
        return response

    def allocate_error(self, *requests: Sequence[str]) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as caught:
            self.allocate(*requests)
        assert caught.value.code() is not grpc.StatusCode.DEADLINE_EXCEEDED, "not bounded"
        return caught.value

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str] = (), size: int = 1
    ) -> list[str]:
        return self.kubelet.preferred(available, must_include, size, timeout=CALL_BOUND)


def make_allocator(
    kube: KubeClient, hook: str, vgpulock: str, *, align: bool = True, **budgets: Any
) -> PodAllocator:
    """The allocator of the stack; `budgets` are `AllocateBudgets` fields."""
    return PodAllocator(
        kube,
        NODE,
        AllocateConfig(
            hook_path=hook, vgpulock_host_path=vgpulock, enable_preferred_allocation=align
        ),
        booking_keys=None,
        resource_name=RESOURCE_GPU,
        new_cache_id=lambda: CACHE_ID,
        budgets=AllocateBudgets(**budgets),
        hamicore=HamiCoreWatch(hook, node_name=NODE, version="9.9.9"),
    )


@pytest.fixture
def stack_factory(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer
) -> Iterator[Callable[..., Stack]]:
    """Builds the stack (once per test): retry `policy`, preferred-allocation alignment
    (`align`) and the allocator's budgets can be changed."""
    apiserver.add_node(NODE)
    cleanup: list[Callable[[], None]] = []

    def build(policy: RetryPolicy = QUICK, *, align: bool = True, **budgets: float) -> Stack:
        kube = KubeClient(apiserver.api_client(), policy)
        cleanup.append(kube.close)
        hook = str(tmp_path / "hook")
        install_fake_hamicore(hook)
        board = DeviceBoard(vgpus(GPU_A, GPU_B))
        cleanup.append(board.close)
        allocator = make_allocator(kube, hook, str(tmp_path / "vgpulock"), align=align, **budgets)
        kubelet = FakeKubelet(sock_dir).start()
        cleanup.append(kubelet.stop)
        registrar = KubeletRegistrar(
            DevicePluginService(board, allocator),
            plugin_dir=sock_dir,
            socket_name=SOCKET,
            resource_name="nvidia.com/gpu",
        )
        cleanup.append(registrar.stop)
        registrar.start()
        kubelet.wait_for_registrations(1)
        return Stack(apiserver, kubelet, registrar, board, hook, sock_dir)

    yield build
    for step in reversed(cleanup):
        step()


@pytest.fixture
def stack(stack_factory: Callable[..., Stack]) -> Stack:
    return stack_factory()


def assert_failure_reported(apiserver: FakeApiServer, name: str, *words: str) -> None:
    """bind-phase failed, the node lock released and one Warning event saying what was wrong."""
    assert pod_annotations(apiserver, name)[ANNOTATION_BIND_PHASE] == "failed"
    assert ANNOTATION_NODE_LOCK not in node_annotations(apiserver)
    events = [e for e in apiserver.events("default") if e["involvedObject"]["name"] == name]
    assert [(e["reason"], e["type"]) for e in events] == [("AllocateFailed", "Warning")]
    for word in words:
        assert word in events[0]["message"]


def assert_still_serving(stack: Stack, name: str = "good", device: str = GPU_A) -> None:
    """A well-formed pod bound after the failure gets its devices."""
    add_pending_pod(stack.apiserver, name, [[dev(device, 1234)]], bind_time=10_000)
    answer = stack.allocate([f"{device}-1"]).container_responses[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == device
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1234m"
    assert pod_annotations(stack.apiserver, name)[ANNOTATION_BIND_PHASE] == "success"


# --- the API server misbehaves during Allocate ---------------------------------------------------


def test_allocate_while_the_api_server_hangs_fails_in_bounded_time_then_recovers(
    stack: Stack,
) -> None:
    add_pending_pod(stack.apiserver, "waiting", [[dev(GPU_A)]])
    stack.apiserver.inject_fault("GET", hang_seconds=30, disconnect=True, times=None)
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert f"get node {NODE}" in error.details() and "timed out" in error.details()
    # Nothing could be read, so nothing was written: the pod still waits for its devices.
    assert pod_annotations(stack.apiserver, "waiting")[ANNOTATION_BIND_PHASE] == "allocating"

    stack.apiserver.clear_faults()
    answer = stack.allocate([f"{GPU_A}-0"]).container_responses[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert pod_annotations(stack.apiserver, "waiting")[ANNOTATION_BIND_PHASE] == "success"


def test_allocate_with_a_hanging_api_server_is_bounded_by_its_budget(
    stack_factory: Callable[..., Stack],
) -> None:
    # Production retry policy (10 s per attempt, 5 attempts: about a minute per call) with a
    # short Allocate budget: kubelet gets its answer when the budget is spent.
    stack = stack_factory(RetryPolicy(), allocate_seconds=0.5, report_seconds=0.5)
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]])
    stack.apiserver.inject_fault(hang_seconds=30, disconnect=True, times=None)
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert "time budget" in error.details()
    stack.apiserver.clear_faults()
    assert_still_serving(stack, device=GPU_B)


def test_a_write_that_hangs_after_the_pod_is_known_fails_the_pod(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "mid", [[dev(GPU_A)]])
    # Both attempts of the first pod patch hang; the failure report then goes through.
    stack.apiserver.inject_fault(
        "PATCH", "/api/v1/namespaces/default/pods/mid", hang_seconds=30, disconnect=True, times=2
    )
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert "default/mid" in error.details()
    assert_failure_reported(stack.apiserver, "mid", "timed out")
    assert_still_serving(stack)


def test_allocate_with_server_errors_then_recovery(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]])
    stack.apiserver.inject_fault(status=500, times=None)
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert "HTTP 500" in error.details()
    stack.apiserver.clear_faults()
    assert stack.allocate([f"{GPU_A}-0"]).container_responses[0].envs
    assert pod_annotations(stack.apiserver, "p")[ANNOTATION_BIND_PHASE] == "success"


def test_allocate_with_the_api_server_down(stack: Stack) -> None:
    # Every connection is dropped without an answer, as with an API server that died.
    stack.apiserver.inject_fault(disconnect=True, times=None)
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert "connection failed" in error.details()
    stack.apiserver.clear_faults()
    assert_still_serving(stack)


def test_a_deadline_bounds_the_calls_of_its_thread_only(apiserver: FakeApiServer) -> None:
    apiserver.add_node(NODE)
    clock = ManualClock()  # the backoffs move it instead of waiting
    policy = RetryPolicy(attempts=5, initial_backoff_seconds=1, max_backoff_seconds=1)
    with KubeClient(apiserver.api_client(), policy, sleep=clock.advance, clock=clock) as kube:
        apiserver.inject_fault(status=503, times=None)
        with kube.deadline(1.9), pytest.raises(Retryable, match="time budget is spent"):
            kube.get_node(NODE)  # waits of 0.5-1 s: the budget allows 2 to 4 attempts, not 5
        assert 2 <= len(apiserver.requests) <= 4
        apiserver.clear_faults()
        apiserver.clear_requests()
        with kube.deadline(1.0):
            clock.advance(1.0)
            with pytest.raises(Retryable, match="not sent"):
                kube.get_node(NODE)
            with kube.deadline(1.0):  # a nested budget of its own (failure reporting)
                assert kube.get_node(NODE).name == NODE
            with pytest.raises(Retryable, match="not sent"):
                kube.get_node(NODE)
            other: list[str] = []
            thread = threading.Thread(target=lambda: other.append(kube.get_node(NODE).name))
            thread.start()
            thread.join()
            assert other == [NODE]  # another thread is not bound by it
        assert kube.get_node(NODE).name == NODE
        assert len(apiserver.requests) == 3


def test_the_server_keeps_serving_while_an_allocate_hangs(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]])
    stack.apiserver.inject_fault(hang_seconds=30, disconnect=True, times=None)
    request = api_pb2.AllocateRequest()
    request.container_requests.add(devices_ids=[f"{GPU_A}-0"])
    pending = stack.stub().Allocate.future(request, timeout=CALL_BOUND)
    wait_until(lambda: stack.apiserver.requests_matching("GET"), timeout=WAIT)
    # Meanwhile: options answer, and a health change reaches kubelet's stream.
    options = stack.stub().GetDevicePluginOptions(api_pb2.Empty(), timeout=CALL_BOUND)
    assert options.get_preferred_allocation_available
    sick = [VgpuDevice(d.id, d.gpu_uuid, d.gpu_uuid != GPU_B, None) for d in vgpus(GPU_A, GPU_B)]
    stack.board.publish(sick)
    stack.kubelet.wait_for_list(lambda s: [d.health for d in s].count("Unhealthy") == 2)
    with pytest.raises(grpc.RpcError) as caught:
        pending.result()
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_kubelet_restart_during_a_hanging_allocate_re_registers_at_once(
    stack_factory: Callable[..., Stack],
) -> None:
    # The hung Allocate keeps its thread for its whole budget; re-registering must not wait.
    stack = stack_factory(RetryPolicy(), allocate_seconds=30, report_seconds=1)
    stack.apiserver.inject_fault(hang_seconds=30, disconnect=True, times=None)
    request = api_pb2.AllocateRequest()
    request.container_requests.add(devices_ids=[f"{GPU_A}-0"])
    pending = stack.stub().Allocate.future(request)
    wait_until(lambda: stack.apiserver.requests_matching("GET"), timeout=WAIT)
    stack.kubelet.restart()
    second = stack.kubelet.wait_for_registrations(2, timeout=30.0)[1]
    stack.kubelet.wait_for_list(lambda s: len(s) == 4, connection=second)
    with pytest.raises(grpc.RpcError):
        pending.result()  # kubelet's side of the call died with it
    stack.apiserver.stop()  # ends the hang, so the Allocate thread finishes before teardown


# --- hostile annotations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw_value", "words"),
    [
        pytest.param("x" * (1 << 20), ["exceeds"], id="1MiB"),
        pytest.param("\x00\xff;;,,,::,;", ["invalid integer"], id="garbage"),
        pytest.param(f"{GPU_A},NVIDIA,-3000,30:;", ["negative"], id="negative-memory"),
        pytest.param(f"{GPU_A},NVIDIA,3000,-1:;", ["negative"], id="negative-cores"),
        pytest.param(f";;{GPU_A},NVIDIA,3000,30:;", ["entry 2", "no matching container"],
                     id="more-entries-than-containers"),
    ],
)  # fmt: skip
def test_a_malformed_to_allocate_fails_only_that_pod(
    stack: Stack, raw_value: str, words: list[str]
) -> None:
    add_pending_pod(stack.apiserver, "bad", raw_value=raw_value)
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "default/bad" in error.details()
    assert len(error.details()) < 600  # the value itself is not echoed back
    for word in words:
        assert word in error.details()
    assert_failure_reported(stack.apiserver, "bad", *words)
    assert_still_serving(stack)


def test_a_pod_without_containers_fails_cleanly(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "empty", [[dev(GPU_A)]], containers=())
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "no matching container" in error.details()
    assert_failure_reported(stack.apiserver, "empty", "0 app containers")
    assert_still_serving(stack)


def test_a_pod_without_uid_fails_instead_of_sharing_a_host_dir(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "nouid", [[dev(GPU_A)]])
    stack.apiserver.update_object(
        "pods", "default", "nouid", lambda pod: pod["metadata"].pop("uid")
    )
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "uid" in error.details()
    assert_failure_reported(stack.apiserver, "nouid", "uid")
    assert not os.path.exists(f"{stack.hook}/vgpu/containers/_main")
    assert_still_serving(stack)


def test_a_garbage_lock_is_ignored_for_the_choice_and_released_after(stack: Stack) -> None:
    # HAMi's release rule: a lock without commas has no owner, whoever finishes releases it.
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]], lock="\x00garbage")
    assert stack.allocate([f"{GPU_A}-0"]).container_responses[0].envs
    assert pod_annotations(stack.apiserver, "p")[ANNOTATION_BIND_PHASE] == "success"
    assert ANNOTATION_NODE_LOCK not in node_annotations(stack.apiserver)


def test_a_garbage_lock_naming_our_pod_is_released(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]], lock="yesterday,default,p")
    assert stack.allocate([f"{GPU_A}-0"]).container_responses[0].envs
    assert ANNOTATION_NODE_LOCK not in node_annotations(stack.apiserver)


def test_a_garbage_lock_naming_another_pod_is_left_alone(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]], lock="yesterday,default,other")
    assert stack.allocate([f"{GPU_A}-0"]).container_responses[0].envs
    assert node_annotations(stack.apiserver)[ANNOTATION_NODE_LOCK] == "yesterday,default,other"


def test_a_garbage_bind_phase_is_not_allocated_and_not_touched(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "odd", [[dev(GPU_A)]], bind_phase="\x00??", lock=None)
    stack.apiserver.clear_requests()
    error = stack.allocate_error([f"{GPU_A}-0"])
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == f"no binding pod found on node {NODE}"
    assert stack.apiserver.requests_matching("PATCH|POST") == []
    assert_still_serving(stack)


def test_an_entry_naming_a_gpu_of_another_node_gets_kubelets_gpu(stack: Stack) -> None:
    # With preferred allocation on (the default) each device follows kubelet's ID (HAMi 4.4).
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_ELSEWHERE, 2000)]])
    answer = stack.allocate([f"{GPU_B}-0"]).container_responses[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"


def test_without_alignment_an_entry_naming_a_gpu_of_another_node_fails_the_pod(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory(align=False)
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_ELSEWHERE)]])
    error = stack.allocate_error([f"{GPU_B}-0"])
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"names GPU {GPU_ELSEWHERE}, which is not on this node" in error.details()
    assert_failure_reported(stack.apiserver, "p", GPU_ELSEWHERE)
    assert_still_serving(stack)


# --- what kubelet sends --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ids",
    [
        pytest.param(["not-ours"], id="foreign-id"),
        pytest.param([f"{GPU_ELSEWHERE}-0"], id="unknown-gpu"),
        pytest.param([f"{GPU_A}-0", f"{GPU_A}-0"], id="duplicate"),
    ],
)
def test_device_ids_we_never_advertised_are_refused(stack: Stack, ids: list[str]) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)] * len(ids)])
    error = stack.allocate_error(ids)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert ids[-1] in error.details()
    assert_failure_reported(stack.apiserver, "p", ids[-1])
    assert_still_serving(stack)


def test_empty_device_ids_is_a_count_mismatch(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]])
    error = stack.allocate_error([])
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "device number not matched" in error.details()
    assert_failure_reported(stack.apiserver, "p", "device number not matched")
    assert_still_serving(stack)


def test_an_allocate_without_container_requests_touches_no_pod(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "innocent", [[dev(GPU_A)]])
    stack.apiserver.clear_requests()
    error = stack.allocate_error()
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "no containers" in error.details()
    assert stack.apiserver.requests == []
    assert pod_annotations(stack.apiserver, "innocent")[ANNOTATION_BIND_PHASE] == "allocating"
    assert stack.allocate([f"{GPU_A}-0"]).container_responses[0].envs


def test_several_container_requests_in_one_call(stack: Stack) -> None:
    add_pending_pod(
        stack.apiserver, "two", [[dev(GPU_A, 1000)], [], [dev(GPU_B, 2000)]],
        containers=("a", "sidecar", "b"),
    )  # fmt: skip
    response = stack.allocate([f"{GPU_A}-1"], [f"{GPU_B}-1"])
    assert [r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] for r in response.container_responses] == [
        "1000m",
        "2000m",
    ]
    assert [r.mounts[1].host_path.rsplit("_", 1)[1] for r in response.container_responses] == [
        "a",
        "b",
    ]
    assert pod_annotations(stack.apiserver, "two")[ANNOTATION_BIND_PHASE] == "success"
    assert ANNOTATION_NODE_LOCK not in node_annotations(stack.apiserver)


def test_more_container_requests_than_entries_fails_the_pod(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "one", [[dev(GPU_A)]])
    error = stack.allocate_error([f"{GPU_A}-0"], [f"{GPU_B}-0"])
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "no pending device allocation found" in error.details()
    assert_failure_reported(stack.apiserver, "one", "no pending device allocation")
    assert_still_serving(stack)


# --- GetPreferredAllocation ----------------------------------------------------------------------

ALL = [f"{GPU_A}-0", f"{GPU_A}-1", f"{GPU_B}-0", f"{GPU_B}-1"]


def test_preferred_size_larger_than_available_returns_what_there_is(stack: Stack) -> None:
    assert sorted(stack.preferred(ALL[:3], size=10)) == sorted(ALL[:3])


def test_preferred_keeps_must_include_even_when_not_available(stack: Stack) -> None:
    answer = stack.preferred(ALL[1:], must_include=[ALL[0]], size=2)
    assert answer[0] == ALL[0]
    assert len(answer) == 2 and len(set(answer)) == 2
    assert answer[1] in ALL[1:]


def test_preferred_never_repeats_an_id(stack: Stack) -> None:
    answer = stack.preferred(ALL + ALL, must_include=[ALL[2], ALL[2]], size=3)
    assert len(answer) == 3 and len(set(answer)) == 3
    assert answer[0] == ALL[2]


def test_preferred_with_the_pods_gpu_dead_falls_back(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]])
    # GPU_A died: kubelet only offers GPU_B's slots.
    assert stack.preferred(ALL[2:], size=1) == [ALL[2]]


def test_preferred_with_odd_sizes_and_ids(stack: Stack) -> None:
    assert stack.preferred(ALL, size=0) == []
    assert stack.preferred([], size=2) == []
    assert stack.preferred(["not-ours", ALL[0]], size=1) in (["not-ours"], [ALL[0]])


def test_preferred_while_the_api_server_hangs_still_answers(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory(RetryPolicy(), preferred_seconds=0.3)
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_B)]])
    stack.apiserver.inject_fault(hang_seconds=30, disconnect=True, times=None)
    assert stack.preferred(ALL, size=1) == [ALL[0]]


def test_preferred_with_several_requests_answers_each(stack: Stack) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_B)], [dev(GPU_A)]], containers=("a", "b"))
    request = api_pb2.PreferredAllocationRequest()
    for _ in range(3):
        request.container_requests.add(available_deviceIDs=ALL, allocation_size=1)
    response = stack.stub().GetPreferredAllocation(request, timeout=CALL_BOUND)
    assert [list(r.deviceIDs) for r in response.container_responses] == [
        [ALL[2]],
        [ALL[0]],
        [ALL[0]],
    ]


# --- node lock release and the register annotation against API trouble ---------------------------


def test_a_lock_release_that_keeps_conflicting_gives_up_without_failing_allocate(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    add_pending_pod(stack.apiserver, "p", [[dev(GPU_A)]])
    stack.apiserver.inject_fault("PATCH", f"/api/v1/nodes/{NODE}", status=409, times=None)
    with caplog.at_level(logging.WARNING, logger="hami_plugin.deviceplugin.allocator"):
        answer = stack.allocate([f"{GPU_A}-0"]).container_responses[0]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert pod_annotations(stack.apiserver, "p")[ANNOTATION_BIND_PHASE] == "success"
    patches = stack.apiserver.requests_matching("PATCH", f"/api/v1/nodes/{NODE}")
    assert 1 < len(patches) <= 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "lock not released" in lines[0]


@pytest.fixture
def publisher_values(
    apiserver: FakeApiServer, kube: KubeClient
) -> Iterator[tuple[RegisterPublisher, list[str]]]:
    apiserver.add_node(NODE)
    values = ["[1]"]
    publisher = RegisterPublisher(kube, NODE, lambda: values[-1], interval_seconds=0.02)
    try:
        yield publisher, values
    finally:
        publisher.stop()


def register_patches(apiserver: FakeApiServer) -> list[object]:
    return [
        r.json()["metadata"]["annotations"][ANNOTATION_NODE_REGISTER]
        for r in apiserver.requests_matching("PATCH", f"/api/v1/nodes/{NODE}")
    ]


def node_gets(apiserver: FakeApiServer) -> int:
    return len(apiserver.requests_matching("GET", f"/api/v1/nodes/{NODE}"))


def test_the_register_annotation_is_written_once_the_api_server_is_back(
    apiserver: FakeApiServer,
    publisher_values: tuple[RegisterPublisher, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher, values = publisher_values
    apiserver.inject_fault(status=503, times=None)
    with caplog.at_level(logging.INFO, logger="hami_plugin.deviceplugin.register"):
        publisher.start()
        wait_until(lambda: len(apiserver.requests) >= 6, timeout=WAIT)  # several failing rounds
        apiserver.clear_faults()
        wait_until(lambda: publisher.last_written == "[1]", timeout=WAIT)  # set after the log line
    assert node_annotations(apiserver)[ANNOTATION_NODE_REGISTER] == "[1]"
    failing = [r for r in caplog.records if "not written" in r.getMessage()]
    assert len(failing) == 1  # one line for the whole outage
    assert any("up to date again" in r.getMessage() for r in caplog.records)

    # Rounds go on (each checks the node) without writing the unchanged value again.
    written = len(register_patches(apiserver))
    gets = node_gets(apiserver)
    wait_until(lambda: node_gets(apiserver) >= gets + 3, timeout=WAIT)
    assert len(register_patches(apiserver)) == written

    values.append("[2]")  # one change, one write
    wait_until(
        lambda: node_annotations(apiserver).get(ANNOTATION_NODE_REGISTER) == "[2]", timeout=WAIT
    )
    gets = node_gets(apiserver)
    wait_until(lambda: node_gets(apiserver) >= gets + 3, timeout=WAIT)
    assert register_patches(apiserver)[written:] == ["[2]"]


def test_a_register_annotation_lost_on_the_node_is_written_again(
    apiserver: FakeApiServer, publisher_values: tuple[RegisterPublisher, list[str]]
) -> None:
    # A node object deleted and re-created by kubelet comes back without our annotation.
    publisher, _ = publisher_values
    publisher.start()
    wait_until(
        lambda: node_annotations(apiserver).get(ANNOTATION_NODE_REGISTER) == "[1]", timeout=WAIT
    )
    apiserver.update_object(
        "nodes", "", NODE, lambda n: n["metadata"]["annotations"].pop(ANNOTATION_NODE_REGISTER)
    )
    wait_until(
        lambda: node_annotations(apiserver).get(ANNOTATION_NODE_REGISTER) == "[1]", timeout=WAIT
    )
    assert register_patches(apiserver) == ["[1]", "[1]"]


# --- kubelet misbehaves --------------------------------------------------------------------------


def test_many_quick_kubelet_restarts_end_registered_with_the_last_one(stack: Stack) -> None:
    for _ in range(8):
        stack.kubelet.restart()
    last = stack.kubelet.restarts
    # The last kubelet got a registration and a full list on a live stream.
    wait_until(
        lambda: any(
            c.lists and len(c.lists[-1]) == 4 and not c.stream_ended.is_set()
            for c in stack.kubelet.connections
        ),
        timeout=WAIT,
    )
    assert last == 8
    options = stack.stub().GetDevicePluginOptions(api_pb2.Empty(), timeout=CALL_BOUND)
    assert options.get_preferred_allocation_available
    assert_still_serving(stack)


class RefusingKubelet(FakeKubelet):
    """Refuses the first `refusals` Register calls, as a kubelet that is not ready yet."""

    def __init__(self, plugin_dir: str, refusals: int) -> None:
        super().__init__(plugin_dir)
        self.refusals = refusals

    def _register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> None:
        if self.refusals > 0:
            self.refusals -= 1
            self._refuse(context, "kubelet is not ready")
        super()._register(request, context)


def test_a_kubelet_that_refuses_register_is_retried_until_it_accepts(
    sock_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = RefusingKubelet(sock_dir, refusals=3).start()
    board = DeviceBoard(vgpus(GPU_A))
    service = DevicePluginService(board, PodAllocator(None, NODE, AllocateConfig()))  # type: ignore[arg-type]
    registrar = KubeletRegistrar(
        service,
        plugin_dir=sock_dir,
        socket_name=SOCKET,
        resource_name="nvidia.com/gpu",
        refused_backoff=RetryPolicy(
            initial_backoff_seconds=0.01, max_backoff_seconds=0.05, jitter=False
        ),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="hami_plugin.deviceplugin.kubelet"):
            registrar.start()
            kubelet.wait_for_registrations(1)
        kubelet.wait_for_list(lambda s: len(s) == 2)
    finally:
        registrar.stop()
        kubelet.stop()
        board.close()
    assert kubelet.errors == ["kubelet is not ready"] * 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "kubelet is not ready" in lines[0]


def test_a_stale_kubelet_socket_with_nobody_listening(sock_dir: str) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.path.join(sock_dir, "kubelet.sock"))
    stale.close()  # the file stays, nobody listens: kubelet died without cleaning up
    board = DeviceBoard(vgpus(GPU_A))
    service = DevicePluginService(board, PodAllocator(None, NODE, AllocateConfig()))  # type: ignore[arg-type]
    registrar = KubeletRegistrar(
        service, plugin_dir=sock_dir, socket_name=SOCKET, resource_name="nvidia.com/gpu"
    )
    kubelet = FakeKubelet(sock_dir)
    try:
        registrar.start()
        wait_until(lambda: os.path.exists(registrar.socket_path), timeout=WAIT)
        kubelet.start()  # deletes every socket, ours too, and serves a new kubelet.sock
        kubelet.wait_for_registrations(1)
        kubelet.wait_for_list(lambda s: len(s) == 2)
    finally:
        registrar.stop()
        kubelet.stop()
        board.close()


# --- ListAndWatch clients ------------------------------------------------------------------------


def test_a_second_watcher_that_comes_and_goes_does_not_disturb_kubelet(stack: Stack) -> None:
    kubelet_connection = stack.kubelet.latest()
    stack.kubelet.wait_for_list(lambda s: len(s) == 4)
    channel = grpc.insecure_channel(f"unix://{stack.registrar.socket_path}")
    stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
    stream = stub.ListAndWatch(api_pb2.Empty())
    assert len(next(stream).devices) == 4
    # Both watchers see a change.
    stack.board.publish(vgpus(GPU_A))
    assert len(next(stream).devices) == 2
    stack.kubelet.wait_for_list(lambda s: len(s) == 2)
    channel.close()  # abrupt: no cancel, the connection just goes
    # The debugging client leaving is no kubelet restart: kubelet's stream lives on.
    stack.board.publish(vgpus(GPU_B))
    stack.kubelet.wait_for_list(
        lambda s: [d.id for d in s] == [f"{GPU_B}-0", f"{GPU_B}-1"], connection=kubelet_connection
    )
    assert not stack.registrar.wait_registered(2, timeout=0.5)
    assert not kubelet_connection.stream_ended.is_set()


def test_streams_that_vanish_leave_no_thread_behind(stack: Stack) -> None:
    stack.kubelet.wait_for_list(lambda s: len(s) == 4)
    server = stack.registrar._server
    assert server is not None
    # Three rounds of six watchers: 18 leaked stream threads would exhaust the 16 workers and
    # the last round (or the Allocate after it) would not be served.
    for _ in range(3):
        channels = [grpc.insecure_channel(f"unix://{server.socket_path}") for _ in range(6)]
        for index, channel in enumerate(channels):
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            stream = stub.ListAndWatch(api_pb2.Empty(), timeout=CALL_BOUND)
            assert len(next(stream).devices) == 4
            if index % 2:
                stream.cancel()
            channel.close()  # the others just go away
        wait_until(lambda: server.live_streams == 1, timeout=WAIT)  # kubelet's own stream is left
    assert stack.registrar.registrations == 1
    assert not stack.kubelet.latest().stream_ended.is_set()
    assert_still_serving(stack)


# --- GPUs that vanish, come back, and a fake file that turns invalid -----------------------------


def write_gpus(path: Path, gpus: Sequence[dict[str, object]] | str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(gpus if isinstance(gpus, str) else yaml.safe_dump({"gpus": list(gpus)}))
    tmp.replace(path)


GPU_SPEC_A = {"uuid": GPU_A, "name": "NVIDIA A100", "memory_mib": 40960, "numa_node": 0}
GPU_SPEC_B = {"uuid": GPU_B, "name": "NVIDIA A100", "memory_mib": 40960, "numa_node": 0}


def registered_uuids(apiserver: FakeApiServer) -> list[str]:
    value = node_annotations(apiserver).get(ANNOTATION_NODE_REGISTER)
    return [d.uuid for d in codec.decode_node_devices(value)] if value else []


def listed_gpus(states: tuple[DeviceState, ...]) -> list[str]:
    return sorted({s.id.rsplit("-", 1)[0] for s in states})


def test_a_gpu_that_vanishes_and_comes_back_and_a_broken_file(
    sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    apiserver.add_node(NODE)
    gpus_file = tmp_path / "gpus.yaml"
    write_gpus(gpus_file, [GPU_SPEC_A, GPU_SPEC_B])
    install_fake_hamicore(tmp_path / "hook")
    settings = DevicePluginSettings(
        metrics_bind_address="0",  # no /metrics port in wire tests
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus_file),
        split_count=2,
        hook_path=str(tmp_path / "hook"),
        register_interval_seconds=0.1,
        health_wait_ms=50,
    )
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "vgpulock")
    )
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()))
    kubelet = FakeKubelet(sock_dir).start()
    thread.start()
    try:
        kubelet.wait_for_registrations(1)
        kubelet.wait_for_list(lambda s: listed_gpus(s) == sorted([GPU_A, GPU_B]))
        wait_until(lambda: registered_uuids(apiserver) == [GPU_A, GPU_B], timeout=WAIT)

        write_gpus(gpus_file, [GPU_SPEC_B])  # GPU_A fell off the bus and out of the list
        kubelet.wait_for_list(lambda s: listed_gpus(s) == [GPU_B])
        wait_until(lambda: registered_uuids(apiserver) == [GPU_B], timeout=WAIT)

        write_gpus(gpus_file, [GPU_SPEC_A, GPU_SPEC_B])
        kubelet.wait_for_list(
            lambda s: (
                listed_gpus(s) == sorted([GPU_A, GPU_B]) and all(d.health == "Healthy" for d in s)
            )
        )
        wait_until(lambda: registered_uuids(apiserver) == [GPU_A, GPU_B], timeout=WAIT)

        write_gpus(gpus_file, "gpus: [ {uuid: ")  # half-written file: the last good one holds
        stack_stub = kubelet.latest().stub
        options = stack_stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=CALL_BOUND)
        assert options.get_preferred_allocation_available
        add_pending_pod(apiserver, "after", [[dev(GPU_A)]])
        answer = kubelet.allocate([f"{GPU_A}-0"], timeout=CALL_BOUND).container_responses[0]
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
        assert listed_gpus(kubelet.latest().lists[-1]) == sorted([GPU_A, GPU_B])
        assert registered_uuids(apiserver) == [GPU_A, GPU_B]
    finally:
        daemon.stop()
        thread.join(10)
        kubelet.stop()
    assert exit_codes == [0]
