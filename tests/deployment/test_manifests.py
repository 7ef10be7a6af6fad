"""What the deployment installs, checked on the plain manifests as written, as `kubectl
kustomize daemonset/` renders them, and as the chart renders them with its defaults: every
object valid against the Kubernetes JSON schemas (offline, kubernetes-validate), the programs'
arguments accepted by the real `hami` parser, and the wiring between the objects (Services ->
ports -> flags, webhook -> Service -> certificate, kube-scheduler -> extender with mutual TLS,
Secrets -> mounts -> flags, the NetworkPolicy -> the scheduler pods' ports)."""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hami_plugin.certs.command import settings_from
from hami_plugin.certs.settings import CertsSettings
from hami_plugin.extender.http import WEBHOOK_ADMIN_PATH, WEBHOOK_ROUTES
from hami_plugin.protocol.model import GpuPolicyName, NodePolicy
from hami_plugin.scheduler.gpu_pods import ADMIN_NAMESPACE_LABEL
from tests.deployment.exercise import (
    certs_job,
    device_plugin_settings,
    parse_hami_args,
    scheduler_config,
)
from tests.deployment.manifests import (
    Obj,
    admission_policy_manifests,
    config_map_data,
    container,
    containers,
    hami_container,
    helm_template,
    kustomize,
    legacy_key_volume,
    named,
    of_kind,
    plain_manifests,
    secret_volume,
    workload_running,
    workloads_mounting,
)

SOURCES: dict[str, Callable[[], list[Obj]]] = {
    "manifests": plain_manifests,
    "kustomize": kustomize,
    "chart": helm_template,
}
# The oldest Kubernetes the chart declares (kubeVersion) and the newest the schemas know.
SCHEMA_VERSIONS = ("1.26.0", kubernetes_validate.latest_version())
ADMISSION_POLICY_SINCE = "1.30.0"
"""ValidatingAdmissionPolicy v1 (and the node name in service account tokens)."""
CERT_MANAGER_GROUP = "cert-manager.io/"


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


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.removeprefix("v").split("."))


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a label selector with matchLabels only selects `labels`."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _pod_labels(workload: Obj) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def certs_settings(objects: list[Obj]) -> CertsSettings:
    """`hami certs` as the install Job runs it, through the real parser."""
    return settings_from(parse_hami_args(hami_container(certs_job(objects), "certs")["args"], []))


# --- schemas ----------------------------------------------------------------------------------


def _objects_at(source: str, version: str) -> list[Obj]:
    """What `source` installs on a cluster of `version`: the chart decides by itself (it is
    rendered for that version); the plain manifests get admission-policy.yaml from 1.30."""
    if source == "chart":
        return helm_template(kube_version=version)
    objects = SOURCES[source]()
    if _version(version) >= _version(ADMISSION_POLICY_SINCE):
        objects += admission_policy_manifests()
    return objects


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("source", SOURCES)
def test_every_object_is_valid_against_the_kubernetes_schemas(source: str, version: str) -> None:
    objects = _objects_at(source, version)
    assert objects
    kinds = {o["kind"] for o in objects}
    assert ("ValidatingAdmissionPolicy" in kinds) == (
        _version(version) >= _version(ADMISSION_POLICY_SINCE)
    )
    for item in objects:
        kubernetes_validate.validate(item, version, strict=True)


CHART_VARIANTS = {
    "cert-manager": ("scheduler.certManager.enabled=true",),
    "no webhook": ("scheduler.admissionWebhook.enabled=false",),
    "no leader election": ("scheduler.leaderElect=false",),
    "own certificates": ("scheduler.patch.enabled=false",),
    "no network policy": ("scheduler.networkPolicy.enabled=false",),
    "node ports": ("scheduler.service.type=NodePort", "devicePlugin.service.type=NodePort"),
    "HAMi-core pre-installed": ("devicePlugin.hamiCore.enabled=false",),
    "GPU Operator": (
        "devicePlugin.gpuOperatorToolkitReady.enabled=true",
        "devicePlugin.runtimeClassName=nvidia",
        "devicePlugin.createRuntimeClass=true",
    ),
}


