"""A fake NVML driven by a YAML file, so every daemon code path runs without a GPU.

`FakeNvml(path)` is module-like: it has the attributes of `pynvml` that hami-plugin calls
(`nvmlInit`, `nvmlDeviceGetHandleByIndex`, the event-set calls, `NVMLError` and its
subclasses, the event-type constants ...), with pynvml's semantics: errors are `NVMLError`
subclasses carrying the NVML `.value` code, calls before `nvmlInit` raise
`NVMLError_Uninitialized`, `nvmlEventSetWait` raises `NVMLError_Timeout` when nothing arrived.

The file format (documented in the README):

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
```

Edit the usage keys while the daemon runs to see the metrics move (the file is re-read).

The file is re-read when it changes: on every call when its stat changes, and every ~100 ms
inside `nvmlEventSetWait`. `healthy` going from true to false, or `xid` taking a new value,
delivers one XidCriticalError event (event data = `xid`, default 79) to every event set the GPU
is registered with. A file that turns invalid while running is reported once in the log and
the last good content stays in force; an invalid file at `nvmlInit` makes init fail with a
message naming the file and the problem.
"""

# The names below copy pynvml's (NVMLError_GpuIsLost, nvmlEventTypeXidCriticalError ...) so that
# the fake is a drop-in for the module.
# ruff: noqa: N801, N816, N818

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import yaml

logger = logging.getLogger(__name__)

DEFAULT_XID = 79
"""Xid reported when a GPU turns `healthy: false` without an explicit `xid` (fallen off the bus)."""

_POLL_SECONDS = 0.1

# --- NVML constants (same values as pynvml) ----------------------------------------------------

NVML_SUCCESS = 0
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypeNone = 0x0
_SUPPORTED_EVENTS = (
    nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError
)
_NOT_APPLICABLE = 0xFFFFFFFF

# --- errors -----------------------------------------------------------------------------------


class NVMLError(Exception):
    """Base NVML error; `.value` is the NVML return code, as in pynvml."""

    _strings: ClassVar[dict[int, str]] = {}

    def __init__(self, value: int, detail: str | None = None) -> None:
        super().__init__(value)
        self.value = value
        self.detail = detail

    def __str__(self) -> str:
        if self.detail:
            return self.detail
        return self._strings.get(self.value, f"NVML Error with code {self.value}")


class _CodedError(NVMLError):
    CODE: ClassVar[int] = 999

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(self.CODE, detail)


class NVMLError_Uninitialized(_CodedError):
    CODE = 1


class NVMLError_InvalidArgument(_CodedError):
    CODE = 2


class NVMLError_NotSupported(_CodedError):
    CODE = 3


class NVMLError_NoPermission(_CodedError):
    CODE = 4


class NVMLError_AlreadyInitialized(_CodedError):
    CODE = 5


class NVMLError_NotFound(_CodedError):
    CODE = 6


class NVMLError_InsufficientSize(_CodedError):
    CODE = 7


class NVMLError_DriverNotLoaded(_CodedError):
    CODE = 9


class NVMLError_Timeout(_CodedError):
    CODE = 10


class NVMLError_LibraryNotFound(_CodedError):
    CODE = 12


class NVMLError_FunctionNotFound(_CodedError):
    CODE = 13


class NVMLError_CorruptedInforom(_CodedError):
    CODE = 14


class NVMLError_GpuIsLost(_CodedError):
    CODE = 15


class NVMLError_ResetRequired(_CodedError):
    CODE = 16


class NVMLError_LibRmVersionMismatch(_CodedError):
    CODE = 18


class NVMLError_InUse(_CodedError):
    CODE = 19


class NVMLError_Memory(_CodedError):
    CODE = 20


class NVMLError_NoData(_CodedError):
    CODE = 21


class NVMLError_NotReady(_CodedError):
    CODE = 27


class NVMLError_GpuNotFound(_CodedError):
    CODE = 28


class NVMLError_Unknown(_CodedError):
    CODE = 999


