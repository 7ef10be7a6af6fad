"""Usage tracking (docs/hami-reference.md 3.3): collapsing, pod and node events, incremental ==
rebuilt."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.codec import decode_pod_devices, encode_node_devices
from hami_plugin.protocol.model import ContainerDevice, GpuDevice
from hami_plugin.protocol.objects import read_node, read_pod
from hami_plugin.protocol.usage import DeviceTally, collapse_pod_devices
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.testing.apiserver import make_container, make_pod

from .helpers import gpu


def dev(uuid: str, memory: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid, "NVIDIA", memory, cores)


def test_collapse_init_peak_and_app_sum() -> None:
    devices = (
        (dev("A", 1000, 10),),  # init
        (dev("A", 3000, 20), dev("B", 100, 1)),  # init
        (dev("A", 500, 5),),  # app
        (dev("A", 700, 5),),  # app
        (),
    )
    assert collapse_pod_devices(devices, init_count=2) == (
        DeviceTally("A", 2, 3000, 20),  # slots: app 2; memory, cores: init peak
        DeviceTally("B", 1, 100, 1),
    )
    assert collapse_pod_devices(devices, init_count=2, app_only=True) == (
        DeviceTally("A", 2, 1200, 10),
    )
    # the app sum wins where it is larger
    assert collapse_pod_devices(((dev("A", 100, 1),), (dev("A", 900, 50),)), 1) == (
        DeviceTally("A", 1, 900, 50),
    )


def test_collapse_reference_fixture() -> None:
    """docs/hami-reference.md 1.4.3 example 6: two containers on two GPUs, and the trailing empty
    entry."""
    devices = decode_pod_devices(
        "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76,NVIDIA,500,3:;"
        "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,NVIDIA,500,3:;"
    )
    assert collapse_pod_devices(devices, 0) == (
        DeviceTally("GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76", 1, 500, 3),
        DeviceTally("GPU-ebe7c3f7-303d-558d-435e-99a160631fe4", 1, 500, 3),
    )


def node_object(name: str, devices: list[GpuDevice], **annotations: str) -> dict[str, Any]:
    values = {"hami.io/node-nvidia-register": encode_node_devices(devices), **annotations}
    return {"kind": "Node", "metadata": {"name": name, "annotations": values}}


def pod_object(
    name: str,
    node: str | None,
    allocated: str | None,
    phase: str = "Running",
    init: int = 0,
    init_done: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    annotations = {}
    if node is not None:
        annotations["hami.io/vgpu-node"] = node
    if allocated is not None:
        annotations["hami.io/vgpu-devices-allocated"] = allocated
    pod = make_pod(
        name,
        "ns",
        phase=phase,
        annotations=annotations,
        containers=[make_container("c")],
        init_containers=[make_container(f"i{i}") for i in range(init)],
    )
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2025-03-04T10:00:00Z"
    if init_done:
        pod["status"]["initContainerStatuses"] = [
            {"state": {"terminated": {"exitCode": 0}}} for _ in range(init)
        ]
    return pod


def usage(ledger: Ledger, name: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    snapshot = ledger.node(name)
    assert snapshot is not None
    return snapshot.used, snapshot.used_memory_mib, snapshot.used_cores


@pytest.fixture
def ledger() -> Ledger:
    ledger = Ledger()
    ledger.update_node(read_node(node_object("n1", [gpu("A", 0), gpu("B", 1)])))
    return ledger


def test_pods_book_and_release(ledger: Ledger) -> None:
    ledger.update_pod(read_pod(pod_object("p1", "n1", "A,NVIDIA,1000,10:;")))
    ledger.update_pod(read_pod(pod_object("p2", "n1", "A,NVIDIA,2000,20:B,NVIDIA,500,5:;")))
    assert usage(ledger, "n1") == ((2, 1), (3000, 500), (30, 5))
    ledger.update_pod(
        read_pod(pod_object("p2", "n1", "A,NVIDIA,2000,20:B,NVIDIA,500,5:;", "Succeeded"))
    )
    assert usage(ledger, "n1") == ((1, 0), (1000, 0), (10, 0))
    ledger.update_pod(read_pod(pod_object("p1", "n1", "A,NVIDIA,1000,10:;", "Failed")))
    assert usage(ledger, "n1") == ((0, 0), (0, 0), (0, 0))
    assert ledger.pod_count == 0


def test_terminating_pods_keep_their_usage(ledger: Ledger) -> None:
    ledger.update_pod(read_pod(pod_object("p", "n1", "A,NVIDIA,1000,10:;", deleting=True)))
    assert usage(ledger, "n1")[0] == (1, 0)
    ledger.delete_pod("ns/p")
    assert usage(ledger, "n1")[0] == (0, 0)


def test_pods_that_are_not_tracked(ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    ledger.update_pod(read_pod(pod_object("no-node", None, "A,NVIDIA,1000,10:;")))
    ledger.update_pod(read_pod(pod_object("no-devices", "n1", None)))
    with caplog.at_level(logging.WARNING):
        ledger.update_pod(read_pod(pod_object("bad", "n1", "A,NVIDIA,lots,10:;")))
    assert "pod ns/bad not tracked" in caplog.text
    assert ledger.pod_count == 0
    assert usage(ledger, "n1")[0] == (0, 0)


def test_a_pod_losing_its_annotation_is_released(ledger: Ledger) -> None:
    ledger.update_pod(read_pod(pod_object("p", "n1", "A,NVIDIA,1000,10:;")))
    ledger.update_pod(read_pod(pod_object("p", "n1", "A,NVIDIA,broken:;")))
    assert usage(ledger, "n1")[0] == (0, 0)


def test_unknown_gpus_are_ignored(ledger: Ledger) -> None:
    ledger.update_pod(read_pod(pod_object("p", "n1", "A,NVIDIA,1000,10:GPU-gone,NVIDIA,5,5:;")))
    assert usage(ledger, "n1") == ((1, 0), (1000, 0), (10, 0))


def test_init_containers_shrink_once_done_and_never_grow_back(ledger: Ledger) -> None:
    allocated = "A,NVIDIA,8000,50:;A,NVIDIA,1000,10:;"
    ledger.update_pod(read_pod(pod_object("p", "n1", allocated, init=1)))
    assert usage(ledger, "n1") == ((1, 0), (8000, 0), (50, 0))
    ledger.update_pod(read_pod(pod_object("p", "n1", allocated, init=1, init_done=True)))
    assert usage(ledger, "n1") == ((1, 0), (1000, 0), (10, 0))
    ledger.update_pod(read_pod(pod_object("p", "n1", allocated, init=1, init_done=False)))
    assert usage(ledger, "n1") == ((1, 0), (1000, 0), (10, 0))


def test_moving_a_pod_to_another_node(ledger: Ledger) -> None:
    ledger.update_node(read_node(node_object("n2", [gpu("C")])))
    ledger.update_pod(read_pod(pod_object("p", "n1", "A,NVIDIA,1000,10:;")))
    ledger.update_pod(read_pod(pod_object("p", "n2", "C,NVIDIA,1000,10:;")))
    assert usage(ledger, "n1")[0] == (0, 0)
    assert usage(ledger, "n2")[0] == (1,)


def test_nodes_register_and_rebook_their_pods(caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger()
    ledger.update_pod(read_pod(pod_object("p", "n1", "A,NVIDIA,1000,10:B,NVIDIA,7,7:;")))
    assert ledger.node("n1") is None  # pods may arrive before their node
    ledger.update_node(read_node(node_object("n1", [gpu("A")])))
    assert usage(ledger, "n1") == ((1,), (1000,), (10,))
    ledger.update_node(read_node(node_object("n1", [gpu("A"), gpu("B", 1)])))  # a GPU comes back
    assert usage(ledger, "n1") == ((1, 1), (1000, 7), (10, 7))
    ledger.remove_node("n1")
    assert ledger.node("n1") is None and len(ledger) == 0
    ledger.update_node(read_node(node_object("n1", [gpu("B", 1)])))
    assert usage(ledger, "n1") == ((1,), (7,), (7,))
    with caplog.at_level(logging.WARNING):
        ledger.update_node(
            read_node(
                {"metadata": {"name": "n1", "annotations": {"hami.io/node-nvidia-register": "[]"}}}
            )
        )
    assert "node n1 not registered" in caplog.text and "no gpu found on node" in caplog.text
    assert ledger.node("n1") is None
    ledger.update_node(read_node({"metadata": {"name": "n1"}}))  # the annotation is gone
    assert ledger.node("n1") is None
    assert ledger.tracked("ns/p") is not None


def test_node_events_without_change_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger()
    bad = {"metadata": {"name": "n", "annotations": {"hami.io/node-nvidia-register": "[{"}}}
    with caplog.at_level(logging.WARNING):
        ledger.update_node(read_node(bad))
        ledger.update_node(read_node(bad))  # a heartbeat: same annotations, no second warning
    assert caplog.text.count("node n not registered") == 1
    good = node_object("n", [gpu("A")])
    ledger.update_node(read_node(good))
    assert ledger.node("n") is not None
    ledger.set_node("n", [gpu("B")])  # typed updates are never skipped...
    ledger.update_node(read_node(good))  # ...and do not hide the next event
    snapshot = ledger.node("n")
    assert snapshot is not None and snapshot.devices[0].uuid == "A"
    ledger.remove_node("n")
    ledger.update_node(read_node(good))  # re-added after a delete event
    assert ledger.node("n") is not None


def test_node_annotations() -> None:
    ledger = Ledger()
    legacy = "GPU-x,10,7680,100,NVIDIA-Tesla P4,0,true:GPU-y,10,7680,100,NVIDIA-Tesla P4,1,false:"
    ledger.update_node(
        read_node(
            {
                "metadata": {
                    "name": "old",
                    "annotations": {
                        "hami.io/node-nvidia-register": legacy,
                        "hami.io/device-cordon": " GPU-y ,,",
                    },
                }
            }
        )
    )
    snapshot = ledger.node("old")
    assert snapshot is not None
    assert [d.uuid for d in snapshot.devices] == ["GPU-x", "GPU-y"]
    assert [d.healthy for d in snapshot.devices] == [True, False]
    assert snapshot.cordoned == frozenset({"GPU-y"})


def test_devices_are_kept_in_index_order() -> None:
    ledger = Ledger()
    ledger.set_node("n", [gpu("Z", 1), gpu("Y", 0), gpu("X", 1)])
    snapshot = ledger.node("n")
    assert snapshot is not None
    assert [d.uuid for d in snapshot.devices] == ["Y", "X", "Z"]


def test_preference_order_follows_usage() -> None:
    ledger = Ledger()
    for name in ("c", "a", "b"):
        ledger.set_node(name, [gpu(f"{name}-0")])
    assert [u.name for u in ledger.by_preference(True)] == ["a", "b", "c"]  # ties: by name
    assert [u.name for u in ledger.by_preference(False)] == ["a", "b", "c"]
    ledger.track("ns/p", "c", (DeviceTally("c-0", 1, 1000, 10),))
    ledger.track("ns/q", "b", (DeviceTally("b-0", 2, 9000, 50),))
    assert [u.name for u in ledger.by_preference(True)] == ["b", "c", "a"]
    assert [u.name for u in ledger.by_preference(False)] == ["a", "c", "b"]
    ledger.untrack("ns/q")
    assert [u.name for u in ledger.by_preference(True)] == ["c", "a", "b"]


# --- incremental updates give the same ledger as building it from scratch -------------------

UUIDS = ["GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-9"]  # GPU-9 is on no node
NODES = ["n0", "n1", "n2"]

node_events = st.tuples(
    st.just("node"),
    st.sampled_from(NODES),
    st.lists(st.sampled_from(UUIDS[:4]), unique=True, max_size=3),
)
pod_events = st.tuples(
    st.just("pod"),
    st.sampled_from(["p0", "p1", "p2", "p3"]),
    st.sampled_from([*NODES, None]),
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(UUIDS), st.integers(0, 5000), st.integers(0, 50)),
            max_size=2,
        ),
        max_size=3,
    ),
    st.sampled_from(["Running", "Running", "Pending", "Succeeded", "Failed"]),
)
delete_events = st.tuples(st.just("delete"), st.sampled_from(["p0", "p1", "p2", "p3"]))


def _allocated(containers: list[list[tuple[str, int, int]]]) -> str:
    return "".join(
        "".join(f"{uuid},NVIDIA,{memory},{cores}:" for uuid, memory, cores in container) + ";"
        for container in containers
    )


def _apply(ledger: Ledger, event: tuple[Any, ...]) -> None:
    if event[0] == "node":
        _, name, uuids = event
        ledger.update_node(
            read_node(
                node_object(name, [gpu(u, i) for i, u in enumerate(uuids)])
                if uuids
                else {"metadata": {"name": name}}
            )
        )
    elif event[0] == "pod":
        _, name, node, containers, phase = event
        ledger.update_pod(read_pod(pod_object(name, node, _allocated(containers), phase)))
    else:
        ledger.delete_pod(f"ns/{event[1]}")


@given(st.lists(st.one_of(node_events, pod_events, delete_events), max_size=25))
def test_incremental_updates_equal_a_rebuild(events: list[tuple[Any, ...]]) -> None:
    ledger = Ledger()
    last: dict[tuple[str, str], tuple[Any, ...]] = {}
    for event in events:
        _apply(ledger, event)
        key = ("node", event[1]) if event[0] == "node" else ("pod", event[1])
        last[key] = event
    rebuilt = Ledger()
    for key in sorted(last, key=lambda k: k[0] != "node"):  # nodes first, then pods
        _apply(rebuilt, last[key])
    assert ledger.node_names() == rebuilt.node_names()
    for name in ledger.node_names():
        assert ledger.node(name) == rebuilt.node(name)
    scores = {usage.name: usage.score for usage in ledger.by_preference(True)}
    for higher in (True, False):
        names = [u.name for u in ledger.by_preference(higher)]
        assert names == [u.name for u in rebuilt.by_preference(higher)]
        sign = -1 if higher else 1
        assert names == sorted(scores, key=lambda n: (sign * scores[n], n))
    # usage is never negative and matches the tracked pods
    for name in ledger.node_names():
        snapshot = ledger.node(name)
        assert snapshot is not None
        assert min(snapshot.used + snapshot.used_memory_mib + snapshot.used_cores, default=0) >= 0
