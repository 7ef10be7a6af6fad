"""Snapshot loading: kubectl's v1 List, YAML streams, errors; PriorityClasses (pods admitted as
the Priority admission plugin admits them) and PodDisruptionBudgets; the book built from it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.snapshot import (
    SnapshotError,
    build_book,
    build_ledger,
    parse_pod,
    parse_snapshot,
    unhealthy_nodes,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "scheduler"
NOW = datetime(2025, 3, 4, 10, 20, 0, tzinfo=UTC)  # the fixtures' --now 1741083600


def test_kubectl_list_fixture() -> None:
    snapshot = parse_snapshot((FIXTURES / "cluster.yaml").read_text())
    assert [node.name for node in snapshot.nodes] == [
        "gpu-a100-0",
        "gpu-v100-0",
        "gpu-t4-0",
        "cpu-0",
    ]
    assert len(snapshot.pods) == 6
    ledger = build_ledger(snapshot, NOW)
    assert ledger.node_names() == ["gpu-a100-0", "gpu-t4-0", "gpu-v100-0"]
    # the Succeeded pod released its GPU; the running ones are booked
    assert ledger.tracked("ml/nightly-eval-9tq4m") is None
    assert ledger.pod_count == 4
    v100 = ledger.node("gpu-v100-0")
    assert v100 is not None
    assert v100.used == (0, 0, 1, 1)
    assert v100.used_memory_mib == (0, 0, 16384, 16384)
    t4 = ledger.node("gpu-t4-0")
    assert t4 is not None and t4.cordoned == frozenset({"GPU-2e6f0b9d-81c4-4f7a-b3d5-6a0c9e1f2b47"})
    assert [device.healthy for device in t4.devices] == [True, False]


REGISTER = (
    '[{"id":"GPU-1","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA T4","health":true}]'
)
ALLOCATED = "{hami.io/vgpu-node: n1, hami.io/vgpu-devices-allocated: 'GPU-1,NVIDIA,100,10:;'}"


def test_multi_document_stream_and_nested_lists() -> None:
    text = f"""
---
apiVersion: v1
kind: Node
metadata:
  name: n1
  annotations:
    hami.io/node-nvidia-register: '{REGISTER}'
---
apiVersion: v1
kind: PodList
items:
- kind: Pod
  metadata: {{name: p, namespace: ns, annotations: {ALLOCATED}}}
