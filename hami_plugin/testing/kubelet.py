"""A test kubelet: the Registration service on a real unix socket, and the dial-back.

It behaves as kubelet's device manager does (docs/kubelet-deviceplugin.md 2.1-2.3):

* serves `v1beta1.Registration` on `<dir>/kubelet.sock` (the directory is created 0750);
* `Register` checks the version and the resource name and answers with kubelet's exact error
  strings (as gRPC UNKNOWN, which is what a plain Go error becomes);
* then, inside Register, dials `<dir>/<endpoint>` (blocking, authority `localhost`), calls
  GetDevicePluginOptions, and after Register has returned reads ListAndWatch in a thread,
  recording every list;
* with `write_checkpoint`, every list a plugin sends replaces its resource's devices in
  `<dir>/kubelet_internal_checkpoint` (`Data.RegisteredDevices`, written whole through a
  temporary file as kubelet's checkpoint manager does; the checksum is a placeholder), as
  kubelet's `genericDeviceUpdateCallback` does for whichever plugin sent last;
* `restart()` is a kubelet restart: the old process's connections die, every unix socket in the
  directory is deleted (`CleanupPluginDirectory`), and a new kubelet.sock is served;
* serves kubelet's PodResources API v1 (`v1.PodResourcesLister`: List, GetAllocatableResources
  and Get) on `pod_resources_socket` (default `<dir>/pod-resources.sock`; kubelet's
  is /var/lib/kubelet/pod-resources/kubelet.sock). `List` answers what the installed provider
  returns (`install_pod_resources`; `PodAdmitter` installs its pod manager), nothing without one;
  `fail_pod_resources` makes it answer an error status instead.

Tests call Allocate / GetPreferredAllocation through `allocate()` / `preferred()`, on the
latest registration's connection, as kubelet would.

Pod admission (which pods get Allocate, in what order, with which IDs) is `PodAdmitter`, in
`hami_plugin.testing.admission`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.deviceplugin.api.podresources import api_pb2 as podresources_pb2
from hami_plugin.deviceplugin.api.podresources import api_pb2_grpc as podresources_pb2_grpc
from hami_plugin.deviceplugin.rivals import CHECKPOINT_NAME

logger = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
POD_RESOURCES_SOCKET = "pod-resources.sock"
SUPPORTED_VERSIONS = ("v1beta1",)

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """Kubernetes' IsExtendedResourceName (docs/kubelet-deviceplugin.md 2.2 step 3)."""
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return False
    qualified = "requests." + name
    prefix, _, short = qualified.rpartition("/")
    if not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
        return False
    return 0 < len(short) <= 63 and bool(_QUALIFIED_NAME_PART.fullmatch(short))


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One device as kubelet read it from ListAndWatch."""

    id: str
    health: str
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ListedContainer:
    """One container as kubelet's PodResources `List` shows it: the device IDs allocated to it
    per resource name (none until its Allocate succeeded)."""

    name: str
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListedPod:
    """One pod of kubelet's pod manager as `List` shows it (app containers only, as kubelet
    lists them: init containers that are not sidecars are left out)."""

    namespace: str
    name: str
    containers: tuple[ListedContainer, ...] = ()


PodResourcesProvider = Callable[[], Sequence[ListedPod]]
"""What kubelet's `List` answers, read at each call."""


@dataclass
class PluginConnection:
    """One successful registration: the request, the options read back, and every list."""

    request: api_pb2.RegisterRequest
    options: api_pb2.DevicePluginOptions
    channel: grpc.Channel
    stub: api_pb2_grpc.DevicePluginStub
    lists: list[tuple[DeviceState, ...]] = field(default_factory=list)
    stream_ended: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None
    call: Any = None

    def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        self.channel.close()
        if self.reader is not None and self.reader is not threading.current_thread():
            self.reader.join(timeout=10)


