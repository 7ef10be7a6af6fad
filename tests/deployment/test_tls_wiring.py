"""The certificates and the booking key as the deployment makes, mounts and uses them.

`hami certs` runs as the install Job configures it against the API server double; its Secrets
are written out as kubelet mounts them into the scheduler and device plugin pods; `hami
scheduler` runs with the Deployment's flags (only addresses and the mount root moved). Then each
party connects as it would in a cluster, from the manifests alone:

* kube-scheduler, with its KubeSchedulerConfiguration's tlsConfig (caFile, its client
  certificate, serverName), calls /filter and /bind on the extender port; the bind's booking
  signature verifies with the key file the device plugin's pods mount;
* the API server, with the caBundle `hami certs` wrote into the webhook configuration and the
  Service DNS name it checks, calls /webhook through the webhook's Service port;
* kubelet's probes (/healthz, /readyz/informer-sync) answer 200 on the port they name (plain
  HTTP on the probe listener);
* a client without kube-scheduler's certificate gets no answer from the extender port.
"""

from __future__ import annotations

import base64
import http.client
import json
import posixpath
import socket
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_plugin.config.keys import load_booking_keys
from hami_plugin.testing.apiserver import FakeApiServer
from tests.bookings import verify_pod
from tests.deployment.exercise import certs_job, run_certs, scheduler_config
from tests.deployment.manifests import (
    Obj,
    config_map_data,
    container,
    hami_container,
    helm_template,
    named,
    of_kind,
    plain_manifests,
    pod_spec,
    workload_running,
)
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod

SOURCES: dict[str, Callable[[], list[Obj]]] = {
    "manifests": plain_manifests,
    # another release and namespace: every name the parties share must follow
    "chart gpu in gpu-system": lambda: helm_template(release="gpu", namespace="gpu-system"),
}


@dataclass(frozen=True, slots=True)
class Mounts:
    """The Secret volumes of one container, written under a local root: container path ->
    local directory."""

    paths: Mapping[str, Path]

    def local(self, path: str) -> str:
        """Where a file the container reads at `path` lies here."""
        for mount, directory in self.paths.items():
            if path.startswith(mount.rstrip("/") + "/"):
                return str(directory / path[len(mount.rstrip("/")) + 1 :])
        raise AssertionError(f"{path} is on no Secret volume")


def mount_secrets(api: FakeApiServer, workload: Obj, item: Obj, root: Path) -> Mounts:
    """Write every Secret volume of container `item` as kubelet does: a directory with one
    file per key. A missing Secret fails (kubelet would not start the pod)."""
    spec = pod_spec(workload)
    namespace = workload["metadata"]["namespace"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    paths: dict[str, Path] = {}
    for mount in item.get("volumeMounts") or []:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        stored = api.get_object("secrets", namespace, secret["secretName"])
        if stored is None and secret.get("optional"):
            stored = {"data": {}}  # kubelet mounts an empty directory
        assert stored is not None, f"Secret {secret['secretName']} missing: the pod waits"
        directory = root / item["name"] / mount["mountPath"].strip("/")
        directory.mkdir(parents=True)
        for key, value in stored["data"].items():
            (directory / key).write_bytes(base64.b64decode(value))
        paths[mount["mountPath"]] = directory
    return Mounts(paths)


def _moved(args: Sequence[str], mounts: Mounts) -> list[str]:
    """The `--flag=PATH` arguments whose PATH is on a Secret volume, moved to the local copy."""
    moved = []
    for arg in args:
        flag, _, value = arg.partition("=")
        if value.startswith("/") and any(value.startswith(m) for m in mounts.paths):
            moved.append(f"{flag}={mounts.local(value)}")
    return moved


def _request(
    port: int,
    server_name: str,
    context: ssl.SSLContext,
    method: str,
    path: str,
    document: Any = None,
) -> tuple[int, Any]:
    """One HTTPS request to 127.0.0.1:`port`, verifying the certificate for `server_name` as a
    client dialling that name would."""
    body = b"" if document is None else json.dumps(document).encode()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: {server_name}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        response = http.client.HTTPResponse(tls)
        response.begin()
        data = response.read()
    kind = response.getheader("Content-Type") or ""
    return response.status, json.loads(data) if kind.startswith("application/json") else data


@dataclass(frozen=True, slots=True)
class Installed:
    """The objects, the cluster double after `hami certs`, and where each pod's files are."""

    objects: list[Obj]
    api: FakeApiServer
    scheduler: Mounts
    kube_scheduler: Mounts
    device_plugin: Mounts


@pytest.fixture(params=SOURCES)
def installed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Installed]:
    objects = SOURCES[request.param]()
    with FakeApiServer() as api:
        for webhook in of_kind(objects, "MutatingWebhookConfiguration"):
            api.add_object(webhook)  # applied with the Job: `hami certs` sets its caBundle
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        assert run_certs(hami_container(certs_job(objects), "certs")["args"], kubeconfig) == 0
        deployment = workload_running(objects, "scheduler")
        plugin = workload_running(objects, "device-plugin")
        root = tmp_path / "volumes"
        yield Installed(
            objects,
            api,
            mount_secrets(api, deployment, hami_container(deployment, "scheduler"), root),
            mount_secrets(api, deployment, container(deployment, "kube-scheduler"), root),
            mount_secrets(api, plugin, hami_container(plugin, "device-plugin"), root / "node"),
        )


