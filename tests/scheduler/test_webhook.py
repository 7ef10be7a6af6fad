"""The admission webhook, rule by rule against HAMi v2.10.

Sources (HAMi v2.10.0): `pkg/scheduler/webhook.go` Handle (lines cited as webhook.go N),
`pkg/device/nvidia/device.go` MutateAdmission and helpers (device.go N), and
controller-runtime v0.24.1 `pkg/webhook/admission` (response.go, webhook.go Complete, http.go)
for the shape of the answer; docs/hami-reference.md 2 ("Webhook mutation") and 3.11.
Every patch is checked by applying it to the pod as it arrived (RFC 6902, the API server
double's `json_patch`) and comparing with the pod HAMi would produce.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.extender.wire import HttpReply, admission_reply
from hami_plugin.protocol.booking import BOOKING_ANNOTATIONS, BOOKING_LABELS
from hami_plugin.scheduler.admission_review import (
    ADMISSION_V1,
    ADMISSION_V1BETA1,
    WEBHOOK_MAX_BODY_BYTES,
    render_admission_review,
    review_admission,
    review_admission_body,
)
from hami_plugin.scheduler.settings import ResourceNames
from hami_plugin.scheduler.webhook import (
    AdmissionVerdict,
    GpuCorePolicy,
    PodAdmission,
    WebhookSettings,
    admit_pod,
)
from hami_plugin.testing.apiserver import json_patch

GPU, MEM, PCT, CORES, PRIORITY = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)
DEFAULTS = WebhookSettings()


def container(
    name: str = "c",
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    result: dict[str, Any] = {"name": name, "image": "cuda"}
    if limits is not None or requests is not None:
        result["resources"] = {}
        if limits is not None:
            result["resources"]["limits"] = limits
        if requests is not None:
            result["resources"]["requests"] = requests
    result.update(fields)
    return result


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if labels is not None:
        metadata["labels"] = labels
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def mutated(original: dict[str, Any], settings: WebhookSettings = DEFAULTS) -> dict[str, Any]:
    """Admit the pod (it must be allowed) and apply the patch to it."""
    admission = admit_pod(original, settings)
    assert admission.verdict is AdmissionVerdict.ALLOWED, admission
    before = copy.deepcopy(original)
    result: dict[str, Any] = json_patch(original, list(admission.patch))
    assert original == before  # the patch is computed against, not applied to, the input
    return result


def expect(original: dict[str, Any], change: Any) -> dict[str, Any]:
    """The original pod with `change(pod)` applied by hand: what HAMi's mutation yields."""
    result = copy.deepcopy(original)
    change(result)
    return result


def containers_of(pod_: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod_["spec"]["containers"])


def set_limit(
    pod_: dict[str, Any], index: int, name: str, value: str, kind: str = "containers"
) -> None:
    resources = pod_["spec"][kind][index].setdefault("resources", {})
    resources.setdefault("limits", {})[name] = value


def add_env(
    pod_: dict[str, Any], index: int, name: str, value: str, kind: str = "containers"
) -> None:
    pod_["spec"][kind][index].setdefault("env", []).append({"name": name, "value": value})


def ours(pod_: dict[str, Any]) -> None:
    pod_["spec"]["schedulerName"] = "hami-scheduler"


# --- denials and pass-through (webhook.go) --------------------------------------------------


