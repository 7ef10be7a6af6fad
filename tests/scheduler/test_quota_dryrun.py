"""`hami schedule` reads ResourceQuota objects in its snapshot and refuses a pod beyond its
namespace's GPU quota with `ResourceQuotaNotFit`, as the scheduler does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_plugin.cli import main
from hami_plugin.protocol.model import ANNOTATION_DEVICES_ALLOCATED, ANNOTATION_VGPU_NODE
from tests.extender.helpers import gpu_node, gpu_pod


def snapshot(tmp_path: Path, limit: str | None) -> Path:
    booked = gpu_pod("booked", memory=6000, namespace="team")
    booked["metadata"]["annotations"] = {
        ANNOTATION_VGPU_NODE: "n1",
        ANNOTATION_DEVICES_ALLOCATED: "GPU-n1-0,NVIDIA,6000,0:;",
    }
    items: list[dict[str, Any]] = [gpu_node("n1", 2), booked]
    if limit is not None:
        items.append(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": "team"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": limit}},
                "status": {"used": {"limits.nvidia.com/gpumem": "6000"}},
            }
        )
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def schedule(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, limit: str | None, namespace: str
) -> tuple[int, dict[str, Any]]:
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(gpu_pod("new", memory=5000, namespace=namespace)))
    code = main(["schedule", "--snapshot", str(snapshot(tmp_path, limit)), "--pod", str(pod)])
    return code, json.loads(capsys.readouterr().out)


def test_a_snapshot_quota_refuses_the_pod(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, output = schedule(capsys, tmp_path, "10000", "team")
    assert code == 2
    assert output["failedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}


@pytest.mark.parametrize(
    ("limit", "namespace"), [("11000", "team"), ("10000", "default"), (None, "team")]
)
def test_room_in_the_quota_or_no_quota_fits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, limit: str | None, namespace: str
) -> None:
    code, output = schedule(capsys, tmp_path, limit, namespace)
    assert code == 0, output
    assert output["node"] == "n1"
