"""Kubelet's PodResources API (v1 `List`), as the device plugin needs it: which pods kubelet
holds that have no device of our resource yet.

Why: kubelet admits one pod at a time and adds each to its pod manager just before admitting it
(pkg/kubelet/kubelet.go HandlePodAdditions); `List` shows the pod manager's active pods with the
devices allocated to each container so far (pkg/kubelet/apis/podresources/server_v1.go). So
during the first Allocate of pod X, `List` shows X without devices of the resource and does not
show the pods kubelet will admit after it: among several not-started pods that could be the
one, it names the one (docs/design.md 5.6). Kubelet calls Allocate outside its device manager's
lock, so asking `List` from inside Allocate cannot deadlock it.

One channel, reused; any failure drops it, and the next call dials again (a restarted kubelet
re-creates the socket). Every failure is one `PodResourcesError` with a message naming the
socket. Kubelet rate-limits the API (100 calls/s, bursts of 10, shared by every client on the
node): a call it refuses with RESOURCE_EXHAUSTED is tried again within the same time budget.
"""

from __future__ import annotations

import os
import threading
import time

import grpc

from hami_plugin.deviceplugin.api.podresources import api_pb2, api_pb2_grpc
from hami_plugin.deviceplugin.pending import KubeletPods
from hami_plugin.kube.retry import RetryPolicy

DEFAULT_TIMEOUT_SECONDS = 2.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""What kubelet's own client takes (a node with many pods answers more than gRPC's 4 MiB)."""
RATE_LIMIT_RETRY = RetryPolicy(attempts=6, jitter=False, steps=(0.02, 0.05, 0.1, 0.2, 0.4))
"""A call refused by kubelet's rate limit (RESOURCE_EXHAUSTED) is tried again after these
pauses (its bucket refills a token every 10 ms), within the call's timeout."""


class PodResourcesError(Exception):
    """Kubelet's PodResources API did not answer: socket missing, unavailable, too slow, or an
    error status. The message names the socket and what happened."""


class PodResourcesClient:
    """A client of kubelet's PodResources API v1 on the unix socket `socket_path`.

    Thread-safe (the gRPC server's threads share it). `timeout_seconds` bounds each call,
    retries after a rate-limit refusal included: kubelet waits on the Allocate that asks.
    """

    def __init__(self, socket_path: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.socket_path = socket_path
        self._timeout = timeout_seconds
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def kubelet_pods(self, resource_name: str) -> KubeletPods:
        """(namespace, name) of every pod kubelet lists, and of those none of whose containers
        holds a device of `resource_name`. Raises PodResourcesError."""
        response = self.list()
        return KubeletPods(
            listed=frozenset((pod.namespace, pod.name) for pod in response.pod_resources),
            without_devices=frozenset(
                (pod.namespace, pod.name)
                for pod in response.pod_resources
                if not any(
                    devices.resource_name == resource_name and devices.device_ids
                    for container in pod.containers
                    for devices in container.devices
                )
            ),
        )

    def list(self) -> api_pb2.ListPodResourcesResponse:
        """Kubelet's `List`. Raises PodResourcesError."""
        if not os.path.exists(self.socket_path):
            self.close()
            raise PodResourcesError(
                f"kubelet's PodResources socket {self.socket_path} does not exist (kubelet not "
                "running, or its pod-resources directory not mounted into this container)"
            )
        deadline = time.monotonic() + self._timeout
        for _ in RATE_LIMIT_RETRY.tries(ends_at=deadline):
            left = deadline - time.monotonic()
            try:
                response: api_pb2.ListPodResourcesResponse = self._connected().List(
                    api_pb2.ListPodResourcesRequest(), timeout=max(left, 0.001)
                )
                return response
            except grpc.RpcError as error:
                failure = error
                code = error.code() if isinstance(error, grpc.Call) else None
                if code is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                    break
        self.close()
        raise PodResourcesError(self._describe(failure, code)) from failure

    def close(self) -> None:
        """Drop the channel (the next call dials again)."""
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def _connected(self) -> api_pb2_grpc.PodResourcesListerStub:
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{self.socket_path}",
                    options=[
                        ("grpc.default_authority", "localhost"),
                        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ],
                )
                self._stub = api_pb2_grpc.PodResourcesListerStub(  # type: ignore[no-untyped-call]
                    self._channel
                )
            return self._stub

    def _describe(self, error: grpc.RpcError, code: grpc.StatusCode | None) -> str:
        details = error.details() if isinstance(error, grpc.Call) else str(error)
        where = f"kubelet's PodResources API on {self.socket_path}"
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"{where} did not answer within {self._timeout:g} s"
        if code is grpc.StatusCode.UNAVAILABLE:
            return f"{where} is unavailable: {details}"
        if code is grpc.StatusCode.UNIMPLEMENTED:
            return f"{where} does not serve v1 List (kubelet older than 1.20?): {details}"
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return f"{where} refused every try within {self._timeout:g} s: {details}"
        name = code.name if code is not None else "UNKNOWN"
        return f"{where} failed: {name}: {details}"
