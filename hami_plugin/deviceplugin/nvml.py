"""The NVML adapter: the physical GPUs of this node and their error events.

The only module that imports `pynvml` (lazily, in `load_pynvml`). Everything NVML-specific is
translated here: the rest of the daemon sees `PhysicalGpu`, `GpuEvent` and the errors
`NvmlError` / `NvmlUnavailable` / `EventsNotSupportedError`, never a pynvml class. The NVML
module is passed in, so the fake NVML (`hami_plugin.testing.fakenvml`, which the entry point
chooses for `--nvml fake`) drives the same code.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hami_plugin.deviceplugin.inventory import PhysicalGpu as PhysicalGpu
from hami_plugin.protocol.topology import DeviceScore, calculate_gpu_scores

logger = logging.getLogger(__name__)

_XID_CRITICAL = 0x8
_DOUBLE_BIT_ECC = 0x2
_SINGLE_BIT_ECC = 0x1
_MIB = 1024 * 1024

# NVML return codes that mean "the driver is not there" rather than "NVML misbehaved".
_DRIVER_MISSING_CODES = frozenset({9, 12})  # DriverNotLoaded, LibraryNotFound
_DRIVER_HINT = (
    " (is the NVIDIA driver mounted? libnvidia-ml.so.1 must be on the library path of this "
    "container; use --nvml fake --fake-gpus FILE to run without a GPU)"
)


class NvmlError(Exception):
    """An NVML call failed; the message says which call and NVML's reason."""


class NvmlUnavailable(NvmlError):  # noqa: N818 (name fixed by the shared interface)
    """NVML could not be initialised; the message is the one log line to show the user."""


NO_INSTANCE_ID = 0xFFFFFFFF
"""The GPU/compute instance id of an event that is not about one MIG device (NVML's
`NVML_VALUE_NOT_AVAILABLE` as uint32; HAMi rm/health.go:181)."""


class EventsNotSupportedError(NvmlError):
    """The GPU (or driver) does not support the error events we want to watch."""


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """One NVML event. `uuid` is None when NVML could not say which GPU it came from."""

    uuid: str | None
    event_type: int
    data: int
    gpu_instance_id: int = NO_INSTANCE_ID
    """NVML's `gpuInstanceId`: the MIG GPU instance the event is about, or `NO_INSTANCE_ID`."""
    compute_instance_id: int = NO_INSTANCE_ID
    """NVML's `computeInstanceId`, or `NO_INSTANCE_ID`."""

    @property
    def is_xid_critical(self) -> bool:
        return bool(self.event_type & _XID_CRITICAL)

    @property
    def xid(self) -> int | None:
        """The Xid of an XidCriticalError event, else None."""
        return self.data if self.is_xid_critical else None


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's live usage, read from NVML at one moment (for the metrics endpoint).

    A field is None when NVML says the GPU cannot report it (NotSupported / FunctionNotFound,
    e.g. memory on unified-memory GPUs); the GPU's other figures are still valid.
    """

    index: int
    uuid: str
    name: str
    memory_used_bytes: int | None
    utilization_percent: int | None
    """NVML utilization rates `.gpu`: percent of the last sample period a kernel ran."""
    memory_utilization_percent: int | None
    """NVML utilization rates `.memory`: percent of the period device memory was read/written."""


NvmlLoader = Callable[[str, str | None], Any]
"""The NVML module for `--nvml` KIND and `--fake-gpus` FILE, given by whoever builds the daemon
(`hami device-plugin`: `hami_plugin.deviceplugin_cli.load_nvml_module`). Raises NvmlUnavailable
or ValueError with the one line to log."""


def load_pynvml() -> Any:
    """The `pynvml` module. Raises NvmlUnavailable when nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as error:
        raise NvmlUnavailable(
            f"NVML init failed: the nvidia-ml-py package is not installed ({error})"
        ) from None


