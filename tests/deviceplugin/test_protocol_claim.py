"""What the node claims in `hami-plugin.io/allocate-protocol`, round by round, and how long pods
bound under in-flight/v2 may still be waiting (`ProtocolClaim`), over the test kubelet's real
PodResources socket."""

from __future__ import annotations

from pathlib import Path

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.podresources import PodResourcesClient
from hami_plugin.deviceplugin.protocol_claim import V2_GRACE_SECONDS, ProtocolClaim
from hami_plugin.protocol.inflight import (
    ALLOCATE_PROTOCOL,
    ALLOCATE_PROTOCOL_V2,
    ANNOTATION_ALLOCATE_PROTOCOL,
)
from hami_plugin.testing.kubelet import FakeKubelet


def _round(claim: ProtocolClaim) -> str:
    """One register round that was written: the value it carried."""
    annotations = claim.annotations()
    claim.written(annotations)
    return annotations[ANNOTATION_ALLOCATE_PROTOCOL]


def test_without_a_socket_v1_always() -> None:
    claim = ProtocolClaim(None)
    assert _round(claim) == ALLOCATE_PROTOCOL
    assert not claim.recently_v2()
    assert claim.failed_at_allocate() is False


def test_v2_while_kubelet_answers_v1_after_an_allocate_saw_it_fail_then_v2_again(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    with FakeKubelet(str(tmp_path)) as kubelet:
        client = PodResourcesClient(kubelet.pod_resources_socket)
        claim = ProtocolClaim(client, clock=clock)
        assert _round(claim) == ALLOCATE_PROTOCOL_V2
        assert claim.recently_v2()
        assert claim.failed_at_allocate() is True  # it claimed v2: wake the register loop
        assert _round(claim) == ALLOCATE_PROTOCOL  # forced, whatever the probe says
        # pods bound under v2 may still wait for kubelet: no guessing for a while
        clock.advance(V2_GRACE_SECONDS - 1)
        assert claim.recently_v2()
        clock.advance(2)
        assert not claim.recently_v2()
        assert _round(claim) == ALLOCATE_PROTOCOL_V2  # the next round probes again
        client.close()


def test_v1_when_kubelets_socket_is_missing(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "nothing.sock"))
    claim = ProtocolClaim(client)
    assert _round(claim) == ALLOCATE_PROTOCOL
    assert not claim.recently_v2()
    client.close()