@pytest.mark.parametrize(
    ("original", "settings", "verdict", "code", "message"),
    [
        # webhook.go 60-63
        (pod(), DEFAULTS, AdmissionVerdict.DENIED, 403, "pod has no containers"),
        (pod(init=(container(limits={GPU: "1"}),)), DEFAULTS, AdmissionVerdict.DENIED, 403,
         "pod has no containers"),
        ({"metadata": {"name": "p"}}, DEFAULTS, AdmissionVerdict.DENIED, 403,
         "pod has no containers"),
        # webhook.go 99-102: privileged (init first) and some GPU anywhere in the pod
        (pod(container(limits={GPU: "1"}),
             container("side", securityContext={"privileged": True})),
         DEFAULTS, AdmissionVerdict.DENIED, 403, "container side is privileged"),
        (pod(container(limits={GPU: "1"}), container("b", securityContext={"privileged": True}),
             init=(container("i", securityContext={"privileged": True}),)),
         DEFAULTS, AdmissionVerdict.DENIED, 403, "container i is privileged"),
        # webhook.go 107-112: a GPU pod already bound to a node
        (pod(container(limits={GPU: "1"}), nodeName="n1"), DEFAULTS, AdmissionVerdict.DENIED,
         403, "pod has node assigned"),
        # device.go 389-396: percentage outside 0..100 (Value() rounds up) -> code 500
        (pod(container(limits={GPU: "1", PCT: "101"})), DEFAULTS, AdmissionVerdict.ERRORED,
         500, "invalid nvidia.com/gpumem-percentage value 101 in container c: must be an "
         "integer between 0 and 100"),
        (pod(container(requests={PCT: "-1"})), DEFAULTS, AdmissionVerdict.ERRORED, 500,
         "invalid nvidia.com/gpumem-percentage value -1 in container c: must be an integer "
         "between 0 and 100"),
        (pod(container(limits={GPU: "1", PCT: "100.5"})), DEFAULTS, AdmissionVerdict.ERRORED,
         500, "invalid nvidia.com/gpumem-percentage value 101 in container c: must be an "
         "integer between 0 and 100"),
        (pod(container("late", limits={PCT: "1e30"}), init=(container("i"),)), DEFAULTS,
         AdmissionVerdict.ERRORED, 500, "invalid nvidia.com/gpumem-percentage value 1e30 in "
         "container late: must be an integer between 0 and 100"),
        (pod(container(limits={PRIORITY: "1e30"})), DEFAULTS, AdmissionVerdict.ERRORED, 500,
         "invalid nvidia.com/priority value 1e30 in container c: out of the int64 range"),
        # a pod Go could not decode -> code 400 (webhook.go 55-59)
        (pod(container(limits={PCT: "abc"})), DEFAULTS, AdmissionVerdict.ERRORED, 400,
         "pod spec.containers.0.resources.limits[nvidia.com/gpumem-percentage]: quantities "
         "must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
        ({"spec": {"containers": "c"}}, DEFAULTS, AdmissionVerdict.ERRORED, 400,
         "pod spec.containers must be a list, got str"),
        (pod(container(securityContext={"privileged": "yes"})), DEFAULTS,
         AdmissionVerdict.ERRORED, 400,
         "pod spec.containers.0.securityContext.privileged must be a boolean, got str"),
        (None, DEFAULTS, AdmissionVerdict.ERRORED, 400, "there is no content to decode"),
    ],
)  # fmt: skip
def test_refusals(
    original: Any, settings: WebhookSettings, verdict: AdmissionVerdict, code: int, message: str
) -> None:
    assert admit_pod(original, settings) == PodAdmission(verdict, code, message)


@pytest.mark.parametrize(
    ("original", "settings"),
    [
        # privileged without any GPU, nodeName without any GPU: HAMi lets them through
        (pod(container(securityContext={"privileged": True})), DEFAULTS),
        (pod(container(), nodeName="n1"), DEFAULTS),
        # nodeName is only checked when a scheduler name is configured (webhook.go 107)
        (pod(container(limits={GPU: "1", CORES: "10"}), nodeName="n1"),
         WebhookSettings(scheduler_name="")),
        # a Ki memory value reads as a sane MiB count (8192); 3k is how a plain 3000 arrives
        (pod(container(limits={GPU: "1", MEM: "8Ki"}), schedulerName="hami-scheduler"),
         DEFAULTS),
        (pod(container(limits={GPU: "1", MEM: "3k"}), schedulerName="hami-scheduler"),
         DEFAULTS),
    ],
)  # fmt: skip
def test_allowed_unchanged(original: dict[str, Any], settings: WebhookSettings) -> None:
    assert admit_pod(original, settings) == PodAdmission(AdmissionVerdict.ALLOWED, 200)


# --- ours: a request the scheduler would misread is denied (scheduler.requests) -------------

_MEM_16GI = (
    "nvidia.com/gpumem=16Gi: out of range 0..2147483647 (MiB); write 16384: nvidia.com/gpumem "
    "counts MiB, and 16Gi is 16384 MiB; the scheduler would drop the GPU request"
)


@pytest.mark.parametrize(
    ("original", "settings", "message"),
    [
        # HAMi admits these; its scheduler then drops the request (the pod runs without a GPU
        # booking) or asks what no GPU has
        (pod(container(limits={GPU: "1", MEM: "16Gi"})), DEFAULTS, f"container 'c': {_MEM_16GI}"),
        (pod(container(limits={GPU: "1.5"})), DEFAULTS,
         "container 'c': nvidia.com/gpu=1.5: not a whole number; write 1 or 2 (a whole number "
         "of GPUs from 1 to 2147483647); the scheduler would drop the GPU request"),
        (pod(container(limits={GPU: "-1"})), DEFAULTS,
         "container 'c': nvidia.com/gpu=-1: as int32 it is -1, not positive; write a whole "
         "number of GPUs from 1 to 2147483647; the scheduler would drop the GPU request"),
        (pod(container(limits={GPU: "99999999999"})), DEFAULTS,
         "container 'c': nvidia.com/gpu=99999999999: larger than int32; write a whole number "
         "of GPUs from 1 to 2147483647; the scheduler would take it as 1215752191"),
        (pod(container(limits={GPU: "1", MEM: "99999999999"})), DEFAULTS,
         "container 'c': nvidia.com/gpumem=99999999999: out of range 0..2147483647 (MiB); "
         "write a whole number of MiB from 0 to 2147483647; the scheduler would drop the GPU "
         "request"),
        (pod(container(limits={GPU: "1", MEM: "2Gi"})), DEFAULTS,
         "container 'c': nvidia.com/gpumem=2Gi: out of range 0..2147483647 (MiB); write 2048: "
         "nvidia.com/gpumem counts MiB, and 2Gi is 2048 MiB; the scheduler would drop the GPU "
         "request"),
        (pod(container(limits={GPU: "1", MEM: "1Gi"})), DEFAULTS,
         "container 'c': nvidia.com/gpumem=1Gi: a byte unit on a count of MiB; write 1024: "
         "nvidia.com/gpumem counts MiB, and 1Gi is 1024 MiB; the scheduler would take it as "
         "1073741824 MiB"),
        # Value() rounds 0.5 up to 1, inside 0..100, so HAMi's webhook admits it; its scheduler
        # (AsInt64) ignores it and books the whole card
        (pod(container(limits={GPU: "1", PCT: "0.5"}), schedulerName="hami-scheduler"),
         DEFAULTS,
         "container 'c': nvidia.com/gpumem-percentage=0.5: not a whole number; write 1 (a "
         "whole percent from 1 to 100); the scheduler would ignore the value"),
        (pod(container(limits={GPU: "1", CORES: "2.5"})), DEFAULTS,
         "container 'c': nvidia.com/gpucores=2.5: not a whole number; write 2 or 3 (a whole "
         "percent of the GPU's cores from 0 to 100); the scheduler would ignore the value"),
        # the container as mutated: memory alone gets the default GPU count, then is read
        (pod(container("m", limits={MEM: "16Gi"})), DEFAULTS, f"container 'm': {_MEM_16GI}"),
        # requests are read too (limits first), init containers first, every problem named
        (pod(container("a", requests={GPU: "1", MEM: "16Gi"}),
             init=(container("i", limits={GPU: "1", CORES: "2.5"}),)), DEFAULTS,
         "container 'i': nvidia.com/gpucores=2.5: not a whole number; write 2 or 3 (a whole "
         "percent of the GPU's cores from 0 to 100); the scheduler would ignore the value; "
         f"container 'a': {_MEM_16GI}"),
        # the range follows memoryFactor, as the scheduler's does
        (pod(container(limits={GPU: "1", MEM: "600000000"})), WebhookSettings(memory_factor=4),
         "container 'c': nvidia.com/gpumem=600000000: out of range 0..536870911 (units of 4 "
         "MiB); write a whole number of units of 4 MiB from 0 to 536870911; the scheduler "
         "would drop the GPU request"),
        # configured resource names
        (pod(container(limits={"x.io/gpu": "1", "x.io/mem": "16Gi"})),
         WebhookSettings(resources=ResourceNames(count="x.io/gpu", memory="x.io/mem")),
         "container 'c': x.io/mem=16Gi: out of range 0..2147483647 (MiB); write 16384: "
         "x.io/mem counts MiB, and 16Gi is 16384 MiB; the scheduler would drop the GPU request"),
    ],
)  # fmt: skip
def test_a_request_the_scheduler_would_misread_is_denied(
    original: dict[str, Any], settings: WebhookSettings, message: str
) -> None:
    assert admit_pod(original, settings) == PodAdmission(AdmissionVerdict.DENIED, 403, message)


@pytest.mark.parametrize(
    ("original", "settings"),
    [
        # (another scheduler's GPU pod is denied before: test_webhook_bypass.py)
        # no GPU asked: gpumem beside a zero count, or alone with the default GPU count off
        (pod(container(limits={GPU: "0", MEM: "16Gi"})), DEFAULTS),
        (pod(container(limits={MEM: "16Gi"})), WebhookSettings(default_gpu_num=0)),
    ],
)  # fmt: skip
def test_a_misread_request_that_asks_no_gpu_is_admitted(
    original: dict[str, Any], settings: WebhookSettings
) -> None:
    assert admit_pod(original, settings).allowed


def test_a_percentage_above_100_stays_hamis_error() -> None:
    """HAMi clamps it in the scheduler (harmless), but its webhook rejects it first (500)."""
    admission = admit_pod(pod(container(limits={GPU: "1", PCT: "150"})), DEFAULTS)
    assert (admission.verdict, admission.code) == (AdmissionVerdict.ERRORED, 500)
    assert admission.message.startswith("invalid nvidia.com/gpumem-percentage value 150")


@pytest.mark.parametrize(
    ("scheduler", "settings", "ours_"),
    [
        # webhook.go 64-69, but a GPU pod naming another scheduler is denied (ours, None)
        ("other", DEFAULTS, None),
        ("hami-scheduler", DEFAULTS, True),
        ("", DEFAULTS, True),
        ("default-scheduler", DEFAULTS, True),  # --force-overwrite-default-scheduler=true
        ("default-scheduler", WebhookSettings(force_overwrite_default_scheduler=False), None),
        ("other", WebhookSettings(scheduler_name=""), False),
        ("default-scheduler", WebhookSettings(scheduler_name=""), True),
    ],
)
def test_scheduler_name_rules(
    scheduler: str, settings: WebhookSettings, ours_: bool | None
) -> None:
    original = pod(container(limits={GPU: "1", CORES: "20"}), schedulerName=scheduler)
    admission = admit_pod(original, settings)
    if ours_ is None:
        assert admission == PodAdmission(
            AdmissionVerdict.DENIED,
            403,
            f"a pod asking for GPUs must be scheduled by hami-scheduler, not {scheduler}",
        )
        return
    if not ours_:
        assert admission == PodAdmission(
            AdmissionVerdict.ALLOWED, 200, "pod already has different scheduler assigned"
        )
        return
    result = mutated(original, settings)
    wanted = settings.scheduler_name or scheduler
    assert result == expect(original, lambda p: p["spec"].update(schedulerName=wanted))
    if scheduler == wanted:
        assert admission.patch == ()


# --- MutateAdmission (device.go 347-450, docs/hami-reference.md 2 "Webhook mutation") --------


def steps(*changes: Callable[[dict[str, Any]], object]) -> Callable[[dict[str, Any]], None]:
    """One expected mutation made of several edits, applied in order."""

    def change(p: dict[str, Any]) -> None:
        for edit in changes:
            edit(p)

    return change


def _cores(index: int = 0, kind: str = "containers") -> Any:
    def change(p: dict[str, Any]) -> None:
        set_limit(p, index, CORES, "100", kind)
        ours(p)

    return change


@pytest.mark.parametrize(
    ("original", "settings", "change"),
    [
        # item 5: gpu alone is exclusive -> gpucores 100
        (pod(container(limits={GPU: "1"})), DEFAULTS, _cores()),
        (pod(container(limits={GPU: "2", PCT: "100"})), DEFAULTS, _cores()),
        (pod(container(limits={GPU: "1"}, requests={PCT: "100"})), DEFAULTS, _cores()),
        # the count in requests only still counts for exclusivity (resourcePresent)
        (pod(container(requests={GPU: "1"})), DEFAULTS, _cores()),
        # not exclusive: memory or a partial percentage given, or cores given
        (pod(container(limits={GPU: "1", MEM: "1000"})), DEFAULTS, ours),
        (pod(container(limits={GPU: "1", PCT: "50"})), DEFAULTS, ours),
        (pod(container(limits={GPU: "1"}, requests={CORES: "30"})), DEFAULTS, ours),
        # ... a percentage decides before memory does
        (pod(container(limits={GPU: "1", PCT: "100", MEM: "1000"})), DEFAULTS, _cores()),
        # no memory resource name configured: exclusive unless a percentage says otherwise
        (pod(container(limits={GPU: "1", MEM: "1000"})),
         WebhookSettings(resources=ResourceNames(memory="")), _cores()),
        # item 4: memory/cores/percentage limits without a count get default_gpu_num
        (pod(container(limits={MEM: "1000"})), DEFAULTS,
         steps(lambda p: set_limit(p, 0, GPU, "1"), ours)),
        (pod(container(limits={CORES: "30"})), WebhookSettings(default_gpu_num=2),
         steps(lambda p: set_limit(p, 0, GPU, "2"), ours)),
        (pod(container(limits={PCT: "100"})), DEFAULTS,
         steps(lambda p: set_limit(p, 0, GPU, "1"), lambda p: set_limit(p, 0, CORES, "100"),
               ours)),
        # BinarySI rendering of the default count: 1000 is 1k, 2048 is 2Ki
        (pod(container(limits={MEM: "1"})), WebhookSettings(default_gpu_num=1000),
         steps(lambda p: set_limit(p, 0, GPU, "1k"), ours)),
        (pod(container(limits={MEM: "1"})), WebhookSettings(default_gpu_num=2048),
         steps(lambda p: set_limit(p, 0, GPU, "2Ki"), ours)),
        (pod(container(limits={MEM: "1"})), WebhookSettings(default_gpu_num=1536),
         steps(lambda p: set_limit(p, 0, GPU, "1536"), ours)),
        # ... but only from limits, and only with default_gpu_num > 0; a pod naming a GPU
        # resource still goes to hami-scheduler (HAMi leaves it alone; ours: it must not be
        # placed by another scheduler, test_webhook_bypass.py)
        (pod(container(requests={MEM: "1000"})), DEFAULTS, ours),
        (pod(container(limits={MEM: "1000"})), WebhookSettings(default_gpu_num=0), ours),
        # a count and memory in requests only: no GPU as far as HAMi's webhook is concerned
        (pod(container(requests={GPU: "1", MEM: "1000"})), DEFAULTS, ours),
        # item 2: limits[priority] -> CUDA_TASK_PRIORITY=Value() (rounded up)
        (pod(container(limits={GPU: "1", CORES: "10", PRIORITY: "1"})), DEFAULTS,
         steps(lambda p: add_env(p, 0, "CUDA_TASK_PRIORITY", "1"), ours)),
        (pod(container(limits={GPU: "1", CORES: "10", PRIORITY: "1500m"},
                       env=[{"name": "A", "value": "a"}])), DEFAULTS,
         steps(lambda p: add_env(p, 0, "CUDA_TASK_PRIORITY", "2"), ours)),
        (pod(container(limits={PRIORITY: "0"})), DEFAULTS,
         lambda p: add_env(p, 0, "CUDA_TASK_PRIORITY", "0")),
        (pod(container(requests={PRIORITY: "1"})), DEFAULTS, lambda p: None),
        # item 3: a core policy other than default, on every container, GPU or not
        (pod(container(limits={GPU: "1", CORES: "10"}), container("b")),
         WebhookSettings(gpu_core_policy=GpuCorePolicy.FORCE),
         steps(lambda p: add_env(p, 0, "GPU_CORE_UTILIZATION_POLICY", "force"),
               lambda p: add_env(p, 1, "GPU_CORE_UTILIZATION_POLICY", "force"), ours)),
        # item 6: runtimeClassName for a GPU pod that has none
        (pod(container(limits={GPU: "1", CORES: "10"})),
         WebhookSettings(runtime_class_name="nvidia"),
         steps(lambda p: p["spec"].update(runtimeClassName="nvidia"), ours)),
        (pod(container(limits={GPU: "1", CORES: "10"}), runtimeClassName="kata"),
         WebhookSettings(runtime_class_name="nvidia"), ours),
        (pod(container(limits={GPU: "1", CORES: "10"}), runtimeClassName=""),
         WebhookSettings(runtime_class_name="nvidia"), ours),
        (pod(container()), WebhookSettings(runtime_class_name="nvidia"), lambda p: None),
        # item 7: overwriteEnv hides the GPUs from containers that asked for none
        (pod(container(limits={GPU: "1", CORES: "10"}), container("b", env=[])),
         WebhookSettings(overwrite_env=True),
         steps(lambda p: add_env(p, 1, "NVIDIA_VISIBLE_DEVICES", "none"), ours)),
        # env order: priority, policy, visible devices (device.go 352-385)
        (pod(container(limits={PRIORITY: "3"})),
         WebhookSettings(overwrite_env=True, gpu_core_policy=GpuCorePolicy.DISABLE),
         steps(lambda p: add_env(p, 0, "CUDA_TASK_PRIORITY", "3"),
               lambda p: add_env(p, 0, "GPU_CORE_UTILIZATION_POLICY", "disable"),
               lambda p: add_env(p, 0, "NVIDIA_VISIBLE_DEVICES", "none"))),
        # init containers go through the same mutation (webhook.go 74-85)
        (pod(container(), init=(container("i", limits={GPU: "1"}),)), DEFAULTS,
         _cores(0, "initContainers")),
        # other resource names, escaped in the JSON pointer (`/` -> ~1, `~` -> ~0)
        (pod(container(limits={"x.io/g~pu": "1"})),
         WebhookSettings(resources=ResourceNames(count="x.io/g~pu", cores="x.io/c/ores")),
         steps(lambda p: set_limit(p, 0, "x.io/c/ores", "100"), ours)),
    ],
)  # fmt: skip
def test_mutation(original: dict[str, Any], settings: WebhookSettings, change: Any) -> None:
    assert mutated(original, settings) == expect(original, change)


@pytest.mark.parametrize(
    ("shape", "expected_op"),
    [
        # a container without resources, without limits, or with a null one needs the parents
        ({"requests": {GPU: "1"}}, {"op": "add", "path": "/spec/containers/0/resources/limits",
                                    "value": {CORES: "100"}}),
        ({"limits": None, "requests": {GPU: "1"}},
         {"op": "add", "path": "/spec/containers/0/resources/limits", "value": {CORES: "100"}}),
        ({"limits": {GPU: "1"}},
         {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpucores",
          "value": "100"}),
    ],
)  # fmt: skip
def test_patch_creates_missing_parents(shape: dict[str, Any], expected_op: Any) -> None:
    original = pod({"name": "c", "resources": shape})
    admission = admit_pod(original, DEFAULTS)
    assert admission.patch[0] == expected_op
    assert mutated(original)["spec"]["containers"][0]["resources"]["limits"][CORES] == "100"


def test_patch_adds_env_list_when_the_container_has_none() -> None:
    original = pod(container(limits={PRIORITY: "7"}), container("b", limits={PRIORITY: "1"}))
    original["spec"]["containers"][1]["env"] = None
    admission = admit_pod(original, DEFAULTS)
    assert list(admission.patch) == [
        {"op": "add", "path": "/spec/containers/0/env",
         "value": [{"name": "CUDA_TASK_PRIORITY", "value": "7"}]},
        {"op": "add", "path": "/spec/containers/1/env",
         "value": [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]},
    ]  # fmt: skip
    assert mutated(original)["spec"]["containers"][1]["env"] == [
        {"name": "CUDA_TASK_PRIORITY", "value": "1"}
    ]


def test_scheduler_name_replaced_when_present() -> None:
    original = pod(container(limits={GPU: "1", CORES: "5"}), schedulerName="default-scheduler")
    assert list(admit_pod(original, DEFAULTS).patch) == [
        {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"}
    ]


# --- scheduler-owned annotations: the deliberate difference ---------------------------------

FORGED = {
    "hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,1000,10:;",
    "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,10:;",
    "hami.io/vgpu-node": "n1",
    "hami.io/vgpu-time": "1705054796",
    "hami.io/bind-phase": "allocating",
    "hami.io/bind-time": "1705054796",
    "hami.io/vgpu-mig-allocations": "[]",
    "hami-plugin.io/booking-signature": "v1:" + "A" * 43 + "=",
}


@pytest.mark.parametrize(
    "original",
    [
        pod(container(limits={GPU: "1"}), annotations={**FORGED, "keep": "me"},
            labels={"hami.io/vgpu-node": "n1", "app": "x"}),
        pod(container(), annotations={**FORGED, "keep": "me"},
            labels={"hami.io/vgpu-node": "n1", "app": "x"}),
        pod(container(), annotations={**FORGED, "keep": "me"},
            labels={"hami.io/vgpu-node": "n1", "app": "x"}, schedulerName="other"),
    ],
)  # fmt: skip
def test_scheduler_owned_annotations_and_label_are_removed(original: dict[str, Any]) -> None:
    assert set(FORGED) == set(BOOKING_ANNOTATIONS)
    admission = admit_pod(original, DEFAULTS)
    assert admission.allowed
    assert [op for op in admission.patch if op["path"].startswith("/metadata")] == [
        {"op": "remove", "path": "/metadata/annotations/" + key.replace("/", "~1")}
        for key in BOOKING_ANNOTATIONS
    ] + [{"op": "remove", "path": "/metadata/labels/hami.io~1vgpu-node"}]
    result = mutated(original)
    assert result["metadata"]["annotations"] == {"keep": "me"}
    assert result["metadata"]["labels"] == {"app": "x"}


def test_other_scheduler_pod_keeps_hamis_message_with_the_removal() -> None:
    original = pod(container(), annotations={"hami.io/bind-phase": "success"}, schedulerName="x")
    assert admit_pod(original, DEFAULTS) == PodAdmission(
        AdmissionVerdict.ALLOWED,
        200,
        "pod already has different scheduler assigned",
        ({"op": "remove", "path": "/metadata/annotations/hami.io~1bind-phase"},),
    )


# --- the AdmissionReview --------------------------------------------------------------------


def _request(original: Any, api_version: str = ADMISSION_V1, uid: str = "uid-1") -> Any:
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ns",
            "operation": "CREATE",
            "object": original,
        },
    }


