"""The Helm chart with the real `helm` binary: lint, the values that matter reaching the
daemons' flags (parsed by the real `hami` parser), the same objects as the plain manifests
when installed as release `hami` in hami-system, and the choices only the chart has
(cert-manager, the admission policies by Kubernetes version, another release name)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_plugin.certs.command import settings_from
from hami_plugin.deviceplugin.device_list import DeviceListStrategy
from hami_plugin.protocol.model import GpuPolicyName, NodePolicy
from tests.deployment.exercise import (
    certs_job,
    device_plugin_settings,
    parse_hami_args,
    scheduler_config,
)
from tests.deployment.manifests import (
    CHART,
    Obj,
    admission_policy_manifests,
    config_map_data,
    container,
    hami_container,
    helm_template,
    is_hook,
    legacy_key_volume,
    named,
    of_kind,
    plain_manifests,
    run,
    secret_volume,
    tool,
    workload_running,
    workloads_mounting,
)
from tests.deployment.test_manifests import certs_settings, check_cert_manager_object

KUBE_VERSION = "v1.31.8"  # the kube-scheduler tag the plain manifests carry


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


def test_another_kubelet_root_moves_the_pod_resources_socket_too(tmp_path: Path) -> None:
    objects = helm_template("devicePlugin.pluginPath=/var/lib/k0s/kubelet/device-plugins")
    daemonset = workload_running(objects, "device-plugin")
    settings = device_plugin_settings(objects, tmp_path, "node-a")
    assert settings.pod_resources_socket == "/var/lib/k0s/kubelet/pod-resources/kubelet.sock"
    plugin = hami_container(daemonset, "device-plugin")
    (mount,) = [
        m for m in plugin["volumeMounts"] if m["mountPath"] == "/var/lib/k0s/kubelet/pod-resources"
    ]
    assert mount["readOnly"] is True
    (volume,) = [
        v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    assert volume["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"


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


def test_without_the_webhook_the_extender_keeps_mutual_tls(tmp_path: Path) -> None:
    objects = helm_template("scheduler.admissionWebhook.enabled=false")
    assert of_kind(objects, "MutatingWebhookConfiguration") == []
    # no webhook Service; the certificate still carries its name, which kube-scheduler checks
    assert [s["metadata"]["name"] for s in of_kind(objects, "Service")] == [
        "hami-device-plugin",
        "hami-scheduler-extender",
    ]
    config, _ = scheduler_config(objects, tmp_path)
    assert config.tls and config.client_ca_file == "/tls/ca.crt"
    assert config.webhook_port and config.probe_bind_address != "0"  # the probes' own
    scheduling = yaml.safe_load(config_map_data(objects, "hami-scheduler", "config.yaml"))
    extender = scheduling["extenders"][0]
    assert extender["urlPrefix"] == "https://hami-scheduler-extender.hami-system.svc:443"
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"]["serverName"] == "hami-scheduler.hami-system.svc"
    # `hami certs` still makes the certificates, and touches no webhook configuration
    assert certs_settings(objects).webhook_configuration == ""
    assert not [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"].startswith(
        "hami-certs")]  # fmt: skip


def test_with_cert_manager_the_certificates_replace_the_job() -> None:
    objects = helm_template("scheduler.certManager.enabled=true")
    # `hami certs` makes the booking key pair only (Helm cannot derive an Ed25519 public key):
    # a hook, no CronJob, no access to the webhook configuration
    (job,) = of_kind(objects, "Job")
    assert of_kind(objects, "CronJob") == [] and of_kind(objects, "ClusterRole") == [
        o for o in of_kind(objects, "ClusterRole") if not o["metadata"]["name"].startswith(
            "hami-certs")
    ]  # fmt: skip
    assert "--booking-keys-only" in hami_container(job, "certs")["args"]
    assert job["metadata"]["annotations"]["helm.sh/hook"].startswith("pre-install")
    for item in objects:
        if item["apiVersion"].startswith("cert-manager.io/"):
            check_cert_manager_object(item)
    issuers = {i["metadata"]["name"]: i["spec"] for i in of_kind(objects, "Issuer")}
    certificates = {c["spec"]["secretName"]: c["spec"] for c in of_kind(objects, "Certificate")}
    # a self-signed CA, which the CA issuer signs with
    ca = certificates["hami-scheduler-ca"]
    assert ca["isCA"] is True and issuers[ca["issuerRef"]["name"]] == {"selfSigned": {}}
    (ca_issuer,) = [name for name, spec in issuers.items() if "ca" in spec]
    assert issuers[ca_issuer]["ca"]["secretName"] == "hami-scheduler-ca"
    # the Secrets the pods mount, issued by that CA for what each is used for
    deployment = workload_running(objects, "scheduler")
    extender = hami_container(deployment, "scheduler")
    kube_scheduler = container(deployment, "kube-scheduler")
    serving = certificates[secret_volume(deployment, extender, "/tls")]
    client = certificates[
        secret_volume(deployment, kube_scheduler, "/etc/kubernetes/hami-scheduler-client")
    ]
    for spec in (serving, client):
        assert spec["issuerRef"]["name"] == ca_issuer and spec.get("isCA") is not True
    assert "server auth" in serving["usages"] and "client auth" not in serving["usages"]
    assert "client auth" in client["usages"] and "server auth" not in client["usages"]
    assert serving["dnsNames"] == [
        "hami-scheduler",
        "hami-scheduler.hami-system",
        "hami-scheduler.hami-system.svc",
        "hami-scheduler.hami-system.svc.cluster.local",
    ]
    # the webhook's CA comes from cert-manager's injector, from the serving certificate
    configuration = named(objects, "MutatingWebhookConfiguration", "hami-webhook")
    annotation = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    (serving_name,) = [c["metadata"]["name"] for c in of_kind(objects, "Certificate") if c[
        "spec"] is serving]  # fmt: skip
    assert annotation == f"hami-system/{serving_name}"
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    # the booking keys: the hook's Secrets, the private one mounted by the scheduler only
    certs = settings_from(parse_hami_args(hami_container(job, "certs")["args"], []))
    assert secret_volume(deployment, extender, "/booking") == certs.booking_key_secret
    plugin = workload_running(objects, "device-plugin")
    assert (
        secret_volume(plugin, hami_container(plugin, "device-plugin"), "/booking")
        == certs.booking_public_key_secret
    )
    assert workloads_mounting(objects, certs.booking_key_secret) == ["Deployment/hami-scheduler"]
    assert not of_kind(objects, "Secret")  # the chart makes no key itself


def _admission_policies(objects: list[Obj]) -> list[str]:
    return sorted(
        o["metadata"]["name"] for o in objects if o["kind"].startswith("ValidatingAdmission")
    )


@pytest.mark.parametrize(
    ("kube_version", "value", "rendered"),
    [
        ("v1.30.0", "auto", True),
        ("v1.32.4", "auto", True),
        ("v1.29.9", "auto", False),
        ("v1.26.0", "auto", False),
        ("v1.29.9", "true", True),
        ("v1.32.4", "false", False),
    ],
)
def test_the_admission_policies_follow_the_kubernetes_version(
    kube_version: str, value: str, rendered: bool
) -> None:
    objects = helm_template(f"admissionPolicy.enabled={value}", kube_version=kube_version)
    expected = [
        "hami-device-plugin-own-node",
        "hami-device-plugin-own-node",
        "hami-device-plugin-own-pods",
        "hami-device-plugin-own-pods",
        "hami-gpu-pods",
        "hami-gpu-pods",
        "hami-scheduler-annotations",
        "hami-scheduler-annotations",
    ]
    assert _admission_policies(objects) == (expected if rendered else [])


def test_a_release_of_another_name_names_every_secret_alike() -> None:
    """Release `gpu` in `gpu-system`: every name the Secrets, Services and certificate share
    follows, and `hami certs` is told the Secrets' names."""
    objects = helm_template(release="gpu", namespace="gpu-system")
    settings = certs_settings(objects)
    assert (settings.namespace, settings.service) == ("gpu-system", "gpu-scheduler")
    deployment = workload_running(objects, "scheduler")
    extender = hami_container(deployment, "scheduler")
    plugin = workload_running(objects, "device-plugin")
    assert secret_volume(deployment, extender, "/tls") == settings.tls_secret
    assert secret_volume(deployment, extender, "/booking") == settings.booking_key_secret
    assert (
        secret_volume(plugin, hami_container(plugin, "device-plugin"), "/booking")
        == settings.booking_public_key_secret
        == "gpu-booking-public-keys"
    )
    assert settings.booking_key_secret == "gpu-booking-signing-key"
    assert workloads_mounting(objects, settings.booking_key_secret) == ["Deployment/gpu-scheduler"]
    assert legacy_key_volume(plugin, hami_container(plugin, "device-plugin")) == "gpu-booking-key"
    assert settings.ca_secret == "gpu-scheduler-ca"
    assert settings.client_secret == "gpu-kube-scheduler-client"
    assert settings.webhook_configuration == "gpu-webhook"
    role = named(objects, "Role", "gpu-certs")
    assert role["rules"][1]["resourceNames"] == [
        settings.ca_secret,
        settings.tls_secret,
        settings.client_secret,
        settings.booking_key_secret,
        settings.booking_public_key_secret,
    ]
    scheduling = yaml.safe_load(config_map_data(objects, "gpu-scheduler", "config.yaml"))
    tls = scheduling["extenders"][0]["tlsConfig"]
    assert tls["serverName"] == "gpu-scheduler.gpu-system.svc"
    assert scheduling["extenders"][0]["urlPrefix"].startswith(
        "https://gpu-scheduler-extender.gpu-system.svc:"
    )
    policy = named(objects, "ValidatingAdmissionPolicy", "gpu-scheduler-annotations")
    (condition,) = policy["spec"]["matchConditions"]
    assert "system:serviceaccount:gpu-system:gpu-scheduler'" in condition["expression"]
    assert "system:serviceaccount:gpu-system:gpu-device-plugin'" in condition["expression"]
    policy = named(objects, "ValidatingAdmissionPolicy", "gpu-device-plugin-own-pods")
    (condition,) = policy["spec"]["matchConditions"]
    assert "'system:serviceaccount:gpu-system:gpu-device-plugin'" in condition["expression"]
    assert named(objects, "ValidatingAdmissionPolicyBinding", "gpu-gpu-pods")


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
    # the release's own objects; the certificate Job (a hook in the chart), its hook roles and
    # the admission policies (a file of their own beside the manifests) are compared below, the
    # dashboard (generated by kustomize) in test_grafana_dashboard.py
    policies = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    charted = {
        k: v
        for k, v in _by_key([o for o in chart if not is_hook(o)]).items()
        if k[0] not in policies and k != ("ConfigMap", "hami-grafana-dashboard")
    }
    written = {k: v for k, v in _by_key(plain).items() if k[0] not in ("Job", "Namespace")}
    assert sorted(charted) == sorted(written)
    differences = [_difference(key, expected, charted[key]) for key, expected in written.items()]
    assert [d for d in differences if d] == []
    # the admission policies: the same as daemonset/admission-policy.yaml
    assert _by_key([o for o in chart if o["kind"] in policies]) == _by_key(
        admission_policy_manifests()
    )
    # the certificate: a plain Job in the manifests, a Helm hook before and after install and
    # upgrade in the chart (before: the pods mount the Secrets; after: the webhook exists),
    # the same container
    job = certs_job(chart)
    assert job["metadata"]["annotations"]["helm.sh/hook"] == (
        "pre-install,pre-upgrade,post-install,post-upgrade"
    )
    # the plain Job alone waits for the webhook configuration (kustomize applies it last); the
    # chart's pre-install run comes before it exists and must not fail
    plain_container = hami_container(certs_job(plain), "certs")
    assert "--require-webhook-configuration" in plain_container["args"]
    plain_container = {
        **plain_container,
        "args": [a for a in plain_container["args"] if a != "--require-webhook-configuration"],
    }
    assert _normalise(hami_container(job, "certs")) == plain_container
    # its ServiceAccount and roles: hooks made before it, the same rules as the CronJob's
    hooks = [o for o in chart if is_hook(o) and o["kind"] != "Job"]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in hooks) == sorted(
        (kind, "hami-certs-hook")
        for kind in (
            "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"
        )
    )  # fmt: skip
    job_weight = int(job["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
    for hook in hooks:
        annotations = hook["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == job["metadata"]["annotations"]["helm.sh/hook"]
        assert int(annotations["helm.sh/hook-weight"]) < job_weight
        assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
        if "rules" in hook:
            assert hook["rules"] == named(chart, hook["kind"], "hami-certs")["rules"]
    assert pod_account(job) == "hami-certs-hook"


def pod_account(job: Obj) -> str:
    return str(job["spec"]["template"]["spec"]["serviceAccountName"])


def _difference(key: tuple[str, str], expected: Obj, charted: Obj) -> str:
    if charted == expected:
        return ""
    diff = difflib.unified_diff(
        yaml.safe_dump(expected, sort_keys=True).splitlines(),
        yaml.safe_dump(charted, sort_keys=True).splitlines(),
        "daemonset",
        "chart",
        lineterm="",
    )
    return f"{key}:\n" + "\n".join(diff)


def test_the_device_list_values_reach_the_device_plugin_with_hamis_names(
    tmp_path: Path,
) -> None:
    default = helm_template()
    settings = device_plugin_settings(default, tmp_path, "node-a")
    assert settings.device_list_strategies == {DeviceListStrategy.ENVVAR}
    assert not (settings.gdrcopy_enabled or settings.gds_enabled or settings.mofed_enabled)
    plugin = hami_container(workload_running(default, "device-plugin"), "device-plugin")
    env_names = [item["name"] for item in plugin["env"]]
    assert "GDRCOPY_ENABLED" not in env_names  # null: unset, as HAMi's chart
    assert all(m["name"] != "cdi-root" for m in plugin["volumeMounts"])

    objects = helm_template(
        "devicePlugin.deviceListStrategy=cdi-annotations\\,envvar",
        "devicePlugin.gdrcopyEnabled=true",
        "devicePlugin.gdsEnabled=false",
        "devicePlugin.mofedEnabled=true",
    )
    settings = device_plugin_settings(objects, tmp_path, "node-a")
    assert settings.device_list_strategies == {
        DeviceListStrategy.CDI_ANNOTATIONS,
        DeviceListStrategy.ENVVAR,
    }
    assert (settings.gdrcopy_enabled, settings.gds_enabled, settings.mofed_enabled) == (
        True,
        False,
        True,
    )
    assert settings.cdi_spec_dir == "/var/run/cdi"
    daemonset = workload_running(objects, "device-plugin")
    plugin = hami_container(daemonset, "device-plugin")
    (mount,) = [m for m in plugin["volumeMounts"] if m["name"] == "cdi-root"]
    assert mount["mountPath"] == "/var/run/cdi" and not mount.get("readOnly")
    (volume,) = [
        v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "cdi-root"
    ]
    assert volume["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}


@pytest.mark.parametrize(
    ("policy", "scored"),
    [("spread", False), ("topology-aware", True), ("binpack\\,topology-aware", True)],
)
def test_a_topology_aware_gpu_policy_turns_the_pair_scores_on(
    tmp_path: Path, policy: str, scored: bool
) -> None:
    """HAMi's chart sets ENABLE_TOPOLOGY_SCORE when the GPU policy is topology-aware
    (daemonsetnvidia.yaml:121-122); here a chain naming it does too (the scheduler takes chains)."""
    objects = helm_template(f"scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy={policy}")
    settings = device_plugin_settings(objects, tmp_path, "node-a")
    assert settings.enable_topology_score is scored


def test_who_may_scrape_is_one_value_for_both_network_policies() -> None:
    # Helm merges maps: a default label goes with null, as docs/install.md says
    objects = helm_template(
        "prometheus.scrapeFrom.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=null",
        "prometheus.scrapeFrom.namespaceSelector.matchLabels.team=observability",
        "prometheus.scrapeFrom.podSelector.matchLabels.app=vmagent",
    )
    for name in ("hami-scheduler", "hami-device-plugin"):
        policy = named(objects, "NetworkPolicy", name)
        (rule,) = [r for r in policy["spec"]["ingress"] if {"port": "metrics", "protocol": "TCP"}
                   in r.get("ports", [])]  # fmt: skip
        (source,) = rule["from"]
        assert source["namespaceSelector"]["matchLabels"] == {"team": "observability"}
        assert source["podSelector"]["matchLabels"] == {
            "app.kubernetes.io/name": "prometheus",
            "app": "vmagent",
        }
