"""HAMi annotation strings <-> domain values, byte for byte as HAMi v2.10 writes them.

Pure functions, no I/O. Every malformed value raises `AnnotationError`, whose message names
the annotation key and the offending part; nothing else escapes a decoder, whatever the input.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from hami_plugin.protocol.gojson import (
    GoJsonError,
    fold_keys,
    fold_name,
    go_json_string,
    is_json_string,
    unmarshal_go_json,
)
from hami_plugin.protocol.govalues import (
    GO_INT,
    GO_TRUE,
    excerpt,
    go_quote,
    parse_go_bool,
    parse_go_int,
)
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICE_CORDON,
    ANNOTATION_DEVICE_SCORING_WEIGHTS,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_GPU_SCHEDULER_POLICY,
    ANNOTATION_NODE_HANDSHAKE,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_NODE_SCHEDULER_POLICY,
    ANNOTATION_NOUSE_GPUTYPE,
    ANNOTATION_NOUSE_GPUUUID,
    ANNOTATION_NUMA_BIND,
    ANNOTATION_USE_GPUTYPE,
    ANNOTATION_USE_GPUUUID,
    ANNOTATION_VGPU_MODE,
    ContainerDevice,
    ContainerDevices,
    GpuDevice,
    GpuPolicy,
    GpuPolicyName,
    Handshake,
    HandshakeState,
    MigPlacement,
    MigProfile,
    NodePolicy,
    OperatingMode,
    PodDevices,
    PodGpuOptions,
    ScoringWeights,
)

MAX_ANNOTATION_BYTES = 256 * 1024
"""Kubernetes caps all annotations of an object at 256 KiB together, so no value is larger."""

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1

MISSING_FIELDS = "pod annotation format error, missing fields, do not use nodeName in task spec"

_HANDSHAKE_TIME = re.compile(r"(\d{4})[-.](\d{2})[-.](\d{2}) (\d{2}):(\d{2}):(\d{2})")


class AnnotationError(ValueError):
    """A malformed annotation value. `key` is the annotation; the message says what is wrong."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"{key}: {detail}")
        self.key = key
        self.detail = detail


def check_annotation_size(key: str, value: str) -> None:
    """Raise AnnotationError when `value` is larger than any annotation can be."""
    # Cheap first: only a long value needs encoding to count its bytes.
    if len(value) > MAX_ANNOTATION_BYTES // 4:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_ANNOTATION_BYTES:
            raise AnnotationError(
                key, f"value of {size} bytes exceeds the {MAX_ANNOTATION_BYTES}-byte limit"
            )


# --- pod device lists (docs/hami-reference.md 1.4) ----------------------------------------


def _check_field(key: str, value: str, what: str) -> None:
    for separator in ",:;":
        if separator in value:
            raise AnnotationError(key, f"device {what} {go_quote(value)} contains {separator!r}")


def encode_container_devices(
    devices: ContainerDevices, key: str = ANNOTATION_DEVICES_TO_ALLOCATE
) -> str:
    """`<uuid>,<type>,<mem>,<cores>:` for every device; an empty container gives `""`.

    Raises AnnotationError when a UUID or type contains a separator (it could not round-trip).
    """
    parts = []
    for device in devices:
        _check_field(key, device.uuid, "uuid")
        _check_field(key, device.type, "type")
        parts.append(f"{device.uuid},{device.type},{device.used_mem_mib},{device.used_cores}:")
    return "".join(parts)


def encode_pod_devices(pod: PodDevices, key: str = ANNOTATION_DEVICES_TO_ALLOCATE) -> str:
    """Every container's string followed by `;` (so `()` gives `""`, `((),)` gives `";"`)."""
    return "".join(encode_container_devices(container, key) + ";" for container in pod)


def decode_container_devices(
    value: str, key: str = ANNOTATION_DEVICES_TO_ALLOCATE
) -> ContainerDevices:
    """Decode one container's devices (docs/hami-reference.md 1.4.2). Pieces without `,` are
    skipped."""
    check_annotation_size(key, value)
    return _decode_container(value, key)


def _decode_container(value: str, key: str) -> ContainerDevices:
    if not value:
        return ()
    devices = []
    for piece in value.split(":"):
        if "," not in piece:
            continue
        fields = piece.split(",")
        if len(fields) < 4:
            raise AnnotationError(key, f"{MISSING_FIELDS}: {excerpt(piece)}")
        try:
            used_mem = parse_go_int(fields[2])
            used_cores = parse_go_int(fields[3])
        except ValueError as error:
            raise AnnotationError(key, f"{error} in device {excerpt(piece)}") from None
        devices.append(ContainerDevice(fields[0], fields[1], used_mem, used_cores))
    return tuple(devices)


