"""Run each daemon, and `hami certs`, as the manifests configure it, against the API server
double, through the paths that reach the API, and return the requests it made as RBAC
attributes.

The programs are started from the container's own `args` and `env` in the manifests (parsed by
the real `hami` parser), with only what cannot work outside a cluster replaced: file paths,
listen addresses, the fake NVML, the in-cluster client. So a flag the manifests set that
changes which calls a program makes (leader election, the Lease's name, the Secrets' names) is
exercised too.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import yaml

from hami_plugin.cli import build_parser
from hami_plugin.clock import ManualClock, SystemClock
from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.hamicore import HAMI_CORE_VERSION
from hami_plugin.deviceplugin.settings import DevicePluginSettings, resolve_settings
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.extender.settings import SchedulerConfig, resolve_config
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.gpu_admin import LABEL_GPU_ADMIN
from hami_plugin.protocol.model import ANNOTATION_BIND_PHASE, ANNOTATION_NODE_LOCK
from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    BookingKeys,
    parse_booking_keys,
)
from hami_plugin.testing.apiserver import FakeApiServer, RecordedRequest, make_pod
from hami_plugin.testing.hamicore import install_fake_hamicore
from hami_plugin.testing.kubelet import FakeKubelet, ListedPod
from tests.bookings import keys_from, private_key_file_text, public_key_file_text, signed_fields
from tests.deployment.manifests import (
    Obj,
    config_map_data,
    hami_container,
    of_kind,
    pod_spec,
    workload_running,
)
from tests.deployment.rbac import Access, access_of
from tests.deviceplugin import pods as dp_pods
from tests.extender.cluster import FAST_RETRY, running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import wait_until

POD_NAME = "hami-scheduler-5d8c9-abcde"


def accesses(requests: Sequence[RecordedRequest]) -> list[Access]:
    return [access_of(r.method, r.path, r.query) for r in requests]


def container_env(container: Mapping[str, Any], field_values: Mapping[str, str]) -> dict[str, str]:
    """The container's environment: literal values, and `fieldRef`s from `field_values`."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            env[item["name"]] = field_values[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def parse_hami_args(args: Sequence[str], overrides: Sequence[str]) -> argparse.Namespace:
    """`hami <args> <overrides>` through the real parser (a later flag wins)."""
    return build_parser().parse_args([*args, *overrides])


def booking_key_file(directory: Path, *, public: bool = False) -> tuple[Path, BookingKeys]:
    """A key file as `hami certs` writes it (one Ed25519 key): the scheduler's private key, or
    with `public` a node's public key; and the keys that sign for it."""
    seed = (
        (directory / "booking-key-seed").read_bytes()
        if (directory / "booking-key-seed").exists()
        else secrets.token_bytes(32)
    )
    (directory / "booking-key-seed").write_bytes(seed)
    path = directory / ("booking-public-keys" if public else "booking-keys")
    path.write_text(public_key_file_text(seed) if public else private_key_file_text(seed))
    parse_booking_keys(path.read_text().splitlines())
    return path, keys_from(seed)


def sign_pod(api: FakeApiServer, namespace: str, name: str, keys: BookingKeys) -> None:
    """Add the scheduler's signature to a pod's booking, as `hami scheduler` does at bind."""
    pod = api.get_pod(namespace, name)
    assert pod is not None
    fields = signed_fields(pod["metadata"]["uid"], pod["metadata"]["annotations"])
    assert fields is not None, f"pod {name} has no booking to sign"
    signature = keys.sign(fields)
    api.update_object(
        "pods",
        namespace,
        name,
        lambda p: p["metadata"]["annotations"].update({ANNOTATION_BOOKING_SIGNATURE: signature}),
    )


