"""Per-container GPU requests of a pod, by HAMi v2.10's rules (docs/hami-reference.md 2).

For each container (init containers first, the order of the `hami.io/vgpu-devices-*`
annotations) every resource is read from `limits`, else `requests`, as Go's
`Quantity.AsInt64()` reads it, then as HAMi stores it (count and cores in int32, without a
range check):

* count (`nvidia.com/gpu`): absent or 0 means no request; a bad value drops the request;
* memory (`nvidia.com/gpumem`, MiB): 0..2147483647/memory_factor, else the container's whole
  request is dropped; the value is multiplied by `memory_factor`;
* percentage (`nvidia.com/gpumem-percentage`): above 100 is clamped to 100, 0 or below means
  unset (the sentinel 101); a bad value is ignored (unset);
* with neither memory nor percentage: `default_memory_mib` if set, else 100 %;
* cores (`nvidia.com/gpucores`): `default_cores` unless given; a bad value is ignored.

The request is always HAMi's reading: the scheduler must decide as HAMi decides. A value HAMi
reads differently from what was written comes back as a `RequestProblem` naming the container,
the resource and the value, what to write instead and what the scheduler does with it; which
values, and which of them are wrong answers (refused by the user tools and the admission
webhook) rather than harmless: `docs/scheduling.md`, "Values the scheduler cannot use".
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from decimal import Decimal

from hami_plugin.protocol.model import NVIDIA_DEVICE_TYPE
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.protocol.quantity import QuantityError, exact_integer, parse_quantity
from hami_plugin.scheduler.settings import SchedulerSettings

__all__ = [
    "INT32_MAX",
    "PERCENTAGE_UNSET",
    "ContainerRequest",
    "PodRequests",
    "ProblemEffect",
    "RequestProblem",
    "container_request",
    "go_int32",
    "pod_requests",
]

INT32_MAX = 2**31 - 1
_UINT32 = 2**32
_MIB = 2**20
PERCENTAGE_UNSET = 101
"""HAMi's "no percentage given; use the memory request" sentinel."""
_BYTE_UNITS = ("Mi", "Gi", "Ti", "Pi", "Ei")
"""Binary suffixes that make a memory value a byte count: 1Mi MiB would be 1 TiB per GPU. The
API server keeps a binary suffix only where the pod was written with one."""
_UNIT_SUFFIXES = ("Ki", *_BYTE_UNITS, "k", "M", "G", "T", "P", "E")


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


class ProblemEffect(enum.StrEnum):
    """What the scheduler (as HAMi v2.10) does with a value it cannot use as written."""

    DROPPED = "dropped"
    """The container asks no GPU."""
    IGNORED = "ignored"
    """The default applies instead."""
    TRUNCATED = "truncated"
    """Kept in int32: the low 32 bits (`taken_as`)."""
    CLAMPED = "clamped"
    """A percentage above 100 taken as 100 (`taken_as`)."""
    TAKEN_LITERALLY = "taken literally"
    """A byte unit on a MiB resource, used as that many MiB (`taken_as`)."""


@dataclass(frozen=True, slots=True)
class RequestProblem:
    """A resource value that HAMi's scheduler does not read as written (module docstring).

    `reason` says what is wrong with the value, `advice` what to write instead; `taken_as` is
    the value used for a truncated, clamped or literally taken one. `str()` renders
    `container 'c': nvidia.com/gpumem=16Gi: <reason>; <advice>; <effect>`.
    """

    container: str
    resource: str
    value: str
    reason: str
    advice: str
    effect: ProblemEffect
    taken_as: int | None = None

    @property
    def dropped(self) -> bool:
        """The container asks no GPU because of this value."""
        return self.effect is ProblemEffect.DROPPED

    @property
    def wrong_answer(self) -> bool:
        """The scheduler would not do what the pod asks: the user tools exit 1 and the
        webhook denies the pod. Only a clamped percentage is harmless."""
        return self.effect is not ProblemEffect.CLAMPED

    def render(self, *, would: bool = False) -> str:
        """The one-line message; `would` words the effect as what the scheduler would do (for
        a pod not yet scheduled, as the webhook sees it)."""
        where = f"container {self.container!r}: {self.resource}={self.value}"
        return f"{where}: {self.reason}; {self.advice}; {self._effect_text(would)}"

    def _effect_text(self, would: bool) -> str:
        if self.effect is ProblemEffect.DROPPED:
            return "the scheduler would drop the GPU request" if would else "GPU request dropped"
        if self.effect is ProblemEffect.IGNORED:
            return "the scheduler would ignore the value" if would else "value ignored"
        unit = " MiB" if self.effect is ProblemEffect.TAKEN_LITERALLY else ""
        taken = f"{self.taken_as}{unit}"
        return f"the scheduler would take it as {taken}" if would else f"taken as {taken}"

    def __str__(self) -> str:
        return self.render()


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
    def wrong_answers(self) -> tuple[RequestProblem, ...]:
        """The problems that make the scheduler's reading differ from the pod's intent."""
        return tuple(problem for problem in self.problems if problem.wrong_answer)

    @property
    def init_requests(self) -> tuple[ContainerRequest | None, ...]:
        return self.containers[: self.init_count]

    @property
    def app_requests(self) -> tuple[ContainerRequest | None, ...]:
        return self.containers[self.init_count :]