def decode_pod_devices(value: str, key: str = ANNOTATION_DEVICES_TO_ALLOCATE) -> PodDevices:
    """Split on `;`; every piece, the empty one after the last `;` included, is a container.

    So `"A:;"` decodes to `((A,), ())`: HAMi keeps empty entries to preserve container indexes.
    """
    check_annotation_size(key, value)
    return tuple(_decode_container(piece, key) for piece in value.split(";"))


# --- node register annotation (docs/hami-reference.md 1.5) --------------------------------


def _encode_mig_profile(profile: MigProfile) -> str:
    placements = ",".join(
        f'{{"start":{placement.start},"size":{placement.size}}}' for placement in profile.placements
    )
    return (
        f'{{"name":{go_json_string(profile.name)},"memoryMB":{profile.memory_mib},'
        f'"core":{profile.cores},"sliceCount":{profile.slice_count},'
        f'"placements":[{placements}]}}'
    )


def _encode_gpu_device(device: GpuDevice) -> str:
    members = []
    values: tuple[tuple[str, str | int], ...] = (
        ("id", device.uuid),
        ("index", device.index),
        ("count", device.split_count),
        ("devmem", device.memory_mib),
        ("devcore", device.cores_percent),
        ("type", device.type),
        ("numa", device.numa_node),
        ("mode", device.mode),
    )
    for name, field_value in values:
        if field_value in ("", 0):
            continue  # Go omitempty
        encoded = go_json_string(field_value) if isinstance(field_value, str) else str(field_value)
        members.append(f'"{name}":{encoded}')
    if device.mig_profiles:
        profiles = ",".join(_encode_mig_profile(profile) for profile in device.mig_profiles)
        members.append(f'"migProfiles":[{profiles}]')
    if device.healthy:
        members.append('"health":true')
    return "{" + ",".join(members) + "}"


def encode_node_devices(devices: Sequence[GpuDevice]) -> str:
    """The v2.10 JSON form: compact, Go field order, zero values omitted
    (docs/hami-reference.md 1.5.1)."""
    return "[" + ",".join(_encode_gpu_device(device) for device in devices) + "]"


def encode_node_devices_legacy(devices: Sequence[GpuDevice], fields: int = 9) -> str:
    """The v2.5-v2.7 comma form (9 fields) or the v2.4 one (7 fields); read-compat tests only."""
    if fields not in (7, 9):
        raise ValueError("fields must be 7 or 9")
    parts = []
    for device in devices:
        for text, what in ((device.uuid, "uuid"), (device.type, "type"), (device.mode, "mode")):
            _check_field(ANNOTATION_NODE_REGISTER, text, what)
        items = [
            device.uuid,
            str(device.split_count),
            str(device.memory_mib),
            str(device.cores_percent),
            device.type,
            str(device.numa_node),
            "true" if device.healthy else "false",
        ]
        if fields == 9:
            items += [str(device.index), device.mode]
        parts.append(",".join(items) + ":")
    return "".join(parts)


def decode_node_devices(value: str) -> tuple[GpuDevice, ...]:
    """Decode `hami.io/node-nvidia-register`: the JSON form, or the older comma form.

    Raises AnnotationError with HAMi's messages (docs/hami-reference.md 1.5): an empty JSON list is
    "no gpu found on node".
    """
    key = ANNOTATION_NODE_REGISTER
    check_annotation_size(key, value)
    if value.lstrip(" \t\r\n").startswith("["):
        return _decode_node_json(value)
    return _decode_node_comma(value)


_field_key = functools.cache(fold_name)
"""The folded form of a field name of DeviceInfo or MigProfile: only ever called with this
module's own names, so the cache stays small."""


def _json_int(key: str, obj: Mapping[str, Any], name: str, low: int, high: int) -> int:
    raw = obj.get(_field_key(name))
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise AnnotationError(key, f"cannot unmarshal {excerpt(repr(raw))} into field {name}")
    if not low <= raw <= high:
        raise AnnotationError(key, f"value {raw} of field {name} out of range")
    return raw


def _json_str(key: str, obj: Mapping[str, Any], name: str) -> str:
    raw = obj.get(_field_key(name))
    if raw is None:
        return ""
    if not is_json_string(raw):
        raise AnnotationError(key, f"cannot unmarshal {excerpt(repr(raw))} into field {name}")
    return raw


