"""Issue 25 item 3 against the scheduler over the wire: a node holds only the public booking
keys, so a full-node booking it writes on an unbound pod, signed with whatever it mounts, is
not counted; the HMAC bookings of the scheme before count only while the legacy key file is
given (the upgrade window).

Before (one HMAC key on every node): the booking signed with the node's key verified, the
scheduler counted the forged booking and refused a 1,000 MiB pod on the victim node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    ANNOTATION_BOOKING_SIGNATURES,
    BookingFields,
)
from hami_plugin.testing.apiserver import FakeApiServer
from tests.bookings import hmac_signature, keys_from, signed_fields
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.extender.signing import KEY, booking, write_key_file, write_public_key_file

VICTIM = "n1"
LEGACY_KEY = "the-hmac-booking-key-of-before-0123456789"


def node_key(tmp_path: Path) -> bytes:
    """What a compromised node reads from its mounted key file: its first key line."""
    path = write_public_key_file(tmp_path / "node-booking-keys")
    lines = [line for line in path.read_text().splitlines() if line and line[0] != "#"]
    return lines[0].encode()


def add_forged_full_node_booking(api: FakeApiServer, sign: Callable[[BookingFields], str]) -> str:
    """An unbound pod that asks for the GPU, with a booking of the victim's whole GPU signed
    by `sign` for the UID the API server gave it."""
    annotations = booking(VICTIM, [(f"GPU-{VICTIM}-0", 32768, 100)], phase="allocating")
    uid = api.add_object(gpu_pod("forged", memory=32768, annotations=annotations))["metadata"][
        "uid"
    ]
    fields = signed_fields(uid, annotations)
    assert fields is not None
    signature = sign(fields)
    api.update_object(
        "pods",
        "default",
        "forged",
        lambda pod: pod["metadata"]["annotations"].update(
            {ANNOTATION_BOOKING_SIGNATURE: signature}
        ),
    )
    return signature


def victim_takes_1000_mib(api: FakeApiServer, tmp_path: Path, **config: Any) -> bool:
    """Whether the scheduler, run with `config`, places a 1,000 MiB pod on the victim node
    once it has seen the forged pod."""
    api.add_object(gpu_node(VICTIM, 1, split=4, protocol=True))
    key_file = write_key_file(tmp_path / "booking-keys")
    with running_scheduler(api, booking_key_file=str(key_file), **config) as scheduler:
        scheduler.sees_pod(
            "default",
            "forged",
            lambda pod: pod.annotations.get(ANNOTATION_BOOKING_SIGNATURE) is not None,
        )
        small = api.add_object(gpu_pod("small", memory=1000))
        nodes: object = scheduler.filter(small, [VICTIM])["NodeNames"]
        return nodes == [VICTIM]


@pytest.mark.parametrize(
    "forge",
    [
        lambda key: lambda fields: hmac_signature(key, fields),
        lambda key: keys_from(key).sign,
    ],
    ids=["hmac-with-the-node-key", "ed25519-pair-of-its-own"],
)
def test_a_node_cannot_book_another_node_full(
    apiserver: FakeApiServer,
    tmp_path: Path,
    forge: Callable[[bytes], Callable[[BookingFields], str]],
) -> None:
    add_forged_full_node_booking(apiserver, forge(node_key(tmp_path)))
    assert victim_takes_1000_mib(apiserver, tmp_path)


@pytest.mark.parametrize("window", [True, False], ids=["legacy-file-given", "no-legacy-file"])
def test_hmac_bookings_of_before_count_only_in_the_upgrade_window(
    apiserver: FakeApiServer, tmp_path: Path, window: bool
) -> None:
    """A booking the scheduler signed with HMAC before the upgrade: counted (the GPU is full)
    while --legacy-booking-key-file names the old key, ignored without it."""
    add_forged_full_node_booking(
        apiserver, lambda fields: hmac_signature(LEGACY_KEY.encode(), fields)
    )
    legacy = tmp_path / "legacy-keys"
    legacy.write_text(f"# the HMAC key of before\n{LEGACY_KEY}\n")
    config = {"legacy_booking_key_file": str(legacy)} if window else {}
    assert victim_takes_1000_mib(apiserver, tmp_path, **config) is not window


@pytest.mark.parametrize(
    ("announced", "version"),
    [(None, "v1"), ("v2", "v2"), ("v2,v1", "v2")],
    ids=["previous-release-node", "upgraded-node", "upgraded-node-in-window"],
)
def test_mid_upgrade_a_node_still_on_hmac_gets_a_booking_it_can_check(
    apiserver: FakeApiServer, tmp_path: Path, announced: str | None, version: str
) -> None:
    """During the rollout the scheduler may run the new release while a node's device plugin
    still checks HMAC only: a node that does not announce v2 (`hami-plugin.io/booking-signatures`)
    gets a v1 booking signed with the legacy key (its plugin would refuse v2); an upgraded node
    gets v2. The bookings verify with what each node holds."""
    notes = {ANNOTATION_BOOKING_SIGNATURES: announced} if announced is not None else {}
    apiserver.add_object(gpu_node("n1", 1, split=4, protocol=True, annotations=notes))
    legacy = tmp_path / "legacy-keys"
    legacy.write_text(f"# the HMAC key of before\n{LEGACY_KEY}\n")
    key_file = write_key_file(tmp_path / "booking-keys")
    with running_scheduler(
        apiserver, booking_key_file=str(key_file), legacy_booking_key_file=str(legacy)
    ) as scheduler:
        pod = apiserver.add_object(gpu_pod("p", memory=1000))
        assert scheduler.schedule(pod, ["n1"]) == "n1"
    stored = apiserver.get_object("pods", "default", "p")
    assert stored is not None
    signature = stored["metadata"]["annotations"][ANNOTATION_BOOKING_SIGNATURE]
    assert signature.startswith(f"{version}:")
    fields = signed_fields(stored["metadata"]["uid"], stored["metadata"]["annotations"])
    # a node still on HMAC checks v1 with the shared key; an upgraded one v2 with the public key
    previous_release = keys_from("unrelated", legacy=(LEGACY_KEY.encode(),))
    node_keys = previous_release if version == "v1" else keys_from(KEY)
    assert node_keys.verify(signature, fields)


def test_without_the_legacy_key_every_booking_is_v2(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    """Once the upgrade window is closed (the legacy key gone), no node gets v1 any more."""
    apiserver.add_object(gpu_node("n1", 1, split=4, protocol=True))
    key_file = write_key_file(tmp_path / "booking-keys")
    with running_scheduler(apiserver, booking_key_file=str(key_file)) as scheduler:
        pod = apiserver.add_object(gpu_pod("p", memory=1000))
        assert scheduler.schedule(pod, ["n1"]) == "n1"
    stored = apiserver.get_object("pods", "default", "p")
    assert stored is not None
    assert stored["metadata"]["annotations"][ANNOTATION_BOOKING_SIGNATURE].startswith("v2:")
