"""The kubelet-facing gRPC server: the five DevicePlugin calls over a unix socket.

One concurrency model: sync grpcio on a thread pool. The pieces:

* `DeviceBoard`: the current vGPU device list, versioned. Health and inventory changes publish
  to it; every ListAndWatch stream waits on its condition and sends the full list on change.
  A stream leaves as soon as its RPC ends (`context.add_callback` wakes it) or the board closes,
  so no thread outlives a dead stream.
* `PodAllocator`: the Allocate edge. It asks the API server for the node lock and the pods,
  lets `deviceplugin.allocate` decide, creates the host directories and writes the result back
  (to-allocate consumed, bind-phase, node lock released); any failure marks the pod `failed`,
  releases the lock and records a Warning event. Kubelet waits for Allocate without a deadline
  (and admits nothing else meanwhile), so the API calls of one Allocate share a time budget, and
  reporting a failure gets a budget of its own: a hanging API server costs seconds, not the
  minutes its retry policy allows per call.
* `DevicePluginService`: the RPC logic shared by every server generation; Allocate calls are
  serialised here.
* `PluginServer`: one grpc.Server bound to one socket file. Re-serving after a kubelet restart
  builds a new one (`deviceplugin.kubelet`) without waiting for the old one's unary calls; a
  stream that a *current* server loses tells the registration loop through `on_stream_lost`.

Domain errors become gRPC status codes in one place (`_abort_with`); anything unexpected is
logged once with its traceback and answered as UNKNOWN.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent import futures
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import grpc

from hami_plugin.deviceplugin import allocate
from hami_plugin.deviceplugin.allocate import (
    AllocateConfig,
    AllocateFailure,
    AllocationDecision,
    FailureReason,
    PendingPodChoice,
    PreferredAnswer,
    PreferredRequest,
)
from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.kube.client import Conflict, KubeError, NodeRecord, NotFound, PodRecord, Retryable
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_NODE_LOCK,
    HEALTHY,
    UNHEALTHY,
    BindPhase,
)

if TYPE_CHECKING:
    from hami_plugin.deviceplugin.inventory import VgpuDevice

logger = logging.getLogger(__name__)

EVENT_REASON_ALLOCATE_FAILED = "AllocateFailed"
DEFAULT_MAX_WORKERS = 16
"""Threads per server: one per live ListAndWatch stream (one per kubelet), concurrent
Allocate/GetPreferredAllocation calls and the GetDevicePluginOptions call kubelet makes while our
own thread is blocked in Register (kubelet-deviceplugin.md 2.2/2.3)."""

_LOCK_RELEASE_ATTEMPTS = 4
ALLOCATE_BUDGET_SECONDS = 20.0
"""All API calls of one Allocate, up to writing its result."""
REPORT_BUDGET_SECONDS = 10.0
"""Reporting a failed Allocate (bind-phase, lock, event), and releasing the lock after success."""
PREFERRED_BUDGET_SECONDS = 5.0
"""Finding the pending pod for GetPreferredAllocation; after it, the answer falls back."""


# --- the device list ListAndWatch streams ----------------------------------------------------


def device_message(device: VgpuDevice) -> api_pb2.Device:
    """One kubelet Device: exact health strings; topology only for a known NUMA node."""
    message = api_pb2.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
    if device.numa_node is not None and device.numa_node >= 0:
        message.topology.nodes.add(ID=device.numa_node)
    return message


class DeviceBoard:
    """The vGPU device list kubelet should see, with a version bumped on every change."""

    def __init__(self, devices: Sequence[VgpuDevice] = ()) -> None:
        self._condition = threading.Condition()
        self._devices: tuple[VgpuDevice, ...] = tuple(devices)
        self._version = 0
        self._closed = False
        self._message = self._build(self._devices)

    @staticmethod
    def _build(devices: Sequence[VgpuDevice]) -> api_pb2.ListAndWatchResponse:
        return api_pb2.ListAndWatchResponse(devices=[device_message(d) for d in devices])

    def publish(self, devices: Sequence[VgpuDevice]) -> bool:
        """Make `devices` the current list; returns False (and wakes nobody) if unchanged."""
        new = tuple(devices)
        message = self._build(new)
        with self._condition:
            if new == self._devices:
                return False
            self._devices = new
            self._message = message
            self._version += 1
            self._condition.notify_all()
        return True

    @property
    def devices(self) -> tuple[VgpuDevice, ...]:
        with self._condition:
            return self._devices

    def wake(self) -> None:
        """Wake every waiting stream so it re-checks whether it should leave."""
        with self._condition:
            self._condition.notify_all()

    def close(self) -> None:
        """End every stream (the plugin is stopping)."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def next_message(
        self, seen_version: int | None, cancelled: Callable[[], bool]
    ) -> tuple[int, api_pb2.ListAndWatchResponse] | None:
        """Block until the list differs from `seen_version` (None: return the current list).

        Returns None once the board is closed or `cancelled()` is true.
        """
        with self._condition:
            self._condition.wait_for(
                lambda: self._closed or cancelled() or self._version != seen_version
            )
            if self._closed or cancelled():
                return None
            return self._version, self._message


