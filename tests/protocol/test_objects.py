"""The one pod and node model: `read_pod` and `read_node` over the API's JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from hami_plugin.protocol.objects import ContainerSpec, ObjectError, read_node, read_pod


def test_read_pod_copies_every_field_the_daemons_read() -> None:
    info = read_pod(
        {
            "metadata": {
                "name": "trainer",
                "namespace": "ml",
                "uid": "u-1",
                "resourceVersion": "42",
                "creationTimestamp": "2024-05-10T08:01:02Z",
                "annotations": {"hami.io/bind-phase": "allocating"},
                "labels": {"app": "trainer"},
            },
            "spec": {
                "nodeName": "gpu-1",
                "schedulerName": "hami-scheduler",
                "initContainers": [{"name": "setup", "env": [{"name": "STAGE", "value": "init"}]}],
                "containers": [
                    {
                        "name": "main",
                        "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "1"}},
                        "env": [
                            {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
                            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"key": "k"}}},
                        ],
                    }
                ],
            },
            "status": {"phase": "Running"},
        }
    )
    assert (info.key, info.uid, info.resource_version) == ("ml/trainer", "u-1", "42")
    assert (info.node_name, info.scheduler_name) == ("gpu-1", "hami-scheduler")
    assert info.phase == "Running"
    assert info.creation_timestamp == datetime(2024, 5, 10, 8, 1, 2, tzinfo=UTC)
    assert info.annotations == {"hami.io/bind-phase": "allocating"}
    assert info.labels == {"app": "trainer"}
    assert info.init_containers == (ContainerSpec("setup", env={"STAGE": "init"}),)
    # only literal env values: a valueFrom entry has no value to read here
    assert info.containers == (
        ContainerSpec(
            "main",
            limits={"nvidia.com/gpu": 1},
            requests={"cpu": "1"},
            env={"CUDA_DISABLE_CONTROL": "true"},
        ),
    )
    assert not info.deleting and not info.finished and not info.init_containers_done


def test_read_pod_fields() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "uid": "u-1",
            "deletionTimestamp": "2025-01-01T00:00:00Z",
            "annotations": {"x": "y"},
        },
        "spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "c"}]},
        "status": {
            "phase": "Succeeded",
            "initContainerStatuses": [{"state": {"terminated": {"exitCode": 0}}}],
        },
    }
    info = read_pod(pod)
    assert info.key == "default/p"  # a pod file without a namespace lands in "default"
    assert info.uid == "u-1"
    assert info.deleting
    assert info.finished
    assert info.init_containers_done
    failed_init = {
        **pod,
        "status": {"initContainerStatuses": [{"state": {"terminated": {"exitCode": 1}}}]},
    }
    assert not read_pod(failed_init).init_containers_done
    running_init = {**pod, "status": {"initContainerStatuses": [{"state": {"running": {}}}]}}
    assert not read_pod(running_init).init_containers_done
    odd_status = {**pod, "status": {"initContainerStatuses": ["terminated"]}}
    assert not read_pod(odd_status).init_containers_done


def test_a_yaml_timestamp_arrives_parsed_and_is_kept() -> None:
    pod = yaml.safe_load("metadata: {name: p, creationTimestamp: 2024-05-10T08:01:02Z}")
    assert read_pod(pod).creation_timestamp == datetime(2024, 5, 10, 8, 1, 2, tzinfo=UTC)


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"metadata": {}}, "metadata.name is missing"),
        ({"metadata": {"name": 3}}, "metadata.name must be a string"),
        ({"metadata": "p"}, "metadata must be a mapping"),
        ({"metadata": {"name": "p", "annotations": {"a": 1}}}, "map strings to strings"),
        ({"metadata": {"name": "p", "annotations": ["a"]}}, "annotations must be a mapping"),
        ({"metadata": {"name": "p", "creationTimestamp": "yesterday"}}, "not an RFC 3339 time"),
        ({"metadata": {"name": "p"}, "spec": {"containers": "x"}}, "must be a list"),
        ({"metadata": {"name": "p"}, "spec": {"containers": {}}}, "containers must be a list"),
        ({"metadata": {"name": "p"}, "spec": {"containers": [None]}}, "is empty"),
        ({"metadata": {"name": "p"}, "spec": {"containers": ["c"]}}, r"\[0\] must be a mapping"),
        (
            {"metadata": {"name": "p"}, "spec": {"containers": [{"resources": {"limits": []}}]}},
            "limits must be a mapping",
        ),
        (
            {"metadata": {"name": "p"}, "spec": {"containers": [{"env": [{"value": "v"}]}]}},
            r"env\[0\] must be an object with a name",
        ),
    ],
)
def test_unreadable_pods(pod: dict[str, Any], message: str) -> None:
    with pytest.raises(ObjectError, match=message):
        read_pod(pod)


def test_read_node() -> None:
    node = read_node(
        {
            "metadata": {
                "name": "gpu-1",
                "resourceVersion": "7",
                "annotations": {"hami.io/node-nvidia-register": "[]"},
                "labels": {"gpu": "on"},
            },
            "status": {"allocatable": {"nvidia.com/gpu": "10", "cpu": 8}},
        }
    )
    assert node.name == "gpu-1" and node.resource_version == "7"
    assert node.annotations == {"hami.io/node-nvidia-register": "[]"}
    assert node.labels == {"gpu": "on"}
    assert node.allocatable == {"nvidia.com/gpu": "10", "cpu": 8}  # quantities left as given


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"metadata": {}}, "metadata.name is missing"),
        ({"metadata": {"name": "n", "annotations": []}}, "annotations must be a mapping"),
        ({"metadata": {"name": "n"}, "status": {"allocatable": "10"}}, "allocatable must be"),
    ],
)
def test_unreadable_nodes(node: dict[str, Any], message: str) -> None:
    with pytest.raises(ObjectError, match=message):
        read_node(node)
