"""`admitted`: the webhook's patch applied to a pod file, and said in lines."""

from __future__ import annotations

from typing import Any

import pytest

from hami_plugin.scheduler.webhook import GpuCorePolicy, WebhookSettings
from hami_plugin.scheduler.webhook_preview import admit, apply_patch, describe
from hami_plugin.testing.apiserver import json_patch


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "annotations": {"hami.io/vgpu-node": "n"}},
        "spec": {
            "initContainers": [{"name": "warm", "resources": {}}],
            "containers": [
                {"name": "app", "resources": {"limits": {"nvidia.com/gpumem": 3000}}},
                {"name": "side", "env": [{"name": "A", "value": "1"}],
                 "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/priority": 0}}},
                {"name": "bare"},
            ],
        },
    }  # fmt: skip


def test_the_patch_applies_as_the_api_server_applies_it() -> None:
    settings = WebhookSettings(overwrite_env=True, gpu_core_policy=GpuCorePolicy.FORCE)
    admitted = admit(pod(), settings)
    assert admitted.admission.allowed
    assert admitted.admission.patch  # every kind of change below
    assert admitted.document == json_patch(pod(), list(admitted.admission.patch))
    containers = admitted.document["spec"]["containers"]
    assert containers[0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert containers[1]["resources"]["limits"]["nvidia.com/gpucores"] == "100"
    assert admitted.document["metadata"]["annotations"] == {}  # the booking stripped


def test_each_change_in_a_line() -> None:
    settings = WebhookSettings(overwrite_env=True)
    admitted = admit(pod(), settings)
    lines = [line for op in admitted.admission.patch for line in describe(pod(), op)]
    assert lines == [
        "metadata.annotations.hami.io/vgpu-node removed",
        "init container warm: env NVIDIA_VISIBLE_DEVICES=none",
        "container app: limits nvidia.com/gpu: 1",
        "container side: env CUDA_TASK_PRIORITY=0",
        "container side: limits nvidia.com/gpucores: 100",
        "container bare: env NVIDIA_VISIBLE_DEVICES=none",
        "spec.schedulerName: hami-scheduler",
    ]


def test_a_denied_pod_is_left_as_given() -> None:
    privileged = pod()
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    admitted = admit(privileged, WebhookSettings())
    assert not admitted.admission.allowed
    assert admitted.document == privileged


@pytest.mark.parametrize(
    "operation",
    [
        {"op": "move", "from": "/spec", "path": "/status"},
        {"op": "replace", "path": "/spec/nodeName", "value": "n"},
        {"op": "add", "path": "/spec/missing/x", "value": 1},
    ],
)
def test_other_operations_are_refused(operation: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        apply_patch(pod(), [operation])