# --- the Kubernetes side of Allocate ---------------------------------------------------------


class KubeApi(Protocol):
    """The Kubernetes calls Allocate needs (`k8s.KubeClient` provides them).

    An implementation that also has `KubeClient.deadline(seconds)` gets its calls time-bounded
    (see `PodAllocator`); one without it (an in-memory double) is used unbounded.
    """

    def get_node(self, name: str) -> NodeRecord: ...

    def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> NodeRecord: ...

    def list_pods_on_node(self, node_name: str) -> list[PodRecord]: ...

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        labels: Mapping[str, str | None] | None = None,
    ) -> PodRecord: ...

    def create_pod_event(
        self,
        pod: PodRecord,
        reason: str,
        message: str,
        event_type: str = "Normal",
        component: str = "hami-device-plugin",
    ) -> None:
        """Best effort: failures are logged, not raised (`PodAllocator._fail` relies on it)."""


class HostSetupError(Exception):
    """A host directory for the container could not be prepared."""


class PodAllocationError(Exception):
    """Allocate failed for a known pod; the pod is already marked `failed`.

    `cause` is the original error (an AllocateFailure, a KubeError, a HostSetupError or
    anything unexpected).
    """

    def __init__(self, pod: PodRecord, cause: BaseException) -> None:
        super().__init__(f"pod {pod.namespace}/{pod.name}: {cause}")
        self.pod = pod
        self.cause = cause


def prepare_host_dirs(decision: AllocationDecision, vgpulock_path: str) -> None:
    """Recreate each container's cache directory (0777) and make sure the lock dir exists.

    Raises HostSetupError naming the path.
    """
    for container in decision.containers:
        try:
            shutil.rmtree(container.host_dir, ignore_errors=True)
            os.makedirs(container.host_dir, exist_ok=True)
            os.chmod(container.host_dir, 0o777)
        except OSError as error:
            raise HostSetupError(
                f"cannot create {container.host_dir}: {error.strerror or error}"
            ) from error
    try:
        os.makedirs(vgpulock_path, exist_ok=True)
    except OSError as error:
        raise HostSetupError(f"cannot create {vgpulock_path}: {error.strerror or error}") from error
    with contextlib.suppress(OSError):
        # Another user's existing directory keeps its mode; HAMi-core only needs it to exist.
        os.chmod(vgpulock_path, 0o777)


def libvgpu_version() -> str:
    """The version suffix HAMi looks for on `libvgpu.so.<version>`: this package's version."""
    from importlib import metadata

    try:
        return metadata.version("hami-plugin")
    except metadata.PackageNotFoundError:
        return "0"