def _json_list(key: str, obj: Mapping[str, Any], name: str) -> list[Any]:
    raw = obj.get(_field_key(name))
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise AnnotationError(key, f"field {name} must be a list")
    return raw


def _json_object(key: str, raw: Any, what: str) -> Mapping[str, Any]:
    """The object's members by folded key: Go matches keys to struct fields that way, and
    the last duplicate wins."""
    if not isinstance(raw, dict):
        raise AnnotationError(key, f"{what} must be a JSON object, got {excerpt(repr(raw))}")
    return fold_keys(raw)


def _decode_mig_profile(key: str, raw: Any) -> MigProfile:
    obj = _json_object(key, raw, "a MIG profile")
    placements = []
    for item in _json_list(key, obj, "placements"):
        placement = _json_object(key, item, "a MIG placement")
        placements.append(
            MigPlacement(
                _json_int(key, placement, "start", 0, 2**32 - 1),
                _json_int(key, placement, "size", 0, 2**32 - 1),
            )
        )
    return MigProfile(
        name=_json_str(key, obj, "name"),
        memory_mib=_json_int(key, obj, "memoryMB", INT32_MIN, INT32_MAX),
        cores=_json_int(key, obj, "core", INT32_MIN, INT32_MAX),
        slice_count=_json_int(key, obj, "sliceCount", INT32_MIN, INT32_MAX),
        placements=tuple(placements),
    )


def _decode_node_json(value: str) -> tuple[GpuDevice, ...]:
    key = ANNOTATION_NODE_REGISTER
    try:
        parsed = unmarshal_go_json(value)
    except GoJsonError as error:
        raise AnnotationError(key, f"invalid JSON: {error}") from None
    if parsed is None or parsed == []:
        raise AnnotationError(key, "no gpu found on node")
    if not isinstance(parsed, list):
        raise AnnotationError(key, "expected a JSON array of devices")
    devices = []
    for raw in parsed:
        obj = _json_object(key, raw, "a device")
        health = obj.get(_field_key("health"))
        if health is not None and not isinstance(health, bool):
            raise AnnotationError(key, f"cannot unmarshal {excerpt(repr(health))} into health")
        devices.append(
            GpuDevice(
                uuid=_json_str(key, obj, "id"),
                index=_json_int(key, obj, "index", 0, UINT64_MAX),
                split_count=_json_int(key, obj, "count", INT32_MIN, INT32_MAX),
                memory_mib=_json_int(key, obj, "devmem", INT32_MIN, INT32_MAX),
                cores_percent=_json_int(key, obj, "devcore", INT32_MIN, INT32_MAX),
                type=_json_str(key, obj, "type"),
                numa_node=_json_int(key, obj, "numa", INT64_MIN, INT64_MAX),
                mode=_json_str(key, obj, "mode"),
                healthy=bool(health),
                mig_profiles=tuple(
                    _decode_mig_profile(key, item) for item in _json_list(key, obj, "migProfiles")
                ),
            )
        )
    return tuple(devices)


def _go_field(text: str, what: str, func: str, bits: int = 64) -> int:
    """One integer field of the comma form, parsed as Go's strconv does; a bad one raises
    ValueError worded as HAMi's DecodeNodeDevices wraps it: `invalid <what> field: strconv.
    <func>: parsing "<text>": invalid syntax` (or `value out of range`)."""
    try:
        return parse_go_int(text, bits)
    except ValueError:
        problem = "value out of range" if GO_INT.fullmatch(text) else "invalid syntax"
        raise ValueError(
            f"invalid {what} field: strconv.{func}: parsing {excerpt(text)}: {problem}"
        ) from None


def _go_health(text: str) -> bool:
    try:
        return parse_go_bool(text)
    except ValueError:
        raise ValueError(
            f"invalid health field: strconv.ParseBool: parsing {excerpt(text)}: invalid syntax"
        ) from None