@pytest.mark.parametrize("api_version", [ADMISSION_V1, ADMISSION_V1BETA1])
def test_review_answers_in_the_request_version(api_version: str) -> None:
    original = pod(container(limits={GPU: "1"}), annotations={"hami.io/vgpu-node": "n"})
    outcome = review_admission(_request(original, api_version, "abc"), DEFAULTS)
    review = outcome.review
    assert (review["kind"], review["apiVersion"]) == ("AdmissionReview", api_version)
    response = review["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        "abc",
        True,
        "JSONPatch",
    )
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch == list(outcome.admission.patch)
    assert json_patch(original, patch) == mutated(original)


# Expected bytes written by hand from controller-runtime v0.24.1: Complete() sets uid and code
# 200; Denied = ValidationResponse(false) (code 403, reason Forbidden); Errored (code, message);
# metav1.Status field order metadata, message, reason, code; json.Encoder adds a newline.
@pytest.mark.parametrize(
    ("original", "expected"),
    [
        (pod(),
         b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","response":{"uid":"u",'
         b'"allowed":false,"status":{"metadata":{},"message":"pod has no containers",'
         b'"reason":"Forbidden","code":403}}}\n'),
        (pod(container()),
         b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","response":{"uid":"u",'
         b'"allowed":true,"status":{"metadata":{},"code":200}}}\n'),
        (pod(container(), schedulerName="other"),
         b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","response":{"uid":"u",'
         b'"allowed":true,"status":{"metadata":{},"message":"pod already has different '
         b'scheduler assigned","code":200}}}\n'),
        (pod(container("<c>", limits={PCT: "200"})),
         b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","response":{"uid":"u",'
         b'"allowed":false,"status":{"metadata":{},"message":"invalid '
         b'nvidia.com/gpumem-percentage value 200 in container \\u003cc\\u003e: must be an '
         b'integer between 0 and 100","code":500}}}\n'),
        (pod(container(limits={GPU: "1", CORES: "9"}), schedulerName="hami-scheduler",
             annotations={"hami.io/bind-time": "1"}),
         b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","response":{"uid":"u",'
         b'"allowed":true,"status":{"metadata":{},"code":200},"patch":"'
         + base64.b64encode(b'[{"op":"remove","path":"/metadata/annotations/hami.io~1bind-time"}]')
         + b'","patchType":"JSONPatch"}}\n'),
    ],
)  # fmt: skip
def test_review_bytes_as_controller_runtime_writes_them(original: Any, expected: bytes) -> None:
    outcome = review_admission(_request(original, uid="u"), DEFAULTS)
    assert render_admission_review(outcome.review) == expected
    assert admission_reply(outcome) == HttpReply(200, expected, "application/json")


