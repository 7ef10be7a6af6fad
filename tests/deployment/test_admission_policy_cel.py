"""The ValidatingAdmissionPolicies run (`tests.deployment.cel`): each rule on a request it must
allow and one it must deny, from the plain file and the chart alike.

The attacks (issue 25): a GPU pod that skips hami-scheduler (another schedulerName, or
spec.nodeName at CREATE) while the webhook is skipped or down, a privileged GPU pod, a GPU pod
that turns HAMi-core off or sets its limits itself, a tenant who writes the booking label, a
device plugin that patches another node's pods or fields it does not own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from hami_plugin.protocol.booking import BOOKING_LABELS
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
)
from hami_plugin.scheduler.gpu_pods import ADMIN_NAMESPACE_LABEL
from tests.deployment.cel import Request, admit
from tests.deployment.manifests import (
    Obj,
    admission_policy_manifests,
    helm_template,
    of_kind,
    plain_manifests,
)

SOURCES: dict[str, Callable[[], list[Obj]]] = {
    "manifests": lambda: plain_manifests() + admission_policy_manifests(),
    "chart": lambda: helm_template(kube_version="v1.30.0"),
}
PLUGIN = "system:serviceaccount:hami-system:hami-device-plugin"
SCHEDULER = "system:serviceaccount:hami-system:hami-scheduler"
NODE_EXTRA = "authentication.kubernetes.io/node-name"
OPTED_OUT = {"hami.io/webhook": "ignore"}
ADMIN = {ADMIN_NAMESPACE_LABEL: "true"}


@pytest.fixture(params=SOURCES, scope="module")
def policies(request: pytest.FixtureRequest) -> dict[str, Obj]:
    found = of_kind(SOURCES[request.param](), "ValidatingAdmissionPolicy")
    return {p["metadata"]["name"].removeprefix("hami-"): p for p in found}


def gpu_pod(
    *, limits: dict[str, str] | None = None, container: dict[str, Any] | None = None, **spec: Any
) -> Obj:
    """A pod as the webhook leaves it: hami-scheduler, no node."""
    main: dict[str, Any] = {
        "name": "main",
        "image": "cuda",
        "resources": {"limits": limits or {"nvidia.com/gpu": "1"}},
    }
    main.update(container or {})
    return {
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"containers": [main], "schedulerName": "hami-scheduler", **spec},
    }


# --- hami-gpu-pods: GPU pods go through hami-scheduler, unprivileged, under HAMi-core ---------


def test_a_gpu_pod_as_the_webhook_leaves_it_is_allowed(policies: dict[str, Obj]) -> None:
    assert admit(policies["gpu-pods"], Request("CREATE", gpu_pod())) == []
    # a pod asking no GPU resource is none of this policy's business
    plain = gpu_pod(limits={"cpu": "1"}, schedulerName="default-scheduler", nodeName="n1")
    plain["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert admit(policies["gpu-pods"], Request("CREATE", plain)) == []


@pytest.mark.parametrize(
    "resource",
    ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"],
)
@pytest.mark.parametrize("where", ["limits", "requests"])
def test_a_gpu_pod_of_another_scheduler_is_denied(
    policies: dict[str, Obj], resource: str, where: str
) -> None:
    """Before: a GPU pod naming another scheduler (or created while the webhook is down, so
    still default-scheduler) was placed without hami-scheduler. After: refused."""
    for name in ("default-scheduler", "my-scheduler"):
        pod = gpu_pod(schedulerName=name)
        pod["spec"]["containers"][0]["resources"] = {where: {resource: "1"}}
        assert admit(policies["gpu-pods"], Request("CREATE", pod)) == [
            "a pod asking for nvidia.com/gpu resources must be scheduled by hami-scheduler, "
            f"not {name}"
        ]
    unnamed = gpu_pod()
    del unnamed["spec"]["schedulerName"]
    assert admit(policies["gpu-pods"], Request("CREATE", unnamed)) != []
    # in an init container too
    init = gpu_pod(limits={"cpu": "1"}, schedulerName="other")
    init["spec"]["initContainers"] = [{"name": "i", "resources": {where: {resource: "1"}}}]
    assert admit(policies["gpu-pods"], Request("CREATE", init)) != []


def test_a_gpu_pod_created_on_a_node_is_denied(policies: dict[str, Obj]) -> None:
    """Before: `spec.nodeName` at CREATE skipped every scheduler (with the pod's own
    hami.io/webhook=ignore label, the webhook too). After: refused in the API server."""
    denied = admit(policies["gpu-pods"], Request("CREATE", gpu_pod(nodeName="n1")))
    assert denied == [
        "a pod asking for nvidia.com/gpu resources may not be created with spec.nodeName n1: "
        "hami-scheduler places it"
    ]
    assert admit(policies["gpu-pods"], Request("CREATE", gpu_pod(nodeName=""))) == []
    labelled = gpu_pod(nodeName="n1")
    labelled["metadata"]["labels"] = dict(OPTED_OUT)  # a pod's own opt-out counts for nothing
    assert admit(policies["gpu-pods"], Request("CREATE", labelled)) == denied


def test_a_privileged_gpu_pod_is_denied(policies: dict[str, Obj]) -> None:
    privileged = {"securityContext": {"privileged": True}}
    pod = gpu_pod(container=privileged)
    assert admit(policies["gpu-pods"], Request("CREATE", pod)) == ["container main is privileged"]
    fine = gpu_pod(container={"securityContext": {"privileged": False, "runAsUser": 1000}})
    assert admit(policies["gpu-pods"], Request("CREATE", fine)) == []
    # an ephemeral container added later (an UPDATE of pods/ephemeralcontainers)
    debugged = gpu_pod()
    debugged["spec"]["ephemeralContainers"] = [{"name": "debug", **privileged}]
    update = Request("UPDATE", debugged, gpu_pod(), sub_resource="ephemeralcontainers")
    assert admit(policies["gpu-pods"], update) == ["container debug is privileged"]


@pytest.mark.parametrize(
    "variable",
    [
        {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80000m"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
        {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/tmp/other.cache"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {
            "name": "CUDA_DISABLE_CONTROL",
            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
        },
    ],
)
def test_hamicore_control_env_needs_an_admin_namespace(
    policies: dict[str, Obj], variable: dict[str, Any]
) -> None:
    """Before: `CUDA_DISABLE_CONTROL=true` in a GPU container left HAMi-core out, and the
    container's CUDA_DEVICE_* or NVIDIA_VISIBLE_DEVICES stood beside Allocate's. After: refused
    unless the namespace is labelled hami-plugin.io/gpu-admin=true."""
    pod = gpu_pod(container={"env": [{"name": "A", "value": "a"}, variable]})
    message = (
        "container main sets CUDA_DISABLE_CONTROL, NVIDIA_VISIBLE_DEVICES or the HAMi-core "
        "limits (CUDA_DEVICE_MEMORY_LIMIT*, CUDA_DEVICE_SM_LIMIT*, "
        "CUDA_DEVICE_MEMORY_SHARED_CACHE), which only a namespace labelled "
        "hami-plugin.io/gpu-admin=true may"
    )
    assert admit(policies["gpu-pods"], Request("CREATE", pod)) == [message]
    init = gpu_pod()
    init["spec"]["initContainers"] = [{"name": "i", "env": [variable]}]
    assert admit(policies["gpu-pods"], Request("CREATE", init)) == [message.replace("main", "i")]
    debugged = gpu_pod()
    debugged["spec"]["ephemeralContainers"] = [{"name": "debug", "env": [variable]}]
    update = Request("UPDATE", debugged, gpu_pod(), sub_resource="ephemeralcontainers")
    assert admit(policies["gpu-pods"], update) == [message.replace("main", "debug")]
    admin = Request("CREATE", pod, namespace_labels={**ADMIN, "team": "x"})
    assert admit(policies["gpu-pods"], admin) == []
    not_admin = Request("CREATE", pod, namespace_labels={ADMIN_NAMESPACE_LABEL: "yes"})
    assert admit(policies["gpu-pods"], not_admin) == [message]


def test_env_the_webhook_writes_and_unrelated_env_pass(policies: dict[str, Obj]) -> None:
    env = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},  # overwriteEnv's
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
        {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
        {"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"},
    ]
    pod = gpu_pod(container={"env": env, "envFrom": [{"configMapRef": {"name": "c"}}]})
    assert admit(policies["gpu-pods"], Request("CREATE", pod)) == []
    prefixed = gpu_pod(
        container={"envFrom": [{"prefix": "CUDA_DEVICE_", "configMapRef": {"name": "c"}}]}
    )
    assert admit(policies["gpu-pods"], Request("CREATE", prefixed)) != []
    for prefix in ("CUDA_", "C", "CUDA_DEVICE_MEMORY_LIMIT_", "NVIDIA_"):
        short = gpu_pod(container={"envFrom": [{"prefix": prefix, "configMapRef": {"name": "c"}}]})
        assert admit(policies["gpu-pods"], Request("CREATE", short)) != [], prefix
    app = gpu_pod(container={"envFrom": [{"prefix": "APP_", "configMapRef": {"name": "c"}}]})
    assert admit(policies["gpu-pods"], Request("CREATE", app)) == []


@pytest.mark.parametrize(
    "mount_path",
    [
        "/etc/ld.so.preload",
        "/etc//ld.so.preload/",
        "./etc/ld.so.preload",
        "/x/../etc/passwd",
        "/usr/local/vgpu/libvgpu.so",
        "/tmp/vgpulock",
    ],
)
def test_a_volume_over_hamicores_mounts_is_refused(
    policies: dict[str, Obj], mount_path: str
) -> None:
    """Before: a ConfigMap file mounted at /etc/ld.so.preload kept HAMi-core out. After:
    refused, however the path is spelt (a `..` anywhere too)."""
    mounts = {"volumeMounts": [{"name": "v", "mountPath": mount_path}]}
    assert admit(policies["gpu-pods"], Request("CREATE", gpu_pod(container=mounts))) == [
        "a container of a pod asking for GPUs mounts a volume where the device plugin mounts "
        "HAMi-core (/etc/ld.so.preload, /tmp/vgpulock, /tmp/license, /usr/bin/vgpuvalidator, "
        "/usr/local/vgpu, /usr/local/vgpu/libvgpu.so) or uses .. in a mountPath"
    ]
    fine = {"volumeMounts": [{"name": "v", "mountPath": "/etc/ld.so.preload.d"}]}
    assert admit(policies["gpu-pods"], Request("CREATE", gpu_pod(container=fine))) == []


def test_a_namespace_opted_out_keeps_hamis_freedom_but_not_the_control_env(
    policies: dict[str, Obj],
) -> None:
    """hami.io/webhook=ignore on the namespace (HAMi's opt-out): another scheduler, a node,
    privileged are that namespace's business; HAMi-core's env still needs the admin label."""
    pod = gpu_pod(schedulerName="other", nodeName="n1", container={"securityContext": {}})
    pod["spec"]["containers"][0]["securityContext"]["privileged"] = True
    assert admit(policies["gpu-pods"], Request("CREATE", pod, namespace_labels=OPTED_OUT)) == []
    assert len(admit(policies["gpu-pods"], Request("CREATE", pod)) or []) == 3
    env = gpu_pod(container={"env": [{"name": "CUDA_DISABLE_CONTROL", "value": "1"}]})
    assert admit(policies["gpu-pods"], Request("CREATE", env, namespace_labels=OPTED_OUT)) != []


def test_the_chart_follows_its_scheduler_and_resource_names() -> None:
    objects = helm_template(
        "schedulerName=gpu-sched",
        "resourceName=example.com/vgpu",
        "resourceMem=example.com/vmem",
        kube_version="v1.30.0",
    )
    (policy,) = [
        p
        for p in of_kind(objects, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-gpu-pods")
    ]
    pod = gpu_pod(limits={"example.com/vmem": "1000"}, schedulerName="gpu-sched")
    assert admit(policy, Request("CREATE", pod)) == []
    pod["spec"]["schedulerName"] = "hami-scheduler"
    assert admit(policy, Request("CREATE", pod)) == [
        "a pod asking for example.com/vgpu resources must be scheduled by gpu-sched, not "
        "hami-scheduler"
    ]
    # the default names are plain resources there
    assert admit(policy, Request("CREATE", gpu_pod(schedulerName="other"))) == []


# --- hami-scheduler-annotations: the booking label too ----------------------------------------


@pytest.mark.parametrize("label", BOOKING_LABELS)
def test_only_the_daemons_may_write_the_booking_label(policies: dict[str, Obj], label: str) -> None:
    """Before: a tenant could add, change or drop hami.io/vgpu-node (hiding its container from
    the vGPU metrics, which list pods by it). After: only our two ServiceAccounts may."""
    policy = policies["scheduler-annotations"]
    bare: Obj = {"metadata": {"labels": {"app": "x"}}, "spec": {}}
    booked = copy.deepcopy(bare)
    booked["metadata"]["labels"][label] = "n1"
    moved = copy.deepcopy(bare)
    moved["metadata"]["labels"][label] = "n2"
    message = (
        f"only the hami-plugin scheduler and device plugin may set or change the label {label}"
    )
    assert admit(policy, Request("CREATE", booked)) == [message]
    for old, new in ((bare, booked), (booked, moved), (booked, bare)):
        assert admit(policy, Request("UPDATE", new, old)) == [message]
    # other labels are free; the scheduler may write it
    relabelled = copy.deepcopy(booked)
    relabelled["metadata"]["labels"]["app"] = "y"
    assert admit(policy, Request("UPDATE", relabelled, booked)) == []
    assert admit(policy, Request("UPDATE", booked, bare, username=SCHEDULER)) is None


# --- hami-device-plugin-own-pods ---------------------------------------------------------------


def _bound(node: str = "n1") -> Obj:
    return {
        "metadata": {
            "name": "p",
            "labels": {"app": "x"},
            "annotations": {ANNOTATION_BIND_PHASE: "allocating", "team/owner": "a"},
            "finalizers": ["f"],
        },
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
    }


def _as_plugin(new: Obj | None, old: Obj | None, node: str = "n1", **kw: Any) -> Request:
    operation = kw.pop("operation", "UPDATE")
    return Request(
        operation, new, old, username=PLUGIN, extra={NODE_EXTRA: [node]} if node else {}, **kw
    )


@pytest.mark.parametrize(
    "written",
    [ANNOTATION_BIND_PHASE, ANNOTATION_DEVICES_TO_ALLOCATE, ANNOTATION_VGPU_MIG_ALLOCATIONS],
)
def test_the_device_plugin_writes_its_annotations_on_its_nodes_pods(
    policies: dict[str, Obj], written: str
) -> None:
    policy = policies["device-plugin-own-pods"]
    old = _bound()
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][written] = "v"
    assert admit(policy, _as_plugin(new, old)) == []
    removed = copy.deepcopy(old)
    del removed["metadata"]["annotations"][ANNOTATION_BIND_PHASE]
    assert admit(policy, _as_plugin(removed, old)) == []
    # anyone else's requests are not this policy's
    assert admit(policy, Request("UPDATE", new, old, username=SCHEDULER)) is None


def test_the_device_plugin_may_not_patch_another_nodes_pods(policies: dict[str, Obj]) -> None:
    """Before: its ServiceAccount could patch any pod in the cluster. After: only pods bound to
    the node its token names."""
    policy = policies["device-plugin-own-pods"]
    old = _bound("n2")
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][ANNOTATION_BIND_PHASE] = "success"
    assert admit(policy, _as_plugin(new, old)) == [
        "the device plugin may only patch pods bound to the node it runs on (its token names "
        "n1, the pod n2)"
    ]
    assert admit(policy, _as_plugin(new, old, node="")) != []  # a token without a node
    unbound = copy.deepcopy(old)
    del unbound["spec"]["nodeName"]
    assert admit(policy, _as_plugin(unbound, unbound)) != []
    for operation in ("CREATE", "DELETE"):
        assert admit(policy, _as_plugin(None if operation == "DELETE" else old, None,
                                        operation=operation)) != []  # fmt: skip
    assert admit(policy, _as_plugin(new, old, sub_resource="status")) != []


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["metadata"]["annotations"].update({"team/owner": "b"}),
        lambda p: p["metadata"]["annotations"].pop("team/owner"),
        lambda p: p["metadata"]["annotations"].update({"hami.io/vgpu-devices-allocated": "x"}),
        lambda p: p["metadata"]["labels"].update({"hami.io/vgpu-node": "n9"}),
        lambda p: p["metadata"].update(finalizers=[]),
        lambda p: p["spec"]["containers"][0].update(image="other"),
    ],
)
def test_the_device_plugin_may_change_nothing_else(
    policies: dict[str, Obj], change: Callable[[Obj], object]
) -> None:
    policy = policies["device-plugin-own-pods"]
    old = _bound()
    new = copy.deepcopy(old)
    change(new)
    denied = admit(policy, _as_plugin(new, old))
    assert denied and denied[0].startswith("the device plugin may change only the annotations")