def test_every_party_reaches_the_scheduler_with_the_certificates_it_is_given(
    installed: Installed, tmp_path: Path
) -> None:
    objects, api = installed.objects, installed.api
    deployment = workload_running(objects, "scheduler")
    namespace = deployment["metadata"]["namespace"]
    extender = hami_container(deployment, "scheduler")
    config, _ = scheduler_config(
        objects,
        tmp_path,
        [
            *_moved(extender["args"], installed.scheduler),
            "--http-bind=127.0.0.1:0",
            "--webhook-bind=127.0.0.1:0",
            "--metrics-bind-address=0",
            "--probe-bind-address=127.0.0.1:0",
        ],
    )
    assert config.tls and config.client_ca_file and config.booking_key_file
    api.add_object(gpu_node("node-a", 1, split=2))
    pod = api.add_object(gpu_pod("tenant"))
    # one replica, leading by itself: the election is not what this test is about
    with running_scheduler(api, replace(config, leader_elect=False)) as scheduler:
        ports = {
            "https": scheduler.daemon.port,
            "webhook": scheduler.daemon.webhook_port,
            "probe": scheduler.daemon.probe_port,
        }

        # kube-scheduler: its configuration as the ConfigMap holds it, its files as mounted
        kube_scheduler = container(deployment, "kube-scheduler")
        (config_arg,) = [a for a in kube_scheduler["command"] if a.startswith("--config=")]
        config_dir = posixpath.dirname(config_arg.removeprefix("--config="))
        (config_mount,) = [m for m in kube_scheduler["volumeMounts"] if m["mountPath"] ==
                           config_dir]  # fmt: skip
        (volume,) = [v for v in pod_spec(deployment)["volumes"] if v["name"] == config_mount[
            "name"]]  # fmt: skip
        scheduling = yaml.safe_load(
            config_map_data(objects, volume["configMap"]["name"], "config.yaml")
        )
        (extender_config,) = scheduling["extenders"]
        tls = extender_config["tlsConfig"]
        files = installed.kube_scheduler
        kube = ssl.create_default_context(cafile=files.local(tls["caFile"]))
        kube.load_cert_chain(files.local(tls["certFile"]), files.local(tls["keyFile"]))
        service_port = extender_config["urlPrefix"].rsplit(":", 1)[1]
        extender_service = _service_named(objects, extender_config["urlPrefix"])
        port = ports[_target(extender_service, int(service_port))]
        status, result = _request(
            port,
            tls["serverName"],
            kube,
            "POST",
            f"/{extender_config['filterVerb']}",
            {"Pod": pod, "NodeNames": ["node-a"]},
        )
        assert status == 200 and result["NodeNames"] == ["node-a"], result
        status, result = _request(
            port,
            tls["serverName"],
            kube,
            "POST",
            f"/{extender_config['bindVerb']}",
            {
                "PodName": "tenant",
                "PodNamespace": "default",
                "PodUID": pod["metadata"]["uid"],
                "Node": "node-a",
            },
        )
        assert status == 200 and result["Error"] == "", result

        # the booking the scheduler signed verifies with the key the device plugins mount
        plugin = hami_container(workload_running(objects, "device-plugin"), "device-plugin")
        (key_arg,) = [a for a in plugin["args"] if a.startswith("--booking-key-file=")]
        keys = load_booking_keys(installed.device_plugin.local(key_arg.partition("=")[2]))
        bound = api.get_pod("default", "tenant")
        assert bound is not None
        assert verify_pod(keys, bound["metadata"]["uid"], bound["metadata"]["annotations"])

        # a client without kube-scheduler's certificate: no answer from the extender port
        anonymous = ssl.create_default_context(cafile=files.local(tls["caFile"]))
        with pytest.raises((OSError, http.client.HTTPException)):
            _request(
                port,
                tls["serverName"],
                anonymous,
                "POST",
                f"/{extender_config['filterVerb']}",
                {"Pod": pod, "NodeNames": ["node-a"]},
            )

        # the API server: the caBundle `hami certs` wrote, the name it checks, no client cert
        configurations = of_kind(objects, "MutatingWebhookConfiguration")
        (configuration,) = configurations
        stored = api.get_object(
            "mutatingwebhookconfigurations", "", configuration["metadata"]["name"]
        )
        assert stored is not None
        # both entries (other namespaces, admin namespaces) reach a route that admits a GPU pod
        assert len(stored["webhooks"]) == 2
        for webhook in stored["webhooks"]:
            reference = webhook["clientConfig"]["service"]
            assert reference["namespace"] == namespace
            bundle = base64.b64decode(webhook["clientConfig"]["caBundle"]).decode()
            apiserver = ssl.create_default_context(cadata=bundle)
            service = named(objects, "Service", reference["name"])
            status, result = _request(
                ports[_target(service, reference["port"])],
                f"{reference['name']}.{reference['namespace']}.svc",
                apiserver,
                "POST",
                reference["path"],
                _admission_review(gpu_pod("admitted")),
            )
            assert status == 200 and result["response"]["allowed"] is True, result

        # kubelet's probes: plain HTTP on the probe listener
        for probe in ("readinessProbe", "livenessProbe"):
            check = extender[probe]["httpGet"]
            assert check["scheme"] == "HTTP"
            connection = http.client.HTTPConnection("127.0.0.1", ports[check["port"]], timeout=10)
            try:
                connection.request("GET", check["path"])
                assert connection.getresponse().status == 200, probe
            finally:
                connection.close()


def _service_named(objects: list[Obj], url: str) -> Obj:
    """The Service a `https://<name>.<namespace>.svc:<port>` URL dials."""
    host = url.removeprefix("https://").split(":")[0]
    name, namespace, svc = host.split(".")
    assert svc == "svc"
    service = named(objects, "Service", name)
    assert service["metadata"]["namespace"] == namespace
    return service


def _target(service: Obj, port: int) -> str:
    """The container port name a Service port sends to."""
    (target,) = [p["targetPort"] for p in service["spec"]["ports"] if p["port"] == port]
    return str(target)


def _admission_review(pod: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "5d3f2a94-8c1e-4f4b-9a8e-7c1d2b3a4e5f",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "default",
            "object": pod,
        },
    }