@pytest.mark.parametrize(
    ("review", "code", "message"),
    [
        ("x", 400, "the admission review is not an object"),
        ({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {}}, 400,
         'no kind "AdmissionReview" is registered for version "admission.k8s.io/v2"'),
        ({"apiVersion": ADMISSION_V1, "kind": "Pod"}, 400,
         'no kind "Pod" is registered for version "admission.k8s.io/v1"'),
        ({"apiVersion": ADMISSION_V1, "kind": "AdmissionReview"}, 400,
         "there is no content to decode"),
        ({"request": {"uid": "u"}}, 400, "there is no content to decode"),
    ],
)  # fmt: skip
def test_unreadable_reviews(review: Any, code: int, message: str) -> None:
    outcome = review_admission(review, DEFAULTS)
    assert outcome.admission == PodAdmission(AdmissionVerdict.ERRORED, code, message)
    assert outcome.review["response"]["allowed"] is False
    assert outcome.review["response"]["status"] == {
        "metadata": {},
        "message": message,
        "code": code,
    }


@pytest.mark.parametrize(
    ("body", "content_type", "code", "message"),
    [
        # controller-runtime http.go ServeHTTP, in its order
        (b"", "application/json", 400, "request body is empty"),
        (b"x" * 11, "application/json", 413, "request entity is too large; limit is 10 bytes"),
        (b"{}", "text/plain", 400, "contentType=text/plain, expected application/json"),
        (b"{", "application/json", 400, "unexpected EOF"),
        (b"{}", "application/json", 400, "there is no content to decode"),
    ],
)
def test_review_body_problems(body: bytes, content_type: str, code: int, message: str) -> None:
    outcome = review_admission_body(body, DEFAULTS, content_type=content_type, max_bytes=10)
    assert outcome.admission == PodAdmission(AdmissionVerdict.ERRORED, code, message)
    assert admission_reply(outcome).status == 200


