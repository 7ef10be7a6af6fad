"""Booking keys and signed pods for the tests of a scheduler run with `--booking-key-file`."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hami_plugin.protocol.codec import encode_pod_devices
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_BIND_TIME,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
    ContainerDevice,
)
from hami_plugin.protocol.signature import (
    ANNOTATION_BOOKING_SIGNATURE,
    BookingKeys,
)
from tests.bookings import (
    keys_from,
    private_key_file_text,
    public_key_file_text,
    signed_fields,
)

KEY = "scheduler-test-booking-key-0123456789"
KEYS = keys_from(KEY.encode())
OTHER_KEYS = keys_from(b"a-key-the-scheduler-does-not-have")
BIND_TIME = "1767268800"


def write_key_file(path: Path, *keys: str) -> Path:
    """The scheduler's `--booking-key-file`: the private keys of these seeds (default `KEY`),
    the first signing (`keys_from` of the same seeds signs and verifies as it does)."""
    path.write_text(private_key_file_text(*(keys or (KEY,))))
    return path


def write_public_key_file(path: Path, *keys: str) -> Path:
    """A node's `--booking-key-file`: only the public keys of these seeds (default `KEY`)."""
    path.write_text(public_key_file_text(*(keys or (KEY,))))
    return path


def booking(
    node: str,
    gpus: Sequence[tuple[str, int, int]],
    *,
    phase: str = "allocating",
    bind_time: str = BIND_TIME,
) -> dict[str, str]:
    """The annotations a bind writes for one container on `gpus` ((uuid, MiB, cores) each)."""
    devices = encode_pod_devices(
        (tuple(ContainerDevice(uuid, "NVIDIA", memory, cores) for uuid, memory, cores in gpus),)
    )
    return {
        ANNOTATION_VGPU_NODE: node,
        ANNOTATION_VGPU_TIME: bind_time,
        ANNOTATION_DEVICES_TO_ALLOCATE: devices,
        ANNOTATION_DEVICES_ALLOCATED: devices,
        ANNOTATION_BIND_PHASE: phase,
        ANNOTATION_BIND_TIME: bind_time,
    }


def signed(pod: dict[str, Any], keys: BookingKeys = KEYS, uid: str | None = None) -> dict[str, Any]:
    """A copy of `pod` whose booking annotations carry the signature a bind by a scheduler
    holding `keys` writes (for the pod's own UID unless `uid` is given)."""
    pod = copy.deepcopy(pod)
    metadata = pod["metadata"]
    annotations = metadata.setdefault("annotations", {})
    fields = signed_fields(uid or metadata["uid"], annotations)
    assert fields is not None, annotations
    annotations[ANNOTATION_BOOKING_SIGNATURE] = keys.sign(fields)
    return pod