_ERROR_CLASSES: dict[int, type[_CodedError]] = {
    cls.CODE: cls
    for cls in (
        NVMLError_Uninitialized,
        NVMLError_InvalidArgument,
        NVMLError_NotSupported,
        NVMLError_NoPermission,
        NVMLError_AlreadyInitialized,
        NVMLError_NotFound,
        NVMLError_InsufficientSize,
        NVMLError_DriverNotLoaded,
        NVMLError_Timeout,
        NVMLError_LibraryNotFound,
        NVMLError_FunctionNotFound,
        NVMLError_CorruptedInforom,
        NVMLError_GpuIsLost,
        NVMLError_ResetRequired,
        NVMLError_LibRmVersionMismatch,
        NVMLError_InUse,
        NVMLError_Memory,
        NVMLError_NoData,
        NVMLError_NotReady,
        NVMLError_GpuNotFound,
        NVMLError_Unknown,
    )
}
_ERROR_NAMES = {
    cls.__name__.removeprefix("NVMLError_"): code for code, cls in _ERROR_CLASSES.items()
}
NVMLError._strings = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    18: "RM has detected an NVML/RM version mismatch.",
    19: "In Use",
    20: "Insufficient Memory",
    21: "No Data",
    27: "Not Ready",
    28: "GPU Not Found",
    999: "Unknown Error",
}


def nvmlExceptionClass(code: int) -> type[NVMLError]:
    """The NVMLError subclass for an NVML return code (pynvml raises ValueError if unknown)."""
    try:
        return _ERROR_CLASSES[code]
    except KeyError:
        raise ValueError(f"nvmlErrorCode {code} is not valid") from None


_NvmlErrorType = NVMLError


def _error(code: int, detail: str | None = None) -> NVMLError:
    return _ERROR_CLASSES[code](detail)


# --- the file ----------------------------------------------------------------------------------


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
    unknown = sorted(str(key) for key in document if key not in ("gpus", "init_error"))
    if unknown:
        raise FakeGpuFileError(f"{prefix}: unknown key {unknown[0]!r} (known: gpus, init_error)")
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
        not isinstance(init_error, str) or init_error not in _ERROR_NAMES
    ):
        raise FakeGpuFileError(
            f"{prefix}: 'init_error' must be an NVML error name such as LibraryNotFound or "
            f"DriverNotLoaded, got {init_error!r}"
        )
    return FakeGpuFile(gpus=tuple(sorted(gpus, key=lambda gpu: gpu.index)), init_error=init_error)


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


# --- NVML-shaped values ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FakeDeviceHandle:
    """What `nvmlDeviceGetHandleBy*` returns: the GPU is looked up by UUID on every call."""

    uuid: str


@dataclass(frozen=True, slots=True)
class FakeMemoryInfo:
    total: int
    free: int
    used: int


@dataclass(frozen=True, slots=True)
class FakeUtilization:
    """Shaped like pynvml's c_nvmlUtilization_t (percent of the last sample period)."""

    gpu: int
    memory: int


@dataclass(frozen=True, slots=True)
class FakePciInfo:
    busId: str
    busIdLegacy: str


@dataclass(slots=True)
class FakeEventData:
    """Shaped like pynvml's c_nvmlEventData_t."""

    device: FakeDeviceHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = _NOT_APPLICABLE
    computeInstanceId: int = _NOT_APPLICABLE


@dataclass(slots=True)
class FakeEventSet:
    registered: dict[str, int] = field(default_factory=dict)
    queue: deque[FakeEventData] = field(default_factory=deque)
    freed: bool = False


# --- the module-like fake -----------------------------------------------------------------------