class PodAllocator:
    """Allocate and GetPreferredAllocation against the API server, for one node."""

    def __init__(
        self,
        kube: KubeApi,
        node_name: str,
        config: AllocateConfig,
        *,
        new_cache_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        version: str | None = None,
        allocate_budget_seconds: float = ALLOCATE_BUDGET_SECONDS,
        report_budget_seconds: float = REPORT_BUDGET_SECONDS,
        preferred_budget_seconds: float = PREFERRED_BUDGET_SECONDS,
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._config = config
        self._new_cache_id = new_cache_id
        self._version = version if version is not None else libvgpu_version()
        self._allocate_budget = allocate_budget_seconds
        self._report_budget = report_budget_seconds
        self._preferred_budget = preferred_budget_seconds

    def _within(self, seconds: float) -> contextlib.AbstractContextManager[object]:
        """The API calls of this thread inside the block share `seconds` (when supported)."""
        deadline: Callable[[float], contextlib.AbstractContextManager[object]] | None = getattr(
            self._kube, "deadline", None
        )
        return deadline(seconds) if deadline is not None else contextlib.nullcontext()

    def _current_config(self) -> AllocateConfig:
        # HAMi stats these files on every call: the plugin's postStart hook installs them on
        # the host after the daemon is already up.
        vgpu_dir = self._config.vgpu_dir
        versioned = f"{vgpu_dir}/libvgpu.so.{self._version}"
        return dataclasses.replace(
            self._config,
            libvgpu_host_path=versioned if os.path.exists(versioned) else None,
            license_present=os.path.exists(f"{vgpu_dir}/license"),
        )

    def _pending_pod(self, device_count: int) -> tuple[NodeRecord, PendingPodChoice[PodRecord]]:
        """The pod kubelet's call for `device_count` devices is for (`select_pending_pod`)."""
        node = self._kube.get_node(self._node_name)
        pods = self._kube.list_pods_on_node(self._node_name)
        choice = allocate.select_pending_pod(
            self._node_name, node.annotations.get(ANNOTATION_NODE_LOCK), pods, device_count
        )
        if choice.lock_warning:
            logger.warning("node %s: %s", self._node_name, choice.lock_warning)
        return node, choice

    def allocate(
        self, requests: Sequence[Sequence[str]], advertised: Collection[str] | None = None
    ) -> AllocationDecision:
        """Decide and carry out one Allocate call.

        `advertised` is every device ID kubelet was offered; an ID outside it fails the pod.
        Raises AllocateFailure(NO_PENDING_POD, NO_MATCHING_POD or INVALID_REQUEST) or a
        KubeError when no pod could be chosen (nothing is patched then), or PodAllocationError
        when the chosen pod failed (it is then marked `failed`, its lock released and a Warning
        event recorded).
        """
        allocate.check_requests(requests)
        with self._within(self._allocate_budget):
            # kubelet sends one container per call; the first one's count picks the pod.
            node, choice = self._pending_pod(len(requests[0]))
            pod = choice.pod
            try:
                decision = allocate.decide_allocation(
                    pod, requests, self._current_config(), self._new_cache_id, advertised
                )
                prepare_host_dirs(decision, self._config.vgpulock_host_path)
                patch: dict[str, str | None] = {
                    ANNOTATION_DEVICES_TO_ALLOCATE: decision.remaining_to_allocate
                }
                if decision.complete:
                    patch[ANNOTATION_BIND_PHASE] = BindPhase.SUCCESS
                self._kube.patch_pod_metadata(pod.namespace, pod.name, patch)
            except Exception as error:
                self._fail(pod, node, error)  # with a budget of its own
                raise PodAllocationError(pod, error) from error
        if decision.complete:
            with self._within(self._report_budget):
                self._release_lock(pod, node)
        for container in decision.containers:
            if container.kubelet_ids_not_used:
                logger.warning(
                    "pod %s/%s container %s: kubelet chose %s, which are not on the GPUs the "
                    "scheduler booked; the container gets the booked GPUs [%s]",
                    pod.namespace,
                    pod.name,
                    container.container_name,
                    ",".join(container.kubelet_ids_not_used),
                    container.envs["NVIDIA_VISIBLE_DEVICES"],
                )
        logger.info(
            "allocated %s to pod %s/%s%s",
            ", ".join(
                f"{c.container_name}=[{c.envs['NVIDIA_VISIBLE_DEVICES']}]"
                for c in decision.containers
            ),
            pod.namespace,
            pod.name,
            " (bind-phase success)" if decision.complete else "",
        )
        return decision

    def preferred(self, requests: Sequence[PreferredRequest]) -> tuple[PreferredAnswer, ...]:
        """GetPreferredAllocation: follow the pending pod's GPUs; never raises for a pod or
        API problem (the answer falls back to a valid choice from `available`)."""
        pod: PodRecord | None
        try:
            with self._within(self._preferred_budget):
                _, choice = self._pending_pod(requests[0].size if requests else 0)
            pod = choice.pod
        except AllocateFailure as error:
            logger.info("preferred allocation without a pod: %s", error)
            pod = None
        except Exception as error:  # the API server is away: still answer
            logger.warning("preferred allocation without a pod: %s", error)
            pod = None
        answers = allocate.decide_preferred(pod, requests)
        for answer in answers:
            if answer.fallback_note:
                logger.info(
                    "preferred allocation fell back (%s): %s",
                    answer.fallback_note,
                    ",".join(answer.device_ids),
                )
        return answers

    def _fail(self, pod: PodRecord, node: NodeRecord, error: BaseException) -> None:
        """Tell the pod: bind-phase `failed`, lock released, a Warning event (best effort,
        within the report budget). Logged by the RPC edge (`_abort_with`), not here."""
        message = f"allocate failed for pod {pod.namespace}/{pod.name}: {error}"
        with self._within(self._report_budget):
            try:
                self._kube.patch_pod_metadata(
                    pod.namespace, pod.name, {ANNOTATION_BIND_PHASE: BindPhase.FAILED}
                )
            except Exception as patch_error:
                logger.warning(
                    "could not mark pod %s/%s failed: %s", pod.namespace, pod.name, patch_error
                )
            self._release_lock(pod, node)
            try:
                self._kube.create_pod_event(pod, EVENT_REASON_ALLOCATE_FAILED, message, "Warning")
            except Exception as event_error:  # the allocation's own error must reach kubelet
                logger.warning("no event for pod %s/%s: %s", pod.namespace, pod.name, event_error)

    def _release_lock(self, pod: PodRecord, node: NodeRecord) -> None:
        """Delete the node lock if `pod` may (`allocate.lock_releasable_by`, HAMi's rule), with
        the node's resourceVersion as precondition; retried on conflict, never raises."""
        for _attempt in range(_LOCK_RELEASE_ATTEMPTS):
            value = node.annotations.get(ANNOTATION_NODE_LOCK)
            if not allocate.lock_releasable_by(value, pod.namespace, pod.name):
                return
            try:
                self._kube.patch_node_annotations(
                    node.name, {ANNOTATION_NODE_LOCK: None}, resource_version=node.resource_version
                )
                return
            except Conflict:
                try:
                    node = self._kube.get_node(node.name)
                except Exception as error:
                    logger.warning("node %s: lock not released: %s", node.name, error)
                    return
            except Exception as error:
                logger.warning("node %s: lock not released: %s", node.name, error)
                return
        logger.warning("node %s: lock not released: kept losing the race", node.name)


# --- the RPC logic -------------------------------------------------------------------------------


def _status_for(error: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The one place domain errors become gRPC status codes; None for the unexpected."""
    cause = error.cause if isinstance(error, PodAllocationError) else error
    message = str(error)
    if isinstance(cause, AllocateFailure):
        if cause.reason in (FailureReason.DEVICE_COUNT_MISMATCH, FailureReason.INVALID_REQUEST):
            return grpc.StatusCode.INVALID_ARGUMENT, message
        return grpc.StatusCode.FAILED_PRECONDITION, message
    if isinstance(cause, Retryable):
        return grpc.StatusCode.UNAVAILABLE, message
    if isinstance(cause, NotFound):
        return grpc.StatusCode.NOT_FOUND, message
    if isinstance(cause, Conflict):
        return grpc.StatusCode.ABORTED, message
    if isinstance(cause, KubeError | HostSetupError):
        return grpc.StatusCode.INTERNAL, message
    if isinstance(error, PodAllocationError):
        return grpc.StatusCode.UNKNOWN, message
    return None


def _abort_with(context: grpc.ServicerContext, call: str, error: BaseException) -> NoReturn:
    status = _status_for(error)
    if status is None:
        logger.exception("%s: unexpected error", call)
        code, message = grpc.StatusCode.UNKNOWN, f"{call}: internal error: {error!r}"
    else:
        code, message = status
        if isinstance(error, PodAllocationError) and code is grpc.StatusCode.UNKNOWN:
            logger.error("%s: unexpected error", call, exc_info=error.cause)
        else:
            logger.warning("%s: %s", call, message)
    context.abort(code, message)
    raise AssertionError("grpc context.abort returned")  # abort always raises


class DevicePluginService:
    """What the DevicePlugin RPCs do, independent of the socket they are served on."""

    def __init__(
        self,
        board: DeviceBoard,
        allocator: PodAllocator,
        *,
        preferred_allocation: bool = True,
    ) -> None:
        self.board = board
        self._allocator = allocator
        self._allocate_lock = threading.Lock()
        self._options = api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=preferred_allocation
        )

    def options(self) -> api_pb2.DevicePluginOptions:
        """The options we register with and answer GetDevicePluginOptions with (identical)."""
        copy = api_pb2.DevicePluginOptions()
        copy.CopyFrom(self._options)
        return copy

    def list_and_watch(
        self, cancelled: Callable[[], bool]
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        """The full list at once, then again after each change, until cancelled or closed."""
        seen: int | None = None
        while True:
            item = self.board.next_message(seen, cancelled)
            if item is None:
                return
            seen, message = item
            yield message

    def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """Serialised Allocate; raises the errors of `PodAllocator.allocate`."""
        requests = [list(container.devices_ids) for container in request.container_requests]
        advertised = {device.id for device in self.board.devices}
        with self._allocate_lock:
            decision = self._allocator.allocate(requests, advertised)
        response = api_pb2.AllocateResponse()
        for container in decision.containers:
            response.container_responses.add(
                envs=dict(container.envs),
                mounts=[
                    api_pb2.Mount(
                        container_path=m.container_path,
                        host_path=m.host_path,
                        read_only=m.read_only,
                    )
                    for m in container.mounts
                ],
            )
        return response

    def preferred_allocation(
        self, request: api_pb2.PreferredAllocationRequest
    ) -> api_pb2.PreferredAllocationResponse:
        requests = [
            PreferredRequest(
                available=tuple(r.available_deviceIDs),
                must_include=tuple(r.must_include_deviceIDs),
                size=r.allocation_size,
            )
            for r in request.container_requests
        ]
        response = api_pb2.PreferredAllocationResponse()
        for answer in self._allocator.preferred(requests):
            response.container_responses.add(deviceIDs=list(answer.device_ids))
        return response


class _Servicer:
    """The DevicePlugin servicer of one PluginServer (grpc dispatches to these names)."""

    def __init__(self, service: DevicePluginService, server: PluginServer) -> None:
        self._service = service
        self._server = server

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return self._service.options()

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        ended = threading.Event()
        board = self._service.board

        def on_end() -> None:
            ended.set()
            board.wake()

        if not context.add_callback(on_end):
            return
        self._server.stream_opened()
        # Any way out except the board closing means kubelet's side went away (a cancelled
        # RPC, or grpc closing the generator at a `yield`).
        stopping = self._server.stopping

        def cancelled() -> bool:
            return ended.is_set() or stopping.is_set()

        board_closed = False
        try:
            yield from self._service.list_and_watch(cancelled)
            board_closed = not cancelled()
        finally:
            self._server.stream_closed(by_peer=not board_closed)

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        try:
            return self._service.preferred_allocation(request)
        except Exception as error:
            _abort_with(context, "GetPreferredAllocation", error)

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        try:
            return self._service.allocate(request)
        except Exception as error:
            _abort_with(context, "Allocate", error)

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


# --- one server on one socket ------------------------------------------------------------------


class PluginServer:
    """A grpc.Server for the DevicePlugin service on `socket_path`.

    `on_stream_lost` is called (from a gRPC thread) when a ListAndWatch stream of this server
    ends from kubelet's side while the server is still meant to run.
    """

    def __init__(
        self,
        service: DevicePluginService,
        socket_path: str,
        *,
        on_stream_lost: Callable[[], None] | None = None,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        self.socket_path = socket_path
        self._service = service
        self._on_stream_lost = on_stream_lost
        self._max_workers = max_workers
        self._executor: futures.ThreadPoolExecutor | None = None
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()
        self._streams_lock = threading.Lock()
        self._live_streams = 0
        self.socket_inode: int | None = None

    @property
    def stopping(self) -> threading.Event:
        """Set once `stop()` began; streams of this server leave when they see it."""
        return self._stopping

    @property
    def live_streams(self) -> int:
        with self._streams_lock:
            return self._live_streams

    def stream_opened(self) -> None:
        with self._streams_lock:
            self._live_streams += 1

    def stream_closed(self, *, by_peer: bool) -> None:
        with self._streams_lock:
            self._live_streams -= 1
        if by_peer and not self._stopping.is_set() and self._on_stream_lost is not None:
            self._on_stream_lost()

    def start(self) -> None:
        """Bind the socket (a stale file is removed first) and start serving.

        Raises OSError when the socket cannot be bound.
        """
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        os.makedirs(os.path.dirname(self.socket_path) or ".", exist_ok=True)
        self._executor = futures.ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix="deviceplugin-grpc"
        )
        server = grpc.server(self._executor, maximum_concurrent_rpcs=None)
        api_pb2_grpc.add_DevicePluginServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(self._service, self), server
        )
        try:
            bound = server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError as error:
            bound = 0
            detail: Any = error
        else:
            detail = "grpc refused the address"
        if not bound:
            self._executor.shutdown(wait=False)
            raise OSError(f"cannot listen on {self.socket_path}: {detail}")
        server.start()
        self._server = server
        try:
            self.socket_inode = os.stat(self.socket_path).st_ino
        except OSError:
            self.socket_inode = None
        logger.info("serving DevicePlugin on %s", self.socket_path)

    def stop(self, grace_seconds: float | None = None, *, wait: bool = True) -> None:
        """Stop serving: end every stream, remove our socket file.

        With `wait`, also wait for the handlers still running. Without it, a unary call that
        is still busy (an Allocate waiting on the API server, within its budget) finishes on
        its own thread, which then exits: a re-registration does not wait for it.
        """
        self._stopping.set()
        # Wake our streams ourselves rather than rely on grpc's cancellation callbacks alone:
        # a stream thread that never wakes would block the executor shutdown below.
        self._service.board.wake()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace_seconds).wait()
        if self._executor is not None:
            self._executor.shutdown(wait=wait)
            self._executor = None
        self._remove_socket()

    def _remove_socket(self) -> None:
        # Only our own socket: after a kubelet restart the path may hold a newer server's file.
        try:
            if self.socket_inode is not None and os.stat(self.socket_path).st_ino == (
                self.socket_inode
            ):
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
