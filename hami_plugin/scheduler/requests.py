"""Per-container GPU requests of a pod, by HAMi v2.10's rules (docs/hami-reference.md 2).

For each container (init containers first, then app containers, the order of the
`hami.io/vgpu-devices-*` annotations) every resource is read from `limits`, else `requests`,
parsed as a Kubernetes quantity and required to be an exact integer:

* count (`nvidia.com/gpu`): absent or 0 means no request; a bad value drops the request;
* memory (`nvidia.com/gpumem`, MiB): 0..2147483647/memory_factor, else the container's whole
  request is dropped; the value is multiplied by `memory_factor`;
* percentage (`nvidia.com/gpumem-percentage`): above 100 is clamped to 100, 0 or below means
  unset (the sentinel 101); a bad value is ignored (unset);
* with neither memory nor percentage: `default_memory_mib` if set, else 100 %;
* cores (`nvidia.com/gpucores`): `default_cores` unless given; a bad value is ignored.

"Exact integer" is Go's `Quantity.AsInt64()`: a whole number within int64. HAMi stores the
count and the cores in int32 without a range check, so, as there, a count or cores value
outside int32 keeps its low 32 bits (a count that becomes 0 or negative asks no GPU).

A dropped, ignored or truncated value is never silent: it comes back as a `RequestProblem`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami_plugin.protocol.model import NVIDIA_DEVICE_TYPE
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.protocol.quantity import QuantityError, exact_integer, parse_quantity
from hami_plugin.scheduler.settings import SchedulerSettings

__all__ = [
    "INT32_MAX",
    "PERCENTAGE_UNSET",
    "ContainerRequest",
    "PodRequests",
    "RequestProblem",
    "container_request",
    "go_int32",
    "pod_requests",
]

INT32_MAX = 2**31 - 1
_UINT32 = 2**32
PERCENTAGE_UNSET = 101
"""HAMi's "no percentage given; use the memory request" sentinel."""


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """HAMi's ContainerDeviceRequest: `count` GPUs, each with this memory and these cores.

    `memory_percent` is 101 when unset; `cores_percent` is as asked (Fit clamps it to 100).
    """

    count: int
    memory_mib: int
    memory_percent: int
    cores_percent: int
    type: str = NVIDIA_DEVICE_TYPE

    def memory_on(self, total_memory_mib: int) -> int:
        """MiB booked on one GPU of this size (docs/hami-reference.md 2 item 6): a percentage of the
        card when no MiB were asked, else the MiB. HAMi computes `Totalmem * pct / 100` in int32
        (only a card above 20 TiB, or a negative `devmem` below -20 TiB, overflows), and so
        does this."""
        if self.memory_percent != PERCENTAGE_UNSET and self.memory_mib == 0:
            product = go_int32(total_memory_mib * self.memory_percent)
            quotient = abs(product) // 100  # Go's division truncates toward zero
            return quotient if product >= 0 else -quotient
        return self.memory_mib


def go_int32(value: int) -> int:
    """Go's `int32(value)`: the low 32 bits, as a signed number."""
    return (value + 2**31) % _UINT32 - 2**31


@dataclass(frozen=True, slots=True)
class RequestProblem:
    """A resource value that was not usable. `dropped`: the container asks no GPU because of it;
    otherwise the value was ignored and the default applies."""

    container: str
    resource: str
    value: str
    reason: str
    dropped: bool
    taken_as: int | None = None
    """Set when the value was not ignored but truncated (to int32, as HAMi does)."""

    def __str__(self) -> str:
        if self.dropped:
            effect = "GPU request dropped"
        elif self.taken_as is not None:
            effect = f"taken as {self.taken_as}"
        else:
            effect = "value ignored"
        where = f"container {self.container!r}: {self.resource}={self.value}"
        return f"{where}: {self.reason}; {effect}"


