"""What the deployment installs, checked on the plain manifests as written, as `kubectl
kustomize daemonset/` renders them, and as the chart renders them with its defaults: every
object valid against the Kubernetes JSON schemas (offline, kubernetes-validate), the daemons'
arguments accepted by the real `hami` parser, and the wiring between the objects (Service ->
ports -> flags, webhook -> Service -> certificate, kube-scheduler -> extender)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hami_plugin.protocol.model import GpuPolicyName, NodePolicy
from tests.deployment.exercise import device_plugin_settings, scheduler_config
from tests.deployment.manifests import (
    Obj,
    config_map_data,
    container,
    hami_container,
    helm_template,
    kustomize,
    named,
    of_kind,
    plain_manifests,
    workload_running,
)

SOURCES: dict[str, Callable[[], list[Obj]]] = {
    "manifests": plain_manifests,
    "kustomize": kustomize,
    "chart": helm_template,
}
# The oldest Kubernetes the chart declares (kubeVersion) and the newest the schemas know.
SCHEMA_VERSIONS = ("1.26.0", kubernetes_validate.latest_version())


@pytest.fixture(params=SOURCES, scope="module")
def objects(request: pytest.FixtureRequest) -> list[Obj]:
    return SOURCES[request.param]()


def _services_selecting(objects: list[Obj], pod_labels: dict[str, str]) -> list[Obj]:
    return [
        s
        for s in of_kind(objects, "Service")
        if all(pod_labels.get(k) == v for k, v in s["spec"]["selector"].items())
    ]


def _service(objects: list[Obj], component: str) -> Obj:
    found = [
        s
        for s in of_kind(objects, "Service")
        if s["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert len(found) == 1
    return found[0]


def _port(service: Obj, name: str) -> dict[str, Any]:
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == name]
    return dict(port)


def _container_port(item: Obj, name: str) -> int:
    (port,) = [p["containerPort"] for p in item.get("ports", []) if p["name"] == name]
    return int(port)


def _env_field(item: Obj, name: str) -> str:
    (entry,) = [e for e in item["env"] if e["name"] == name]
    return str(entry["valueFrom"]["fieldRef"]["fieldPath"])


def _volume(workload: Obj, name: str) -> dict[str, Any]:
    (volume,) = [v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == name]
    return dict(volume)


def _mount(item: Obj, path: str) -> dict[str, Any]:
    (mount,) = [m for m in item["volumeMounts"] if m["mountPath"] == path]
    return dict(mount)


# --- schemas ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(
    objects: list[Obj], version: str
) -> None:
    assert objects
    for item in objects:
        kubernetes_validate.validate(item, version, strict=True)


def test_the_schema_check_catches_a_misspelt_field() -> None:
    deployment = named(plain_manifests(), "Deployment", "hami-scheduler")
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, SCHEMA_VERSIONS[-1], strict=True)


def test_kustomize_renders_every_file_and_the_dashboard() -> None:
    rendered = {(o["kind"], o["metadata"]["name"]) for o in kustomize()}
    written = {(o["kind"], o["metadata"]["name"]) for o in plain_manifests()}
    assert rendered == written | {("ConfigMap", "hami-grafana-dashboard")}
    dashboard = named(kustomize(), "ConfigMap", "hami-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "hami-gpu-dashboard.json" in dashboard["data"]


# --- the device plugin ------------------------------------------------------------------------


def test_the_device_plugin_daemonset(objects: list[Obj], tmp_path: Path) -> None:
    daemonset = workload_running(objects, "device-plugin")
    pod = daemonset["spec"]["template"]
    spec = pod["spec"]
    plugin = hami_container(daemonset, "device-plugin")
    assert spec["nodeSelector"] == {"gpu": "on"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert pod["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    assert _env_field(plugin, "NODE_NAME") == "spec.nodeName"
    assert plugin["securityContext"]["runAsUser"] == 0
    assert plugin["resources"]["requests"] and plugin["resources"]["limits"]
    # host paths: kubelet's socket directory, the hook directory and the shared lock directory
    # at the same paths inside (the daemon hands host paths to kubelet)
    for path in ("/var/lib/kubelet/device-plugins", "/usr/local/vgpu", "/tmp/vgpulock"):
        mount = _mount(plugin, path)
        assert _volume(daemonset, mount["name"])["hostPath"]["path"] == path
    # HAMi's /device-config.yaml from the device ConfigMap the scheduler reads too
    device_mount = _mount(plugin, "/device-config.yaml")
    assert device_mount["subPath"] == "device-config.yaml"
    configmap = _volume(daemonset, device_mount["name"])["configMap"]["name"]
    scheduler = workload_running(objects, "scheduler")
    scheduler_mount = _mount(hami_container(scheduler, "scheduler"), "/device-config.yaml")
    assert _volume(scheduler, scheduler_mount["name"])["configMap"]["name"] == configmap

    settings = device_plugin_settings(objects, tmp_path, "node-a")
    assert settings.node_name == "node-a"
    assert (settings.split_count, settings.memory_scaling, settings.cores_scaling) == (10, 1, 1)
    assert settings.hook_path == "/usr/local"
    # metrics: the flag, the container port, the scrape annotations and the Service agree
    metrics_port = _container_port(plugin, "metrics")
    assert settings.metrics_bind_address == f":{metrics_port}"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(metrics_port)
    assert _services_selecting(objects, pod["metadata"]["labels"]) == [
        _service(objects, "device-plugin")
    ]
    # the probes dial the socket the daemon serves
    socket_path = f"{settings.device_plugin_path.rstrip('/')}/{settings.socket_name}"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = plugin[probe]["exec"]["command"]
        assert command[0] == "python" and command[-1] == socket_path


# --- the scheduler ----------------------------------------------------------------------------


def test_the_scheduler_deployment(objects: list[Obj], tmp_path: Path) -> None:
    deployment = workload_running(objects, "scheduler")
    pod = deployment["spec"]["template"]
    extender = hami_container(deployment, "scheduler")
    kube_scheduler = container(deployment, "kube-scheduler")
    assert deployment["spec"]["replicas"] == 2
    assert pod["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    assert _env_field(extender, "POD_NAME") == "metadata.name"
    assert _env_field(extender, "POD_NAMESPACE") == "metadata.namespace"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    for item in (extender, kube_scheduler):
        assert item["resources"]["requests"] and item["resources"]["limits"]
        assert item["securityContext"]["readOnlyRootFilesystem"] is True

    config, _ = scheduler_config(objects, tmp_path)
    assert config.leader_elect
    assert config.tls
    assert config.settings.node_policy is NodePolicy.BINPACK
    assert config.settings.gpu_policy.names == (GpuPolicyName.SPREAD,)
    assert config.http_port == _container_port(extender, "https")
    assert config.metrics_bind_address == f":{_container_port(extender, 'metrics')}"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(
        _container_port(extender, "metrics")
    )
    tls = _volume(deployment, _mount(extender, "/tls")["name"])["secret"]["secretName"]
    assert config.cert_file == "/tls/tls.crt" and config.key_file == "/tls/tls.key"

    # the Service reaches the leader's https and metrics ports
    service = _service(objects, "scheduler")
    assert service["spec"]["selector"]["hami.io/scheduler-role"] == "leader"
    assert _services_selecting(
        objects, {**pod["metadata"]["labels"], "hami.io/scheduler-role": "leader"}
    ) == [service]
    assert _port(service, "https")["targetPort"] == "https"
    assert _port(service, "metrics")["targetPort"] == "metrics"

    # kube-scheduler: its configuration calls this Service as docs/hami-reference.md 3.8 says
    volume = _volume(deployment, kube_scheduler["volumeMounts"][0]["name"])
    assert (
        f"--config={kube_scheduler['volumeMounts'][0]['mountPath']}/config.yaml"
        in (kube_scheduler["command"])
    )
    scheduling = yaml.safe_load(
        config_map_data(objects, volume["configMap"]["name"], "config.yaml")
    )
    check_kube_scheduler_configuration(scheduling)
    (extender_config,) = scheduling["extenders"]
    namespace = deployment["metadata"]["namespace"]
    https_port = _port(service, "https")["port"]
    assert extender_config["urlPrefix"] == (
        f"https://{service['metadata']['name']}.{namespace}.svc:{https_port}"
    )
    assert scheduling["profiles"] == [{"schedulerName": config.scheduler_name}]
    resources = config.settings.resources
    assert [r["name"] for r in extender_config["managedResources"]] == [
        resources.count,
        resources.memory,
        resources.memory_percentage,
        resources.cores,
        resources.priority,
    ]
    election = scheduling["leaderElection"]
    assert election["leaderElect"] is True and election["resourceNamespace"] == namespace
    # two elections on one Lease would lock each other out
    assert election["resourceName"] != config.leader_elect_resource_name

    # the webhook goes to the same Service, with a certificate for its name
    (webhook,) = named(objects, "MutatingWebhookConfiguration", _webhook_name(objects))["webhooks"]
    assert webhook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": namespace,
        "path": "/webhook",
        "port": https_port,
    }
    hosts, secret = _certificate(objects)
    assert f"{service['metadata']['name']}.{namespace}.svc" in hosts
    assert secret == tls


def _webhook_name(objects: list[Obj]) -> str:
    (webhook,) = of_kind(objects, "MutatingWebhookConfiguration")
    return str(webhook["metadata"]["name"])


def _certgen_steps(objects: list[Obj]) -> dict[str, dict[str, str]]:
    steps: dict[str, dict[str, str]] = {}
    for job in of_kind(objects, "Job"):
        spec = job["spec"]["template"]["spec"]
        for step in spec.get("initContainers", []) + spec["containers"]:
            args = step["args"]
            steps[args[0]] = dict(a.removeprefix("--").split("=", 1) for a in args[1:])
    return steps


def _certificate(objects: list[Obj]) -> tuple[list[str], str]:
    create = _certgen_steps(objects)["create"]
    assert (create["cert-name"], create["key-name"]) == ("tls.crt", "tls.key")
    return create["host"].split(","), create["secret-name"]


def test_the_webhook(objects: list[Obj]) -> None:
    configuration = named(objects, "MutatingWebhookConfiguration", _webhook_name(objects))
    (webhook,) = configuration["webhooks"]
    assert webhook["name"] == "vgpu.hami.io"
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["sideEffects"] == "None"
    assert webhook["timeoutSeconds"] == 10
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "*",
        }
    ]
    ignore = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    assert ignore in webhook["namespaceSelector"]["matchExpressions"]
    assert ignore in webhook["objectSelector"]["matchExpressions"]
    assert "admission.k8s.io/v1" not in webhook["admissionReviewVersions"]  # versions, not groups
    assert webhook["admissionReviewVersions"][0] == "v1"
    # the CA is written by the job: not in the manifest, so `kubectl apply` leaves it alone
    assert "caBundle" not in webhook["clientConfig"]
    steps = _certgen_steps(objects)
    assert steps["patch"]["webhook-name"] == configuration["metadata"]["name"]
    assert steps["patch"]["secret-name"] == steps["create"]["secret-name"]
    assert steps["patch"]["patch-validating"] == "false"


# --- KubeSchedulerConfiguration ---------------------------------------------------------------
# Not a cluster object, so no schema ships for it: its structure as kube-scheduler's
# kubescheduler.config.k8s.io/v1 types and validation define it (the fields used here).

_TOP = {"apiVersion", "kind", "leaderElection", "profiles", "extenders", "clientConnection",
        "parallelism", "percentageOfNodesToScore", "podInitialBackoffSeconds",
        "podMaxBackoffSeconds"}  # fmt: skip
_ELECTION = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
             "resourceName", "resourceNamespace"}  # fmt: skip
_PROFILE = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
_EXTENDER = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
             "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
             "ignorable"}  # fmt: skip
_TLS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData",
        "caData"}  # fmt: skip


def check_kube_scheduler_configuration(config: dict[str, Any]) -> None:
    """Raise AssertionError where kube-scheduler would refuse the configuration (unknown or
    mistyped fields, its extender validation rules) or where it differs from
    docs/hami-reference.md 3.8."""
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= _TOP, set(config) - _TOP
    election = config.get("leaderElection", {})
    assert set(election) <= _ELECTION, set(election) - _ELECTION
    assert isinstance(election.get("leaderElect", False), bool)
    names = [p["schedulerName"] for p in config["profiles"]]
    assert all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
    for profile in config["profiles"]:
        assert set(profile) <= _PROFILE, set(profile) - _PROFILE
    extenders = config["extenders"]
    assert sum(1 for e in extenders if e.get("bindVerb")) <= 1, "only one extender may bind"
    for extender in extenders:
        assert set(extender) <= _EXTENDER, set(extender) - _EXTENDER
        assert set(extender.get("tlsConfig", {})) <= _TLS
        assert isinstance(extender["weight"], int) and extender["weight"] > 0
        assert extender["urlPrefix"].startswith("https://" if extender["enableHTTPS"] else "http")
        for item in extender["managedResources"]:
            assert set(item) == {"name", "ignoredByScheduler"}
            assert item["ignoredByScheduler"] is True
        # docs/hami-reference.md 3.8: what kube-scheduler must send and how long it waits
        assert (extender["filterVerb"], extender["bindVerb"]) == ("filter", "bind")
        assert extender["nodeCacheCapable"] is True
        assert extender["httpTimeout"] == "30s"
        assert extender["enableHTTPS"] is True and extender["tlsConfig"] == {"insecure": True}


def test_the_configuration_check_refuses_what_kube_scheduler_refuses(tmp_path: Path) -> None:
    good = yaml.safe_load(config_map_data(plain_manifests(), "hami-scheduler", "config.yaml"))
    check_kube_scheduler_configuration(good)
    for broken in (
        {**good, "extender": good["extenders"]},
        {**good, "extenders": [{**good["extenders"][0], "filterverb": "filter"}]},
        {**good, "extenders": good["extenders"] * 2},
        {**good, "apiVersion": "kubescheduler.config.k8s.io/v1beta3"},
    ):
        with pytest.raises(AssertionError):
            check_kube_scheduler_configuration(broken)