def _mounted_config_map(workload: Obj, subcommand: str, path: str) -> str:
    """The ConfigMap mounted at `path` in the container running `hami <subcommand>`."""
    item = hami_container(workload, subcommand)
    (mount,) = [m for m in item["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    return str(volume["configMap"]["name"])


def device_config_file(objects: Sequence[Obj], directory: Path) -> tuple[Path, Path]:
    """The device ConfigMap and the per-node ConfigMap as the pods see them, written out."""
    scheduler = workload_running(objects, "scheduler")
    plugin = workload_running(objects, "device-plugin")
    device = directory / "device-config.yaml"
    name = _mounted_config_map(scheduler, "scheduler", "/device-config.yaml")
    device.write_text(config_map_data(objects, name, "device-config.yaml"))
    node = directory / "config.json"
    name = _mounted_config_map(plugin, "device-plugin", "/config")
    node.write_text(config_map_data(objects, name, "config.json"))
    return device, node


def device_plugin_settings(
    objects: Sequence[Obj], directory: Path, node: str, overrides: Sequence[str] = ()
) -> DevicePluginSettings:
    """The device plugin's settings as its DaemonSet starts it (paths moved to `directory`)."""
    daemonset = workload_running(objects, "device-plugin")
    container = hami_container(daemonset, "device-plugin")
    device, node_config = device_config_file(objects, directory)
    args = parse_hami_args(
        container["args"],
        [f"--config-file={device}", f"--node-config-file={node_config}", *overrides],
    )
    env = container_env(container, {"spec.nodeName": node})
    return resolve_settings(args, env)


def scheduler_config(
    objects: Sequence[Obj], directory: Path, overrides: Sequence[str] = ()
) -> tuple[SchedulerConfig, dict[str, str]]:
    """The scheduler's config as its Deployment starts it, and its environment (the booking
    key file, which is read at start, moved to `directory`)."""
    deployment = workload_running(objects, "scheduler")
    container = hami_container(deployment, "scheduler")
    device, _ = device_config_file(objects, directory)
    keys, _ = booking_key_file(directory)
    namespace = deployment["metadata"]["namespace"]
    env = container_env(container, {"metadata.name": POD_NAME, "metadata.namespace": namespace})
    args = parse_hami_args(
        container["args"],
        [f"--device-config-file={device}", f"--booking-key-file={keys}", *overrides],
    )
    return resolve_config(args, env), env


# --- the device plugin --------------------------------------------------------------------------


def _fake_gpus(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {"uuid": dp_pods.GPU_A, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960},
                    {"uuid": dp_pods.GPU_B, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960},
                ]
            }
        )
    )
    return path


def device_plugin_requests(objects: Sequence[Obj], directory: Path) -> list[RecordedRequest]:
    """Run `hami device-plugin` as the DaemonSet configures it: register, Allocate a pod,
    fail one, serve a scrape, shut down. Every request it sent."""
    node = dp_pods.NODE
    sock_dir = tempfile.mkdtemp(prefix="hami-rbac-", dir="/tmp")  # short unix socket paths
    keys_path, keys = booking_key_file(directory, public=True)
    # what the DaemonSet's hami-core initContainer leaves on the node (HAMi's release name)
    install_fake_hamicore(directory / "hook", version=HAMI_CORE_VERSION)
    try:
        settings = device_plugin_settings(
            objects,
            directory,
            node,
            [
                f"--booking-key-file={keys_path}",
                "--nvml=fake",
                f"--fake-gpus={_fake_gpus(directory / 'gpus.yaml')}",
                f"--device-plugin-path={sock_dir}",
                f"--hook-path={directory / 'hook'}",
                "--metrics-bind-address=127.0.0.1:0",
                "--register-interval-seconds=0.3",
                # the test kubelet's PodResources API (a booking is served only to the pod
                # kubelet lists as being admitted)
                f"--pod-resources-socket={sock_dir}/pod-resources.sock",
            ],
        )
        with FakeApiServer() as api:
            api.add_node(node)
            kube = KubeClient(api.api_client(), FAST_RETRY)
            daemon = DevicePluginDaemon(
                settings,
                load_nvml=load_nvml_module,
                kube=kube,
                vgpulock_path=str(directory / "vgpulock"),
            )
            kubelet = FakeKubelet(sock_dir).start()
            admitting: list[ListedPod] = []
            kubelet.install_pod_resources(lambda: admitting)
            codes: list[int] = []
            thread = threading.Thread(target=lambda: codes.append(daemon.run()))
            thread.start()
            try:
                assert daemon.started.wait(10)
                kubelet.wait_for_registrations(1)
                wait_until(
                    lambda: (
                        "hami.io/node-nvidia-register"
                        in (api.get_node(node) or {})["metadata"]["annotations"]
                    ),
                    what="the register annotation",
                )
                # Allocate: the pod named by the node lock gets its GPU, the lock is released
                dp_pods.add_pending_pod(api, "served", [[dp_pods.dev(dp_pods.GPU_A)]])
                sign_pod(api, "default", "served", keys)
                admitting[:] = [ListedPod("default", "served")]
                kubelet.allocate([f"{dp_pods.GPU_A}-0"])
                assert dp_pods.pod_annotations(api, "served")[ANNOTATION_BIND_PHASE] == "success"
                # Allocate for a pod whose booking is unreadable: bind-phase failed and an event
                dp_pods.add_pending_pod(api, "broken", raw_value="GPU-x,NVIDIA,bad,0:;", lock=None)
                sign_pod(api, "default", "broken", keys)
                admitting[:] = [ListedPod("default", "broken")]
                try:
                    kubelet.allocate([f"{dp_pods.GPU_B}-0"])
                    raise AssertionError("Allocate for an unreadable booking succeeded")
                except grpc.RpcError:
                    pass
                assert dp_pods.pod_annotations(api, "broken")[ANNOTATION_BIND_PHASE] == "failed"
                # Allocate for a container that turns HAMi-core off in a gpu-admin namespace:
                # the namespace is read, the preload left out
                api.add_object(
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": "default", "labels": {LABEL_GPU_ADMIN: "true"}},
                    }
                )
                disabled = {"CUDA_DISABLE_CONTROL": "true"}
                dp_pods.add_pending_pod(
                    api, "tool", [[dp_pods.dev(dp_pods.GPU_A)]], env=disabled, lock=None
                )
                sign_pod(api, "default", "tool", keys)
                admitting[:] = [ListedPod("default", "tool")]
                answer = kubelet.allocate([f"{dp_pods.GPU_A}-1"])
                (container,) = answer.container_responses
                assert "/etc/ld.so.preload" not in {m.container_path for m in container.mounts}
                assert daemon.metrics is not None, "the DaemonSet's metrics address did not serve"
                with urllib.request.urlopen(daemon.metrics.url, timeout=10) as response:
                    assert response.status == 200
            finally:
                daemon.stop()
                thread.join(10)
                kubelet.stop()
                kube.close()
            assert codes == [0]
            return api.requests
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


