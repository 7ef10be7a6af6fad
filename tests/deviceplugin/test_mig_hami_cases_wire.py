"""HAMi v2.10's GetPreferredAllocation case for MIG reservations (plugin/server_test.go:528),
over the real wire: the daemon on a dynamic-MIG node (the fake NVML's A100s of
tests/deviceplugin/test_mig_dynamic_wire.py), the test kubelet over gRPC and the API server
double."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_plugin.testing.apiserver import FakeApiServer
from tests.deviceplugin.pods import NODE
from tests.deviceplugin.test_mig_dynamic_wire import GPU, IDLE, Node, bind_mig_pod, reservation


@pytest.fixture
def mig_node(tmp_path: Path, sock_dir: str, apiserver: FakeApiServer) -> Node:
    apiserver.add_node(NODE)
    return Node(tmp_path, sock_dir, apiserver)


def test_kubelet_is_steered_to_a_slot_of_the_gpu_holding_the_mig_reservation(
    mig_node: Node,
) -> None:
    """plugin/server_test.go:528 TestSelectPreferredDeviceIDsWithPhysicalMIGReservations: HAMi's
    GetPreferredAllocation (server.go:631-713) picks, for each GPU the pending pod's booking
    names, an available slot ID of that GPU; on a dynamic-MIG node the booking names the GPU of
    the MIG reservation. Here the other GPU's slots come first in kubelet's list; the answer is
    still a slot of the reserved GPU, and Allocate then realises the reservation there."""
    with mig_node.daemon() as (_, kubelet):
        bind_mig_pod(mig_node, "mig-pod", [reservation()])
        available = [f"{IDLE}-0", f"{IDLE}-1", f"{GPU}-3", f"{GPU}-0"]
        chosen = kubelet.preferred(available, size=1)
        assert chosen == [f"{GPU}-3"]
        answer = kubelet.allocate(chosen).container_responses[0]
        (instance,) = mig_node.instances(0)
        assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": instance.uuid}
        assert mig_node.instances(1) == ()
