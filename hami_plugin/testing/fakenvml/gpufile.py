"""The fake GPU file: the YAML file that drives the fake NVML, parsed and validated.

The format (documented in docs/device-plugin.md, "Fake GPUs"):

```yaml
init_error: LibraryNotFound   # optional: nvmlInit fails with this NVML error
gpus:
  - uuid: GPU-<8-4-4-4-12 hex> # required, unique, NVML's shape
    name: NVIDIA A100-SXM4-80GB
    memory_mib: 81920         # null: NVML cannot report memory (NotSupported)
    numa_node: 0              # omitted: NVML has no NUMA call (sysfs fallback is used)
    healthy: true             # false: the GPU is lost (queries raise GpuIsLost)
    xid: 79                   # a new value fires an XidCriticalError event
    mig: false                # MIG mode enabled (current mode)
    mig_pending: false        # the pending MIG mode, when it differs (a reset is due)
    mig_devices:              # MIG devices present at start (needs mig: true and a MIG model)
      - {profile: 1g.10gb, start: 0}          # go-nvlib's profile name, placement start
      - {profile: 3g.40gb, start: 4, uuid: MIG-<8-4-4-4-12 hex>, processes: [4242]}
    processes: [1234]         # pids nvmlDeviceGetComputeRunningProcesses reports on the GPU
    index: 0                  # NVML index (default: position in the list)
    pci_bus_id: 00000000:10:00.0
    minor_number: 0           # /dev/nvidia<minor> (default: the index)
    memory_used_mib: 1024     # used memory reported by nvmlDeviceGetMemoryInfo (default 0)
    utilization_percent: 37   # nvmlDeviceGetUtilizationRates .gpu (default 0; null: NotSupported)
    memory_utilization_percent: 12   # ... .memory (default 0; null: NotSupported)
topology:                     # optional: PCIe levels and NVLinks of GPU pairs (fakenvml.topology)
  preset: hgx-8-nvswitch
```

Edit the usage keys while the daemon runs to see the metrics move (the file is re-read).

MIG models (`fakenvml.migtables`: A100-SXM4-40GB, A100-SXM4-80GB, H100-SXM5-80GB) answer the
MIG calls with their real profiles and placements; their `memory_mib` defaults to the model's.
MIG instances created or destroyed through NVML are kept in `<file>.mig-state.json` next to the
file, so a restarted daemon finds them again; `mig`, `mig_pending` and `mig_devices` seed that
state, and editing them for a GPU re-seeds that GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from hami_plugin.testing.fakenvml.errors import ERROR_CODES
from hami_plugin.testing.fakenvml.migtables import (
    model_profiles,
    model_total_memory_mib,
    profile_display_name,
    resolve_profile,
)
from hami_plugin.testing.fakenvml.topology import (
    FakeTopology,
    FakeTopologyError,
    parse_topology,
)


class FakeGpuFileError(ValueError):
    """The fake GPU file is unreadable or invalid; the message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class FakeMigDeviceSpec:
    """One MIG device of the fake file's `mig_devices` (a GPU instance with its full compute
    instance); validated against the model's profiles and placements."""

    profile: str
    start: int
    uuid: str | None = None
    """None: derived from the parent UUID and the instance ids (`fakenvml.migstate`)."""
    processes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FakeGpuSpec:
    """One GPU of the fake file, defaults filled in."""

    uuid: str
    name: str
    memory_mib: int | None
    numa_node: int | None
    healthy: bool
    xid: int | None
    mig: bool
    index: int
    pci_bus_id: str
    minor_number: int
    memory_used_mib: int = 0
    utilization_percent: int | None = 0
    """None: the GPU cannot report utilisation (`nvmlDeviceGetUtilizationRates` NotSupported)."""
    memory_utilization_percent: int | None = 0
    mig_pending: bool | None = None
    """The pending MIG mode; None: the same as `mig`."""
    mig_devices: tuple[FakeMigDeviceSpec, ...] = ()
    processes: tuple[int, ...] = ()
    """Pids of the compute processes running on the GPU itself."""


