"""`FakeNvml`: a pynvml look-alike driven by the fake GPU file (`fakenvml.gpufile`).

`FakeNvml(path)` is module-like: it has the attributes of `pynvml` that hami-plugin calls
(`nvmlInit`, `nvmlDeviceGetHandleByIndex`, the event-set calls, `NVMLError` and its
subclasses, the event-type constants ...), with pynvml's semantics: errors are `NVMLError`
subclasses carrying the NVML `.value` code, calls before `nvmlInit` raise
`NVMLError_Uninitialized`, `nvmlEventSetWait` raises `NVMLError_Timeout` when nothing arrived.

The file is re-read when it changes: on every call when its stat changes, and every ~100 ms
inside `nvmlEventSetWait`. `healthy` going from true to false, or `xid` taking a new value,
delivers one XidCriticalError event (event data = `xid`, default 79) to every event set the GPU
is registered with. A file that turns invalid while running is reported once in the log and
the last good content stays in force; an invalid file at `nvmlInit` makes init fail with a
message naming the file and the problem.

MIG (`fakenvml.migcalls`, `fakenvml.migdevices`): the modelled GPUs answer pynvml's MIG calls
with their real profiles and placements; instances live in `<file>.mig-state.json`
(`fakenvml.migstate`).
"""

# The names below copy pynvml's (NVMLError_GpuIsLost, nvmlEventTypeXidCriticalError ...) so that
# the fake is a drop-in for the module.

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque

from hami_plugin.testing.fakenvml.errors import (
    ERROR_CODES,
    NVML_SUCCESS,
    NVMLError,
    NVMLError_AlreadyInitialized,
    NVMLError_ArgumentVersionMismatch,
    NVMLError_CorruptedInforom,
    NVMLError_Deprecated,
    NVMLError_DriverNotLoaded,
    NVMLError_FunctionNotFound,
    NVMLError_GpuIsLost,
    NVMLError_GpuNotFound,
    NVMLError_InsufficientResources,
    NVMLError_InsufficientSize,
    NVMLError_InUse,
    NVMLError_InvalidArgument,
    NVMLError_InvalidState,
    NVMLError_LibraryNotFound,
    NVMLError_LibRmVersionMismatch,
    NVMLError_Memory,
    NVMLError_NoData,
    NVMLError_NoPermission,
    NVMLError_NotFound,
    NVMLError_NotReady,
    NVMLError_NotSupported,
    NVMLError_ResetRequired,
    NVMLError_Timeout,
    NVMLError_Uninitialized,
    NVMLError_Unknown,
    nvml_error,
    nvmlExceptionClass,
)
from hami_plugin.testing.fakenvml.gpufile import (
    FakeGpuFile,
    FakeGpuFileError,
    FakeGpuSpec,
    parse_fake_gpus,
)
from hami_plugin.testing.fakenvml.migcalls import MigCalls
from hami_plugin.testing.fakenvml.migdevices import MigDeviceCalls
from hami_plugin.testing.fakenvml.migvalues import FakeMigDeviceHandle
from hami_plugin.testing.fakenvml.topology import (
    NVML_FEATURE_DISABLED,
    NVML_FEATURE_ENABLED,
    NVML_NVLINK_DEVICE_TYPE_GPU,
    NVML_NVLINK_DEVICE_TYPE_IBMNPU,
    NVML_NVLINK_DEVICE_TYPE_SWITCH,
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
    NVML_NVLINK_MAX_LINKS,
    NVML_TOPOLOGY_HOSTBRIDGE,
    NVML_TOPOLOGY_INTERNAL,
    NVML_TOPOLOGY_MULTIPLE,
    NVML_TOPOLOGY_NODE,
    NVML_TOPOLOGY_SINGLE,
    NVML_TOPOLOGY_SYSTEM,
    FakeTopology,
    NvLinkLane,
)
from hami_plugin.testing.fakenvml.values import (
    NVML_DEVICE_MIG_DISABLE,
    NVML_DEVICE_MIG_ENABLE,
    SUPPORTED_EVENTS,
    FakeDeviceHandle,
    FakeEventData,
    FakeEventSet,
    FakeMemoryInfo,
    FakePciInfo,
    FakeUtilization,
    nvmlEventTypeClock,
    nvmlEventTypeDoubleBitEccError,
    nvmlEventTypeNone,
    nvmlEventTypePState,
    nvmlEventTypeSingleBitEccError,
    nvmlEventTypeXidCriticalError,
)

logger = logging.getLogger(__name__)

DEFAULT_XID = 79
"""Xid reported when a GPU turns `healthy: false` without an explicit `xid` (fallen off the bus)."""

_POLL_SECONDS = 0.1

_NvmlErrorType = NVMLError