def test_review_body_round_trip() -> None:
    request = _request(pod(container(limits={GPU: "1"})), ADMISSION_V1BETA1)
    body = json.dumps(request).encode()
    assert review_admission_body(body, DEFAULTS) == review_admission(request, DEFAULTS)
    assert WEBHOOK_MAX_BODY_BYTES == 7 * 1024 * 1024


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="default_gpu_num"):
        WebhookSettings(default_gpu_num=-1)
    with pytest.raises(ValueError, match="count resource"):
        WebhookSettings(resources=ResourceNames(count=""))
    with pytest.raises(ValueError):
        WebhookSettings(gpu_core_policy="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory_factor"):
        WebhookSettings(memory_factor=0)


# --- properties -----------------------------------------------------------------------------

_junk: st.SearchStrategy[object] = st.sampled_from([None, 5, 1.5, True, "x", [], {}, [None]])
_quantities = st.sampled_from(["1", "0", "2", "100", "50", "101", "-1", "0.5", "1k", "2Ki", "1e30"])
_resource_names = st.sampled_from([GPU, MEM, PCT, CORES, PRIORITY, "cpu"])
_resource_lists = st.dictionaries(_resource_names, _quantities, max_size=3)
_string_maps = st.dictionaries(
    st.sampled_from([*BOOKING_ANNOTATIONS, "keep", "app"]), st.just("v"), max_size=4
)
_scheduler_names = st.sampled_from(["", "default-scheduler", "hami-scheduler", "other"])


