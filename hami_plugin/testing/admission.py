"""The test kubelet's pod admission: which pods get Allocate, in what order, with which IDs.

`PodAdmitter` plays kubelet's pod admission for one node against an API server (the
`FakeApiServer` double) over plain HTTP: it polls the pods bound to the node, sorts each batch of
new pods by creationTimestamp (ties in seeded random order, as kubelet's unstable sort leaves
them), and admits one pod at a time, calling GetPreferredAllocation and Allocate per GPU
container (init containers first) with device IDs picked as kubelet's device manager picks them.

It talks to the device plugin through a `FakeKubelet`'s latest registration
(`hami_plugin.testing.kubelet`), and keeps kubelet's pod manager as kubelet's PodResources `List`
shows it, installed into that `FakeKubelet` while it runs: a pod is added just before its
admission (before its first GetPreferredAllocation or Allocate), each container's device IDs
are recorded once its Allocate succeeded, and a pod leaves when it is gone or finished; a pod
kubelet rejected stays until it is gone (older kubelets list the whole pod manager; newer ones
only active pods, which leaves rejected pods out: the double keeps the harder case).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import quote

import grpc
import urllib3

from hami_plugin.deviceplugin.api import api_pb2
from hami_plugin.protocol.model import HEALTHY
from hami_plugin.protocol.objects import ContainerSpec, read_pod
from hami_plugin.testing.kubelet import FakeKubelet, ListedContainer, ListedPod

logger = logging.getLogger(__name__)

UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"


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


@dataclass(slots=True)
class _Managed:
    """A pod in kubelet's pod manager: the device IDs recorded per container, and whether
    admission rejected it."""

    pod: _Pod
    devices: dict[str, tuple[str, ...]]
    rejected: bool = False


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
        self._pod_manager: dict[str, _Managed] = {}  # pod UID -> kubelet's record, in order
        self._status_due: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._admitted: list[tuple[str, str]] = []
        self._responses: dict[tuple[str, str, str], api_pb2.ContainerAllocateResponse] = {}
        self._device_ids: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self._failures: dict[tuple[str, str], str] = {}
        self._batches: list[list[tuple[str, str]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> PodAdmitter:
        """Start polling on a thread of its own, and answer the kubelet's PodResources `List`
        from this pod manager."""
        self._stop.clear()
        self._kubelet.install_pod_resources(self.listed_pods)
        self._thread = threading.Thread(target=self._run, name="pod-admitter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (an admission in progress finishes first) and close the connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._kubelet.install_pod_resources(None)
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

    def listed_pods(self) -> list[ListedPod]:
        """Kubelet's pod manager as its PodResources `List` shows it: the app containers of each
        pod, with the device IDs of those whose Allocate succeeded."""
        with self._condition:
            managed = list(self._pod_manager.values())
            return [
                ListedPod(
                    entry.pod.namespace,
                    entry.pod.name,
                    tuple(
                        ListedContainer(
                            name,
                            {self._resource: entry.devices[name]} if name in entry.devices else {},
                        )
                        for name, _ in entry.pod.containers
                    ),
                )
                for entry in managed
            ]

    def wait_for(self, keys: Iterable[tuple[str, str]], timeout: float = 10.0) -> None:
        """Block until every (namespace, name) was admitted or failed; AssertionError if not."""
        wanted = set(keys)

        def done() -> bool:
            return wanted <= set(self._admitted) | set(self._failures)

        with self._condition:
            if not self._condition.wait_for(done, timeout):
                missing = wanted - set(self._admitted) - set(self._failures)
                raise AssertionError(f"not admitted within {timeout} s: {sorted(missing)}")

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
        listed = {p.uid for p in pods}
        with self._condition:
            for uid in list(self._held):
                if uid not in live:  # deleted or finished: its devices are free again
                    del self._held[uid]
            for uid, entry in list(self._pod_manager.items()):
                if uid not in listed or (uid not in live and not entry.rejected):
                    del self._pod_manager[uid]
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
        with self._condition:
            # kubelet's HandlePodAdditions: podManager.AddPod, then admission
            self._pod_manager[pod.uid] = _Managed(pod, {})
        try:
            self._allocate_pod(pod)
        except AdmissionError as error:
            logger.info("pod admitter: %s/%s rejected: %s", pod.namespace, pod.name, error)
            with self._condition:
                self._held.pop(pod.uid, None)
                managed = self._pod_manager.get(pod.uid)
                if managed is not None:
                    # the device manager frees a rejected pod's devices (UpdateAllocatedDevices)
                    managed.rejected = True
                    managed.devices.clear()
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
                managed = self._pod_manager.get(pod.uid)
                if managed is not None:  # the device manager's podDevices.insert
                    managed.devices[name] = tuple(ids)
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