class FakeNvml(MigCalls, MigDeviceCalls):
    """pynvml look-alike backed by a YAML file (the format: `fakenvml.gpufile`); the MIG calls
    come from `fakenvml.migcalls` and `fakenvml.migdevices`."""

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
    NVML_TOPOLOGY_INTERNAL = NVML_TOPOLOGY_INTERNAL
    NVML_TOPOLOGY_SINGLE = NVML_TOPOLOGY_SINGLE
    NVML_TOPOLOGY_MULTIPLE = NVML_TOPOLOGY_MULTIPLE
    NVML_TOPOLOGY_HOSTBRIDGE = NVML_TOPOLOGY_HOSTBRIDGE
    NVML_TOPOLOGY_NODE = NVML_TOPOLOGY_NODE
    NVML_TOPOLOGY_SYSTEM = NVML_TOPOLOGY_SYSTEM
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_DISABLED = NVML_FEATURE_DISABLED
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED
    NVML_NVLINK_DEVICE_TYPE_GPU = NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = NVML_NVLINK_DEVICE_TYPE_IBMNPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = NVML_NVLINK_DEVICE_TYPE_UNKNOWN
    NVML_ERROR_INVALID_ARGUMENT = 2

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
    NVMLError_InsufficientResources = NVMLError_InsufficientResources
    NVMLError_ArgumentVersionMismatch = NVMLError_ArgumentVersionMismatch
    NVMLError_Deprecated = NVMLError_Deprecated
    NVMLError_NotReady = NVMLError_NotReady
    NVMLError_InvalidState = NVMLError_InvalidState
    NVMLError_GpuNotFound = NVMLError_GpuNotFound
    NVMLError_Unknown = NVMLError_Unknown

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._init_count = 0
        self._gpus: dict[str, FakeGpuSpec] = {}
        self._by_index: dict[int, str] = {}
        self._topology: FakeTopology | None = None
        self._init_error: str | None = None
        self._stat: tuple[int, int, int, int] | None = None
        self._raw: bytes | None = None
        self._problem: str | None = None
        self._event_sets: list[FakeEventSet] = []
        self._wait_errors: deque[int] = deque()
        self._mig_setup(path)

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
            self._topology = parsed.topology
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
                raise nvml_error(ERROR_CODES[self._init_error])
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

    def nvmlDeviceGetUUID(self, handle: FakeDeviceHandle | FakeMigDeviceHandle) -> str:
        if isinstance(handle, FakeMigDeviceHandle):
            return self._mig_uuid(handle)
        return self._lookup(handle, live=False).uuid

    def nvmlDeviceGetIndex(self, handle: FakeDeviceHandle) -> int:
        return self._lookup(handle, live=False).index

    def nvmlDeviceGetName(self, handle: FakeDeviceHandle | FakeMigDeviceHandle) -> str:
        if isinstance(handle, FakeMigDeviceHandle):
            return self._mig_name(handle)
        return self._lookup(handle, live=True).name

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeDeviceHandle | FakeMigDeviceHandle, version: object = None
    ) -> FakeMemoryInfo:
        if isinstance(handle, FakeMigDeviceHandle):
            return self._mig_memory(handle)
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

    # -- topology (pynvml's names and return types; the model: fakenvml.topology) --

    def nvmlDeviceGetTopologyCommonAncestor(
        self, device1: FakeDeviceHandle, device2: FakeDeviceHandle
    ) -> int:
        """The NVML_TOPOLOGY_* level of the pair; `system` for every pair without a model."""
        first = self._lookup(device1, live=True)
        second = self._lookup(device2, live=True)
        with self._lock:
            topology = self._topology
        if topology is None:
            return NVML_TOPOLOGY_INTERNAL if first.index == second.index else NVML_TOPOLOGY_SYSTEM
        return topology.level(first.index, second.index)

    def _lane(self, handle: FakeDeviceHandle, link: int) -> NvLinkLane | None:
        """The lane behind link number `link`; None for an unused lane of an NVLink GPU."""
        gpu = self._lookup(handle, live=True)
        if isinstance(link, bool) or not isinstance(link, int) or link < 0:
            raise NVMLError_InvalidArgument()
        with self._lock:
            topology = self._topology
        lanes = topology.lanes_of(gpu.index) if topology is not None else ()
        if not lanes:
            raise NVMLError_NotSupported()
        if link >= NVML_NVLINK_MAX_LINKS:
            raise NVMLError_InvalidArgument()
        return lanes[link] if link < len(lanes) else None

    def nvmlDeviceGetNvLinkState(self, device: FakeDeviceHandle, link: int) -> int:
        enabled = self._lane(device, link) is not None
        return NVML_FEATURE_ENABLED if enabled else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: FakeDeviceHandle, link: int) -> FakePciInfo:
        lane = self._lane(device, link)
        if lane is None:
            raise NVMLError_NotSupported()
        if lane.remote_switch_bus_id is not None:
            bus_id = lane.remote_switch_bus_id
        else:
            with self._lock:
                uuid = self._by_index[lane.remote_gpu] if lane.remote_gpu is not None else ""
                bus_id = self._gpus[uuid].pci_bus_id
        return FakePciInfo(busId=bus_id, busIdLegacy=bus_id[-12:])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeDeviceHandle, link: int) -> int:
        lane = self._lane(handle, link)
        if lane is None:
            raise NVMLError_NotSupported()
        if lane.remote_gpu is None:
            return NVML_NVLINK_DEVICE_TYPE_SWITCH
        return NVML_NVLINK_DEVICE_TYPE_GPU

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
        return SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(
        self, handle: FakeDeviceHandle, event_types: int, event_set: FakeEventSet
    ) -> None:
        gpu = self._lookup(handle, live=True)
        if event_types & ~SUPPORTED_EVENTS:
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
                    raise nvml_error(self._wait_errors.popleft())
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