def _optional(strategies: dict[str, Any]) -> Any:
    return st.fixed_dictionaries({}, optional=strategies)


_containers = _optional(
    {
        "name": st.sampled_from(["a", "b", "<c>"]),
        "resources": _optional({"limits": _resource_lists, "requests": _resource_lists}),
        "env": st.just([{"name": "A", "value": "1"}]),
        "securityContext": _optional({"privileged": st.booleans()}),
    }
)
_pods = st.fixed_dictionaries(
    {
        "metadata": _optional({"annotations": _string_maps, "labels": _string_maps}),
        "spec": st.fixed_dictionaries(
            {"containers": st.lists(_containers, min_size=1, max_size=3)},
            optional={
                "initContainers": st.lists(_containers, max_size=2),
                "schedulerName": _scheduler_names,
                "nodeName": st.sampled_from(["", "n1"]),
                "runtimeClassName": st.sampled_from(["", "kata"]),
            },
        ),
    }
)
_settings = st.builds(
    WebhookSettings,
    scheduler_name=st.sampled_from(["", "hami-scheduler"]),
    force_overwrite_default_scheduler=st.booleans(),
    default_gpu_num=st.sampled_from([0, 1, 2, 1024]),
    overwrite_env=st.booleans(),
    gpu_core_policy=st.sampled_from(list(GpuCorePolicy)),
    runtime_class_name=st.sampled_from(["", "nvidia"]),
)


