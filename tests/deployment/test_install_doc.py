"""The `helm install` lines of docs/install.md and the README, run as a reader runs them:
through bash, with `helm install` turned into `helm template` (same arguments, nothing
installed). Each names the image (without it every pod of ours runs `hami-plugin:<appVersion>`,
which no registry has, and the pre-install certificate hook never ends), and the quoted GPU
policy chain reaches the scheduler as one policy: bash leaves `numa\\,binpack` alone in single
quotes, and Helm unescapes the comma."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.deployment.exercise import parse_hami_args
from tests.deployment.manifests import (
    CHART,
    REPO,
    Obj,
    containers,
    hami_container,
    load_all,
    tool,
    workload_running,
)

DOCS = (REPO / "docs" / "install.md", REPO / "README.md")


def helm_install_lines() -> list[tuple[str, str]]:
    """(file, command) of every `helm install` in a fenced sh block, continuations joined."""
    found: list[tuple[str, str]] = []
    for path in DOCS:
        text = path.read_text()
        for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
            joined = block.replace("\\\n", " ")
            for line in joined.splitlines():
                if line.startswith("helm install"):
                    found.append((path.name, re.split(r"\s+#", line, maxsplit=1)[0]))
    return found


def through_bash(line: str) -> subprocess.CompletedProcess[str]:
    """`line` run by bash in the repository root, `helm install` rendering instead."""
    shim = f'helm() {{ shift; "{tool("helm")}" template "$@"; }}\n'
    return subprocess.run(
        ["bash", "-c", shim + line], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def render(line: str) -> list[Obj]:
    result = through_bash(line)
    assert result.returncode == 0, f"{line}\n{result.stderr}"
    return load_all(result.stdout)


LINES = helm_install_lines()


def test_the_docs_have_helm_install_lines() -> None:
    assert {name for name, _ in LINES} == {"install.md", "README.md"}
    assert CHART.is_dir()


@pytest.mark.parametrize(
    ("name", "line"), LINES, ids=[f"{n}:{i}" for i, (n, _) in enumerate(LINES)]
)
def test_every_documented_helm_install_names_a_pullable_image(name: str, line: str) -> None:
    objects = render(line)
    images = {
        item["image"]
        for workload in objects
        if workload.get("kind") in ("Deployment", "DaemonSet", "Job", "CronJob")
        for item in containers(workload)
        if "kube-scheduler" not in item["image"] and "projecthami" not in item["image"]
    }
    assert images, name
    # the registry the line names, not the unpushed default `hami-plugin:<appVersion>`
    assert all(image.startswith("registry.example.com/") for image in images), (name, images)


def test_the_documented_gpu_policy_chain_survives_bash() -> None:
    (line,) = [line for name, line in LINES if "gpuSchedulerPolicy" in line]
    deployment = workload_running(render(line), "scheduler")
    args = parse_hami_args(hami_container(deployment, "scheduler")["args"], [])
    assert str(args.gpu_scheduler_policy) == "numa,binpack"
    # the line unquoted, as the docs had it: bash eats the backslash and Helm refuses
    unquoted = line.replace("'", "")
    result = through_bash(unquoted)
    assert result.returncode != 0 and 'key "binpack" has no value' in result.stderr
