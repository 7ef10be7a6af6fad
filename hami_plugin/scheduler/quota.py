"""Namespace GPU quotas: `ResourceQuota` `limits.nvidia.com/gpumem` / `limits.nvidia.com/gpucores`
as HAMi v2.10's `QuotaManager` keeps them (`pkg/device/quota.go`).

Per namespace and per resource name HAMi keeps a `Quota{Used, Limit, LimitSet}`:

* `add_quota` / `del_quota` / `update_quota` (quota.go:209-298) read a ResourceQuota's
  `spec.hard`: only `limits.<name>` keys whose `<name>` is the GPU memory or cores resource, and
  only values that are whole int64 numbers (Go's `Quantity.AsInt64`). Adding sets the limit and
  `LimitSet`; deleting zeroes both, whatever other ResourceQuota of the namespace still sets the
  key (HAMi keeps one limit per name: the last quota seen wins).
* `add_usage` / `rm_usage` (quota.go:119-182) add and subtract a pod's booked MiB and cores
  (its devices collapsed as the ledger books them); an entry created by usage has no limit, and
  `Used` never goes below 0.
* `fit_quota` (quota.go:62-99): a namespace without entries always fits; memory fails when
  `Used + request > Limit * memory_factor` (the factor only when above 1), cores when
  `Used + request > Limit`, each only for a limit that was set (an explicit `0` blocks).

Only NVIDIA's two resource names are managed (HAMi's `IsManagedQuota` asks every vendor backend;
this product has only the NVIDIA one). Mutable like the ledger: the extender state owns one
book and calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami_plugin.protocol.quantity import QuantityError, exact_integer, parse_quantity
from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.fit import QuotaFit
from hami_plugin.scheduler.ledger import TrackedPod
from hami_plugin.scheduler.settings import ResourceNames

__all__ = [
    "LIMITS_PREFIX",
    "Quota",
    "QuotaBook",
    "QuotaEntry",
    "ResourceQuotaInfo",
    "managed_quota_name",
    "pod_quota_usage",
    "quota_limits",
    "read_resource_quota",
]

LIMITS_PREFIX = "limits."


@dataclass(slots=True)
class Quota:
    """One namespace's figures for one resource name (HAMi's `Quota`).

    `limit_set` tells an explicit limit (even `0`, which blocks) from an entry that usage made,
    which has `limit` 0 and means no limit.
    """

    used: int = 0
    limit: int = 0
    limit_set: bool = False


@dataclass(frozen=True, slots=True)
class ResourceQuotaInfo:
    """What the scheduler keeps of a ResourceQuota: its identity and `spec.hard` (values as
    the API server sends them). `status.used`, which the quota controller rewrites on every
    pod event, is not kept, so those updates change nothing."""

    namespace: str
    name: str
    hard: tuple[tuple[str, str], ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def hard_map(self) -> dict[str, str]:
        return dict(self.hard)


def read_resource_quota(obj: Mapping[str, Any]) -> ResourceQuotaInfo:
    """A ResourceQuota object (as listed or watched) to `ResourceQuotaInfo`; raises ValueError
    for one without a namespace or name."""
    metadata = obj.get("metadata") or {}
    namespace, name = metadata.get("namespace"), metadata.get("name")
    if not isinstance(namespace, str) or not namespace or not isinstance(name, str) or not name:
        raise ValueError("ResourceQuota without metadata.namespace and metadata.name")
    spec = obj.get("spec") or {}
    hard = spec.get("hard") or {}
    if not isinstance(hard, Mapping):
        raise ValueError(f"ResourceQuota {namespace}/{name}: spec.hard is not a map")
    return ResourceQuotaInfo(
        namespace, name, tuple(sorted((str(key), str(value)) for key, value in hard.items()))
    )


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    """One line of `QuotaBook.entries` (what HAMi's `GetResourceQuota` copies out for the
    `hami_resource_quota_*` metrics)."""

    namespace: str
    resource: str
    used: int
    limit: int
    limit_set: bool


def managed_quota_name(key: str, resources: ResourceNames) -> str | None:
    """The resource a ResourceQuota key limits (`limits.nvidia.com/gpumem` ->
    `nvidia.com/gpumem`), or None for keys HAMi does not track (quota.go:332-342)."""
    if not key.startswith(LIMITS_PREFIX):
        return None
    name = key[len(LIMITS_PREFIX) :]
    if name and name in (resources.memory, resources.cores):
        return name
    return None


def quota_limits(hard: Mapping[str, object], resources: ResourceNames) -> dict[str, int]:
    """The managed limits of a ResourceQuota's `spec.hard`, as HAMi's `addQuotaLocked` reads
    them: keys `managed_quota_name` accepts, values that parse and are whole int64 numbers
    (others skipped, as `AsInt64`'s "not ok" skips them)."""
    limits: dict[str, int] = {}
    for key, raw in hard.items():
        name = managed_quota_name(key, resources)
        if name is None or not isinstance(raw, str | int | float):
            continue
        try:
            value = exact_integer(parse_quantity(raw))
        except QuantityError:
            continue
        if value is not None:
            limits[name] = value
    return limits


def pod_quota_usage(tallies: Iterable[DeviceTally], resources: ResourceNames) -> dict[str, int]:
    """What a pod counts against its namespace (HAMi's `countPodDevices`, quota.go:101-117):
    the MiB and cores of its collapsed devices, summed over GPUs (a 2-GPU pod of 10 GiB each
    counts 20 GiB)."""
    memory = cores = 0
    seen = False
    for tally in tallies:
        seen = True
        memory += tally.memory_mib
        cores += tally.cores
    if not seen:
        return {}
    return {resources.memory: memory, resources.cores: cores}


@dataclass(slots=True)
class QuotaBook:
    """Every namespace's quotas and usage (HAMi's `QuotaManager.Quotas`).

    `pods` remembers what each pod added, so removing a pod subtracts exactly that (HAMi's
    `RmUsage` subtracts the devices its pod manager kept).
    """

    resources: ResourceNames = field(default_factory=ResourceNames)
    namespaces: dict[str, dict[str, Quota]] = field(default_factory=dict)
    pods: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    limited: set[str] = field(default_factory=set)
    """Namespaces with at least one limit set: the fit's fast check."""

    def add_quota(self, namespace: str, hard: Mapping[str, object]) -> None:
        """A ResourceQuota appeared (quota.go:242-266)."""
        limits = quota_limits(hard, self.resources)
        if not limits:
            return
        entries = self.namespaces.setdefault(namespace, {})
        for name, value in limits.items():
            quota = entries.setdefault(name, Quota())
            quota.limit = value
            quota.limit_set = True
        self._refresh(namespace)

    def del_quota(self, namespace: str, hard: Mapping[str, object]) -> None:
        """A ResourceQuota went away: its keys' limits are released (quota.go:269-289)."""
        entries = self.namespaces.get(namespace)
        if entries is None:
            return
        for name in quota_limits(hard, self.resources):
            quota = entries.get(name)
            if quota is not None:
                quota.limit = 0
                quota.limit_set = False
        self._refresh(namespace)

    def update_quota(
        self, namespace: str, old: Mapping[str, object], new: Mapping[str, object]
    ) -> None:
        """A ResourceQuota changed: the old limits released and the new ones set in one step
        (quota.go:229-239; the caller's lock makes it atomic for `fit_quota`)."""
        self.del_quota(namespace, old)
        self.add_quota(namespace, new)

    def add_usage(self, namespace: str, usage: Mapping[str, int]) -> None:
        """Add a pod's usage (quota.go:136-150)."""
        if not usage:
            return
        entries = self.namespaces.setdefault(namespace, {})
        for name, value in usage.items():
            entries.setdefault(name, Quota()).used += value

    def rm_usage(self, namespace: str, usage: Mapping[str, int]) -> None:
        """Subtract a pod's usage, never below 0 (quota.go:169-182)."""
        entries = self.namespaces.get(namespace)
        if entries is None:
            return
        for name, value in usage.items():
            quota = entries.get(name)
            if quota is not None:
                quota.used = max(quota.used - value, 0)

    def add_pod(self, key: str, namespace: str, tallies: Iterable[DeviceTally]) -> None:
        """Count a booked pod once (HAMi adds usage only when its pod manager added the pod);
        a pod counted already is replaced (HAMi's `ReplaceUsage`, quota.go:184-194)."""
        self.remove_pod(key)
        usage = pod_quota_usage(tallies, self.resources)
        if usage:
            self.pods[key] = (namespace, usage)
            self.add_usage(namespace, usage)

    def remove_pod(self, key: str) -> None:
        """Stop counting a pod (no-op for one not counted)."""
        counted = self.pods.pop(key, None)
        if counted is not None:
            self.rm_usage(*counted)

    def follow(self, key: str, tracked: TrackedPod | None) -> None:
        """Count pod `<namespace>/<name>` as the ledger now books it (None: not booked), so
        the usage follows the same pod events as the ledger (HAMi calls `AddUsage`/`RmUsage`
        where its pod manager adds and removes the pod, `pkg/scheduler/scheduler.go:137-252`)."""
        if tracked is None:
            self.remove_pod(key)
        else:
            self.add_pod(key, key.partition("/")[0], tracked.tallies)

    def entries(self) -> list[QuotaEntry]:
        """Every namespace's figures, sorted, as copies (read at scrape time)."""
        return [
            QuotaEntry(namespace, name, quota.used, quota.limit, quota.limit_set)
            for namespace in sorted(self.namespaces)
            for name, quota in sorted(self.namespaces[namespace].items())
        ]

    def has_limits(self, namespace: str) -> bool:
        """Whether `fit_quota` can say no for this namespace (cheap: a set lookup)."""
        return namespace in self.limited

    def fit_quota(
        self,
        namespace: str,
        memory_mib: int,
        memory_factor: int,
        cores: int,
        exclude_pod: str | None = None,
    ) -> bool:
        """HAMi's `FitQuota` (quota.go:62-99) for a request of `memory_mib` and `cores` in all.

        `exclude_pod`'s own counted usage is left out: HAMi's Filter removes a pod's usage
        before fitting it again (`pkg/scheduler/scheduler.go:1092-1094`).
        """
        entries = self.namespaces.get(namespace)
        if entries is None:
            return True
        own = self.pods.get(exclude_pod) if exclude_pod is not None else None
        own_usage = own[1] if own is not None and own[0] == namespace else {}
        memory = entries.get(self.resources.memory)
        if memory is not None:
            limit = memory.limit * memory_factor if memory_factor > 1 else memory.limit
            used = max(memory.used - own_usage.get(self.resources.memory, 0), 0)
            if memory.limit_set and used + memory_mib > limit:
                return False
        core = entries.get(self.resources.cores)
        if core is not None and core.limit_set:
            used = max(core.used - own_usage.get(self.resources.cores, 0), 0)
            if used + cores > core.limit:
                return False
        return True

    def quota_fit(self, namespace: str, memory_factor: int) -> QuotaFit | None:
        """The namespace's check for `decide` (`fit_quota` bound to it), or None when no limit
        is set there: HAMi's `FitQuota` then always says yes, so the fit skips it."""
        if namespace not in self.limited:
            return None

        def fits(memory_mib: int, cores: int) -> bool:
            return self.fit_quota(namespace, memory_mib, memory_factor, cores)

        return fits

    def _refresh(self, namespace: str) -> None:
        entries = self.namespaces.get(namespace, {})
        if any(quota.limit_set for quota in entries.values()):
            self.limited.add(namespace)
        else:
            self.limited.discard(namespace)