---
kind: ConfigMap
metadata: {{name: ignored}}
...
"""
    snapshot = parse_snapshot(text)
    assert [n.name for n in snapshot.nodes] == ["n1"]
    assert [p.key for p in snapshot.pods] == ["ns/p"]
    node = build_ledger(snapshot, NOW).node("n1")
    assert node is not None and node.used_memory_mib == (100,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("items: [", "snapshot:"),
        ("- just\n- a list\n", "expected Kubernetes objects, got list"),
        ("kind: Pod\nmetadata: {namespace: x}\n", "object 0 (Pod): metadata.name is missing"),
        ("kind: Node\nmetadata: {name: n, annotations: {a: 1}}\n", "map strings to strings"),
        # not kubectl's output, or no node to place a pod on: never "no node fits"
        ('{"foo": 1}', "snapshot: object 0 has no kind; expected Kubernetes objects"),
        ("kind: List\nitems: [{metadata: {name: n}}]\n", "object 0 has no kind"),
        ("", "snapshot: no Node in the snapshot (found nothing); expected a cluster snapshot"),
        ("kind: Pod\nmetadata: {name: p}\n", "no Node in the snapshot (found 1 Pod);"),
        (
            "kind: Pod\nmetadata: {name: p}\n---\nkind: Pod\nmetadata: {name: q}\n---\n"
            "kind: ConfigMap\nmetadata: {name: c}\n",
            "no Node in the snapshot (found 2 Pods and 1 other object);",
        ),
    ],
)
def test_bad_snapshots(text: str, message: str) -> None:
    with pytest.raises(SnapshotError, match=re.escape(message)):
        parse_snapshot(text)


def test_parse_pod() -> None:
    pod = parse_pod((FIXTURES / "pod-init.yaml").read_text())
    assert pod.key == "inference/warm-cache"
    assert [c.name for c in pod.init_containers] == ["download-weights", "compile-engine"]
    with pytest.raises(SnapshotError, match="expected one pod, found 2 objects"):
        parse_pod("kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: b}\n")
    with pytest.raises(SnapshotError, match="expected a Pod, found kind Node"):
        parse_pod("kind: Node\nmetadata: {name: a}\n")
    with pytest.raises(SnapshotError, match="expected one pod, found 0 objects"):
        parse_pod("")


def test_nodes_whose_device_plugin_is_gone_are_not_registered() -> None:
    """HAMi v2.10 CheckHealth (docs/hami-reference.md 1.6, 3.2): no allocatable nvidia.com/gpu and a
    Requesting_ handshake 60 s old or more at the time given."""
    snapshot = parse_snapshot((FIXTURES / "handshake.yaml").read_text())
    assert unhealthy_nodes(snapshot, NOW) == ("gpu-gone-0", "gpu-zero-0")
    ledger = build_ledger(snapshot, NOW)
    assert ledger.node_names() == ["gpu-live-0", "gpu-new-0", "gpu-waiting-0"]
    # the same handshakes judged earlier: 59 s after 10:15:02 nobody is gone yet, 60 s after
    # both are (HAMi: healthy while now is before t + 60 s)
    written = datetime(2025, 3, 4, 10, 15, 2, tzinfo=UTC)
    assert unhealthy_nodes(snapshot, written + timedelta(seconds=59)) == ()
    assert len(build_ledger(snapshot, written + timedelta(seconds=59))) == 5
    assert unhealthy_nodes(snapshot, written + timedelta(seconds=60)) == (
        "gpu-gone-0",
        "gpu-zero-0",
    )
    # an hour later the 10:19:30 handshake has expired too
    assert unhealthy_nodes(snapshot, NOW + timedelta(hours=1)) == (
        "gpu-gone-0",
        "gpu-zero-0",
        "gpu-waiting-0",
    )
    # the handshake text is read in the zone of the time given (10:20 UTC is 11:20 at +01:00)
    plus_one = NOW.astimezone(timezone(timedelta(hours=1)))
    assert unhealthy_nodes(snapshot, plus_one) == (
        "gpu-gone-0",
        "gpu-zero-0",
        "gpu-waiting-0",
    )


def test_pods_on_an_unregistered_node_stay_tracked() -> None:
    text = f"""
kind: List
items:
- kind: Node
  metadata:
    name: n1
    annotations:
      hami.io/node-nvidia-register: '{REGISTER}'
      hami.io/node-handshake: Requesting_2025-03-04 10:00:00
- kind: Pod
  metadata: {{name: p, namespace: ns, annotations: {ALLOCATED}}}
