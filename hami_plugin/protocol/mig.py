"""`hami.io/vgpu-mig-allocations`: the scheduler's MIG reservations for a pod, as HAMi v2.10
writes and reads them (`pkg/device/nvidia/mig_allocations.go`).

One `MigAllocation` per MIG device the pod gets: which container (`containerIndex`, the
container's position in the pod's devices, init containers first) and which of its devices
(`deviceIndex`), the physical GPU, the profile and the exact placement (start slice, size).
The device plugin realises that placement and adds the runtime identity (`migUUID`,
`gpuInstanceID`, `computeInstanceID`: all three or none, mig_allocations.go:92-104).

The encoding is Go's `json.Marshal` of HAMi's `[]MigAllocation`, byte for byte: fields in
struct order, `migUUID` omitted when empty and the two instance ids when nil (pointers, so an
id of 0 is written). Decoding is `DecodeMigAllocations` (mig_allocations.go:79-112): Go's
decoder (keys matched case-insensitively, unknown keys ignored, null leaves the zero value),
then HAMi's checks with HAMi's messages.

What the booking signature covers is the scheduler's part (`signed_mig_part`): every field
but the runtime identity, re-encoded, so the device plugin may fill the runtime identity in
without breaking the signature while any change to a GPU, profile, placement or index does.
Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami_plugin.protocol.gojson import (
    GoJsonError,
    fold_keys,
    go_json_string,
    is_json_string,
    json_kind,
    unmarshal_go_json,
)
from hami_plugin.protocol.model import ANNOTATION_VGPU_MIG_ALLOCATIONS, MigPlacement

__all__ = [
    "ANNOTATION_VGPU_MIG_ALLOCATIONS",
    "MIG_PLACEMENT_INFO",
    "MIG_PROFILE_INFO",
    "MigAllocation",
    "MigAllocationError",
    "decode_mig_allocations",
    "encode_mig_allocations",
    "signed_mig_part",
]

MIG_PROFILE_INFO = "migProfile"
MIG_PLACEMENT_INFO = "migPlacement"
"""HAMi's CustomInfo keys for a booked MIG device's profile and placement
(mig_allocations.go:28-31); listed for reference, this code carries them as fields."""

_INT_MAX = 2**63 - 1  # Go int on a 64-bit build
_UINT32_MAX = 2**32 - 1


class MigAllocationError(ValueError):
    """The annotation does not decode, or fails HAMi's checks; the message is HAMi's."""


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """HAMi's `MigAllocation` (mig_allocations.go:37-47)."""

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def runtime_ready(self) -> bool:
        """All three runtime fields set (HAMi scheduler.go:731 `RuntimeReady`)."""
        return (
            self.mig_uuid != ""
            and self.gpu_instance_id is not None
            and self.compute_instance_id is not None
        )

    def scheduler_part(self) -> MigAllocation:
        """The reservation as the scheduler wrote it: the runtime identity dropped."""
        return replace(self, mig_uuid="", gpu_instance_id=None, compute_instance_id=None)

    def with_runtime(
        self, mig_uuid: str, gpu_instance_id: int, compute_instance_id: int
    ) -> MigAllocation:
        """The reservation realised: the device plugin's runtime identity filled in."""
        return replace(
            self,
            mig_uuid=mig_uuid,
            gpu_instance_id=gpu_instance_id,
            compute_instance_id=compute_instance_id,
        )


def _encode_one(allocation: MigAllocation) -> str:
    members = [
        f'"containerIndex":{allocation.container_index}',
        f'"deviceIndex":{allocation.device_index}',
        f'"gpuUUID":{go_json_string(allocation.gpu_uuid)}',
        f'"profile":{go_json_string(allocation.profile)}',
        f'"placement":{{"start":{allocation.placement.start},"size":{allocation.placement.size}}}',
    ]
    if allocation.mig_uuid:
        members.append(f'"migUUID":{go_json_string(allocation.mig_uuid)}')
    if allocation.gpu_instance_id is not None:
        members.append(f'"gpuInstanceID":{allocation.gpu_instance_id}')
    if allocation.compute_instance_id is not None:
        members.append(f'"computeInstanceID":{allocation.compute_instance_id}')
    return "{" + ",".join(members) + "}"


def encode_mig_allocations(allocations: Sequence[MigAllocation]) -> str:
    """Go's `json.Marshal(allocations)` (HAMi EncodeMigAllocations, mig_allocations.go:69-73)."""
    return "[" + ",".join(_encode_one(allocation) for allocation in allocations) + "]"