def _decode_node_comma(value: str) -> tuple[GpuDevice, ...]:
    """The ≤ v2.7 comma form, checked as HAMi v2.10's `DecodeNodeDevices` does
    (`pkg/device/devices.go` lines 317-381): separator, segment, field count, then count,
    memory, core, health, numa, index and its sign, each error under HAMi's prefix."""
    key = ANNOTATION_NODE_REGISTER
    if ":" not in value:
        raise AnnotationError(key, "node annotation missing device separator")
    devices = []
    for segment in value.split(":"):
        if not segment:
            continue
        if "," not in segment:
            raise AnnotationError(key, f"malformed node annotation segment: {excerpt(segment)}")
        fields = segment.split(",")
        if len(fields) not in (7, 9):
            raise AnnotationError(key, f"unexpected field count {len(fields)} in node annotation")
        try:
            count = _go_field(fields[1], "count", "ParseInt", bits=32)
            memory = _go_field(fields[2], "memory", "ParseInt", bits=32)
            cores = _go_field(fields[3], "core", "ParseInt", bits=32)
            healthy = _go_health(fields[6])  # HAMi reads health (field 6) before numa (5)
            numa = _go_field(fields[5], "numa", "Atoi")
            index, mode = 0, OperatingMode.HAMI_CORE.value
            if len(fields) == 9:
                index = _go_field(fields[7], "index", "Atoi")
                if index < 0:
                    raise ValueError(f"index field must not be negative: {index}")
                mode = fields[8]
        except ValueError as error:
            raise AnnotationError(key, f"{error} in segment {excerpt(segment)}") from None
        devices.append(
            GpuDevice(
                uuid=fields[0],
                index=index,
                split_count=count,
                memory_mib=memory,
                cores_percent=cores,
                type=fields[4],
                numa_node=numa,
                mode=mode,
                healthy=healthy,
            )
        )
    return tuple(devices)


# --- handshake (docs/hami-reference.md 1.6) -----------------------------------------------


def _parse_handshake_time(text: str) -> datetime | None:
    match = _HANDSHAKE_TIME.match(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(group) for group in match.groups())
    try:
        return datetime(year, month, day, hour, minute, second)
    except ValueError:
        return None


def parse_handshake(value: str) -> Handshake:
    """Classify `hami.io/node-handshake`; never raises (garbage is state UNKNOWN).

    Times are naive: HAMi writes the scheduler's local wall-clock time without a zone.
    """
    check_annotation_size(ANNOTATION_NODE_HANDSHAKE, value)
    if "Requesting" in value:
        _, underscore, rest = value.partition("_")
        when = _parse_handshake_time(rest) if underscore else None
        return Handshake(HandshakeState.REQUESTING, when, value)
    if value.startswith("Deleted_"):
        return Handshake(HandshakeState.DELETED, _parse_handshake_time(value[8:]), value)
    if value.startswith("Reported "):
        return Handshake(HandshakeState.REPORTED, _parse_handshake_time(value[9:]), value)
    return Handshake(HandshakeState.UNKNOWN, None, value)


def format_handshake_requesting(now: datetime) -> str:
    """`Requesting_<YYYY-MM-DD HH:MM:SS>` in the wall-clock time of `now`."""
    return "Requesting_" + now.strftime("%Y-%m-%d %H:%M:%S")


# --- user annotations on the pod (docs/hami-reference.md 1.1, 3.5.4, 3.6) -----------------


def parse_gpu_policy(text: str, key: str = ANNOTATION_GPU_SCHEDULER_POLICY) -> GpuPolicy:
    """`binpack`, `spread`, `mutex`, `topology-aware`, `numa` or a comma chain of them.

    Unknown names and a blank text are errors (HAMi silently falls back to spread); a pod
    annotation goes through `parse_pod_gpu_options`, which keeps HAMi's reading of blanks.
    """
    policy = _parse_gpu_policy_text(text, key)
    if not policy.names:
        raise AnnotationError(key, "empty GPU scheduler policy")
    return policy


def _parse_gpu_policy_text(text: str, key: str) -> GpuPolicy:
    check_annotation_size(key, text)
    names: list[GpuPolicyName] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            name = GpuPolicyName(item)
        except ValueError:
            allowed = ", ".join(policy.value for policy in GpuPolicyName)
            raise AnnotationError(
                key, f"unknown GPU scheduler policy {excerpt(item)} (allowed: {allowed})"
            ) from None
        if name not in names:
            names.append(name)
    chain = "," in text or text == GpuPolicyName.NUMA
    # HAMi matches a single name against the whole text, blanks included.
    exact = chain or len(names) != 1 or text == names[0]
    return GpuPolicy(tuple(names), chain, exact)


def parse_node_policy(text: str, key: str = ANNOTATION_NODE_SCHEDULER_POLICY) -> NodePolicy:
    """`binpack` or `spread`; anything else is an error (HAMi silently uses binpack)."""
    check_annotation_size(key, text)
    try:
        return NodePolicy(text.strip())
    except ValueError:
        raise AnnotationError(
            key, f"unknown node scheduler policy {excerpt(text)} (allowed: binpack, spread)"
        ) from None