class FakeKubelet:
    """Registration server + plugin client, like kubelet's device manager."""

    def __init__(
        self,
        plugin_dir: str,
        *,
        dial_timeout_seconds: float = 5.0,
        pod_resources_socket: str | None = None,
        write_checkpoint: bool = False,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.checkpoint_path = os.path.join(plugin_dir, CHECKPOINT_NAME)
        self._write_checkpoint = write_checkpoint
        self._registered_devices: dict[str, list[str]] = {}
        self.socket_path = os.path.join(plugin_dir, KUBELET_SOCKET)
        self.pod_resources_socket = pod_resources_socket or os.path.join(
            plugin_dir, POD_RESOURCES_SOCKET
        )
        """Where the PodResources API is served (the device plugin's --pod-resources-socket)."""
        self._dial_timeout = dial_timeout_seconds
        self._condition = threading.Condition()
        self._connections: list[PluginConnection] = []
        self._errors: list[str] = []
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._pod_resources: PodResourcesProvider | None = None
        self._pod_resources_fault: tuple[grpc.StatusCode, int | None] | None = None
        self._pod_resources_calls = 0
        self.restarts = 0

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, *, cleanup: bool = True) -> FakeKubelet:
        """Clean the directory's sockets (as kubelet does at start) and serve Registration."""
        os.makedirs(self.plugin_dir, mode=0o750, exist_ok=True)
        if cleanup:
            self.cleanup_sockets()
        self._executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet")
        server = grpc.server(self._executor)
        api_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            _Registration(self), server
        )
        podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(  # type: ignore[no-untyped-call]
            _PodResourcesLister(self), server
        )
        # One server for both sockets (kubelet runs two): each answers both services.
        server.add_insecure_port(f"unix://{self.socket_path}")
        if os.path.exists(self.pod_resources_socket):
            os.unlink(self.pod_resources_socket)  # a socket left by an earlier kubelet
        server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Kubelet exits: its server stops and every plugin connection closes."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(None).wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with self._condition:
            connections = list(self._connections)
        for connection in connections:
            connection.close()

    def restart(self) -> None:
        """A kubelet restart: old process gone, sockets deleted, new kubelet.sock served."""
        self.stop()
        self.restarts += 1
        self.start(cleanup=True)

    def cleanup_sockets(self) -> list[str]:
        """Delete every unix-socket file in the directory (kubelet's CleanupPluginDirectory)."""
        removed = []
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
                    removed.append(name)
            except FileNotFoundError:
                continue
        return removed

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what kubelet saw -------------------------------------------------------------------

    @property
    def connections(self) -> list[PluginConnection]:
        with self._condition:
            return list(self._connections)

    @property
    def errors(self) -> list[str]:
        """Register errors returned to plugins, oldest first."""
        with self._condition:
            return list(self._errors)

    def wait_for_registrations(self, count: int, timeout: float = 30.0) -> list[PluginConnection]:
        """Block until `count` registrations succeeded in total; raises AssertionError if not."""
        with self._condition:
            if not self._condition.wait_for(lambda: len(self._connections) >= count, timeout):
                raise AssertionError(
                    f"expected {count} registrations within {timeout} s, got "
                    f"{len(self._connections)} (errors: {self._errors})"
                )
            return list(self._connections)

    def wait_for_list(
        self,
        predicate: Callable[[tuple[DeviceState, ...]], bool],
        timeout: float = 30.0,
        connection: PluginConnection | None = None,
    ) -> tuple[DeviceState, ...]:
        """Block until the latest (or given) connection's newest list satisfies `predicate`."""
        with self._condition:

            def ready() -> bool:
                target = connection or (self._connections[-1] if self._connections else None)
                return bool(target and target.lists and predicate(target.lists[-1]))

            if not self._condition.wait_for(ready, timeout):
                target = connection or (self._connections[-1] if self._connections else None)
                last = target.lists[-1] if target and target.lists else None
                raise AssertionError(f"no matching device list within {timeout} s; last: {last}")
            target = connection or self._connections[-1]
            return target.lists[-1]

    def latest(self) -> PluginConnection:
        with self._condition:
            if not self._connections:
                raise AssertionError("no plugin registered")
            return self._connections[-1]

    def current(self) -> tuple[PluginConnection, tuple[DeviceState, ...]] | None:
        """The latest registration and its newest device list; None before any list arrived."""
        with self._condition:
            if not self._connections or not self._connections[-1].lists:
                return None
            connection = self._connections[-1]
            return connection, connection.lists[-1]

    # --- the PodResources API ---------------------------------------------------------------

    def install_pod_resources(self, provider: PodResourcesProvider | None) -> None:
        """What `List` answers from now on (None: no pods)."""
        with self._condition:
            self._pod_resources = provider

    def fail_pod_resources(self, code: grpc.StatusCode | None, *, times: int | None = None) -> None:
        """Answer the next `times` PodResources calls (every call when None) with `code`, or
        answer normally again (`code` None)."""
        with self._condition:
            self._pod_resources_fault = None if code is None else (code, times)

    @property
    def pod_resources_calls(self) -> int:
        """PodResources `List` calls answered so far, errors included."""
        with self._condition:
            return self._pod_resources_calls

    def _pod_resources_check(self, context: grpc.ServicerContext) -> None:
        with self._condition:
            fault = self._pod_resources_fault
            if fault is None:
                return
            code, times = fault
            if times is not None:
                self._pod_resources_fault = (code, times - 1) if times > 1 else None
        context.abort(code, f"fake kubelet: {code.name.lower()}")

    def _list_pod_resources(
        self, context: grpc.ServicerContext
    ) -> podresources_pb2.ListPodResourcesResponse:
        with self._condition:
            self._pod_resources_calls += 1
            provider = self._pod_resources
        self._pod_resources_check(context)
        response = podresources_pb2.ListPodResourcesResponse()
        for pod in provider() if provider is not None else ():
            _write_pod(response.pod_resources.add(), pod)
        return response

    def _get_pod_resources(
        self, request: podresources_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.GetPodResourcesResponse:
        """kubelet's Get (feature gate KubeletPodResourcesGet on): one pod of the pod manager."""
        with self._condition:
            provider = self._pod_resources
        self._pod_resources_check(context)
        for pod in provider() if provider is not None else ():
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                response = podresources_pb2.GetPodResourcesResponse()
                _write_pod(response.pod_resources, pod)
                return response
        # a plain Go error in kubelet: UNKNOWN on the wire
        context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable: abort raises")

    def _allocatable_resources(
        self, context: grpc.ServicerContext
    ) -> podresources_pb2.AllocatableResourcesResponse:
        """Every device the latest registration listed, one entry per device and NUMA node, as
        kubelet's containerDevicesFromResourceDeviceInstances writes them."""
        self._pod_resources_check(context)
        response = podresources_pb2.AllocatableResourcesResponse()
        current = self.current()
        if current is None:
            return response
        connection, states = current
        resource_name = connection.request.resource_name
        for state in states:
            if not state.numa_nodes:
                response.devices.add(resource_name=resource_name, device_ids=[state.id])
            for node in state.numa_nodes:
                devices = response.devices.add(resource_name=resource_name, device_ids=[state.id])
                devices.topology.nodes.add(ID=node)
        return response

    # --- calls kubelet makes on admission ---------------------------------------------------

    def allocate(
        self, device_ids: Sequence[str], timeout: float = 10.0
    ) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=list(device_ids))
        response: api_pb2.AllocateResponse = self.latest().stub.Allocate(request, timeout=timeout)
        return response

    def preferred(
        self,
        available: Sequence[str],
        must_include: Sequence[str] = (),
        size: int = 1,
        timeout: float = 10.0,
    ) -> list[str]:
        request = api_pb2.PreferredAllocationRequest()
        request.container_requests.add(
            available_deviceIDs=list(available),
            must_include_deviceIDs=list(must_include),
            allocation_size=size,
        )
        response = self.latest().stub.GetPreferredAllocation(request, timeout=timeout)
        return list(response.container_responses[0].deviceIDs)

    # --- Register, as kubelet implements it ----------------------------------------------------

    def _register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> None:
        if request.version not in SUPPORTED_VERSIONS:
            self._refuse(
                context,
                f'requested API version "{request.version}" is not supported by kubelet. '
                'Supported version is ["v1beta1"]',
            )
        if not is_extended_resource_name(request.resource_name):
            self._refuse(context, f'the ResourceName "{request.resource_name}" is invalid')
        endpoint = os.path.join(self.plugin_dir, request.endpoint)
        channel = grpc.insecure_channel(
            f"unix://{endpoint}", options=[("grpc.default_authority", "localhost")]
        )
        try:
            grpc.channel_ready_future(channel).result(timeout=self._dial_timeout)
        except grpc.FutureTimeoutError:
            channel.close()
            self._refuse(context, "failed to dial device plugin: context deadline exceeded")
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        try:
            options = stub.GetDevicePluginOptions(api_pb2.Empty())
        except grpc.RpcError as error:
            channel.close()
            self._refuse(context, f"failed to get device plugin options: {error.details()}")
        connection = PluginConnection(request, options, channel, stub)
        connection.reader = threading.Thread(
            target=self._read_stream, args=(connection,), name="kubelet-listandwatch", daemon=True
        )
        with self._condition:
            self._connections.append(connection)
            self._condition.notify_all()
        # kubelet's connectClient starts the ListAndWatch goroutine before Register returns.
        connection.reader.start()

    def _save_checkpoint(self) -> None:
        # Under `_condition`. Kubelet's PodDeviceEntries are left empty: no pod is admitted here.
        document = {
            "Data": {"PodDeviceEntries": None, "RegisteredDevices": self._registered_devices},
            "Checksum": 0,
        }
        temporary = f"{self.checkpoint_path}.tmp"
        with open(temporary, "w") as file:
            json.dump(document, file)
        os.replace(temporary, self.checkpoint_path)

    def _refuse(self, context: grpc.ServicerContext, message: str) -> None:
        with self._condition:
            self._errors.append(message)
            self._condition.notify_all()
        context.abort(grpc.StatusCode.UNKNOWN, message)

    def _read_stream(self, connection: PluginConnection) -> None:
        try:
            connection.call = connection.stub.ListAndWatch(api_pb2.Empty())
            for response in connection.call:
                devices = tuple(
                    DeviceState(d.ID, d.health, tuple(n.ID for n in d.topology.nodes))
                    for d in response.devices
                )
                with self._condition:
                    connection.lists.append(devices)
                    if self._write_checkpoint:
                        resource = connection.request.resource_name
                        self._registered_devices[resource] = [d.id for d in devices]
                        self._save_checkpoint()
                    self._condition.notify_all()
        except grpc.RpcError:
            pass
        except ValueError:
            pass  # "Channel closed": a restart closed the channel before the stream began
        finally:
            connection.stream_ended.set()
            with self._condition:
                self._condition.notify_all()


class _Registration:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        self._kubelet._register(request, context)
        return api_pb2.Empty()


def _write_pod(message: podresources_pb2.PodResources, pod: ListedPod) -> None:
    message.name = pod.name
    message.namespace = pod.namespace
    for container in pod.containers:
        resources = message.containers.add(name=container.name)
        for resource_name, ids in container.devices.items():
            if ids:
                resources.devices.add(resource_name=resource_name, device_ids=list(ids))


class _PodResourcesLister:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Get(
        self, request: podresources_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.GetPodResourcesResponse:
        return self._kubelet._get_pod_resources(request, context)

    def List(
        self, request: podresources_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.ListPodResourcesResponse:
        return self._kubelet._list_pod_resources(context)

    def GetAllocatableResources(
        self, request: podresources_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.AllocatableResourcesResponse:
        return self._kubelet._allocatable_resources(context)
