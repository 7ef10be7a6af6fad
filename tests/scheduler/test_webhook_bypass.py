"""The webhook's fail-closed rules for GPU pods (issue 25): no other scheduler, no
`spec.nodeName` at CREATE, no privileged container, no HAMi-core control environment outside an
admin namespace (`/webhook/gpu-admin`). The same rules in the API server: the policy
hami-gpu-pods (tests/deployment/test_admission_policy_cel.py).

Each attack here was admitted on main: HAMi's webhook lets a pod naming another scheduler
through untouched (webhook.go 64-69) and checks privileged and nodeName only for the pods it
counts as asking for GPUs (limits of the count, device.go 398-415).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from hami_plugin.scheduler.gpu_pods import ADMIN_NAMESPACE_LABEL, CONTROL_ENV_SUMMARY
from hami_plugin.scheduler.webhook import AdmissionVerdict, WebhookSettings, admit_pod
from hami_plugin.testing.apiserver import FakeApiServer, make_container, make_pod
from tests.extender.cluster import running_scheduler
from tests.scheduler.test_webhook import CORES, DEFAULTS, GPU, MEM, PCT, container, pod

ADMIN = WebhookSettings(control_env_allowed=True)


def _denied(original: Any, settings: WebhookSettings = DEFAULTS) -> str:
    admission = admit_pod(original, settings)
    assert (admission.verdict, admission.code, admission.patch) == (
        AdmissionVerdict.DENIED,
        403,
        (),
    ), admission
    return admission.message


@pytest.mark.parametrize(
    "asks",
    [
        {"limits": {GPU: "1"}},
        {"limits": {MEM: "1000"}},
        {"limits": {GPU: "1", PCT: "50"}},
        {"requests": {CORES: "30"}},
        {"requests": {MEM: "1000"}},
    ],
)
@pytest.mark.parametrize("scheduler", ["other", "my-scheduler"])
def test_a_gpu_pod_naming_another_scheduler_is_denied(asks: dict[str, Any], scheduler: str) -> None:
    """Before: allowed untouched ("pod already has different scheduler assigned"), so another
    scheduler placed it without a booking. After: denied."""
    original = pod(container(**asks), schedulerName=scheduler)
    assert _denied(original) == (
        f"a pod asking for GPUs must be scheduled by hami-scheduler, not {scheduler}"
    )
    # from an init container too
    init = pod(container(), init=(container("i", **asks),), schedulerName=scheduler)
    assert _denied(init).startswith("a pod asking for GPUs")


def test_a_pod_of_another_scheduler_asking_no_gpu_is_still_left_alone() -> None:
    admission = admit_pod(pod(container(limits={"cpu": "1"}), schedulerName="x"), DEFAULTS)
    assert admission.allowed and admission.message == "pod already has different scheduler assigned"


def test_without_a_scheduler_name_the_webhook_names_none() -> None:
    """`--scheduler-name` unset (HAMi's choice to leave schedulerName alone): nothing to hold
    the pod to."""
    settings = WebhookSettings(scheduler_name="")
    assert admit_pod(pod(container(limits={GPU: "1"}), schedulerName="x"), settings).allowed


IGNORE = {"hami.io/webhook": "ignore"}


def test_a_gpu_pods_own_ignore_label_skips_nothing() -> None:
    """Before: the webhook configuration's objectSelector kept a pod labelled
    hami.io/webhook=ignore away, so its author chose its scheduler and node and kept a forged
    booking. After: the label counts only on the namespace (the webhook configuration's
    namespaceSelector); a GPU pod with it goes through every rule."""
    labelled = pod(container(limits={GPU: "1"}), labels=IGNORE, schedulerName="other")
    assert _denied(labelled).startswith("a pod asking for GPUs must be scheduled by")
    assert _denied(pod(container(limits={GPU: "1"}), labels=IGNORE, nodeName="n1")) == (
        "pod has node assigned"
    )
    admission = admit_pod(pod(container(limits={GPU: "1"}), labels=IGNORE), DEFAULTS)
    assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in (
        admission.patch
    )


def test_a_pod_asking_no_gpu_keeps_its_ignore_label() -> None:
    """Our own pods carry the label (HAMi's chart does too): while they ask for no GPU they are
    left as they are, overwriteEnv or not, as HAMi's objectSelector left them; a booking key is
    still removed."""
    settings = WebhookSettings(overwrite_env=True)
    plugin = pod(container("plugin", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
                 labels=IGNORE, annotations={"hami.io/bind-phase": "success"})  # fmt: skip
    admission = admit_pod(plugin, settings)
    assert admission.allowed
    assert admission.patch == (
        {"op": "remove", "path": "/metadata/annotations/hami.io~1bind-phase"},
    )
    # without the label, overwriteEnv hides the GPUs from it (HAMi's rule)
    unlabelled = admit_pod(pod(container("plugin")), settings)
    assert unlabelled.patch[0]["value"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]


@pytest.mark.parametrize("asks", [{"limits": {GPU: "1"}}, {"requests": {MEM: "1000"}}])
def test_a_gpu_pod_with_a_node_or_privileged_is_denied(asks: dict[str, Any]) -> None:
    """Before: only pods with the GPU count in limits were checked (a gpumem request alone was
    not). After: any pod naming a GPU resource."""
    assert _denied(pod(container(**asks), nodeName="n1")) == "pod has node assigned"
    privileged = container(**asks, securityContext={"privileged": True})
    assert _denied(pod(privileged)) == "container c is privileged"


@pytest.mark.parametrize(
    "variable",
    [
        {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
        {"name": "CUDA_DISABLE_CONTROL", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80000m"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
        {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/usr/local/vgpu/other.cache"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ],
)
def test_hamicore_control_env_is_denied_outside_an_admin_namespace(
    variable: dict[str, Any],
) -> None:
    """Before: `CUDA_DISABLE_CONTROL=true` made Allocate leave the preload out (HAMi-core never
    loads, no memory or core limit) and CUDA_DEVICE_* stood beside Allocate's limits. After:
    denied unless the API server called `/webhook/gpu-admin`."""
    original = pod(container(limits={GPU: "1"}, env=[{"name": "A", "value": "a"}, variable]))
    assert _denied(original) == (
        f"container c sets {variable['name']}: only pods in a namespace labelled "
        f"{ADMIN_NAMESPACE_LABEL}=true may set {CONTROL_ENV_SUMMARY}"
    )
    in_init = pod(container(limits={GPU: "1"}), init=(container("i", env=[variable]),))
    assert _denied(in_init).startswith("container i sets")
    assert admit_pod(original, ADMIN).allowed
    # a pod asking for no GPU is not HAMi-core's
    assert admit_pod(pod(container(env=[variable])), DEFAULTS).allowed


def test_env_from_a_control_prefix_is_denied_and_the_webhooks_own_env_passes() -> None:
    prefixed = container(
        limits={GPU: "1"}, envFrom=[{"prefix": "CUDA_DEVICE_", "configMapRef": {"name": "m"}}]
    )
    assert _denied(pod(prefixed)) == (
        "container c sets envFrom prefix CUDA_DEVICE_: only pods in a namespace labelled "
        f"{ADMIN_NAMESPACE_LABEL}=true may set {CONTROL_ENV_SUMMARY}"
    )
    harmless = container(
        limits={GPU: "1"},
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}, {"name": "CUDA_VISIBLE_DEVICES"}],
        envFrom=[{"configMapRef": {"name": "m"}}, {"prefix": "APP_", "secretRef": {"name": "s"}}],
    )
    assert admit_pod(pod(harmless), DEFAULTS).allowed
    # CUDA's own CUDA_DEVICE_* variables are the workload's (Megatron-LM sets the second)
    cuda = [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}]
    cuda.append({"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"})
    assert admit_pod(pod(container(limits={GPU: "1"}, env=cuda)), DEFAULTS).allowed
    # a shorter prefix with the right key makes HAMi-core's names all the same
    for prefix in ("CUDA_", "C", "CUDA_DEVICE_MEMORY_LIMIT_", "NVIDIA_"):
        short = container(
            limits={GPU: "1"}, envFrom=[{"prefix": prefix, "configMapRef": {"name": "m"}}]
        )
        assert _denied(pod(short)).startswith(f"container c sets envFrom prefix {prefix}:")
    # overwriteEnv writes NVIDIA_VISIBLE_DEVICES=none itself; its pod stays admissible
    overwritten = WebhookSettings(overwrite_env=True)
    assert admit_pod(pod(container(limits={GPU: "1"}), container("b")), overwritten).allowed


def _review(original: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "r", "namespace": "ml", "operation": "CREATE", "object": original},
    }


def test_the_admin_path_over_the_wire(apiserver: FakeApiServer) -> None:
    """The API server calls `/webhook` for other namespaces and `/webhook/gpu-admin` for admin
    ones (daemonset/webhook.yaml): the same pod is denied on the first, mutated on the second."""
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    gpu = make_container("app", limits={GPU: "1"})
    gpu["env"] = env
    original = make_pod("tool", containers=[gpu], uid="uid-tool")
    with running_scheduler(apiserver) as scheduler:
        status, denied = scheduler.post("/webhook", _review(original))
        admin_status, admitted = scheduler.post("/webhook/gpu-admin", _review(original))
    assert (status, admin_status) == (200, 200)
    assert denied["response"]["allowed"] is False
    assert denied["response"]["status"]["code"] == 403
    assert "CUDA_DISABLE_CONTROL" in denied["response"]["status"]["message"]
    assert admitted["response"]["allowed"] is True
    patch = json.loads(base64.b64decode(admitted["response"]["patch"]))
    scheduler_ops = [op for op in patch if op["path"] == "/spec/schedulerName"]
    assert [op["value"] for op in scheduler_ops] == ["hami-scheduler"]


@pytest.mark.parametrize(
    "mount_path",
    [
        "/etc/ld.so.preload",
        "/etc//ld.so.preload/",
        "/./etc/ld.so.preload",
        "/data/../etc/ld.so.preload",
        "/usr/local/vgpu",
        "/tmp/vgpulock",
    ],
)
def test_a_volume_over_hamicores_mounts_is_denied(mount_path: str) -> None:
    """Before: an empty ConfigMap file mounted at /etc/ld.so.preload landed on top of
    Allocate's (kubelet appends the spec's mounts after the plugin's) and HAMi-core never
    loaded, no variable needed. After: denied, however the path is spelt."""
    mounted = container(limits={GPU: "1"}, volumeMounts=[{"name": "v", "mountPath": mount_path}])
    assert _denied(pod(mounted)) == (
        f"container c mounts a volume at {mount_path}: a GPU container may not mount over the "
        "device plugin's HAMi-core files, nor use .. in a mountPath"
    )
    elsewhere = container(limits={GPU: "1"}, volumeMounts=[{"name": "v", "mountPath": "/etc/x"}])
    assert admit_pod(pod(elsewhere), DEFAULTS).allowed
    assert admit_pod(
        pod(container(volumeMounts=[{"name": "v", "mountPath": mount_path}])), DEFAULTS
    ).allowed