def _parse_pod_node_policy(text: str) -> NodePolicy:
    # HAMi: exactly "spread" is spread, any other text binpack. We still refuse unknown names,
    # but a blank text or a known name with blanks around it behaves as HAMi's binpack.
    if not text.strip():
        return NodePolicy.BINPACK
    policy = parse_node_policy(text)
    return policy if text == policy.value else NodePolicy.BINPACK


def parse_scoring_weights(
    text: str, key: str = ANNOTATION_DEVICE_SCORING_WEIGHTS
) -> ScoringWeights:
    """`slot=<int>,core=<int>,memory=<int>` in any order, HAMi v2.10's messages on error."""
    check_annotation_size(key, text)
    entries = text.split(",")
    if len(entries) != 3:
        raise AnnotationError(key, "expected slot, core, and memory weights")
    weights: dict[str, int] = {}
    for entry in entries:
        name, equals, raw = entry.partition("=")
        if not equals:
            raise AnnotationError(key, "expected key=value entries")
        name = name.strip()
        if name not in ("slot", "core", "memory"):
            raise AnnotationError(key, f"unknown weight {go_quote(name)}")
        if name in weights:
            raise AnnotationError(key, f"duplicate {go_quote(name)} weight")
        try:
            weight = parse_go_int(raw.strip(), bits=64)
        except ValueError:
            raise AnnotationError(key, f"{go_quote(name)} weight must be an integer") from None
        if weight < 0:
            raise AnnotationError(key, f"{go_quote(name)} weight must not be negative")
        weights[name] = weight
    if not any(weights.values()):
        raise AnnotationError(key, "at least one weight must be positive")
    return ScoringWeights(weights["slot"], weights["core"], weights["memory"])


def parse_device_cordon(value: str) -> frozenset[str]:
    """`hami.io/device-cordon`: comma list of GPU UUIDs, whitespace trimmed, empties skipped."""
    check_annotation_size(ANNOTATION_DEVICE_CORDON, value)
    return frozenset(_trimmed_items(value))


def _trimmed_items(value: str) -> Iterator[str]:
    return (item.strip() for item in value.split(",") if item.strip())


def _listed(value: str | None) -> tuple[str, ...] | None:
    # HAMi: an absent or blank list is no constraint; items are trimmed, blank ones skipped.
    if value is None or not value.strip():
        return None
    return tuple(_trimmed_items(value))


def parse_pod_gpu_options(annotations: Mapping[str, str]) -> PodGpuOptions:
    """Read every GPU placement annotation a user can put on a pod, as HAMi reads them.

    Raises AnnotationError for an unknown policy name or an invalid scoring-weights value.
    `numa-bind` follows Go's ParseBool and, like HAMi, only a true value enables it (anything
    else is false). A blank GPU policy orders GPUs as spread and a blank node policy is
    binpack, as in HAMi (docs/hami-reference.md 1.1, 3.5.4).
    """

    def get(key: str) -> str | None:
        value = annotations.get(key)
        if value is not None:
            check_annotation_size(key, value)
        return value

    use_types = get(ANNOTATION_USE_GPUTYPE)
    nouse_types = get(ANNOTATION_NOUSE_GPUTYPE)
    use_uuids = get(ANNOTATION_USE_GPUUUID)
    nouse_uuids = get(ANNOTATION_NOUSE_GPUUUID)
    numa_bind = get(ANNOTATION_NUMA_BIND)
    vgpu_mode = get(ANNOTATION_VGPU_MODE)
    gpu_policy = get(ANNOTATION_GPU_SCHEDULER_POLICY)
    node_policy = get(ANNOTATION_NODE_SCHEDULER_POLICY)
    weights = get(ANNOTATION_DEVICE_SCORING_WEIGHTS)
    return PodGpuOptions(
        use_gpu_types=_listed(use_types),
        nouse_gpu_types=_listed(nouse_types),
        use_gpu_uuids=_listed(use_uuids),
        nouse_gpu_uuids=_listed(nouse_uuids),
        numa_bind=numa_bind in GO_TRUE,
        vgpu_mode=vgpu_mode,
        gpu_policy=(
            None
            if gpu_policy is None
            else _parse_gpu_policy_text(gpu_policy, ANNOTATION_GPU_SCHEDULER_POLICY)
        ),
        node_policy=None if node_policy is None else _parse_pod_node_policy(node_policy),
        scoring_weights=parse_scoring_weights(weights) if weights else None,
    )