@dataclass(frozen=True, slots=True)
class PodRequests:
    """One entry per container, init containers first; None for a container without a GPU."""

    containers: tuple[ContainerRequest | None, ...]
    init_count: int
    problems: tuple[RequestProblem, ...] = ()

    @property
    def wants_gpu(self) -> bool:
        return any(request is not None for request in self.containers)

    @property
    def init_requests(self) -> tuple[ContainerRequest | None, ...]:
        return self.containers[: self.init_count]

    @property
    def app_requests(self) -> tuple[ContainerRequest | None, ...]:
        return self.containers[self.init_count :]


class _BadValueError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _lookup(container: ContainerSpec, resource: str) -> object | None:
    if resource in container.limits:
        return container.limits[resource]
    return container.requests.get(resource)


def _integer(raw: object) -> int:
    if not isinstance(raw, (str, int, float)):
        raise _BadValueError(f"not a quantity ({type(raw).__name__})")
    try:
        quantity = parse_quantity(raw)
    except QuantityError:
        raise _BadValueError("not a Kubernetes quantity") from None
    value = exact_integer(quantity)
    if value is None:
        raise _BadValueError("not a whole number")
    return value


def container_request(
    container: ContainerSpec, settings: SchedulerSettings
) -> tuple[ContainerRequest | None, tuple[RequestProblem, ...]]:
    """The container's NVIDIA request (None when it asks no GPU) and any problem found."""
    names = settings.resources
    problems: list[RequestProblem] = []

    def problem(
        resource: str, raw: object, reason: str, dropped: bool, taken_as: int | None = None
    ) -> None:
        problems.append(
            RequestProblem(container.name, resource, str(raw), reason, dropped, taken_as)
        )

    raw_count = _lookup(container, names.count)
    if raw_count is None:
        return None, ()
    try:
        count = _integer(raw_count)
    except _BadValueError as bad:
        problem(names.count, raw_count, bad.reason, True)
        return None, tuple(problems)
    if count == 0:
        return None, ()
    if not 0 < count <= INT32_MAX:
        truncated = go_int32(count)
        if truncated <= 0:
            problem(names.count, raw_count, f"as int32 it is {truncated}, not positive", True)
            return None, tuple(problems)
        problem(names.count, raw_count, "larger than int32", False, truncated)
        count = truncated

    memory_mib = 0
    raw_memory = _lookup(container, names.memory)
    if raw_memory is not None:
        limit = INT32_MAX // settings.memory_factor
        try:
            memory = _integer(raw_memory)
            if not 0 <= memory <= limit:
                raise _BadValueError(f"out of range 0..{limit} (MiB)")
        except _BadValueError as bad:
            problem(names.memory, raw_memory, bad.reason, True)
            return None, tuple(problems)
        memory_mib = memory * settings.memory_factor

    percent = PERCENTAGE_UNSET
    raw_percent = _lookup(container, names.memory_percentage)
    if raw_percent is not None:
        try:
            asked = _integer(raw_percent)
        except _BadValueError as bad:
            problem(names.memory_percentage, raw_percent, bad.reason, False)
        else:
            if asked > 100:
                percent = 100
            elif asked > 0:
                percent = asked

    if percent == PERCENTAGE_UNSET and memory_mib == 0:
        if settings.default_memory_mib:
            memory_mib = settings.default_memory_mib
        else:
            percent = 100

    cores = settings.default_cores
    raw_cores = _lookup(container, names.cores)
    if raw_cores is not None:
        try:
            asked = _integer(raw_cores)
        except _BadValueError as bad:
            problem(names.cores, raw_cores, bad.reason, False)
        else:
            cores = go_int32(asked)
            if cores != asked:
                problem(names.cores, raw_cores, "outside int32", False, cores)

    return ContainerRequest(count, memory_mib, percent, cores), tuple(problems)


def pod_requests(info: PodInfo, settings: SchedulerSettings) -> PodRequests:
    """Requests of every container, init containers first."""
    entries: list[ContainerRequest | None] = []
    problems: list[RequestProblem] = []
    for container in (*info.init_containers, *info.containers):
        request, found = container_request(container, settings)
        entries.append(request)
        problems.extend(found)
    return PodRequests(tuple(entries), len(info.init_containers), tuple(problems))