def sysfs_pci_address(bus_id: str) -> str:
    """NVML's bus id (`00000000:3B:00.0`) as sysfs names the device (`0000:3b:00.0`)."""
    domain, sep, rest = bus_id.strip().partition(":")
    if sep and len(domain) == 8:
        domain = domain[4:]
    return f"{domain}{sep}{rest}".lower()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """GPU inventory and error events through an NVML module (pynvml or the fake).

    Call `start()` before anything else and `shutdown()` at the end. Methods other than
    `start` raise NvmlError when NVML fails as a whole; per-GPU failures are logged and that GPU
    is left out (or keeps its last known record, see `scan`).
    """

    def __init__(
        self, nvml: Any, sysfs_root: str = "/sys", *, preconfigured_memory_mib: int = 0
    ) -> None:
        self._nvml = nvml
        self._sysfs_root = sysfs_root
        self._preconfigured_memory_mib = preconfigured_memory_mib
        self._error_type: type[Exception] = nvml.NVMLError
        self._known: dict[str, PhysicalGpu] = {}
        # NVML index -> the last usage-read failure logged for it (see read_usage).
        self._usage_failures: dict[int, str] = {}
        self._usage_lock = threading.Lock()

    @property
    def nvml(self) -> Any:
        """The NVML module this backend calls (for the MIG adapter, `mig.nvml.NvmlMig`, which
        shares the session `start` opened)."""
        return self._nvml

    def _code(self, error: BaseException) -> int | None:
        value = getattr(error, "value", None)
        return value if isinstance(value, int) else None

    def _not_supported(self, error: BaseException) -> bool:
        # NotSupported (3) or FunctionNotFound (13): the driver or GPU lacks this call.
        return self._code(error) in (3, 13)

    def start(self) -> None:
        """Initialise NVML. Raises NvmlUnavailable with the message to log."""
        try:
            self._nvml.nvmlInit()
        except self._error_type as error:
            hint = _DRIVER_HINT if self._code(error) in _DRIVER_MISSING_CODES else ""
            raise NvmlUnavailable(f"NVML init failed: {error}{hint}") from error
        try:
            version = _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._error_type as error:
            version = f"unknown ({error})"
        logger.info("NVML started, driver version %s", version)

    def shutdown(self) -> None:
        """Release NVML; failures are only logged."""
        try:
            self._nvml.nvmlShutdown()
        except self._error_type as error:
            logger.warning("NVML shutdown failed: %s", error)

    def scan(self) -> list[PhysicalGpu]:
        """All GPUs, in NVML index order, MIG-enabled ones included (flagged).

        A GPU whose queries fail is logged and left out, unless an earlier scan saw it: then
        its last record is kept, so a lost GPU stays in the inventory (health reports it)
        instead of vanishing. Raises NvmlError when the GPU count cannot be read.
        """
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except self._error_type as error:
            raise NvmlError(f"NVML device count failed: {error}") from error
        gpus: list[PhysicalGpu] = []
        for index in range(count):
            gpu = self._read_gpu(index)
            if gpu is not None:
                gpus.append(gpu)
        return gpus

    def _read_gpu(self, index: int) -> PhysicalGpu | None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except self._error_type as error:
            known_at_index = next((g for g in self._known.values() if g.index == index), None)
            if known_at_index is not None:
                return _keep_last_record(known_at_index, index, error)
            logger.error("GPU at NVML index %d skipped: cannot read its UUID: %s", index, error)
            return None
        try:
            name = _text(nvml.nvmlDeviceGetName(handle))
            memory_mib = self._memory_mib(handle)
            mig_enabled = self._mig_enabled(handle)
            pci_bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            minor_number = self._minor_number(handle)
        except _GpuUnusableError as skip:
            logger.error("GPU %s (NVML index %d) skipped: %s", uuid, index, skip)
            return None
        except self._error_type as error:
            known = self._known.get(uuid)
            if known is not None:
                return _keep_last_record(known, index, error)
            logger.error(
                "GPU %s (NVML index %d) skipped: NVML query failed: %s", uuid, index, error
            )
            return None
        gpu = PhysicalGpu(
            uuid=uuid,
            index=index,
            name=name,
            memory_mib=memory_mib,
            numa_node=self._numa_node(handle, pci_bus_id),
            mig_enabled=mig_enabled,
            pci_bus_id=pci_bus_id,
            minor_number=minor_number,
        )
        self._known[uuid] = gpu
        return gpu

    def _memory_mib(self, handle: Any) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
        except self._error_type as error:
            if not self._not_supported(error):
                raise
        # HAMi: NVML cannot report memory (e.g. some vGPU guests) -> preconfigured or skip.
        if self._preconfigured_memory_mib > 0:
            return self._preconfigured_memory_mib
        raise _GpuUnusableError(
            "NVML cannot report its memory; set --preconfigured-device-memory to use it"
        )

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current = self._nvml.nvmlDeviceGetMigMode(handle)[0]
        except self._error_type as error:
            if self._not_supported(error):
                return False  # not a MIG-capable GPU
            raise
        return bool(current == self._nvml.NVML_DEVICE_MIG_ENABLE)

    def _minor_number(self, handle: Any) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetMinorNumber(handle))
        except self._error_type as error:
            if self._not_supported(error):
                return None
            raise

    def _numa_node(self, handle: Any, bus_id: str) -> int:
        getter = getattr(self._nvml, "nvmlDeviceGetNumaNodeId", None)
        if getter is not None:
            try:
                node = int(getter(handle))
            except self._error_type as error:
                # Older drivers lack the call (NotSupported / FunctionNotFound): use sysfs.
                logger.debug("NVML NUMA query failed (%s); reading sysfs for %s", error, bus_id)
            else:
                return node if node >= 0 else -1
        return self._sysfs_numa_node(bus_id)

    def _sysfs_numa_node(self, bus_id: str) -> int:
        path = os.path.join(
            self._sysfs_root, "bus", "pci", "devices", sysfs_pci_address(bus_id), "numa_node"
        )
        try:
            with open(path, encoding="ascii") as stream:
                node = int(stream.read().strip())
        except (OSError, ValueError):
            return -1
        return node if node >= 0 else -1

    def is_responsive(self, uuid: str) -> bool:
        """True when the GPU answers NVML (handle by UUID and a memory query succeed)."""
        try:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            self._nvml.nvmlDeviceGetMemoryInfo(handle)
        except self._error_type as error:
            logger.debug("GPU %s does not answer NVML: %s", uuid, error)
            return False
        return True

    # -- live usage (used by the metrics endpoint) --

    def read_usage(self) -> list[GpuUsage]:
        """Used memory and utilisation of every GPU NVML sees, in index order, read now.

        A GPU whose queries fail is left out. That is logged as one warning when the GPU starts
        failing (or fails differently), at debug level while it keeps failing, and at info level
        when it answers again, so a lost GPU does not write a line on every scrape. Thread-safe
        (NVML is; the failure book has a lock). Raises NvmlError when the GPU count cannot be
        read.
        """
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except self._error_type as error:
            raise NvmlError(f"NVML device count failed: {error}") from error
        usages: list[GpuUsage] = []
        for index in range(count):
            try:
                usage = self._read_usage(index)
            except self._error_type as error:
                self._usage_failed(index, str(error))
                continue
            self._usage_answered(index, usage.uuid)
            usages.append(usage)
        return usages

    def _read_usage(self, index: int) -> GpuUsage:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory_used: int | None = None
        try:
            memory_used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except self._error_type as error:
            # HAMi's monitor skips only the memory figure of a GPU that cannot report it.
            if not self._not_supported(error):
                raise
        utilization: int | None = None
        memory_utilization: int | None = None
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        except self._error_type as error:
            if not self._not_supported(error):
                raise
        else:
            utilization, memory_utilization = int(rates.gpu), int(rates.memory)
        return GpuUsage(index, uuid, name, memory_used, utilization, memory_utilization)

    def _usage_failed(self, index: int, message: str) -> None:
        with self._usage_lock:
            repeated = self._usage_failures.get(index) == message
            self._usage_failures[index] = message
        level = logging.DEBUG if repeated else logging.WARNING
        logger.log(level, "GPU at NVML index %d left out of the metrics: %s", index, message)

    def _usage_answered(self, index: int, uuid: str) -> None:
        with self._usage_lock:
            failed = self._usage_failures.pop(index, None)
        if failed is not None:
            logger.info("GPU %s (NVML index %d) reports its usage again", uuid, index)

    # -- events (used by health.py) --

    def pair_scores(self, uuids: Sequence[str]) -> tuple[list[DeviceScore], bool]:
        """HAMi `nvidia.CalculateGPUScore` (calculate_score.go): the listed GPUs' pair scores
        and whether any pair was asymmetric. Raises NvmlError when a pair cannot be measured."""
        from hami_plugin.deviceplugin.topology import TopologyError, measure_links

        try:
            links = measure_links(self._nvml, uuids)
        except (TopologyError, self._error_type) as error:
            raise NvmlError(f"calculate gpu topo score error: {error}") from error
        return calculate_gpu_scores(links)

    def create_event_set(self) -> Any:
        """A new NVML event set. Raises NvmlError."""
        try:
            return self._nvml.nvmlEventSetCreate()
        except self._error_type as error:
            raise NvmlError(f"NVML event set creation failed: {error}") from error

    def register_events(self, event_set: Any, uuid: str) -> None:
        """Watch the GPU for Xid critical errors and double/single-bit ECC errors.

        The wanted types are masked with the ones the GPU supports. Raises EventsNotSupportedError
        when it supports none of them (or NVML says not supported), NvmlError otherwise.
        """
        wanted = _XID_CRITICAL | _DOUBLE_BIT_ECC | _SINGLE_BIT_ECC
        try:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            mask = wanted & int(self._nvml.nvmlDeviceGetSupportedEventTypes(handle))
            if mask == 0:
                raise EventsNotSupportedError(f"GPU {uuid} supports none of the error events")
            self._nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
        except NvmlError:
            raise
        except self._error_type as error:
            if self._not_supported(error):
                raise EventsNotSupportedError(
                    f"GPU {uuid}: event registration not supported: {error}"
                ) from error
            raise NvmlError(f"GPU {uuid}: event registration failed: {error}") from error

    def wait_event(self, event_set: Any, timeout_ms: int) -> GpuEvent | None:
        """The next event, or None when `timeout_ms` passed without one. Raises NvmlError."""
        try:
            data = self._nvml.nvmlEventSetWait(event_set, timeout_ms)
        except self._error_type as error:
            if self._code(error) == 10:  # NVML_ERROR_TIMEOUT
                return None
            raise NvmlError(f"NVML event wait failed: {error}") from error
        uuid: str | None
        try:
            uuid = _text(self._nvml.nvmlDeviceGetUUID(data.device))
        except self._error_type as error:
            logger.warning("NVML event without a readable GPU UUID: %s", error)
            uuid = None
        return GpuEvent(
            uuid=uuid,
            event_type=int(data.eventType),
            data=int(data.eventData),
            gpu_instance_id=int(getattr(data, "gpuInstanceId", NO_INSTANCE_ID)),
            compute_instance_id=int(getattr(data, "computeInstanceId", NO_INSTANCE_ID)),
        )

    def free_event_set(self, event_set: Any) -> None:
        """Release an event set; failures are only logged."""
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except self._error_type as error:
            logger.warning("NVML event set release failed: %s", error)


def _keep_last_record(known: PhysicalGpu, index: int, error: BaseException) -> PhysicalGpu:
    logger.warning(
        "GPU %s (NVML index %d) does not answer NVML (%s); keeping its last record",
        known.uuid,
        index,
        error,
    )
    return known


class _GpuUnusableError(Exception):
    """This GPU cannot be used; the message says why."""