def _spoil(value: Any, data: Any) -> Any:
    """Replace one randomly chosen part of a JSON value with junk of another type."""
    if isinstance(value, dict) and value and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: _spoil(value[key], data)}
    if isinstance(value, list) and value and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(value) - 1))
        return [*value[:index], _spoil(value[index], data), *value[index + 1 :]]
    return data.draw(_junk)


def _check_review(original: Any, settings: WebhookSettings, api_version: str) -> Any:
    """The webhook's invariants for any input; returns the patched pod when allowed."""
    before = copy.deepcopy(original)
    outcome = review_admission(_request(original, api_version), settings)
    assert original == before
    review = outcome.review
    assert (review["kind"], review["apiVersion"]) == ("AdmissionReview", api_version)
    response = review["response"]
    assert response["uid"] == "uid-1"
    assert response["allowed"] is outcome.admission.allowed
    status = response["status"]
    assert status["code"] == outcome.admission.code
    assert not status.get("message", "").startswith("internal error")
    json.loads(render_admission_review(review))
    if not outcome.admission.allowed:
        assert "patch" not in response
        return None
    operations = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    assert operations == list(outcome.admission.patch)
    for op in operations:
        assert op["op"] in ("add", "remove", "replace")
        # only what the webhook owns changes: the removals, container env/limits, two fields
        assert op["path"].startswith(("/metadata/annotations/", "/metadata/labels/")) or (
            op["path"] in ("/spec/schedulerName", "/spec/runtimeClassName")
            or "/env" in op["path"]
            or "/resources" in op["path"]
        ), op
    result = json_patch(original, operations)  # applies cleanly to the pod as it arrived
    metadata = result.get("metadata") or {}
    assert not set(metadata.get("annotations") or {}) & set(BOOKING_ANNOTATIONS)
    assert not set(metadata.get("labels") or {}) & set(BOOKING_LABELS)
    return result