"""
    ledger = build_ledger(parse_snapshot(text), NOW)
    assert len(ledger) == 0
    tracked = ledger.tracked("ns/p")
    assert tracked is not None and tracked.node == "n1"


# --- PriorityClasses and PodDisruptionBudgets ------------------------------------------------

CLASSES = """
- {kind: PriorityClass, metadata: {name: batch}, value: 10, preemptionPolicy: Never}
- {kind: PriorityClass, metadata: {name: base}, value: 7, globalDefault: true}
- {kind: PriorityClass, metadata: {name: base-high}, value: 9, globalDefault: true}
"""
CLASSES_PARSED = parse_snapshot(
    "kind: List\nitems:\n- {kind: Node, metadata: {name: n}}\n" + CLASSES
).priority_classes


def _pod(name: str, spec: str) -> str:
    return f"- {{kind: Pod, metadata: {{name: {name}, namespace: ns}}, spec: {spec}}}\n"


def test_pods_are_admitted_with_the_snapshots_priority_classes() -> None:
    """kube-apiserver's Priority admission plugin (`admitPod`): the class's value and policy,
    the lowest global default for a pod without a class, the system classes always known; a
    pod that carries `spec.priority` keeps what it has. The classes follow the pods, as kubectl
    prints them."""
    text = (
        "kind: List\nitems:\n"
        "- {kind: Node, metadata: {name: n1}}\n"
        + _pod("named", "{priorityClassName: batch}")
        + _pod("own-policy", "{priorityClassName: batch, preemptionPolicy: PreemptLowerPriority}")
        + _pod("defaulted", "{}")
        + _pod("system", "{priorityClassName: system-node-critical}")
        + _pod("admitted", "{priorityClassName: batch, priority: 3}")
        + CLASSES
    )
    snapshot = parse_snapshot(text)
    admitted = {p.name: (p.priority, p.priority_class_name, p.preemption_policy)
                for p in snapshot.pods}  # fmt: skip
    assert admitted == {
        "named": (10, "batch", "Never"),
        "own-policy": (10, "batch", "PreemptLowerPriority"),
        "defaulted": (7, "base", "PreemptLowerPriority"),
        "system": (2_000_001_000, "system-node-critical", "PreemptLowerPriority"),
        "admitted": (3, "batch", ""),
    }
    assert [c.name for c in snapshot.priority_classes] == ["batch", "base", "base-high"]
    # the pod asked about is admitted with the snapshot's classes too
    pod = parse_pod("kind: Pod\nmetadata: {name: p}\nspec: {}\n", "p.yaml", CLASSES_PARSED)
    assert (pod.priority, pod.priority_class_name) == (7, "base")
    assert parse_pod("kind: Pod\nmetadata: {name: p}\n").priority == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_pod("p", "{priorityClassName: gold}"),
         "snapshot: pod ns/p: no PriorityClass with name gold was found in the snapshot"),
        ("- {kind: PriorityClass, metadata: {name: c}, value: high}\n",
         "object 1 (PriorityClass): value must be a 32-bit integer, not 'high'"),
        ("- {kind: PriorityClass, metadata: {name: c}, value: 1, globalDefault: 'yes'}\n",
         "object 1 (PriorityClass): globalDefault must be true or false"),
        ("- {kind: PodDisruptionBudget, metadata: {name: b}, status: {disruptionsAllowed: x}}\n",
         "object 1 (PodDisruptionBudget): status.disruptionsAllowed must be an integer"),
    ],
)  # fmt: skip
def test_bad_priority_classes_and_budgets(text: str, message: str) -> None:
    with pytest.raises(SnapshotError, match=re.escape(message)):
        parse_snapshot("kind: List\nitems:\n- {kind: Node, metadata: {name: n1}}\n" + text)


def test_budgets_are_read_and_the_book_holds_the_snapshot() -> None:
    text = (FIXTURES / "preemption.yaml").read_text() + (
        "---\n"
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\n"
        "metadata: {name: training, namespace: research}\n"
        "spec: {maxUnavailable: 0, selector: {matchLabels: {app: training}}}\n"
        "status: {disruptionsAllowed: 0, disruptedPods: {train-9: '2025-12-06T10:14:00Z'}}\n"
    )
    snapshot = parse_snapshot(text)
    (budget,) = snapshot.budgets
    assert (budget.key, budget.disruptions_allowed) == ("research/training", 0)
    assert budget.match_labels == {"app": "training"}
    assert budget.disrupted_pods == frozenset({"train-9"})
    # the book holds the nodes and pods as the scheduler's watches would
    book = build_book(snapshot, SchedulerSettings(), NOW)
    assert book.registered_nodes() == ["gpu-a100-0"]
    usage = book.node_usage("gpu-a100-0")
    assert usage is not None and usage.used_memory_mib == (60000, 60000)
    assert [p.key for p in book.tracked_pods()] == [
        "research/notebook-0",
        "research/notebook-1",
        "research/train-0",
        "research/train-1",
    ]
