"""The Helm chart with the real `helm` binary: lint, the values that matter reaching the
daemons' flags (parsed by the real `hami` parser), and the same objects as the plain
manifests when installed as release `hami` in hami-system."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from hami_plugin.protocol.model import GpuPolicyName, NodePolicy
from tests.deployment.exercise import device_plugin_settings, scheduler_config
from tests.deployment.manifests import (
    CHART,
    Obj,
    config_map_data,
    hami_container,
    helm_template,
    named,
    of_kind,
    plain_manifests,
    run,
    tool,
    workload_running,
)

KUBE_VERSION = "v1.32.4"  # the kube-scheduler tag the plain manifests carry


def scheduler_args(objects: list[Obj]) -> list[str]:
    args = hami_container(workload_running(objects, "scheduler"), "scheduler")["args"]
    return [str(a) for a in args]


def test_helm_lint_passes_strict() -> None:
    run([tool("helm"), "lint", str(CHART), "--strict", "--namespace", "hami-system"])


def test_the_policies_from_helm_values_reach_the_scheduler_flags(tmp_path: Path) -> None:
    objects = helm_template(
        "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy=binpack",
        "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy=spread",
    )
    args = scheduler_args(objects)
    assert args[0] == "scheduler"
    assert "--node-scheduler-policy=binpack" in args
    assert "--gpu-scheduler-policy=spread" in args
    # the defaults are the same two: set the other way round, the flags must follow
    swapped = helm_template(
        "scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy=spread",
        "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy=binpack",
    )
    args = scheduler_args(swapped)
    assert "--node-scheduler-policy=spread" in args
    assert "--gpu-scheduler-policy=binpack" in args
    assert not any(a.startswith("--node-scheduler-policy=binpack") for a in args)
    config, _ = scheduler_config(swapped, tmp_path)
    assert config.settings.node_policy is NodePolicy.SPREAD
    assert config.settings.gpu_policy.names == (GpuPolicyName.BINPACK,)


def test_hami_value_keys_reach_the_daemons(tmp_path: Path) -> None:
    objects = helm_template(
        "devicePlugin.deviceSplitCount=4",
        "devicePlugin.deviceMemoryScaling=2",
        "devicePlugin.deviceCoreScaling=1.5",
        "schedulerName=gpu-scheduler",
        "scheduler.nodeLockExpire=10m",
        "scheduler.nodeLabelSelector.gpu=on",
        "resourceName=example.com/vgpu",
    )
    settings = device_plugin_settings(objects, tmp_path, "node-a")
    assert (settings.split_count, settings.memory_scaling, settings.cores_scaling) == (4, 2, 1.5)
    assert settings.resource_name == "example.com/vgpu"
    config, _ = scheduler_config(objects, tmp_path)
    assert config.scheduler_name == "gpu-scheduler"
    assert config.node_lock_timeout.total_seconds() == 600
    assert config.node_label_selector == {"gpu": "on"}
    assert config.settings.resources.count == "example.com/vgpu"
    scheduling = yaml.safe_load(config_map_data(objects, "hami-scheduler", "config.yaml"))
    assert scheduling["profiles"] == [{"schedulerName": "gpu-scheduler"}]
    assert scheduling["leaderElection"]["resourceName"] == "gpu-scheduler"
    assert scheduling["extenders"][0]["managedResources"][0]["name"] == "example.com/vgpu"
    lease_role = named(objects, "Role", "hami-kube-scheduler")
    assert lease_role["rules"][0]["resourceNames"] == ["gpu-scheduler"]


def test_without_leader_election_one_replica_and_no_lease(tmp_path: Path) -> None:
    objects = helm_template("scheduler.leaderElect=false")
    deployment = workload_running(objects, "scheduler")
    assert deployment["spec"]["replicas"] == 1
    config, _ = scheduler_config(objects, tmp_path)
    assert not config.leader_elect
    service = named(objects, "Service", "hami-scheduler")
    # nobody writes the leader label without an election
    assert "hami.io/scheduler-role" not in service["spec"]["selector"]
    assert not [r for r in of_kind(objects, "Role") if r["rules"][0]["resources"] == ["leases"]]
    scheduling = yaml.safe_load(config_map_data(objects, "hami-scheduler", "config.yaml"))
    assert scheduling["leaderElection"] == {"leaderElect": False}


def test_without_the_webhook_plain_http_and_no_certificate(tmp_path: Path) -> None:
    objects = helm_template("scheduler.admissionWebhook.enabled=false")
    assert of_kind(objects, "MutatingWebhookConfiguration") == []
    assert of_kind(objects, "Job") == []
    config, _ = scheduler_config(objects, tmp_path)
    assert not config.tls
    scheduling = yaml.safe_load(config_map_data(objects, "hami-scheduler", "config.yaml"))
    extender = scheduling["extenders"][0]
    assert extender["urlPrefix"] == "http://hami-scheduler.hami-system.svc:443"
    assert extender["enableHTTPS"] is False and "tlsConfig" not in extender


# --- the same objects as daemonset/*.yaml ---------------------------------------------------

_HELM_LABELS = frozenset(
    {
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/managed-by",
        "helm.sh/chart",
    }
)


def _normalise(value: Any) -> Any:
    """Drop what only Helm adds: its labels (also inside selectors), hook and checksum
    annotations, and maps left empty by that."""
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            if key in _HELM_LABELS or key.startswith(("helm.sh/", "checksum/")):
                continue
            item = _normalise(item)
            if key == "annotations" and not item:
                continue
            result[key] = item
        return result
    if isinstance(value, list):
        return [_normalise(item) for item in value]
    return value


def _by_key(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): _normalise(o) for o in objects}


def test_the_chart_renders_the_same_objects_as_the_plain_manifests() -> None:
    chart = helm_template(kube_version=KUBE_VERSION)
    plain = plain_manifests()
    charted = {k: v for k, v in _by_key(chart).items() if k[0] != "Job"}
    written = {k: v for k, v in _by_key(plain).items() if k[0] not in ("Job", "Namespace")}
    assert sorted(charted) == sorted(written)
    differences = []
    for key, expected in written.items():
        if charted[key] != expected:
            diff = difflib.unified_diff(
                yaml.safe_dump(expected, sort_keys=True).splitlines(),
                yaml.safe_dump(charted[key], sort_keys=True).splitlines(),
                "daemonset",
                "chart",
                lineterm="",
            )
            differences.append(f"{key}:\n" + "\n".join(diff))
    assert differences == [], "\n\n".join(differences)
    # the certificate: one Job with two steps in the manifests, two Helm hooks in the chart
    steps_written = {c["name"]: c for job in of_kind(plain, "Job") for c in _steps(job)}
    steps_charted = {c["name"]: c for job in of_kind(chart, "Job") for c in _steps(job)}
    assert steps_written == steps_charted
    hooks = {j["metadata"]["name"]: j["metadata"]["annotations"]["helm.sh/hook"] for j in
             of_kind(chart, "Job")}  # fmt: skip
    assert hooks == {
        "hami-webhook-certgen-create": "pre-install,pre-upgrade",
        "hami-webhook-certgen-patch": "post-install,post-upgrade",
    }


def _steps(job: Obj) -> list[Obj]:
    spec = job["spec"]["template"]["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])