# --- the scheduler ------------------------------------------------------------------------------


def scheduler_requests(objects: Sequence[Obj], directory: Path) -> list[RecordedRequest]:
    """Run `hami scheduler` as the Deployment configures it (leader election included):
    watches, the webhook, filter with and without a fit, bind on a node with HAMi's node lock
    and on one with the in-flight protocol, recovery of a stuck allocation and of a stale
    lock, events, and shutdown (the Lease released). Every request it sent."""
    config, env = scheduler_config(
        objects,
        directory,
        ["--http-bind=127.0.0.1:0", "--webhook-bind=127.0.0.1:0", "--metrics-bind-address=0"],
    )
    # No TLS here (test_certs.py runs it with the certificates): one plain listener serves
    # every route, which makes the same API calls.
    config = _without_tls(config)
    namespace = env["POD_NAMESPACE"]
    now = datetime.now(UTC)
    clock = ManualClock(now)
    stale = f"{now - timedelta(minutes=30):%Y-%m-%dT%H:%M:%SZ},default,gone-long-ago"
    with FakeApiServer() as api:
        own = make_pod(POD_NAME, namespace, labels={"app.kubernetes.io/component": "scheduler"})
        api.add_object(own)
        # a previous leader still labelled leader: the new leader relabels it follower
        api.add_object(
            make_pod("hami-scheduler-old", namespace, labels={"hami.io/scheduler-role": "leader"})
        )
        api.add_object(gpu_node("hami-node", 1, split=2))  # HAMi's plugin: node lock
        api.add_object(gpu_node("our-node", 1, split=2, protocol=True))  # in-flight protocol
        api.add_object(gpu_node("preempt-node", 1, split=2, protocol=True))
        api.add_object(gpu_node("stale-lock", 1, annotations={ANNOTATION_NODE_LOCK: stale}))
        with running_scheduler(
            api,
            config,
            clock=clock,
            # the lease on real time: moving the booking clock 121 s must not expire it
            election_clock=SystemClock(),
            node_lock_retry_timeout_seconds=5.0,
            allocation_timeout_seconds=120,
        ) as scheduler:
            wait_until(
                lambda: (
                    (api.get_pod(namespace, POD_NAME) or {})["metadata"]["labels"].get(
                        "hami.io/scheduler-role"
                    )
                    == "leader"
                ),
                what="the leader labels its pod",
            )
            wait_until(
                lambda: (
                    (api.get_pod(namespace, "hami-scheduler-old") or {})["metadata"]["labels"].get(
                        "hami.io/scheduler-role"
                    )
                    == "follower"
                ),
                what="the old leader relabelled",
            )
            status, _ = scheduler.post("/webhook", _admission_review())
            assert status == 200
            too_big = api.add_object(gpu_pod("too-big", memory=10**6))
            assert scheduler.filter(too_big, ["hami-node"])["NodeNames"] in (None, [])
            locked = api.add_object(gpu_pod("on-hami-node"))
            assert scheduler.schedule(locked, ["hami-node"]) == "hami-node"
            flying = api.add_object(gpu_pod("on-our-node"))
            assert scheduler.schedule(flying, ["our-node"]) == "our-node"
            # preemption: a whole-GPU pod of priority 0, then one of priority 100 that needs
            # its GPU: the preemptor nominated, the victim's DisruptionTarget, its DELETE
            victim = api.add_object(gpu_pod("victim", memory=32768))
            assert scheduler.schedule(victim, ["preempt-node"]) == "preempt-node"
            scheduler.sees_pod("default", "victim", lambda p: p.node_name == "preempt-node")
            urgent = gpu_pod("urgent", memory=1000)
            urgent["spec"]["priority"] = 100
            urgent = api.add_object(urgent)
            scheduler.sees_pod("default", "urgent", lambda p: p.priority == 100)
            assert scheduler.filter(urgent, ["preempt-node"])["NodeNames"] in (None, [])
            wait_until(
                lambda: bool(
                    (api.get_pod("default", "victim") or {})["metadata"].get("deletionTimestamp")
                ),
                what="the victim evicted",
            )
            wait_until(
                lambda: (
                    ANNOTATION_NODE_LOCK
                    not in (api.get_node("stale-lock") or {})["metadata"]["annotations"]
                ),
                what="the stale lock released",
            )
            scheduler.sees_pod("default", "on-hami-node", lambda p: p.node_name == "hami-node")
            clock.advance(121)
            wait_until(
                lambda: (
                    (api.get_pod("default", "on-hami-node") or {})["metadata"]["annotations"].get(
                        ANNOTATION_BIND_PHASE
                    )
                    == "failed"
                ),
                what="the stuck allocation recovered",
            )
            wait_until(lambda: len(api.events()) >= 3, what="events")
        lease = api.get_lease(namespace, config.leader_elect_resource_name)
        assert lease is not None and not lease["spec"].get("holderIdentity"), "lease not released"
        return api.requests


