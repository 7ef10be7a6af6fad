"""Objects as the API server double stores them: plain JSON dicts, and builders for the Nodes,
Pods and containers the tests, the benchmarks and the demo store in it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

JsonObject = dict[str, Any]


def make_node(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
) -> JsonObject:
    """A Node object as the API server stores it (without server-set fields)."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {"kubernetes.io/hostname": name}),
        },
        "spec": {},
        "status": {
            "allocatable": dict(allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}),
            "capacity": dict(allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}),
        },
    }


def make_container(
    name: str,
    *,
    env: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    image: str = "busybox",
) -> JsonObject:
    """A container entry for `make_pod`."""
    container: JsonObject = {"name": name, "image": image, "resources": {}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if limits:
        container["resources"] = {"limits": dict(limits)}
    return container


def make_pod(
    name: str,
    namespace: str = "default",
    *,
    node_name: str = "",
    phase: str = "Pending",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    containers: Iterable[JsonObject] | None = None,
    init_containers: Iterable[JsonObject] | None = None,
    scheduler_name: str = "default-scheduler",
    uid: str = "",
    creation_timestamp: str = "",
    resource_version: str = "",
) -> JsonObject:
    """A Pod object as the API server stores it. The server-set fields (`uid`,
    `creationTimestamp`, `resourceVersion`) are left out unless given: the double sets them
    when the pod is stored; a pod handed straight to the scheduler's code carries them."""
    spec: JsonObject = {
        "containers": list(containers) if containers is not None else [make_container("main")],
        "schedulerName": scheduler_name,
    }
    if init_containers is not None:
        spec["initContainers"] = list(init_containers)
    if node_name:
        spec["nodeName"] = node_name
    metadata: JsonObject = {
        "name": name,
        "namespace": namespace,
        "annotations": dict(annotations or {}),
        "labels": dict(labels or {}),
    }
    for key, value in (
        ("uid", uid),
        ("creationTimestamp", creation_timestamp),
        ("resourceVersion", resource_version),
    ):
        if value:
            metadata[key] = value
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase},
    }