def _type_error(value: object, field: str, go_type: str) -> MigAllocationError:
    """Go's UnmarshalTypeError text for a field of MigAllocation or MigPlacement."""
    kind = json_kind(value)
    if kind == "number":
        kind = f"number {value}"
    return MigAllocationError(
        f"json: cannot unmarshal {kind} into Go struct field {field} of type {go_type}"
    )


def _int(obj: Mapping[str, Any], key: str, field: str, go_type: str, high: int) -> int | None:
    """An integer field: None when absent or null (Go leaves the zero value / nil pointer)."""
    raw = obj.get(key.upper())
    if raw is None:
        return None
    low = -_INT_MAX - 1 if go_type == "int" else 0
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise _type_error(raw, field, go_type)
    return raw


def _str(obj: Mapping[str, Any], key: str, field: str) -> str:
    raw = obj.get(key.upper())
    if raw is None:
        return ""
    if not is_json_string(raw):
        raise _type_error(raw, field, "string")
    return raw


def _decode_one(raw: object) -> MigAllocation:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise MigAllocationError(
            f"json: cannot unmarshal {json_kind(raw)} into Go value of type nvidia.MigAllocation"
        )
    obj = fold_keys(raw)
    placement_raw = obj.get("PLACEMENT")
    if placement_raw is None:
        placement_raw = {}
    if not isinstance(placement_raw, dict):
        raise _type_error(placement_raw, "MigAllocation.placement", "device.MigPlacement")
    placement = fold_keys(placement_raw)
    field = "MigAllocation.placement."
    return MigAllocation(
        container_index=_int(obj, "containerIndex", "MigAllocation.containerIndex", "int", _INT_MAX)
        or 0,
        device_index=_int(obj, "deviceIndex", "MigAllocation.deviceIndex", "int", _INT_MAX) or 0,
        gpu_uuid=_str(obj, "gpuUUID", "MigAllocation.gpuUUID"),
        profile=_str(obj, "profile", "MigAllocation.profile"),
        placement=MigPlacement(
            start=_int(placement, "start", field + "start", "uint32", _UINT32_MAX) or 0,
            size=_int(placement, "size", field + "size", "uint32", _UINT32_MAX) or 0,
        ),
        mig_uuid=_str(obj, "migUUID", "MigAllocation.migUUID"),
        gpu_instance_id=_int(
            obj, "gpuInstanceID", "MigAllocation.gpuInstanceID", "uint32", _UINT32_MAX
        ),
        compute_instance_id=_int(
            obj, "computeInstanceID", "MigAllocation.computeInstanceID", "uint32", _UINT32_MAX
        ),
    )


def decode_mig_allocations(raw: str) -> tuple[MigAllocation, ...]:
    """HAMi's `DecodeMigAllocations`: `""` is no allocations; otherwise Go's decoder, then
    every allocation complete, its runtime identity all or nothing, no (container, device)
    twice. Raises `MigAllocationError` with HAMi's message."""
    if raw == "":
        return ()
    try:
        parsed = unmarshal_go_json(raw)
    except GoJsonError as error:
        raise MigAllocationError(str(error)) from None
    if parsed is None:
        return ()
    if not isinstance(parsed, list):
        raise MigAllocationError(
            f"json: cannot unmarshal {json_kind(parsed)} into Go value of type "
            "[]nvidia.MigAllocation"
        )
    allocations = tuple(_decode_one(item) for item in parsed)
    seen: set[tuple[int, int]] = set()
    for index, allocation in enumerate(allocations):
        if (
            allocation.container_index < 0
            or allocation.device_index < 0
            or allocation.gpu_uuid == ""
            or allocation.profile == ""
            or allocation.placement.size == 0
        ):
            raise MigAllocationError(f"MIG allocation {index} is incomplete")
        runtime_fields = (
            (allocation.mig_uuid != "")
            + (allocation.gpu_instance_id is not None)
            + (allocation.compute_instance_id is not None)
        )
        if runtime_fields not in (0, 3):
            raise MigAllocationError(f"MIG allocation {index} has partial runtime identity")
        key = (allocation.container_index, allocation.device_index)
        if key in seen:
            raise MigAllocationError(
                f"duplicate MIG allocation for container {key[0]} device {key[1]}"
            )
        seen.add(key)
    return allocations


def signed_mig_part(allocations: Sequence[MigAllocation]) -> str:
    """What the booking signature covers of MIG reservations: the scheduler's part of each,
    re-encoded (a reservation that does not decode is signed as its raw text instead, which
    never matches what the scheduler signed: `PodBooking.signed_fields`)."""
    return encode_mig_allocations([allocation.scheduler_part() for allocation in allocations])