def _without_tls(config: SchedulerConfig) -> SchedulerConfig:
    return replace(
        config, cert_file="", key_file="", client_ca_file="", webhook_host=None, webhook_port=0
    )


def _admission_review() -> dict[str, Any]:
    pod = gpu_pod("admitted")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3b0c7a4e-1f7e-4a35-9d9b-9f7c1e0a0001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "default",
            "object": pod,
        },
    }


# --- hami certs -----------------------------------------------------------------------------------


def certs_job(objects: Sequence[Obj]) -> Obj:
    """The Job that runs `hami certs` at install (a Helm hook in the chart)."""
    (job,) = [j for j in of_kind(objects, "Job") if hami_container(j, "certs")]
    return job


def run_certs(args: Sequence[str], kubeconfig: Path, overrides: Sequence[str] = ()) -> int:
    """`hami certs <args>` in this process against the cluster of `kubeconfig`."""
    parsed = parse_hami_args(args, [f"--kubeconfig={kubeconfig}", *overrides])
    code = parsed.func(parsed)
    assert isinstance(code, int)
    return code


def certs_requests(objects: Sequence[Obj], directory: Path) -> list[RecordedRequest]:
    """Run `hami certs` as the install Job configures it through each path that calls the
    API: the first install (Secrets created; the webhook configuration not applied yet), the
    run after it (caBundle set), one with a Secret that cannot be read (rewritten), one with
    nothing to do. Every request it sent."""
    args = hami_container(certs_job(objects), "certs")["args"]
    settings = parse_hami_args(args, [])
    namespace = settings.namespace
    with FakeApiServer() as api:
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        # the plain Job waits for the webhook configuration: it writes the Secrets, then fails
        # (and is retried) while the configuration is missing
        waits = "--require-webhook-configuration" in args
        assert run_certs(args, kubeconfig) == (1 if waits else 0)
        stored = {s["metadata"]["name"] for s in api.objects("secrets", namespace)}
        assert len(stored) == 5, stored
        for webhook in of_kind(objects, "MutatingWebhookConfiguration"):
            api.add_object(webhook)
        assert run_certs(args, kubeconfig) == 0
        for webhook in of_kind(objects, "MutatingWebhookConfiguration"):
            stored_webhook = api.get_object(
                "mutatingwebhookconfigurations", "", webhook["metadata"]["name"]
            )
            assert stored_webhook is not None
            assert all(w["clientConfig"].get("caBundle") for w in stored_webhook["webhooks"])
        garbage = base64.b64encode(b"garbage").decode()
        for name in stored:  # every Secret unreadable: each one is rewritten
            api.update_object(
                "secrets",
                namespace,
                name,
                lambda s: s.update(data=dict.fromkeys(s["data"], garbage)),
            )
        assert run_certs(args, kubeconfig) == 0
        for name in stored:
            rewritten = api.get_object("secrets", namespace, name)
            assert rewritten is not None and garbage not in rewritten["data"].values(), name
        before = len(api.requests)
        assert run_certs(args, kubeconfig) == 0
        assert all(r.method == "GET" for r in api.requests[before:]), "a run with nothing to do"
        return api.requests