class FakeNvml:
    """pynvml look-alike backed by a YAML file (see the module docstring for the format)."""

    NVML_SUCCESS = NVML_SUCCESS
    NVML_DEVICE_MIG_DISABLE = NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_UNKNOWN = 999
    nvmlEventTypeSingleBitEccError = nvmlEventTypeSingleBitEccError
    nvmlEventTypeDoubleBitEccError = nvmlEventTypeDoubleBitEccError
    nvmlEventTypePState = nvmlEventTypePState
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    nvmlEventTypeClock = nvmlEventTypeClock
    nvmlEventTypeNone = nvmlEventTypeNone

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_AlreadyInitialized = NVMLError_AlreadyInitialized
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_InsufficientSize = NVMLError_InsufficientSize
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_CorruptedInforom = NVMLError_CorruptedInforom
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_ResetRequired = NVMLError_ResetRequired
    NVMLError_LibRmVersionMismatch = NVMLError_LibRmVersionMismatch
    NVMLError_InUse = NVMLError_InUse
    NVMLError_Memory = NVMLError_Memory
    NVMLError_NoData = NVMLError_NoData
    NVMLError_NotReady = NVMLError_NotReady
    NVMLError_GpuNotFound = NVMLError_GpuNotFound
    NVMLError_Unknown = NVMLError_Unknown

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._init_count = 0
        self._gpus: dict[str, FakeGpuSpec] = {}
        self._by_index: dict[int, str] = {}
        self._init_error: str | None = None
        self._stat: tuple[int, int, int, int] | None = None
        self._raw: bytes | None = None
        self._problem: str | None = None
        self._event_sets: list[FakeEventSet] = []
        self._wait_errors: deque[int] = deque()

    @staticmethod
    def nvmlExceptionClass(code: int) -> type[_NvmlErrorType]:
        return nvmlExceptionClass(code)

    @staticmethod
    def nvmlErrorString(result: int) -> str:
        return str(NVMLError(result))

    # -- file watching --

    def _refresh(self, *, force_read: bool = False) -> None:
        """Re-read the file if it changed; apply it and deliver the events its changes mean."""
        try:
            status = os.stat(self.path)
        except OSError as error:
            self._set_problem(f"cannot read: {error.strerror or error}")
            return
        signature = (status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
        with self._lock:
            if signature == self._stat and not force_read and self._problem is None:
                return
            self._stat = signature
        try:
            with open(self.path, "rb") as stream:
                data = stream.read()
        except OSError as error:
            self._set_problem(f"cannot read: {error.strerror or error}")
            return
        with self._lock:
            if data == self._raw:
                return
            self._raw = data
        try:
            parsed = parse_fake_gpus(data, self.path)
        except FakeGpuFileError as error:
            self._set_problem(str(error).removeprefix(f"fake GPU file {self.path}: "))
            return
        self._apply(parsed)

    def _set_problem(self, problem: str) -> None:
        with self._lock:
            if problem == self._problem:
                return
            self._problem = problem
            # A later good read must not be mistaken for "unchanged".
            self._raw = None
            had_state = bool(self._gpus) or self._init_error is not None
        if had_state:
            logger.error("fake GPU file %s: %s; keeping the last good content", self.path, problem)

    def _apply(self, parsed: FakeGpuFile) -> None:
        with self._changed:
            previous = self._gpus
            recovered = self._problem is not None and bool(previous)
            self._problem = None
            self._gpus = {gpu.uuid: gpu for gpu in parsed.gpus}
            self._by_index = {gpu.index: gpu.uuid for gpu in parsed.gpus}
            self._init_error = parsed.init_error
            for gpu in parsed.gpus:
                old = previous.get(gpu.uuid)
                if old is None:
                    continue
                went_bad = old.healthy and not gpu.healthy
                new_xid = gpu.xid is not None and gpu.xid != old.xid
                if went_bad or new_xid:
                    xid = gpu.xid if gpu.xid is not None else DEFAULT_XID
                    logger.info("fake GPU %s: Xid %d event (from %s)", gpu.uuid, xid, self.path)
                    self._deliver_locked(gpu.uuid, nvmlEventTypeXidCriticalError, xid)
            self._changed.notify_all()
        if recovered:
            logger.info("fake GPU file %s is valid again: %d GPU(s)", self.path, len(parsed.gpus))
        else:
            logger.debug("fake GPU file %s loaded: %d GPU(s)", self.path, len(parsed.gpus))

    def _deliver_locked(self, uuid: str, event_type: int, data: int) -> None:
        for event_set in self._event_sets:
            if event_set.registered.get(uuid, 0) & event_type:
                event_set.queue.append(FakeEventData(FakeDeviceHandle(uuid), event_type, data))

    # -- test hooks (not part of pynvml) --

    def inject_event(
        self, uuid: str, event_type: int = nvmlEventTypeXidCriticalError, data: int = DEFAULT_XID
    ) -> None:
        """Deliver an event as if NVML had reported it (for tests)."""
        with self._changed:
            self._deliver_locked(uuid, event_type, data)
            self._changed.notify_all()

    def inject_wait_error(self, code: int = 999) -> None:
        """Make the next `nvmlEventSetWait` raise the NVML error with this code (for tests)."""
        with self._changed:
            self._wait_errors.append(code)
            self._changed.notify_all()

    # -- init --

    def _check_init(self) -> None:
        if self._init_count == 0:
            raise NVMLError_Uninitialized()

    def nvmlInit(self) -> None:
        self._refresh(force_read=True)
        with self._lock:
            if self._problem is not None:
                raise NVMLError_Unknown(f"fake GPU file {self.path}: {self._problem}")
            if self._init_error is not None:
                raise _error(_ERROR_NAMES[self._init_error])
            self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count == 0:
                raise NVMLError_Uninitialized()
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return "0.0.0-fake"

    # -- devices --

    def _lookup(self, handle: FakeDeviceHandle, *, live: bool) -> FakeGpuSpec:
        self._check_init()
        self._refresh()
        if not isinstance(handle, FakeDeviceHandle):
            raise NVMLError_InvalidArgument()
        with self._lock:
            gpu = self._gpus.get(handle.uuid)
        if gpu is None or (live and not gpu.healthy):
            raise NVMLError_GpuIsLost()
        return gpu

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        self._refresh()
        with self._lock:
            return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDeviceHandle:
        self._check_init()
        self._refresh()
        with self._lock:
            uuid = self._by_index.get(index)
        if uuid is None:
            raise NVMLError_InvalidArgument()
        return FakeDeviceHandle(uuid)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeDeviceHandle:
        self._check_init()
        self._refresh()
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        with self._lock:
            known = text in self._gpus
        if not known:
            raise NVMLError_NotFound()
        return FakeDeviceHandle(text)

    def nvmlDeviceGetUUID(self, handle: FakeDeviceHandle) -> str:
        return self._lookup(handle, live=False).uuid

    def nvmlDeviceGetIndex(self, handle: FakeDeviceHandle) -> int:
        return self._lookup(handle, live=False).index

    def nvmlDeviceGetName(self, handle: FakeDeviceHandle) -> str:
        return self._lookup(handle, live=True).name

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeDeviceHandle, version: object = None
    ) -> FakeMemoryInfo:
        gpu = self._lookup(handle, live=True)
        if gpu.memory_mib is None:
            raise NVMLError_NotSupported()
        total = gpu.memory_mib * 1024 * 1024
        used = gpu.memory_used_mib * 1024 * 1024
        return FakeMemoryInfo(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDeviceHandle) -> FakeUtilization:
        gpu = self._lookup(handle, live=True)
        if gpu.utilization_percent is None or gpu.memory_utilization_percent is None:
            raise NVMLError_NotSupported()
        return FakeUtilization(gpu=gpu.utilization_percent, memory=gpu.memory_utilization_percent)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeDeviceHandle) -> int:
        gpu = self._lookup(handle, live=True)
        if gpu.numa_node is None:
            raise NVMLError_NotSupported()
        return gpu.numa_node

    def nvmlDeviceGetPciInfo(self, handle: FakeDeviceHandle) -> FakePciInfo:
        gpu = self._lookup(handle, live=True)
        return FakePciInfo(busId=gpu.pci_bus_id, busIdLegacy=gpu.pci_bus_id[-12:])

    def nvmlDeviceGetMigMode(self, handle: FakeDeviceHandle) -> list[int]:
        gpu = self._lookup(handle, live=True)
        mode = NVML_DEVICE_MIG_ENABLE if gpu.mig else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMinorNumber(self, handle: FakeDeviceHandle) -> int:
        return self._lookup(handle, live=True).minor_number

    # -- events --

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check_init()
        event_set = FakeEventSet()
        with self._lock:
            self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeDeviceHandle) -> int:
        self._lookup(handle, live=True)
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(
        self, handle: FakeDeviceHandle, event_types: int, event_set: FakeEventSet
    ) -> None:
        gpu = self._lookup(handle, live=True)
        if event_types & ~_SUPPORTED_EVENTS:
            raise NVMLError_NotSupported()
        with self._lock:
            if event_set.freed:
                raise NVMLError_InvalidArgument()
            event_set.registered[gpu.uuid] = event_set.registered.get(gpu.uuid, 0) | event_types

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeoutms: int) -> FakeEventData:
        """Next event of the set; raises NVMLError_Timeout after `timeoutms` without one."""
        self._check_init()
        deadline = time.monotonic() + max(timeoutms, 0) / 1000.0
        while True:
            self._refresh(force_read=True)
            with self._changed:
                if event_set.freed:
                    raise NVMLError_InvalidArgument()
                if self._wait_errors:
                    raise _error(self._wait_errors.popleft())
                if event_set.queue:
                    return event_set.queue.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NVMLError_Timeout()
                self._changed.wait(min(_POLL_SECONDS, remaining))

    nvmlEventSetWait_v2 = nvmlEventSetWait

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._check_init()
        with self._changed:
            event_set.freed = True
            if event_set in self._event_sets:
                self._event_sets.remove(event_set)
            self._changed.notify_all()