@pytest.mark.parametrize("variant", CHART_VARIANTS)
def test_every_chart_variant_is_valid(variant: str) -> None:
    """The chart with the values that change which objects it renders. cert-manager's kinds
    are no Kubernetes schema: they are checked against cert-manager's v1 fields instead."""
    objects = helm_template(*CHART_VARIANTS[variant])
    for item in objects:
        if item["apiVersion"].startswith(CERT_MANAGER_GROUP):
            check_cert_manager_object(item)
        else:
            kubernetes_validate.validate(item, SCHEMA_VERSIONS[-1], strict=True)


def test_the_schema_check_catches_a_misspelt_field() -> None:
    deployment = named(plain_manifests(), "Deployment", "hami-scheduler")
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, SCHEMA_VERSIONS[-1], strict=True)


def test_kustomize_renders_every_file_and_the_dashboard() -> None:
    # the certificate Job is named after its image (tests/deployment/test_kustomize.py)
    job_name = certs_job(kustomize())["metadata"]["name"]
    rendered = {(o["kind"], o["metadata"]["name"]) for o in kustomize()}
    written = {(o["kind"], o["metadata"]["name"]) for o in plain_manifests()}
    written = (written - {("Job", "hami-certs")}) | {("Job", job_name)}
    assert rendered == written | {
        ("ConfigMap", "hami-grafana-dashboard"),
        ("ConfigMap", job_name),
    }
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
    # kubelet's PodResources socket (in-flight/v2): its host directory, at the same path, read-only
    # (connect() on a unix socket writes nothing to the mount)
    pod_resources_dir = settings.pod_resources_socket.rsplit("/", 1)[0]
    assert pod_resources_dir == "/var/lib/kubelet/pod-resources"
    mount = _mount(plugin, pod_resources_dir)
    assert mount.get("readOnly") is True
    assert _volume(daemonset, mount["name"])["hostPath"]["path"] == pod_resources_dir
    # the booking keys: the nodes mount only the public ones (a directory kubelet updates when
    # the Secret changes), the private ones only the scheduler; the HMAC key of before both,
    # optional (the upgrade window)
    assert settings.booking_key_file == "/booking/keys"
    assert settings.legacy_booking_key_file == "/booking-legacy/keys"
    scheduler = workload_running(objects, "scheduler")
    extender = hami_container(scheduler, "scheduler")
    assert secret_volume(daemonset, plugin, "/booking") == "hami-booking-public-keys"
    assert secret_volume(scheduler, extender, "/booking") == "hami-booking-signing-key"
    assert workloads_mounting(objects, "hami-booking-signing-key") == ["Deployment/hami-scheduler"]
    assert legacy_key_volume(daemonset, plugin) == "hami-booking-key"
    assert legacy_key_volume(scheduler, extender) == "hami-booking-key"
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
    # startup and readiness dial the socket the daemon serves; liveness asks the probe
    # listener, whose /healthz calls the gRPC server
    socket_path = f"{settings.device_plugin_path.rstrip('/')}/{settings.socket_name}"
    for probe in ("startupProbe", "readinessProbe"):
        command = plugin[probe]["exec"]["command"]
        assert command[0] == "python" and command[-1] == socket_path
    request = plugin["livenessProbe"]["httpGet"]
    assert (request["path"], request["port"], request["scheme"]) == ("/healthz", "probe", "HTTP")
    assert settings.probe_bind_address == f":{_container_port(plugin, 'probe')}"


# --- the scheduler ----------------------------------------------------------------------------