def _limits(container_: dict[str, Any], kind: str) -> dict[str, Any]:
    return dict((container_.get("resources") or {}).get(kind) or {})


_versions = st.sampled_from([ADMISSION_V1, ADMISSION_V1BETA1])


@given(original=_pods, settings=_settings, api_version=_versions)
def test_pod_patch_applies_and_reaches_a_fixed_point(
    original: dict[str, Any], settings: WebhookSettings, api_version: str
) -> None:
    result = _check_review(original, settings, api_version)
    if result is None:
        return
    # Admitting the mutated pod again changes no resources, names or metadata (env variables
    # are appended again, as HAMi does; a pod is admitted once, at CREATE). Not so for a
    # count in requests only: the gpucores limit added the first time makes HAMi's
    # mutateContainerResource add a count limit the second time (device.go 404-411).
    containers = [*result["spec"]["containers"], *result["spec"].get("initContainers", [])]
    if any(GPU in _limits(c, "requests") and GPU not in _limits(c, "limits") for c in containers):
        return
    again = admit_pod(result, settings)
    assert again.allowed
    assert all(op["path"].endswith(("/env", "/env/-")) for op in again.patch), again.patch


@given(original=_pods, settings=_settings, api_version=_versions, data=st.data())
def test_any_pod_gets_a_valid_review(
    original: dict[str, Any], settings: WebhookSettings, api_version: str, data: Any
) -> None:
    _check_review(_spoil(original, data), settings, api_version)
