"""Where Allocate is served: the kubelet-facing gRPC server, five DevicePlugin calls over a socket.

One concurrency model: sync grpcio on a thread pool. The pieces:

* `DevicePluginService`: the RPC logic shared by every server generation, over the device list
  (`deviceplugin.board`) and the Kubernetes side of Allocate (`deviceplugin.allocator`);
  Allocate calls are serialised here.
* `PluginServer`: one grpc.Server bound to one socket file. Re-serving after a kubelet restart
  builds a new one (`deviceplugin.kubelet`) without waiting for the old one's unary calls; a
  stream that a *current* server loses tells the registration loop through `on_stream_lost`.

Domain errors become gRPC status codes in one place (`_abort_with`); anything unexpected is
logged once with its traceback and answered as UNKNOWN.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, NoReturn

import grpc

from hami_plugin.deviceplugin.allocate import AllocateFailure, FailureReason
from hami_plugin.deviceplugin.allocator import HostSetupError, PodAllocationError, PodAllocator
from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.preferred import PreferredRequest
from hami_plugin.kube.errors import Conflict, KubeError, NotFound, Retryable

logger = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 16
"""Threads per server: one per live ListAndWatch stream (one per kubelet), concurrent
Allocate/GetPreferredAllocation calls and the GetDevicePluginOptions call kubelet makes while our
own thread is blocked in Register (docs/kubelet-deviceplugin.md 2.2/2.3)."""


def _status_for(error: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The one place domain errors become gRPC status codes; None for the unexpected."""
    cause = error.cause if isinstance(error, PodAllocationError) else error
    message = str(error)
    if isinstance(cause, AllocateFailure):
        if cause.reason in (FailureReason.DEVICE_COUNT_MISMATCH, FailureReason.INVALID_REQUEST):
            return grpc.StatusCode.INVALID_ARGUMENT, message
        if cause.reason is FailureReason.BOOKING_NOT_SIGNED:
            # Not a state that may yet change: the pod's booking is not the scheduler's.
            return grpc.StatusCode.PERMISSION_DENIED, message
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
                annotations=dict(container.annotations),
                cdi_devices=[api_pb2.CDIDevice(name=name) for name in container.cdi_devices],
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