@dataclass(frozen=True, slots=True)
class FakeGpuFile:
    """The parsed fake GPU file."""

    gpus: tuple[FakeGpuSpec, ...]
    init_error: str | None = None
    topology: FakeTopology | None = None
    """None: no `topology` key (every pair `system`, no NVLink)."""


_GPU_KEYS = (
    "uuid",
    "name",
    "memory_mib",
    "numa_node",
    "healthy",
    "xid",
    "mig",
    "index",
    "pci_bus_id",
    "minor_number",
    "memory_used_mib",
    "utilization_percent",
    "memory_utilization_percent",
    "mig_pending",
    "mig_devices",
    "processes",
)
_MIG_DEVICE_KEYS = ("profile", "start", "uuid", "processes")
# NVML's shape: kubelet device IDs `<uuid>-<slot>` map back to the GPU only for it (HAMi's rule in
# `inventory.physical_uuid_of`), so a fake GPU with another shape would be misallocated.
_UUID_RE = re.compile(
    r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_BUS_ID_RE = re.compile(r"^([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_MIG_UUID_RE = re.compile(
    r"^MIG-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_DEFAULT_NAME = "NVIDIA Fake GPU"
_DEFAULT_MEMORY_MIB = 16384


def _int_field(entry: Mapping[str, object], key: str, where: str, *, minimum: int) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FakeGpuFileError(f"{where}: '{key}' must be an integer, got {value!r}")
    if value < minimum:
        raise FakeGpuFileError(f"{where}: '{key}' must be >= {minimum}, got {value}")
    return value


def _percent_field(entry: Mapping[str, object], key: str, where: str) -> int | None:
    """A 0..100 value; absent means 0, an explicit null means "NVML cannot report it"."""
    if key not in entry:
        return 0
    value = _int_field(entry, key, where, minimum=0)
    if value is not None and value > 100:
        raise FakeGpuFileError(f"{where}: '{key}' must be <= 100, got {value}")
    return value


def _bool_field(entry: Mapping[str, object], key: str, where: str, default: bool) -> bool:
    value = entry.get(key, default)
    if not isinstance(value, bool):
        raise FakeGpuFileError(f"{where}: '{key}' must be true or false, got {value!r}")
    return value


def _parse_gpu(entry: object, position: int, prefix: str) -> FakeGpuSpec:
    where = f"{prefix}: gpus[{position}]"
    if not isinstance(entry, Mapping):
        raise FakeGpuFileError(f"{where}: expected a mapping, got {entry!r}")
    unknown = sorted(str(key) for key in entry if key not in _GPU_KEYS)
    if unknown:
        raise FakeGpuFileError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_GPU_KEYS)})"
        )
    uuid = entry.get("uuid")
    if uuid is None:
        raise FakeGpuFileError(f"{where}: 'uuid' is required")
    if not isinstance(uuid, str) or not _UUID_RE.match(uuid):
        raise FakeGpuFileError(
            f"{where}: 'uuid' must be an NVML GPU UUID "
            f"(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, hex), got {uuid!r}"
        )
    name = entry.get("name", _DEFAULT_NAME)
    if not isinstance(name, str) or not name.strip():
        raise FakeGpuFileError(f"{where}: 'name' must be a non-empty string, got {name!r}")
    memory_mib = (
        _int_field(entry, "memory_mib", where, minimum=1)
        if "memory_mib" in entry
        else (model_total_memory_mib(name) or _DEFAULT_MEMORY_MIB)
    )
    index = _int_field(entry, "index", where, minimum=0)
    pci_bus_id = entry.get("pci_bus_id")
    if pci_bus_id is not None and (
        not isinstance(pci_bus_id, str) or not _BUS_ID_RE.match(pci_bus_id)
    ):
        raise FakeGpuFileError(
            f"{where}: 'pci_bus_id' must look like 00000000:3B:00.0, got {pci_bus_id!r}"
        )
    resolved_index = position if index is None else index
    minor = _int_field(entry, "minor_number", where, minimum=0)
    memory_used_mib = _int_field(entry, "memory_used_mib", where, minimum=0) or 0
    if memory_mib is not None and memory_used_mib > memory_mib:
        raise FakeGpuFileError(
            f"{where}: 'memory_used_mib' ({memory_used_mib}) exceeds 'memory_mib' ({memory_mib})"
        )
    utilization = _percent_field(entry, "utilization_percent", where)
    memory_utilization = _percent_field(entry, "memory_utilization_percent", where)
    mig = _bool_field(entry, "mig", where, False)
    mig_pending = (
        None if entry.get("mig_pending") is None else _bool_field(entry, "mig_pending", where, mig)
    )
    if mig_pending is not None and not model_profiles(name):
        raise FakeGpuFileError(
            f"{where}: 'mig_pending' needs a MIG-capable model ({_mig_models_hint()}), "
            f"got name {name!r}"
        )
    mig_devices = _parse_mig_devices(entry.get("mig_devices"), where, name, memory_mib, mig)
    return FakeGpuSpec(
        uuid=uuid,
        name=name,
        memory_mib=memory_mib,
        numa_node=_int_field(entry, "numa_node", where, minimum=0),
        healthy=_bool_field(entry, "healthy", where, True),
        xid=_int_field(entry, "xid", where, minimum=0),
        mig=mig,
        index=resolved_index,
        pci_bus_id=pci_bus_id or f"00000000:{0x10 + resolved_index:02X}:00.0",
        minor_number=resolved_index if minor is None else minor,
        memory_used_mib=memory_used_mib,
        utilization_percent=utilization,
        memory_utilization_percent=memory_utilization,
        mig_pending=mig_pending,
        mig_devices=mig_devices,
        processes=_pid_list(entry.get("processes"), f"{where}: 'processes'"),
    )


