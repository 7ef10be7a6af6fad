"""docs/examples/: every example is a valid v1 Pod (the Kubernetes schema, offline) that
`hami schedule` places on the sample cluster `tests/fixtures/scheduler/cluster.yaml`, and
docs/examples/README.md lists each file; docs/LICENSE is the Apache-2.0 text pyproject.toml
declares and points its wheel at."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
CLUSTER = ROOT / "tests" / "fixtures" / "scheduler" / "cluster.yaml"
FILES = sorted(EXAMPLES.glob("*.yaml"))
GPU = "nvidia.com/gpu"


def test_there_are_examples_and_the_index_lists_each() -> None:
    assert len(FILES) >= 5
    index = (EXAMPLES / "README.md").read_text()
    assert [path.name for path in FILES if f"`{path.name}`" not in index] == []


@pytest.mark.parametrize("path", FILES, ids=[path.name for path in FILES])
def test_every_example_is_a_pod_that_hami_schedule_places(path: Path) -> None:
    (pod,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert pod["kind"] == "Pod"
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    assert any(GPU in (c.get("resources") or {}).get("limits", {}) for c in containers)

    result = subprocess.run(
        [sys.executable, "-m", "hami_plugin", "schedule", "--snapshot", str(CLUSTER), "--pod",
         str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    decision = json.loads(result.stdout)
    assert decision["node"], decision
    assert decision["annotations"]["hami.io/vgpu-devices-to-allocate"]


def test_the_licence_is_apache_2_0_and_the_wheel_carries_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["docs/LICENSE"]
    text = (ROOT / "docs" / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # the image builds the wheel from what the Dockerfile copies
    assert "COPY docs/LICENSE ./docs/LICENSE" in (ROOT / "Dockerfile").read_text()
