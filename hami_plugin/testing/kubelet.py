"""A test kubelet: the Registration service on a real unix socket, and the dial-back.

It behaves as kubelet's device manager does (docs/kubelet-deviceplugin.md 2.1-2.3):

* serves `v1beta1.Registration` on `<dir>/kubelet.sock` (the directory is created 0750);
* `Register` checks the version and the resource name and answers with kubelet's exact error
  strings (as gRPC UNKNOWN, which is what a plain Go error becomes);
* then, inside Register, dials `<dir>/<endpoint>` (blocking, authority `localhost`), calls
  GetDevicePluginOptions, and after Register has returned reads ListAndWatch in a thread,
  recording every list;
* `restart()` is a kubelet restart: the old process's connections die, every unix socket in the
  directory is deleted (`CleanupPluginDirectory`), and a new kubelet.sock is served.

Tests call Allocate / GetPreferredAllocation through `allocate()` / `preferred()`, on the
latest registration's connection, as kubelet would.

`PodAdmitter` plays kubelet's pod admission for one node against an API server (the
`FakeApiServer` double) over plain HTTP: it polls the pods bound to the node, sorts each batch of
new pods by creationTimestamp (ties in seeded random order, as kubelet's unstable sort leaves
them), and admits one pod at a time, calling GetPreferredAllocation and Allocate per GPU
container (init containers first) with device IDs picked as kubelet's device manager picks them.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import stat
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any
from urllib.parse import quote

import grpc
import urllib3

from hami_plugin.deviceplugin.api import api_pb2, api_pb2_grpc
from hami_plugin.protocol.model import HEALTHY
from hami_plugin.protocol.objects import ContainerSpec, read_pod

logger = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
SUPPORTED_VERSIONS = ("v1beta1",)
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"

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

    def __init__(self, plugin_dir: str, *, dial_timeout_seconds: float = 5.0) -> None:
        self.plugin_dir = plugin_dir
        self.socket_path = os.path.join(plugin_dir, KUBELET_SOCKET)
        self._dial_timeout = dial_timeout_seconds
        self._condition = threading.Condition()
        self._connections: list[PluginConnection] = []
        self._errors: list[str] = []
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
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
        server.add_insecure_port(f"unix://{self.socket_path}")
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

    def wait_for_registrations(self, count: int, timeout: float = 5.0) -> list[PluginConnection]:
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
        timeout: float = 5.0,
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
                    self._condition.notify_all()
        except grpc.RpcError:
            pass
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


# --- pod admission ------------------------------------------------------------------------------


class AdmissionError(Exception):
    """kubelet refuses the pod; `str(error)` is the message it puts in the pod status."""


@dataclass(frozen=True, slots=True)
class _Pod:
    """The fields of a Pod that admission reads."""

    namespace: str
    name: str
    uid: str
    phase: str
    created_seconds: int
    init_containers: tuple[tuple[str, int], ...]  # (name, devices of the resource)
    containers: tuple[tuple[str, int], ...]

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def _device_count(container: ContainerSpec, resource: str) -> int:
    for part in (container.limits, container.requests):
        value = part.get(resource)
        if value is not None:
            try:
                return max(int(str(value)), 0)
            except ValueError:
                return 0
    return 0


def _read_pod(obj: Mapping[str, Any], resource: str) -> _Pod:
    """The admission fields of a listed pod, read by the daemons' own reader. Raises
    ObjectError (a ValueError) for a malformed pod."""
    pod = read_pod(obj)
    created = pod.creation_timestamp
    seconds = int(created.replace(tzinfo=created.tzinfo or UTC).timestamp()) if created else 0

    def containers(specs: tuple[ContainerSpec, ...]) -> tuple[tuple[str, int], ...]:
        return tuple((c.name, _device_count(c, resource)) for c in specs)

    return _Pod(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        phase=pod.phase,
        created_seconds=seconds,
        init_containers=containers(pod.init_containers),
        containers=containers(pod.containers),
    )


class PodAdmitter:
    """kubelet's pod admission for one node, against the API server at `api_url`.

    Every `poll_interval_seconds` it lists the pods with `spec.nodeName=<node>`; the pods it has
    not seen before form one batch, sorted by creation second with ties in random order (seeded
    with `seed`), admitted one at a time. For each container asking `resource` (init containers
    first) it picks device IDs as kubelet's device manager does: devices of earlier init
    containers of the pod first, then, when the plugin's options offer it, the
    GetPreferredAllocation answer kept to the available IDs, then its own pick (sorted IDs);
    available = healthy advertised IDs minus those held by admitted pods that are neither gone
    nor finished. Then Allocate over the plugin's socket. A pod whose containers all succeeded
    is marked Running; the first failure marks it Failed with reason `UnexpectedAdmissionError`
    and kubelet's message. Pods already Failed/Succeeded when first seen are not admitted.

    API failures (the double's faults) are retried: a failed list is the next poll, a failed
    status patch is sent again each poll until it lands or the pod is gone. Results:
    `admitted` (keys in admission order), `responses[(ns, pod, container)]`, `device_ids` (the
    IDs sent to Allocate, same keys), `failures[(ns, pod)]` (kubelet's message), `batches`.
    """

    def __init__(
        self,
        kubelet: FakeKubelet,
        api_url: str,
        node_name: str,
        *,
        resource_name: str = "nvidia.com/gpu",
        poll_interval_seconds: float = 0.03,
        seed: int = 0,
        token: str | None = "fake-token",
        request_timeout_seconds: float = 2.0,
        rpc_timeout_seconds: float = 30.0,
    ) -> None:
        self._kubelet = kubelet
        self._api_url = api_url.rstrip("/")
        self._node_name = node_name
        self._resource = resource_name
        self._interval = poll_interval_seconds
        self._rng = random.Random(seed)
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._http = urllib3.PoolManager(
            retries=False,
            timeout=urllib3.Timeout(connect=request_timeout_seconds, read=request_timeout_seconds),
        )
        self._rpc_timeout = rpc_timeout_seconds
        self._condition = threading.Condition()
        self._seen: set[str] = set()  # pod UIDs
        self._held: dict[str, set[str]] = {}  # pod UID -> device IDs
        self._status_due: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._admitted: list[tuple[str, str]] = []
        self._responses: dict[tuple[str, str, str], api_pb2.ContainerAllocateResponse] = {}
        self._device_ids: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self._failures: dict[tuple[str, str], str] = {}
        self._batches: list[list[tuple[str, str]]] = []
        self._polls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> PodAdmitter:
        """Start polling on a thread of its own."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pod-admitter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (an admission in progress finishes first) and close the connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._http.clear()

    def __enter__(self) -> PodAdmitter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- results --------------------------------------------------------------------------

    @property
    def admitted(self) -> list[tuple[str, str]]:
        with self._condition:
            return list(self._admitted)

    @property
    def responses(self) -> dict[tuple[str, str, str], api_pb2.ContainerAllocateResponse]:
        with self._condition:
            return dict(self._responses)

    @property
    def device_ids(self) -> dict[tuple[str, str, str], tuple[str, ...]]:
        with self._condition:
            return dict(self._device_ids)

    @property
    def failures(self) -> dict[tuple[str, str], str]:
        with self._condition:
            return dict(self._failures)

    @property
    def batches(self) -> list[list[tuple[str, str]]]:
        """Each batch in the order it was admitted (after the sort)."""
        with self._condition:
            return [list(b) for b in self._batches]

    @property
    def polls(self) -> int:
        """Completed polls (successful lists)."""
        with self._condition:
            return self._polls

    def wait_for(self, keys: Iterable[tuple[str, str]], timeout: float = 10.0) -> None:
        """Block until every (namespace, name) was admitted or failed; AssertionError if not."""
        wanted = set(keys)

        def done() -> bool:
            return wanted <= set(self._admitted) | set(self._failures)

        with self._condition:
            if not self._condition.wait_for(done, timeout):
                missing = wanted - set(self._admitted) - set(self._failures)
                raise AssertionError(f"not admitted within {timeout} s: {sorted(missing)}")

    def wait_for_polls(self, count: int, timeout: float = 10.0) -> None:
        """Block until `count` more polls have completed (the API server is readable again)."""
        with self._condition:
            target = self._polls + count
            if not self._condition.wait_for(lambda: self._polls >= target, timeout):
                raise AssertionError(f"fewer than {count} polls within {timeout} s")

    # --- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception:  # a bug here must not end the loop silently
                logger.exception("pod admitter: poll failed")
            self._stop.wait(self._interval)

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        """One API call. Raises LookupError for 404 (gone) and 409 (a precondition such as the
        uid failed), RuntimeError for another non-2xx, urllib3 errors as they come."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
            data = json.dumps(body).encode()
        response = self._http.request(method, self._api_url + path, body=data, headers=headers)
        if response.status in (404, 409):
            raise LookupError(f"{method} {path}: HTTP {response.status}")
        if not 200 <= response.status <= 299:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}")
        return json.loads(response.data)

    def _poll(self) -> None:
        self._send_due_statuses()
        selector = quote(f"spec.nodeName={self._node_name}")
        try:
            listing = self._request("GET", f"/api/v1/pods?fieldSelector={selector}")
            pods = [_read_pod(item, self._resource) for item in listing.get("items") or ()]
        except (urllib3.exceptions.HTTPError, RuntimeError, LookupError, ValueError) as error:
            logger.debug("pod admitter: list failed: %s", error)
            return
        live = {p.uid for p in pods if p.phase not in ("Failed", "Succeeded")}
        with self._condition:
            self._polls += 1
            self._condition.notify_all()
            for uid in list(self._held):
                if uid not in live:  # deleted or finished: its devices are free again
                    del self._held[uid]
        batch = [p for p in pods if p.uid not in self._seen]
        if not batch:
            return
        self._seen.update(p.uid for p in batch)
        # kubelet's sort.Sort by creation time is not stable: ties come in any order.
        self._rng.shuffle(batch)
        batch.sort(key=lambda p: p.created_seconds)
        with self._condition:
            self._batches.append([p.key for p in batch])
        for pod in batch:
            if self._stop.is_set():
                return
            if pod.phase in ("Failed", "Succeeded"):
                continue
            self._admit(pod)

    def _admit(self, pod: _Pod) -> None:
        try:
            self._allocate_pod(pod)
        except AdmissionError as error:
            logger.info("pod admitter: %s/%s rejected: %s", pod.namespace, pod.name, error)
            with self._condition:
                self._held.pop(pod.uid, None)
            # The status is tried before the result is published, so a waiter sees it when the
            # API server is up (retried later otherwise).
            self._set_status(
                pod,
                {"phase": "Failed", "reason": UNEXPECTED_ADMISSION_ERROR, "message": str(error)},
            )
            with self._condition:
                self._failures[pod.key] = str(error)
                self._condition.notify_all()
            return
        self._set_status(pod, {"phase": "Running"})
        with self._condition:
            self._admitted.append(pod.key)
            self._condition.notify_all()

    def _allocate_pod(self, pod: _Pod) -> None:
        reusable: list[str] = []  # devices of this pod's init containers, reused by later ones
        for index, (name, needed) in enumerate(pod.init_containers + pod.containers):
            if needed <= 0:
                continue
            is_init = index < len(pod.init_containers)
            ids = self._pick(pod, needed, reusable)
            response = self._call_allocate(ids)
            with self._condition:
                self._responses[(pod.namespace, pod.name, name)] = response
                self._device_ids[(pod.namespace, pod.name, name)] = tuple(ids)
            if is_init:
                reusable.extend(i for i in ids if i not in reusable)
            else:
                reusable = [i for i in reusable if i not in ids]

    def _pick(self, pod: _Pod, needed: int, reusable: Sequence[str]) -> list[str]:
        """kubelet's devicesToAllocate (devicemanager/manager.go), without topology."""
        current = self._kubelet.current()
        if current is None:
            raise AdmissionError(f"cannot allocate unregistered device {self._resource}")
        connection, states = current
        healthy = sorted(s.id for s in states if s.health == HEALTHY)
        if not healthy:
            raise AdmissionError(
                f"no healthy devices present; cannot allocate unhealthy devices {self._resource}"
            )
        chosen = list(reusable[:needed])
        with self._condition:
            in_use = set().union(*self._held.values()) if self._held else set()
            held = self._held.setdefault(pod.uid, set())
            held.update(chosen)
        if len(chosen) == needed:
            return chosen
        available = [i for i in healthy if i not in in_use and i not in chosen]
        if len(available) < needed - len(chosen):
            raise AdmissionError(
                f"requested number of devices unavailable for {self._resource}. "
                f"Requested: {needed - len(chosen)}, Available: {len(available)}"
            )
        if connection.options.get_preferred_allocation_available:
            request = api_pb2.PreferredAllocationRequest()
            request.container_requests.add(
                available_deviceIDs=available + chosen,
                must_include_deviceIDs=chosen,
                allocation_size=needed,
            )
            try:
                answer = connection.stub.GetPreferredAllocation(request, timeout=self._rpc_timeout)
            except grpc.RpcError as error:
                raise AdmissionError(
                    "device plugin GetPreferredAllocation rpc failed with err: "
                    f"{_rpc_error_text(error)}"
                ) from error
            if answer.container_responses:
                for device_id in answer.container_responses[0].deviceIDs:
                    if len(chosen) < needed and device_id in available and device_id not in chosen:
                        chosen.append(device_id)
        for device_id in available:
            if len(chosen) >= needed:
                break
            if device_id not in chosen:
                chosen.append(device_id)
        with self._condition:
            self._held.setdefault(pod.uid, set()).update(chosen)
        return chosen

    def _call_allocate(self, ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        current = self._kubelet.current()
        if current is None:
            raise AdmissionError(f"cannot allocate unregistered device {self._resource}")
        request = api_pb2.AllocateRequest()
        request.container_requests.add(devices_ids=list(ids))
        try:
            response = current[0].stub.Allocate(request, timeout=self._rpc_timeout)
        except grpc.RpcError as error:
            raise AdmissionError(
                f"Allocate failed due to {_rpc_error_text(error)}, which is unexpected"
            ) from error
        if not response.container_responses:
            raise AdmissionError(
                "Allocate failed due to no containers return in allocation response "
                f"{response}, which is unexpected"
            )
        result: api_pb2.ContainerAllocateResponse = response.container_responses[0]
        return result

    # --- pod status -------------------------------------------------------------------------

    def _set_status(self, pod: _Pod, status: dict[str, Any]) -> None:
        with self._condition:
            self._status_due[pod.key] = (pod.uid, status)
        self._send_due_statuses()

    def _send_due_statuses(self) -> None:
        with self._condition:
            due = dict(self._status_due)
        for (namespace, name), (uid, status) in due.items():
            path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
            try:
                # The double has no /status subresource; a merge patch of `status` on the pod
                # does what kubelet's status manager does. A real API server takes the uid as a
                # precondition (409 for a new pod of the same name).
                self._request("PATCH", path, {"metadata": {"uid": uid}, "status": status})
            except LookupError:
                pass  # gone: nothing to report
            except (urllib3.exceptions.HTTPError, RuntimeError, ValueError) as error:
                logger.debug("pod admitter: status of %s/%s not sent: %s", namespace, name, error)
                continue
            with self._condition:
                if self._status_due.get((namespace, name), (None,))[0] == uid:
                    del self._status_due[(namespace, name)]


def _rpc_error_text(error: grpc.RpcError) -> str:
    """The error as a Go gRPC client prints it: `rpc error: code = X desc = Y`."""
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    name = "".join(part.capitalize() for part in code.name.split("_")) if code else "Unknown"
    return f"rpc error: code = {name} desc = {details}"
