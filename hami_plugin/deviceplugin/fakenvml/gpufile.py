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
    mig: false                # MIG mode enabled
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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from hami_plugin.deviceplugin.fakenvml.errors import ERROR_CODES
from hami_plugin.deviceplugin.fakenvml.topology import (
    FakeTopology,
    FakeTopologyError,
    parse_topology,
)


class FakeGpuFileError(ValueError):
    """The fake GPU file is unreadable or invalid; the message names the file and the problem."""


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
)
# NVML's shape: kubelet device IDs `<uuid>-<slot>` map back to the GPU only for it (HAMi's rule in
# `inventory.physical_uuid_of`), so a fake GPU with another shape would be misallocated.
_UUID_RE = re.compile(
    r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_BUS_ID_RE = re.compile(r"^([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
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
        else _DEFAULT_MEMORY_MIB
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
    return FakeGpuSpec(
        uuid=uuid,
        name=name,
        memory_mib=memory_mib,
        numa_node=_int_field(entry, "numa_node", where, minimum=0),
        healthy=_bool_field(entry, "healthy", where, True),
        xid=_int_field(entry, "xid", where, minimum=0),
        mig=_bool_field(entry, "mig", where, False),
        index=resolved_index,
        pci_bus_id=pci_bus_id or f"00000000:{0x10 + resolved_index:02X}:00.0",
        minor_number=resolved_index if minor is None else minor,
        memory_used_mib=memory_used_mib,
        utilization_percent=utilization,
        memory_utilization_percent=memory_utilization,
    )


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
