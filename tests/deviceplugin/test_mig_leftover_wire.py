"""A gone pod's leftover MIG instance over real wires: the daemon with the fake NVML (its
instances and their processes kept in the fake's state file, as a GPU keeps them across a
daemon restart), the test kubelet over gRPC and the API server double.

A pod deleted while the daemon is down, on a GPU another pod still uses, leaves its instance
untracked on a GPU the start does not reset. Idle, the restarted daemon destroys it; running
processes, it is never handed to the next pod the scheduler books there: that pod's Allocate
fails with a message naming it, and once the processes end a reconciliation round destroys it
and the Allocate of the pod that replaces it creates a fresh instance."""

from __future__ import annotations

import json
import logging
import os

import grpc
import pytest

from hami_plugin.protocol.mig import decode_mig_allocations
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    MigPlacement,
)
from hami_plugin.testing.fakenvml.migstate import state_path
from tests.deviceplugin.pods import pod_annotations
from tests.deviceplugin.test_mig_dynamic_wire import (
    GPU,
    Node,
    bind_mig_pod,
    reservation,
)
from tests.deviceplugin.test_mig_dynamic_wire import (
    node as node,  # the fixture
)

SLOT_5 = MigPlacement(5, 1)
SLOT_6 = MigPlacement(6, 1)


def set_processes(node: Node, mig_uuid: str, pids: tuple[int, ...]) -> None:
    """Make NVML report `pids` running on the MIG device `mig_uuid`, to every NVML session of
    the node (the daemon's included): written into the fake's state file, which each session
    reads again when it changes."""
    path = state_path(str(node.gpus_file))
    with open(path, encoding="utf-8") as stream:
        document = json.load(stream)
    found = 0
    for gpu in document["gpus"].values():
        for gi in gpu["gpu_instances"]:
            for ci in gi["compute_instances"]:
                if ci["uuid"] == mig_uuid:
                    ci["processes"] = list(pids)
                    found += 1
    assert found == 1, f"{mig_uuid} is not in the fake's state file"
    temporary = path + ".test.tmp"
    with open(temporary, "w", encoding="utf-8") as stream:
        json.dump(document, stream)
    os.replace(temporary, path)  # a new inode: every session sees the change


def run_two_pods_then_stop(node: Node) -> tuple[str, str]:
    """Pods `gone` (slot 6) and `stays` (slot 5) realised on GPU 0, then the daemon stopped.
    Returns their MIG UUIDs."""
    with node.daemon() as (_, kubelet):
        bind_mig_pod(node, "gone", [reservation(start=6)])
        kubelet.allocate([f"{GPU}-0"])
        bind_mig_pod(node, "stays", [reservation(start=5)])
        kubelet.allocate([f"{GPU}-1"])
    by_placement = {d.placement: d.uuid for d in node.instances(0)}
    assert set(by_placement) == {SLOT_5, SLOT_6}
    return by_placement[SLOT_6], by_placement[SLOT_5]


def test_an_idle_instance_of_a_pod_deleted_while_the_daemon_was_down_is_destroyed(
    node: Node,
) -> None:
    gone, stays = run_two_pods_then_stop(node)
    node.apiserver.delete_pod("default", "gone")
    with node.daemon() as (daemon, _):
        # GPU 0 is in use (pod `stays`), so it is not reset; the gone pod's instance is swept.
        assert [d.uuid for d in node.instances(0)] == [stays]
        assert daemon.dynamic_mig is not None
        assert [i.mig_uuid for i in daemon.dynamic_mig.manager.tracked().values()] == [stays]
    assert gone not in [d.uuid for d in node.instances(0)]


def test_a_busy_leftover_is_never_handed_over_and_goes_once_its_processes_end(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    gone, stays = run_two_pods_then_stop(node)
    node.apiserver.delete_pod("default", "gone")
    set_processes(node, gone, (4242,))  # the gone pod's process has not ended yet
    with node.daemon() as (daemon, kubelet):
        assert daemon.dynamic_mig is not None
        mig = daemon.dynamic_mig
        # Left on the GPU (it runs processes), never tracked.
        assert sorted(d.uuid for d in node.instances(0)) == sorted([gone, stays])
        assert [i.mig_uuid for i in mig.manager.tracked().values()] == [stays]
        # The scheduler saw slot 6 free and books the next pod there.
        bind_mig_pod(node, "next", [reservation(start=6)])
        with pytest.raises(grpc.RpcError) as caught:
            kubelet.allocate([f"{GPU}-0"])
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert caught.value.details() == (
            "pod default/next: resolve allocated NVIDIA devices: MIG instance "
            f"{gone} at placement {{Start:6 Size:1}} on GPU 0 still runs processes of a pod "
            "that is gone"
        )
        annotations = pod_annotations(node.apiserver, "next")
        assert annotations[ANNOTATION_BIND_PHASE] == "failed"
        (stored,) = decode_mig_allocations(annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS])
        assert not stored.runtime_ready  # no identity handed over
        assert gone in [d.uuid for d in node.instances(0)]  # nothing destroyed under it
        assert gone not in [i.mig_uuid for i in mig.manager.tracked().values()]
        # A round while it still runs leaves it; once the processes end, a round destroys it.
        mig.reconcile()
        assert gone in [d.uuid for d in node.instances(0)]
        set_processes(node, gone, ())
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hami_plugin.deviceplugin.mig"):
            mig.reconcile()
        assert [d.uuid for d in node.instances(0)] == [stays]
        assert f"destroyed MIG instance {gone} on gpu 0" in caplog.text
        # Kubelet fails the pod; its controller's replacement is booked at slot 6 again.
        node.apiserver.delete_pod("default", "next")
        bind_mig_pod(node, "retry", [reservation(start=6)])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hami_plugin.deviceplugin.mig"):
            answer = kubelet.allocate([f"{GPU}-0"]).container_responses[0]
        assert "created scheduler-reserved MIG allocation" in caplog.text
        (fresh,) = [d for d in node.instances(0) if d.placement == SLOT_6]
        assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": fresh.uuid}
        assert pod_annotations(node.apiserver, "retry")[ANNOTATION_BIND_PHASE] == "success"
        assert [i.mig_uuid for i in mig.manager.tracked().values()].count(fresh.uuid) == 1