def _mig_models_hint() -> str:
    return "NVIDIA A100-SXM4-40GB, NVIDIA A100-SXM4-80GB or NVIDIA H100-SXM5-80GB"


def _pid_list(value: object, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or any(
        isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 for pid in value
    ):
        raise FakeGpuFileError(
            f"{where} must be a list of process ids (integers > 0), got {value!r}"
        )
    return tuple(value)


def _parse_mig_devices(
    value: object, where: str, model: str, memory_mib: int | None, mig: bool
) -> tuple[FakeMigDeviceSpec, ...]:
    """`mig_devices`, checked as NVML would refuse to create them: the profile must exist on
    the model, the start must be one of its placements, no two may share a memory slice, and
    no profile may have more instances than NVML allows."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise FakeGpuFileError(f"{where}: 'mig_devices' must be a list, got {value!r}")
    if not value:
        return ()
    if not mig:
        raise FakeGpuFileError(f"{where}: 'mig_devices' needs 'mig: true' (MIG mode enabled)")
    profiles = model_profiles(model)
    if not profiles or memory_mib is None:
        raise FakeGpuFileError(
            f"{where}: 'mig_devices' needs a MIG-capable model ({_mig_models_hint()}) with "
            f"'memory_mib', got name {model!r}"
        )
    known = ", ".join(profile_display_name(profile, memory_mib) for profile in profiles)
    used: dict[int, str] = {}
    counts: dict[int, int] = {}
    uuids: set[str] = set()
    devices: list[FakeMigDeviceSpec] = []
    for position, item in enumerate(value):
        at = f"{where}: mig_devices[{position}]"
        if not isinstance(item, Mapping):
            raise FakeGpuFileError(f"{at}: expected a mapping like {{profile: 1g.10gb, start: 0}}")
        unknown = sorted(str(key) for key in item if key not in _MIG_DEVICE_KEYS)
        if unknown:
            raise FakeGpuFileError(
                f"{at}: unknown key {unknown[0]!r} (known: {', '.join(_MIG_DEVICE_KEYS)})"
            )
        name = item.get("profile")
        if not isinstance(name, str):
            raise FakeGpuFileError(f"{at}: 'profile' is required, e.g. 1g.10gb")
        profile = resolve_profile(model, memory_mib, name)
        if profile is None:
            raise FakeGpuFileError(f"{at}: unknown profile {name!r} for {model} (known: {known})")
        start = item.get("start")
        if isinstance(start, bool) or not isinstance(start, int) or start not in profile.starts:
            starts = ", ".join(str(candidate) for candidate in profile.starts)
            raise FakeGpuFileError(
                f"{at}: 'start' of {name} must be one of its placements ({starts}), got {start!r}"
            )
        for memory_slice in range(start, start + profile.size):
            other = used.get(memory_slice)
            if other is not None:
                raise FakeGpuFileError(
                    f"{at}: {name} at start {start} overlaps {other} (memory slice {memory_slice})"
                )
            used[memory_slice] = f"{name} at start {start}"
        counts[profile.id] = counts.get(profile.id, 0) + 1
        if counts[profile.id] > profile.instance_count:
            raise FakeGpuFileError(
                f"{at}: at most {profile.instance_count} {name} instance(s) fit on {model}"
            )
        uuid = item.get("uuid")
        if uuid is not None:
            if not isinstance(uuid, str) or not _MIG_UUID_RE.match(uuid):
                raise FakeGpuFileError(
                    f"{at}: 'uuid' must be a MIG UUID "
                    f"(MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, hex), got {uuid!r}"
                )
            if uuid in uuids:
                raise FakeGpuFileError(f"{at}: uuid {uuid} appears twice")
            uuids.add(uuid)
        devices.append(
            FakeMigDeviceSpec(
                profile=name,
                start=start,
                uuid=uuid,
                processes=_pid_list(item.get("processes"), f"{at}: 'processes'"),
            )
        )
    return tuple(devices)


def parse_fake_gpus(text: str | bytes, path: str) -> FakeGpuFile:
    """Parse and validate the fake GPU file content. Raises FakeGpuFileError."""
    prefix = f"fake GPU file {path}"
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "syntax error"
        raise FakeGpuFileError(f"{prefix}: not valid YAML{where}: {problem}") from None
    if not isinstance(document, Mapping):
        raise FakeGpuFileError(f"{prefix}: expected a mapping with a 'gpus' list")
    unknown = sorted(str(key) for key in document if key not in ("gpus", "init_error", "topology"))
    if unknown:
        raise FakeGpuFileError(
            f"{prefix}: unknown key {unknown[0]!r} (known: gpus, init_error, topology)"
        )
    entries = document.get("gpus")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise FakeGpuFileError(f"{prefix}: 'gpus' must be a list")
    gpus = tuple(_parse_gpu(entry, position, prefix) for position, entry in enumerate(entries))
    seen_uuids: set[str] = set()
    for gpu in gpus:
        if gpu.uuid in seen_uuids:
            raise FakeGpuFileError(f"{prefix}: uuid {gpu.uuid} appears twice")
        seen_uuids.add(gpu.uuid)
        for device in gpu.mig_devices:
            if device.uuid is None:
                continue
            if device.uuid in seen_uuids:
                raise FakeGpuFileError(f"{prefix}: uuid {device.uuid} appears twice")
            seen_uuids.add(device.uuid)
    if sorted(gpu.index for gpu in gpus) != list(range(len(gpus))):
        raise FakeGpuFileError(
            f"{prefix}: GPU indexes must be 0..{len(gpus) - 1}, each once "
            f"(got {sorted(gpu.index for gpu in gpus)})"
        )
    init_error = document.get("init_error")
    if init_error is not None and (
        not isinstance(init_error, str) or init_error not in ERROR_CODES
    ):
        raise FakeGpuFileError(
            f"{prefix}: 'init_error' must be an NVML error name such as LibraryNotFound or "
            f"DriverNotLoaded, got {init_error!r}"
        )
    topology = None
    if document.get("topology") is not None:
        try:
            topology = parse_topology(document["topology"], len(gpus), prefix)
        except FakeTopologyError as error:
            raise FakeGpuFileError(str(error)) from None
    return FakeGpuFile(
        gpus=tuple(sorted(gpus, key=lambda gpu: gpu.index)),
        init_error=init_error,
        topology=topology,
    )


def load_fake_gpus(path: str) -> FakeGpuFile:
    """Read and validate a fake GPU file. Raises FakeGpuFileError."""
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except OSError as error:
        raise FakeGpuFileError(
            f"fake GPU file {path}: cannot read: {error.strerror or error}"
        ) from None
    return parse_fake_gpus(data, path)
