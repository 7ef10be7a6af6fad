"""`hami decode` and `hami encode`: inspect and build real HAMi annotation values.

JSON shapes (stable, every field present):
- `hami.io/vgpu-devices-to-allocate`, `hami.io/vgpu-devices-allocated`: a list of containers,
  each a list of `{"uuid", "type", "usedmem", "usedcores"}`;
- `hami.io/node-nvidia-register`: a list of
  `{"id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health"}`
  (plus `"migProfiles"` when the GPU has any);
- `hami.io/mutex.lock`: `{"time", "namespace", "pod"}` (namespace and pod null for a legacy lock).
`decode` also reads the pod-level user annotations and the handshake (no `encode` for those).
`encode` takes those shapes and, for the register annotation, HAMi's own JSON too, where Go's
omitempty leaves out `index`, `numa`, `mode` and `health` when zero (`gpu_devices_from_json`);
a bad input gets every problem reported, a line each.

HAMi's parsers accept values that hold no device at all: a pod device list skips every piece
without a `,` (`garbage` decodes to `[[]]`), a comma-form register skips empty segments (`:`
decodes to `[]`). `decode` prints what the value decodes to and, when that is no device or a
piece was skipped, says so on stderr and exits 1: a user tool should not let `[[]]` pass for
an answer. (A `hami.io/vgpu-devices-to-allocate` of empty containers, `;;`, is what HAMi's
device plugin leaves once every container is allocated: no devices, exit 1, and stderr says
so.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from hami_plugin.protocol import codec, govalues, nodelock
from hami_plugin.protocol.govalues import excerpt
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICE_CORDON,
    ANNOTATION_DEVICE_SCORING_WEIGHTS,
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_GPU_SCHEDULER_POLICY,
    ANNOTATION_NODE_HANDSHAKE,
    ANNOTATION_NODE_LOCK,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_NODE_SCHEDULER_POLICY,
    ANNOTATION_NOUSE_GPUTYPE,
    ANNOTATION_NOUSE_GPUUUID,
    ANNOTATION_NUMA_BIND,
    ANNOTATION_USE_GPUTYPE,
    ANNOTATION_USE_GPUUUID,
    ContainerDevice,
    GpuDevice,
    MigPlacement,
    MigProfile,
    PodDevices,
)

_POD_DEVICE_KEYS = (ANNOTATION_DEVICES_TO_ALLOCATE, ANNOTATION_DEVICES_ALLOCATED)


class _InputError(ValueError):
    """The JSON given to `hami encode` does not have the documented shape."""


# --- values -> JSON ----------------------------------------------------------------------


def pod_devices_to_json(pod: PodDevices) -> list[list[dict[str, Any]]]:
    """A pod device list in the JSON shape of the module docstring."""
    return [
        [
            {
                "uuid": device.uuid,
                "type": device.type,
                "usedmem": device.used_mem_mib,
                "usedcores": device.used_cores,
            }
            for device in container
        ]
        for container in pod
    ]


def gpu_device_to_json(device: GpuDevice) -> dict[str, Any]:
    """One registered GPU in the JSON shape of the module docstring."""
    obj: dict[str, Any] = {
        "id": device.uuid,
        "index": device.index,
        "count": device.split_count,
        "devmem": device.memory_mib,
        "devcore": device.cores_percent,
        "type": device.type,
        "numa": device.numa_node,
        "mode": device.mode,
        "health": device.healthy,
    }
    if device.mig_profiles:
        obj["migProfiles"] = [
            {
                "name": profile.name,
                "memoryMB": profile.memory_mib,
                "core": profile.cores,
                "sliceCount": profile.slice_count,
                "placements": [{"start": p.start, "size": p.size} for p in profile.placements],
            }
            for profile in device.mig_profiles
        ]
    return obj


def _optional_list(items: tuple[str, ...] | None) -> list[str] | None:
    return None if items is None else list(items)


def _decode_to_json(key: str, value: str) -> Any:
    if key in _POD_DEVICE_KEYS:
        return pod_devices_to_json(codec.decode_pod_devices(value, key))
    if key == ANNOTATION_NODE_REGISTER:
        return [gpu_device_to_json(device) for device in codec.decode_node_devices(value)]
    if key == ANNOTATION_NODE_LOCK:
        lock = nodelock.parse_node_lock(value)
        return {
            "time": govalues.format_rfc3339(lock.time),
            "namespace": lock.namespace,
            "pod": lock.pod_name,
        }
    if key == ANNOTATION_NODE_HANDSHAKE:
        handshake = codec.parse_handshake(value)
        when = handshake.time.strftime("%Y-%m-%d %H:%M:%S") if handshake.time else None
        return {"state": handshake.state.value, "time": when}
    if key == ANNOTATION_DEVICE_SCORING_WEIGHTS:
        weights = codec.parse_scoring_weights(value)
        return {"slot": weights.slot, "core": weights.core, "memory": weights.memory}
    if key == ANNOTATION_GPU_SCHEDULER_POLICY:
        policy = codec.parse_gpu_policy(value)
        return {"names": [name.value for name in policy.names], "chain": policy.chain}
    if key == ANNOTATION_NODE_SCHEDULER_POLICY:
        return codec.parse_node_policy(value).value
    if key == ANNOTATION_DEVICE_CORDON:
        return sorted(codec.parse_device_cordon(value))
    options = codec.parse_pod_gpu_options({key: value})
    simple: dict[str, Callable[[], Any]] = {
        ANNOTATION_USE_GPUTYPE: lambda: _optional_list(options.use_gpu_types),
        ANNOTATION_NOUSE_GPUTYPE: lambda: _optional_list(options.nouse_gpu_types),
        ANNOTATION_USE_GPUUUID: lambda: _optional_list(options.use_gpu_uuids),
        ANNOTATION_NOUSE_GPUUUID: lambda: _optional_list(options.nouse_gpu_uuids),
        ANNOTATION_NUMA_BIND: lambda: options.numa_bind,
    }
    if key in simple:
        return simple[key]()
    raise _InputError(f"unsupported annotation key {key!r}")


def _skipped_pieces(value: str) -> list[str]:
    """The pieces of a pod device list HAMi's DecodeContainerDevices skips: not empty, no `,`
    (the rule of `codec.decode_container_devices`)."""
    return [
        piece
        for container in value.split(";")
        for piece in container.split(":")
        if piece and "," not in piece
    ]


def _hollow_value(key: str, value: str, decoded: Any) -> str | None:
    """Why a decoded device list does not say what it seems to (None when it does): it holds
    no device, or HAMi's parser skipped part of it."""
    if key in _POD_DEVICE_KEYS:
        skipped = _skipped_pieces(value)
        devices = sum(len(container) for container in decoded)
    elif key == ANNOTATION_NODE_REGISTER:
        skipped, devices = [], len(decoded)
    else:
        return None
    if skipped:
        shown = ", ".join(excerpt(piece) for piece in skipped[:3])
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        skips = f"HAMi's parser skips {shown}{more} (a device is uuid,type,usedmem,usedcores)"
        if not devices:
            return f"{key}: decodes to no devices: {skips} and accepts the value"
        return f"{key}: {skips}; the devices printed are the rest"
    if devices:
        return None
    if key == ANNOTATION_DEVICES_TO_ALLOCATE and decoded:
        # HAMi's device plugin empties each container's entry once it is allocated
        return f"{key}: decodes to no devices: every container is empty (allocated, or no GPU)"
    return f"{key}: decodes to no devices (HAMi's parser accepts it too)"