class _BadValueError(Exception):
    def __init__(self, reason: str, quantity: Decimal | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.quantity = quantity
        """The value when it is a quantity (not a whole number, or beyond int64)."""


def _integer(raw: object) -> int:
    """Go's `Quantity.AsInt64()`; raises _BadValueError saying why not."""
    if not isinstance(raw, (str, int, float)):
        raise _BadValueError(f"not a quantity ({type(raw).__name__})")
    try:
        quantity = parse_quantity(raw)
    except QuantityError:
        raise _BadValueError("not a Kubernetes quantity") from None
    value = exact_integer(quantity)
    if value is None:
        if quantity == quantity.to_integral_value():
            raise _BadValueError("beyond the int64 range", quantity)
        raise _BadValueError("not a whole number", quantity)
    return value


def _whole_choices(quantity: Decimal | None, low: int, high: int) -> list[int]:
    """The whole numbers next to a fractional quantity that lie within low..high."""
    if quantity is None or quantity == quantity.to_integral_value():
        return []
    below, above = math.floor(quantity), math.ceil(quantity)
    return [number for number in (below, above) if low <= number <= high]


def _write(choices: list[int], fallback: str) -> str:
    if not choices:
        return f"write {fallback}"
    return "write " + " or ".join(str(number) for number in choices) + f" ({fallback})"


def _has_suffix(raw: object, suffixes: tuple[str, ...]) -> bool:
    return isinstance(raw, str) and raw.endswith(suffixes)


def _count_advice(quantity: Decimal | None) -> str:
    return _write(
        _whole_choices(quantity, 1, INT32_MAX), "a whole number of GPUs from 1 to 2147483647"
    )


def _memory_advice(
    resource: str, raw: object, quantity: Decimal | None, factor: int, limit: int
) -> str:
    """What to write for a memory value HAMi cannot use: with a unit suffix the value was most
    likely meant as bytes, so the same memory in MiB (rounded up to a whole unit)."""
    unit = "MiB" if factor == 1 else f"units of {factor} MiB"
    if quantity is not None and quantity > 0 and _has_suffix(raw, _UNIT_SUFFIXES):
        units = math.ceil(quantity / (_MIB * factor))
        if 0 < units <= limit:
            exact = quantity == units * _MIB * factor
            size = (
                f"{raw} is {units} {unit}"
                if exact
                else f"{raw} bytes are {units} {unit} rounded up"
            )
            return f"write {units}: {resource} counts {unit}, and {size}"
    return _write(_whole_choices(quantity, 0, limit), f"a whole number of {unit} from 0 to {limit}")


def _percent_advice(quantity: Decimal | None, low: int, high: int, what: str) -> str:
    return _write(_whole_choices(quantity, low, high), f"{what} from {low} to {high}")


def container_request(
    container: ContainerSpec, settings: SchedulerSettings
) -> tuple[ContainerRequest | None, tuple[RequestProblem, ...]]:
    """The container's NVIDIA request (None when it asks no GPU) and any problem found."""
    names = settings.resources
    reader = _Reader(container)
    count = _read_count(reader, names.count)
    if count is None:
        return None, tuple(reader.problems)
    memory_mib = _read_memory(reader, names.memory, settings.memory_factor)
    if memory_mib is None:
        return None, tuple(reader.problems)
    percent = _read_memory_percentage(reader, names.memory_percentage)
    if percent == PERCENTAGE_UNSET and memory_mib == 0:
        if settings.default_memory_mib:
            memory_mib = settings.default_memory_mib
        else:
            percent = 100
    cores = _read_cores(reader, names.cores, settings.default_cores)
    return ContainerRequest(count, memory_mib, percent, cores), tuple(reader.problems)


class _Reader:
    """One container's resources, and the problems found reading them."""

    __slots__ = ("container", "problems")

    def __init__(self, container: ContainerSpec) -> None:
        self.container = container
        self.problems: list[RequestProblem] = []

    def raw(self, resource: str) -> object | None:
        """The value from `limits`, else `requests` (None: absent)."""
        if resource in self.container.limits:
            return self.container.limits[resource]
        return self.container.requests.get(resource)

    def problem(
        self,
        resource: str,
        raw: object,
        reason: str,
        advice: str,
        effect: ProblemEffect,
        taken_as: int | None = None,
    ) -> None:
        name = self.container.name
        self.problems.append(
            RequestProblem(name, resource, str(raw), reason, advice, effect, taken_as)
        )


def _read_count(reader: _Reader, resource: str) -> int | None:
    """The GPU count; None when the container asks none (absent, 0, or a value HAMi drops)."""
    raw = reader.raw(resource)
    if raw is None:
        return None
    try:
        count = _integer(raw)
    except _BadValueError as bad:
        advice = _count_advice(bad.quantity)
        reader.problem(resource, raw, bad.reason, advice, ProblemEffect.DROPPED)
        return None
    if count == 0:
        return None
    if 0 < count <= INT32_MAX:
        return count
    truncated = go_int32(count)
    if truncated <= 0:
        reason = f"as int32 it is {truncated}, not positive"
        reader.problem(resource, raw, reason, _count_advice(None), ProblemEffect.DROPPED)
        return None
    effect = ProblemEffect.TRUNCATED
    reader.problem(resource, raw, "larger than int32", _count_advice(None), effect, truncated)
    return truncated


def _read_memory(reader: _Reader, resource: str, factor: int) -> int | None:
    """The MiB asked per GPU (0: none given); None when HAMi drops the request over it."""
    raw = reader.raw(resource)
    if raw is None:
        return 0
    limit = INT32_MAX // factor
    try:
        memory = _integer(raw)
        if not 0 <= memory <= limit:
            unit = "MiB" if factor == 1 else f"units of {factor} MiB"
            raise _BadValueError(f"out of range 0..{limit} ({unit})", Decimal(memory))
    except _BadValueError as bad:
        advice = _memory_advice(resource, raw, bad.quantity, factor, limit)
        reader.problem(resource, raw, bad.reason, advice, ProblemEffect.DROPPED)
        return None
    memory_mib = memory * factor
    if memory and _has_suffix(raw, _BYTE_UNITS):
        reason = "a byte unit on a count of MiB"
        advice = _memory_advice(resource, raw, Decimal(memory), factor, limit)
        reader.problem(resource, raw, reason, advice, ProblemEffect.TAKEN_LITERALLY, memory_mib)
    return memory_mib


def _read_memory_percentage(reader: _Reader, resource: str) -> int:
    """The percentage of each GPU's memory asked (`PERCENTAGE_UNSET`: none)."""
    raw = reader.raw(resource)
    if raw is None:
        return PERCENTAGE_UNSET
    try:
        asked = _integer(raw)
    except _BadValueError as bad:
        advice = _percent_advice(bad.quantity, 1, 100, "a whole percent")
        reader.problem(resource, raw, bad.reason, advice, ProblemEffect.IGNORED)
        return PERCENTAGE_UNSET
    if asked > 100:
        reader.problem(resource, raw, "above 100", "write at most 100", ProblemEffect.CLAMPED, 100)
        return 100
    return asked if asked > 0 else PERCENTAGE_UNSET


def _read_cores(reader: _Reader, resource: str, default: int) -> int:
    """The percent of each GPU's cores asked (`default` when absent or unusable)."""
    raw = reader.raw(resource)
    if raw is None:
        return default
    what = "a whole percent of the GPU's cores"
    try:
        asked = _integer(raw)
    except _BadValueError as bad:
        advice = _percent_advice(bad.quantity, 0, 100, what)
        reader.problem(resource, raw, bad.reason, advice, ProblemEffect.IGNORED)
        return default
    cores = go_int32(asked)
    if cores != asked:
        advice = _percent_advice(None, 0, 100, what)
        reader.problem(resource, raw, "outside int32", advice, ProblemEffect.TRUNCATED, cores)
    return cores


def pod_requests(info: PodInfo, settings: SchedulerSettings) -> PodRequests:
    """Requests of every container, init containers first."""
    entries: list[ContainerRequest | None] = []
    problems: list[RequestProblem] = []
    for container in (*info.init_containers, *info.containers):
        request, found = container_request(container, settings)
        entries.append(request)
        problems.extend(found)
    return PodRequests(tuple(entries), len(info.init_containers), tuple(problems))