def _service_to(objects: list[Obj], target_port: str) -> Obj:
    """The one Service with a port that targets the container port named `target_port`."""
    found = [
        s
        for s in of_kind(objects, "Service")
        if any(p["targetPort"] == target_port for p in s["spec"]["ports"])
    ]
    assert len(found) == 1, f"{len(found)} Services target {target_port}"
    return found[0]


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
    assert config.settings.node_policy is NodePolicy.BINPACK
    assert config.settings.gpu_policy.names == (GpuPolicyName.SPREAD,)
    assert config.http_port == _container_port(extender, "https")
    assert config.webhook_port == _container_port(extender, "webhook") != config.http_port
    assert config.metrics_bind_address == f":{_container_port(extender, 'metrics')}"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(
        _container_port(extender, "metrics")
    )
    # one serving certificate for both listeners; its CA verifies kube-scheduler's client
    # certificate; the booking key signs each bind
    assert config.tls
    assert (config.cert_file, config.key_file, config.client_ca_file) == (
        "/tls/tls.crt",
        "/tls/tls.key",
        "/tls/ca.crt",
    )
    assert parse_hami_args(extender["args"], []).booking_key_file == "/booking/keys"
    tls = secret_volume(deployment, extender, "/tls")
    booking = secret_volume(deployment, extender, "/booking")
    # the probes go to a listener of their own, which no other client can fill. Ready once
    # synced, leader or not (/readyz, 503 on followers, would stall rolling updates and empty
    # the webhook's Service); the extender's Service adds the leader label below.
    assert config.probe_bind_address == f":{_container_port(extender, 'probe')}"
    for probe, path in (("readinessProbe", "/readyz/informer-sync"), ("livenessProbe", "/healthz")):
        request = extender[probe]["httpGet"]
        assert (request["path"], request["port"], request["scheme"]) == (path, "probe", "HTTP")
    strategy = deployment["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0  # why followers must be ready

    # the extender's Service reaches the leader's https and metrics ports; the webhook's every
    # replica's webhook port
    extender_service = _service_to(objects, "https")
    webhook_service = _service_to(objects, "webhook")
    labels = pod["metadata"]["labels"]
    assert extender_service["spec"]["selector"]["hami.io/scheduler-role"] == "leader"
    leader = {**labels, "hami.io/scheduler-role": "leader"}
    assert _names(_services_selecting(objects, leader)) == _names(
        [extender_service, webhook_service]
    )
    assert _names(_services_selecting(objects, labels)) == _names([webhook_service])
    assert _port(extender_service, "metrics")["targetPort"] == "metrics"
    namespace = deployment["metadata"]["namespace"]

    # kube-scheduler: its configuration calls the extender's Service as
    # docs/hami-reference.md 3.8 says, over mutual TLS
    config_mount = [m for m in kube_scheduler["volumeMounts"] if "configMap" in _volume(
        deployment, m["name"])]  # fmt: skip
    (config_mount,) = config_mount
    assert f"--config={config_mount['mountPath']}/config.yaml" in kube_scheduler["command"]
    volume = _volume(deployment, config_mount["name"])
    scheduling = yaml.safe_load(
        config_map_data(objects, volume["configMap"]["name"], "config.yaml")
    )
    check_kube_scheduler_configuration(scheduling)
    (extender_config,) = scheduling["extenders"]
    https_port = _port(extender_service, "https")["port"]
    assert extender_config["urlPrefix"] == (
        f"https://{extender_service['metadata']['name']}.{namespace}.svc:{https_port}"
    )
    tls_config = extender_config["tlsConfig"]
    # the name the serving certificate carries (the webhook's Service), not the one dialled
    assert tls_config["serverName"] == f"{webhook_service['metadata']['name']}.{namespace}.svc"
    client_dir = posixpath.dirname(tls_config["certFile"])
    assert (tls_config["certFile"], tls_config["keyFile"], tls_config["caFile"]) == tuple(
        f"{client_dir}/{name}" for name in ("tls.crt", "tls.key", "ca.crt")
    )
    client = secret_volume(deployment, kube_scheduler, client_dir)
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

    # the webhook goes to the webhook's Service (the admin namespaces' entry to its own path)
    webhooks = named(objects, "MutatingWebhookConfiguration", _webhook_name(objects))["webhooks"]
    assert [w["clientConfig"]["service"] for w in webhooks] == [
        {
            "name": webhook_service["metadata"]["name"],
            "namespace": namespace,
            "path": path,
            "port": _port(webhook_service, "webhook")["port"],
        }
        for path in ("/webhook", WEBHOOK_ADMIN_PATH)
    ]
    assert {"/webhook", WEBHOOK_ADMIN_PATH} <= WEBHOOK_ROUTES

    # `hami certs` makes exactly the Secrets mounted, the certificate for the webhook's Service
    certs = certs_settings(objects)
    assert certs.namespace == namespace
    assert certs.service == webhook_service["metadata"]["name"]
    assert f"{certs.service}.{namespace}.svc" in certs.serving_spec.dns_names
    assert (certs.tls_secret, certs.client_secret, certs.booking_key_secret) == (
        tls,
        client,
        booking,
    )
    assert certs.booking_public_key_secret == secret_volume(
        workload_running(objects, "device-plugin"),
        hami_container(workload_running(objects, "device-plugin"), "device-plugin"),
        "/booking",
    )
    assert certs.webhook_configuration == _webhook_name(objects)


def _names(objects: list[Obj]) -> set[str]:
    return {o["metadata"]["name"] for o in objects}


def _webhook_name(objects: list[Obj]) -> str:
    (webhook,) = of_kind(objects, "MutatingWebhookConfiguration")
    return str(webhook["metadata"]["name"])


def test_the_webhook(objects: list[Obj]) -> None:
    configuration = named(objects, "MutatingWebhookConfiguration", _webhook_name(objects))
    webhook, admin = configuration["webhooks"]
    assert (webhook["name"], admin["name"]) == ("vgpu.hami.io", "admin.vgpu.hami.io")
    # one entry per namespace: the admin namespaces' alone goes to /webhook/gpu-admin
    ignore = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    for entry, operator in ((webhook, "NotIn"), (admin, "In")):
        assert entry["namespaceSelector"]["matchExpressions"] == [
            ignore,
            {"key": ADMIN_NAMESPACE_LABEL, "operator": operator, "values": ["true"]},
        ]
        # the opt-out is the namespace's alone (a pod author may label a pod, not a namespace)
        assert "objectSelector" not in entry
        rest = {k: v for k, v in entry.items() if k not in ("name", "namespaceSelector")}
        rest["clientConfig"] = {**rest["clientConfig"], "service": None}
        assert rest == {
            **{k: v for k, v in webhook.items() if k not in ("name", "namespaceSelector")},
            "clientConfig": {**webhook["clientConfig"], "service": None},
        }
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
    assert "admission.k8s.io/v1" not in webhook["admissionReviewVersions"]  # versions, not groups
    assert webhook["admissionReviewVersions"][0] == "v1"
    # the CA is written by `hami certs`: not in the manifest, so `kubectl apply` leaves it alone
    assert "caBundle" not in webhook["clientConfig"]
    assert certs_settings(objects).webhook_configuration == configuration["metadata"]["name"]


def test_the_certificate_job_and_its_renewal(objects: list[Obj]) -> None:
    """`hami certs` once at install and weekly after, the same run, as a non-root user that
    cannot write to its image, kept away from the webhook it configures."""
    job = certs_job(objects)
    (cronjob,) = of_kind(objects, "CronJob")
    # the install run alone may wait (fail, retry) for the webhook configuration to exist
    waits = "--require-webhook-configuration"
    run = [a for a in hami_container(job, "certs")["args"] if a != waits]
    for workload in (job, cronjob):
        item = hami_container(workload, "certs")
        assert [a for a in item["args"] if a != waits] == run
        assert waits not in hami_container(cronjob, "certs")["args"]
        assert item["image"] == hami_container(workload_running(objects, "scheduler"),
                                               "scheduler")["image"]  # fmt: skip
        assert item["securityContext"]["readOnlyRootFilesystem"] is True
        assert item["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert item["resources"]["limits"]["memory"]
        spec = (workload["spec"].get("jobTemplate") or workload)["spec"]["template"]
        assert spec["metadata"]["labels"]["hami.io/webhook"] == "ignore"
        assert spec["spec"]["securityContext"]["runAsNonRoot"] is True
        assert spec["spec"]["restartPolicy"] == "OnFailure"
    _minute, _hour, day, month, weekday = cronjob["spec"]["schedule"].split()
    assert (day, month) == ("*", "*") and weekday.isdigit(), "weekly"
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    # renewal starts well before a certificate expires, and weekly runs fit into that window
    settings = certs_settings(objects)
    assert settings.renew_before.days >= 4 * 7


# --- the network policy -------------------------------------------------------------------------


def _named_ports(workload: Obj) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in containers(workload) for p in c.get("ports", [])}


def _rules_admitting(policy: Obj, workload: Obj, port: int) -> list[list[Obj] | None]:
    """The sources of each ingress rule of `policy` that admits `port` of `workload`'s pods
    (None: every source)."""
    named_ports = _named_ports(workload)
    found: list[list[Obj] | None] = []
    for rule in policy["spec"]["ingress"]:
        ports = set()
        for entry in rule.get("ports") or []:
            assert entry.get("protocol", "TCP") == "TCP" and "endPort" not in entry
            number = entry["port"]
            ports.add(named_ports[number] if isinstance(number, str) else int(number))
        if not ports or port in ports:
            found.append(rule.get("from") or None)
    return found


def _policy_for(objects: list[Obj], workload: Obj, other: Obj) -> Obj:
    """The one NetworkPolicy selecting `workload`'s pods (and not `other`'s)."""
    labels = _pod_labels(workload)
    (policy,) = [
        p for p in of_kind(objects, "NetworkPolicy") if _selects(p["spec"]["podSelector"], labels)
    ]
    assert not _selects(policy["spec"]["podSelector"], _pod_labels(other))
    assert policy["metadata"]["namespace"] == workload["metadata"]["namespace"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    return policy


def _only_prometheus(rules: list[list[Obj] | None]) -> None:
    """Every rule admits only pods chosen by both a namespace and a pod selector."""
    assert rules, "nothing admitted: Prometheus cannot scrape"
    for sources in rules:
        assert sources, "the metrics port is open to every source"
        for source in sources:
            assert set(source) == {"namespaceSelector", "podSelector"}, source
            assert source["namespaceSelector"].get("matchLabels"), "every namespace"
            assert source["podSelector"].get("matchLabels"), "every pod of the namespace"


def check_network_policy(objects: list[Obj]) -> None:
    """Raise AssertionError unless one NetworkPolicy selects the scheduler pods and admits
    their extender port only from the scheduler pods, their metrics port only from the
    Prometheus selector, their webhook port from anywhere and their probe port from no pod; and
    one selects the device plugin pods and admits their metrics port only from the Prometheus
    selector and their probe port from no pod."""
    deployment = workload_running(objects, "scheduler")
    plugin = workload_running(objects, "device-plugin")
    scheduler_labels, plugin_labels = _pod_labels(deployment), _pod_labels(plugin)
    policy = _policy_for(objects, deployment, plugin)
    extender = hami_container(deployment, "scheduler")
    for sources in _rules_admitting(policy, deployment, _container_port(extender, "https")):
        # the extender only from pods of this namespace that are scheduler pods
        assert sources, "the extender port is open to every source"
        for source in sources:
            assert set(source) == {"podSelector"}, source
            assert _selects(source["podSelector"], scheduler_labels)
            assert not _selects(source["podSelector"], plugin_labels)
            assert source["podSelector"]["matchLabels"], "every pod of the namespace"
    assert None in _rules_admitting(policy, deployment, _container_port(extender, "webhook"))
    _only_prometheus(_rules_admitting(policy, deployment, _container_port(extender, "metrics")))
    assert _rules_admitting(policy, deployment, _container_port(extender, "probe")) == []

    policy = _policy_for(objects, plugin, deployment)
    device_plugin = hami_container(plugin, "device-plugin")
    _only_prometheus(_rules_admitting(policy, plugin, _container_port(device_plugin, "metrics")))
    assert _rules_admitting(policy, plugin, _container_port(device_plugin, "probe")) == []


def test_the_network_policies_admit_each_port_only_from_whom_it_serves(
    objects: list[Obj],
) -> None:
    check_network_policy(objects)


def _open_to_all(ingress: list[Obj]) -> None:
    ingress[1]["ports"].append({"port": "https", "protocol": "TCP"})


def _no_source(ingress: list[Obj]) -> None:
    ingress[0].pop("from")


def _every_namespace(ingress: list[Obj]) -> None:
    ingress[0]["from"].append({"namespaceSelector": {}})


def _every_pod(ingress: list[Obj]) -> None:
    ingress[0]["from"][0]["podSelector"]["matchLabels"] = {}


def _metrics_open(ingress: list[Obj]) -> None:
    ingress[1]["ports"].append({"port": "metrics", "protocol": "TCP"})


def _probe_open(ingress: list[Obj]) -> None:
    ingress[1]["ports"].append({"port": "probe", "protocol": "TCP"})


def _metrics_from_every_namespace(ingress: list[Obj]) -> None:
    ingress[2]["from"][0]["namespaceSelector"] = {}


@pytest.mark.parametrize(
    "change",
    [
        _open_to_all,
        _no_source,
        _every_namespace,
        _every_pod,
        _metrics_open,
        _probe_open,
        _metrics_from_every_namespace,
    ],
)
def test_the_network_policy_check_refuses_an_open_port(
    change: Callable[[list[Obj]], None],
) -> None:
    objects = plain_manifests()
    check_network_policy(objects)
    change(named(objects, "NetworkPolicy", "hami-scheduler")["spec"]["ingress"])
    with pytest.raises(AssertionError):
        check_network_policy(objects)


def _plugin_metrics_open(ingress: list[Obj]) -> None:
    ingress[0].pop("from")


def _plugin_probe_open(ingress: list[Obj]) -> None:
    ingress.append({"ports": [{"port": "probe", "protocol": "TCP"}]})


@pytest.mark.parametrize("change", [_plugin_metrics_open, _plugin_probe_open])
def test_the_network_policy_check_refuses_an_open_device_plugin_port(
    change: Callable[[list[Obj]], None],
) -> None:
    objects = plain_manifests()
    change(named(objects, "NetworkPolicy", "hami-device-plugin")["spec"]["ingress"])
    with pytest.raises(AssertionError):
        check_network_policy(objects)


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
        # mutual TLS: kube-scheduler verifies the extender (no `insecure`) and presents a
        # client certificate, from files kubelet keeps current (not inline data)
        assert extender["enableHTTPS"] is True
        tls = extender["tlsConfig"]
        assert not tls.get("insecure", False), "kube-scheduler must verify the extender"
        assert {"caFile", "certFile", "keyFile"} <= set(tls), tls
        assert not {"caData", "certData", "keyData"} & set(tls)


def test_the_configuration_check_refuses_what_kube_scheduler_refuses(tmp_path: Path) -> None:
    good = yaml.safe_load(config_map_data(plain_manifests(), "hami-scheduler", "config.yaml"))
    check_kube_scheduler_configuration(good)
    for broken in (
        {**good, "extender": good["extenders"]},
        {**good, "extenders": [{**good["extenders"][0], "filterverb": "filter"}]},
        {**good, "extenders": good["extenders"] * 2},
        {**good, "apiVersion": "kubescheduler.config.k8s.io/v1beta3"},
        _with_tls(good, insecure=True),
        _with_tls(good, caFile=None),
        _with_tls(good, keyFile=None),
        {**good, "extenders": [{**good["extenders"][0], "enableHTTPS": False}]},
    ):
        with pytest.raises(AssertionError):
            check_kube_scheduler_configuration(broken)


def _with_tls(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`config` with its extender's tlsConfig changed (a None value removes the field)."""
    result = copy.deepcopy(config)
    tls = result["extenders"][0]["tlsConfig"]
    for key, value in changes.items():
        if value is None:
            tls.pop(key, None)
        else:
            tls[key] = value
    return result


# --- cert-manager's objects ---------------------------------------------------------------------
# Not in the Kubernetes schemas: the fields of cert-manager.io/v1 the chart uses, by structure.

_CERTIFICATE = {"secretName", "commonName", "dnsNames", "duration", "renewBefore", "privateKey",
                "usages", "issuerRef", "isCA", "subject", "ipAddresses", "uris",
                "secretTemplate", "revisionHistoryLimit"}  # fmt: skip
_USAGES = {"digital signature", "key encipherment", "server auth", "client auth", "cert sign",
           "crl sign", "signing"}  # fmt: skip
_ISSUER_TYPES = {"selfSigned", "ca", "acme", "vault", "venafi"}


def check_cert_manager_object(item: Obj) -> None:
    """Raise AssertionError where cert-manager would refuse an Issuer or Certificate."""
    assert item["apiVersion"] == "cert-manager.io/v1"
    assert set(item) == {"apiVersion", "kind", "metadata", "spec"}
    assert item["metadata"]["name"] and item["metadata"]["namespace"]
    spec = item["spec"]
    if item["kind"] == "Issuer":
        assert len(spec) == 1 and set(spec) <= _ISSUER_TYPES, spec
        if "ca" in spec:
            assert set(spec["ca"]) == {"secretName"}
        return
    assert item["kind"] == "Certificate", item["kind"]
    assert set(spec) <= _CERTIFICATE, set(spec) - _CERTIFICATE
    assert spec["secretName"] and spec["issuerRef"]["name"]
    assert set(spec["issuerRef"]) <= {"name", "kind", "group"}
    assert set(spec.get("usages", [])) <= _USAGES
    assert spec.get("commonName") or spec.get("dnsNames")
    key = spec.get("privateKey", {})
    assert set(key) <= {"algorithm", "size", "encoding", "rotationPolicy"}
    assert key.get("algorithm", "RSA") in ("RSA", "ECDSA", "Ed25519")
    for field in ("duration", "renewBefore"):
        if field in spec:
            assert spec[field].endswith(("h", "m", "s")) and spec[field][:-1].isdigit()