# --- JSON -> values ----------------------------------------------------------------------


_ZERO: dict[type, Any] = {int: 0, str: "", bool: False}


class _Problems:
    """Every problem of one input, gathered so that `hami encode` reports them all at once."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def field(self, obj: Any, name: str, kind: type, where: str, *, optional: bool = False) -> Any:
        """`obj[name]`, of `kind`; its zero value, and a problem noted, when it is missing (and
        not `optional`: Go's omitempty leaves zero values out) or of another kind."""
        if not isinstance(obj, dict):
            return _ZERO[kind]  # noted once by `object`
        value = obj.get(name)
        if value is None:
            if name not in obj and not optional:
                self.lines.append(f'{where} has no "{name}"')
            return _ZERO[kind]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            self.lines.append(f'{where}: "{name}" must be an integer')
            return 0
        if not isinstance(value, kind):
            self.lines.append(f'{where}: "{name}" must be a {kind.__name__}')
            return _ZERO[kind]
        return value

    def object(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            self.lines.append(f"{where} must be a JSON object")

    def list(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []  # Go writes a nil slice as null
        if not isinstance(value, list):
            self.lines.append(f"{where} must be a JSON list")
            return []
        return value

    def check(self) -> None:
        """Raises _InputError with one line per problem, if there is any."""
        if self.lines:
            raise _InputError("\n".join(self.lines))


def pod_devices_from_json(data: Any) -> PodDevices:
    """The inverse of `pod_devices_to_json`; raises ValueError naming every misshapen part,
    a line each."""
    problems = _Problems()
    containers = []
    for c_index, container in enumerate(problems.list(data, "the input")):
        devices = []
        for d_index, obj in enumerate(problems.list(container, f"container {c_index}")):
            where = f"container {c_index} device {d_index}"
            problems.object(obj, where)
            devices.append(
                ContainerDevice(
                    uuid=problems.field(obj, "uuid", str, where),
                    type=problems.field(obj, "type", str, where),
                    used_mem_mib=problems.field(obj, "usedmem", int, where),
                    used_cores=problems.field(obj, "usedcores", int, where),
                )
            )
        containers.append(tuple(devices))
    problems.check()
    return tuple(containers)


def _mig_profiles_from_json(obj: Any, where: str, problems: _Problems) -> tuple[MigProfile, ...]:
    profiles = []
    raw_profiles = obj.get("migProfiles") if isinstance(obj, dict) else None
    for p_index, raw in enumerate(problems.list(raw_profiles, f"{where} migProfiles")):
        at = f"{where} migProfiles[{p_index}]"
        problems.object(raw, at)
        raw_placements = raw.get("placements") if isinstance(raw, dict) else None
        if isinstance(raw, dict) and "placements" not in raw:
            problems.lines.append(f'{at} has no "placements"')
        placements = []
        for item in problems.list(raw_placements, f"{at} placements"):
            problems.object(item, f"{at} placement")
            placements.append(
                MigPlacement(
                    problems.field(item, "start", int, f"{at} placement"),
                    problems.field(item, "size", int, f"{at} placement"),
                )
            )
        profiles.append(
            MigProfile(
                name=problems.field(raw, "name", str, at),
                memory_mib=problems.field(raw, "memoryMB", int, at),
                cores=problems.field(raw, "core", int, at),
                slice_count=problems.field(raw, "sliceCount", int, at),
                placements=tuple(placements),
            )
        )
    return tuple(profiles)


def gpu_devices_from_json(data: Any) -> list[GpuDevice]:
    """The inverse of `gpu_device_to_json` over a list, and HAMi's own JSON of the annotation:
    `index`, `numa`, `mode`, `health` and `migProfiles` may be left out (Go's omitempty drops
    GPU 0's index, NUMA node 0, an empty mode, an unhealthy GPU's `health`) and read as zero;
    `id`, `count`, `devmem`, `devcore` and `type`, which every registered GPU has, may not.
    Raises ValueError naming every misshapen part, a line each."""
    problems = _Problems()
    devices = []
    for index, obj in enumerate(problems.list(data, "the input")):
        where = f"device {index}"
        problems.object(obj, where)
        devices.append(
            GpuDevice(
                uuid=problems.field(obj, "id", str, where),
                index=problems.field(obj, "index", int, where, optional=True),
                split_count=problems.field(obj, "count", int, where),
                memory_mib=problems.field(obj, "devmem", int, where),
                cores_percent=problems.field(obj, "devcore", int, where),
                type=problems.field(obj, "type", str, where),
                numa_node=problems.field(obj, "numa", int, where, optional=True),
                mode=problems.field(obj, "mode", str, where, optional=True),
                healthy=problems.field(obj, "health", bool, where, optional=True),
                mig_profiles=_mig_profiles_from_json(obj, where, problems),
            )
        )
    problems.check()
    return devices


def _encode_from_json(key: str, data: Any) -> str:
    if key in _POD_DEVICE_KEYS:
        return codec.encode_pod_devices(pod_devices_from_json(data), key)
    if key == ANNOTATION_NODE_REGISTER:
        return codec.encode_node_devices(gpu_devices_from_json(data))
    if key == ANNOTATION_NODE_LOCK:
        problems = _Problems()
        problems.object(data, "the lock")
        time = problems.field(data, "time", str, "the lock")
        problems.check()
        lock = nodelock.parse_node_lock(time)
        namespace, pod = data.get("namespace"), data.get("pod")
        if (namespace is None) != (pod is None):
            raise _InputError('the lock needs both "namespace" and "pod", or neither')
        return nodelock.format_node_lock(nodelock.NodeLock(lock.time, namespace, pod))
    raise _InputError(f"cannot encode annotation key {key!r}")


# --- sub-commands ------------------------------------------------------------------------


def _read_value(value: str) -> str:
    if value != "-":
        return value
    text = sys.stdin.read()
    return text[:-1] if text.endswith("\n") else text


def run_decode(args: argparse.Namespace) -> int:
    """`hami decode KEY VALUE`: print the value as JSON; 1 and one line on stderr if bad, or
    if it decodes to no devices or part of it to nothing (the JSON is printed then too)."""
    value = _read_value(args.value)
    try:
        result = _decode_to_json(args.key, value)
    except (codec.AnnotationError, _InputError) as error:
        print(f"hami decode: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=args.indent, ensure_ascii=False), flush=True)
    hollow = _hollow_value(args.key, value, result)
    if hollow is not None:
        print(f"hami decode: {hollow}", file=sys.stderr)
        return 1
    return 0


def run_encode(args: argparse.Namespace) -> int:
    """`hami encode KEY` < JSON: print the annotation value; 1 and one line on stderr if bad."""
    try:
        data = json.loads(sys.stdin.read())
        value = _encode_from_json(args.key, data)
    except json.JSONDecodeError as error:
        print(f"hami encode: input is not JSON: {error}", file=sys.stderr)
        return 1
    except (codec.AnnotationError, _InputError, ValueError) as error:
        for line in str(error).splitlines():
            print(f"hami encode: {line}", file=sys.stderr)
        return 1
    print(value)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `hami decode` and `hami encode`."""
    decode = subparsers.add_parser(
        "decode",
        help="decode a HAMi annotation value into JSON",
        description=(
            "Decode a HAMi annotation value and print it as JSON. Exit 1 on a value that "
            "does not decode, or that decodes to no devices or partly to nothing (HAMi's "
            "parser accepts those: the JSON is printed and stderr says what was skipped)."
        ),
    )
    decode.add_argument("key", help="annotation key, e.g. hami.io/vgpu-devices-allocated")
    decode.add_argument("value", help="annotation value, or - to read it from stdin")
    decode.add_argument("--indent", type=int, default=None, help="pretty-print with this indent")
    decode.set_defaults(func=run_decode)
    encode = subparsers.add_parser(
        "encode",
        help="encode JSON (stdin) into a HAMi annotation value",
        description="Read JSON on stdin (the shape `hami decode` prints) and print the value.",
    )
    encode.add_argument("key", help="annotation key")
    encode.set_defaults(func=run_encode)
