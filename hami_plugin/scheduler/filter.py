"""The placement decision: a pod and candidate nodes in, a node and the annotations out.

HAMi's Filter (docs/hami-reference.md 3.4) fits the pod on every candidate and takes the
best-scored fitting node. The node score does not depend on the pod and the ledger keeps nodes
sorted by it, so `decide` fits the candidates in policy order (binpack: highest score first,
spread: lowest; equal scores: smaller name first), and a chooser stops where it has its answer:

* first fit (the scheduler's hot path): the first node that fits, HAMi's choice with ties made
  deterministic (docs/design.md 9.5); `failed_nodes` holds the unregistered candidates and the
  nodes rejected before it (every candidate when none fits: HAMi's complete map);
* first fit without a wait (`would_wait`, `look_ahead`: a burst fans out only as far as it
  must): when the bind would wait on the first fitting node (a node lock another pod holds, or
  an in-flight pod kubelet's Allocate could confuse with this one), the next fitting node on
  which it would not, at most `look_ahead` past the first, else the first. A pod placed while
  nothing is in flight goes exactly where HAMi puts it;
* all fits (`exhaustive`, the dry run): every candidate fitted, `failed_nodes`, `scores` and
  `placements` complete, as HAMi's FilteringSucceed event lists them.

The ledger is only read: the caller books the decision with `assume` (HAMi tracks it before the
informer sees the patch), and untracks a re-scheduled pod before deciding. A `FitCache`
remembers each node's last fit while its usage snapshot is the same object (the ledger replaces
it on every change), for repeated decisions for pods of one shape.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from hami_plugin.protocol.booking import booking_annotations
from hami_plugin.protocol.codec import (
    AnnotationError,
    parse_pod_gpu_options,
)
from hami_plugin.protocol.mig import MigAllocation
from hami_plugin.protocol.model import (
    GpuPolicy,
    NodePolicy,
    PodDevices,
    PodGpuOptions,
)
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.usage import collapse_pod_devices
from hami_plugin.scheduler.fit import NODE_UNREGISTERED, FitContext, FitFailure, QuotaFit
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.pod_fit import PodFit, fit_pod
from hami_plugin.scheduler.policy import prefers_higher_score
from hami_plugin.scheduler.requests import PodRequests, pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.usage import NodeUsage

__all__ = [
    "FilterResult",
    "FitCache",
    "NodeFitter",
    "WouldWait",
    "assume",
    "decide",
    "node_fitter",
    "pod_shape",
]

WouldWait = Callable[[str, PodDevices, Hashable], bool]
"""`would_wait(node, devices, shape)`: True when binding the pod there with these devices would
have to wait for another pod (the caller knows the locks and the pods in flight)."""

_WALK_GLOBAL_ORDER_FRACTION = 4
"""Walk the ledger's sorted order (skipping non-candidates) when at least 1/4 of the registered
nodes are candidates; sort the few candidates instead when there are fewer."""


@dataclass(frozen=True, slots=True)
class FilterResult:
    """The outcome of one decision.

    `node` is None when the pod asks no GPU (`requests.wants_gpu` False: every candidate
    passes, nothing to write), when no node fits, or when `error` is set (invalid pod
    annotation: HAMi's Filter returns an error for the pod).
    """

    node: str | None
    requests: PodRequests
    devices: PodDevices = ()
    failed_nodes: Mapping[str, FitFailure] = field(default_factory=dict)
    scores: Mapping[str, float] = field(default_factory=dict)
    placements: Mapping[str, PodDevices] = field(default_factory=dict)
    node_policy: NodePolicy | None = None
    gpu_policy: GpuPolicy | None = None
    error: AnnotationError | None = None
    """The pod's GPU annotation that cannot be read (its key and detail); rendered at the edge."""
    fitted: int = 0
    """How many nodes were fitted (registered candidates tried)."""
    shape: Hashable | None = None
    """What the pod asks, as far as Allocate can tell pods apart (`pod_shape`): the requests
    and the resolved GPU options. None when the pod asks no GPU or has an unreadable option."""
    fanned_out: bool = False
    """The first fitting node would have made the pod wait, so `node` is a later one."""
    mig: tuple[MigAllocation, ...] = ()
    """The chosen node's MIG reservations (`PodFit.mig`), written to
    `hami.io/vgpu-mig-allocations` and booked by `assume`."""
    mig_placements: Mapping[str, tuple[MigAllocation, ...]] = field(default_factory=dict)
    """With `exhaustive`, the MIG reservations of every fitting node that has any."""
    decided_at: datetime | None = None
    """When the node was chosen (`hami.io/vgpu-time`)."""

    @property
    def annotations(self) -> dict[str, str]:
        """What the decision books on the pod (`protocol.booking.booking_annotations`), encoded
        on each read: {} without a node."""
        if self.node is None or self.decided_at is None:
            return {}
        return booking_annotations(self.node, self.devices, self.mig, self.decided_at)


class FitCache:
    """The last fit of every node, valid while the node's usage snapshot is unchanged."""

    __slots__ = ("_entries", "candidates")

    def __init__(self) -> None:
        self._entries: dict[str, tuple[NodeUsage, object, PodFit | FitFailure]] = {}
        self.candidates: tuple[list[str], int, set[str], list[str]] | None = None
        """The last candidate list resolved against the ledger: (names as sent,
        `Ledger.membership` then, the registered ones, the unregistered ones). kube-scheduler
        sends the same thousands of names call after call; while no node registers or leaves,
        they resolve the same way."""

    def __len__(self) -> int:
        return len(self._entries)

    def fit(
        self, usage: NodeUsage, requests: PodRequests, context: FitContext, signature: object
    ) -> PodFit | FitFailure:
        """`fit_pod(usage, requests, context)`, remembered under `signature` (a value that
        equals another only when requests and context do)."""
        entry = self._entries.get(usage.name)
        if entry is not None and entry[0] is usage and entry[1] == signature:
            return entry[2]
        result = fit_pod(usage, requests, context)
        self._entries[usage.name] = (usage, signature, result)
        return result

    def clear(self) -> None:
        self._entries.clear()


def _candidates(
    ledger: Ledger,
    names: Iterable[str] | None,
    higher_first: bool,
    failed: dict[str, FitFailure],
    cache: FitCache | None = None,
) -> Iterator[NodeUsage]:
    if names is None:
        return ledger.by_preference(higher_first)
    names = names if isinstance(names, list) else list(names)
    last = cache.candidates if cache is not None else None
    if last is not None and last[1] == ledger.membership and last[0] == names:
        wanted = last[2]
        for name in last[3]:
            failed[name] = NODE_UNREGISTERED
    else:
        # Set operations run in C: kube-scheduler sends every node that passed its own filters,
        # thousands of names per call, nearly always all of them registered.
        wanted = set(names)
        registered = ledger.registered_names()
        missing = []
        if not wanted <= registered:
            missing = [name for name in names if name not in registered]
            for name in missing:
                failed[name] = NODE_UNREGISTERED
            wanted &= registered
        if cache is not None:
            cache.candidates = (names, ledger.membership, wanted, missing)
    if len(wanted) * _WALK_GLOBAL_ORDER_FRACTION >= len(ledger):
        return (usage for usage in ledger.by_preference(higher_first) if usage.name in wanted)
    usages = [usage for name in wanted if (usage := ledger.node(name)) is not None]
    if higher_first:
        usages.sort(key=lambda usage: (-usage.score, usage.name))
    else:
        usages.sort(key=lambda usage: (usage.score, usage.name))
    return iter(usages)


def pod_shape(pod: PodInfo, settings: SchedulerSettings) -> Hashable | None:
    """What the pod asks as far as Allocate can tell pods apart: its per-container requests
    (init containers first) and its GPU options resolved against the defaults (types, UUIDs,
    NUMA, GPU policy). Two pods with equal shapes get the same limits from either one's
    booking. None for a pod that asks no GPU or whose options cannot be read."""
    requests = pod_requests(pod, settings)
    if not requests.wants_gpu:
        return None
    try:
        options = parse_pod_gpu_options(pod.annotations)
    except AnnotationError:
        return None
    return _signature(requests, _context(options, settings))


def _context(options: PodGpuOptions, settings: SchedulerSettings) -> FitContext:
    return FitContext.for_pod(
        options, settings.gpu_policy, numa_grouped_order=settings.numa_grouped_order
    )


def _signature(requests: PodRequests, context: FitContext) -> Hashable:
    """The fit cache's key for the pod, and its `pod_shape`."""
    return (requests.containers, requests.init_count, context)


def decide(
    ledger: Ledger,
    pod: PodInfo,
    candidates: Iterable[str] | None,
    now: datetime,
    settings: SchedulerSettings,
    *,
    exhaustive: bool = False,
    cache: FitCache | None = None,
    requests: PodRequests | None = None,
    would_wait: WouldWait | None = None,
    look_ahead: int = 0,
    quota: QuotaFit | None = None,
) -> FilterResult:
    """Choose a node for the pod among `candidates` (None: every registered node): the first
    fit, or with `exhaustive` all fits, or with `would_wait` and `look_ahead > 0` the first
    fit without a wait (the module docstring).

    `requests`: the pod's `pod_requests` when the caller has them. An invalid GPU annotation
    is reported in `FilterResult.error`; nothing is raised. `quota`: the namespace quota check
    (`QuotaBook.quota_fit`; None without a GPU limit); its verdict depends on the namespace's
    usage, so such a pod is fitted without `cache`.
    """
    if requests is None:
        requests = pod_requests(pod, settings)
    if not requests.wants_gpu:
        return FilterResult(node=None, requests=requests)
    try:
        options = parse_pod_gpu_options(pod.annotations)
    except AnnotationError as error:
        return FilterResult(node=None, requests=requests, error=error)
    asked = _Pod.resolve(requests, options, settings, quota)
    search = _NodeSearch(ledger, candidates, asked, None if quota is not None else cache)
    if exhaustive:
        chosen = _all_fits(search)
    elif would_wait is not None and look_ahead > 0:
        chosen = _first_fit_without_wait(search, would_wait, look_ahead, asked.shape)
    else:
        chosen = _first_fit(search)
    return _result(asked, search, chosen, now, exhaustive)


NodeFitter = Callable[[NodeUsage, QuotaFit | None], PodFit | FitFailure]
"""`fit(usage, quota)`: the pod's fit on one node's usage with that quota check."""


def node_fitter(
    pod: PodInfo, requests: PodRequests, settings: SchedulerSettings
) -> NodeFitter | None:
    """The pod's fit on one node as `decide` fits it, resolved once (preemption fits the same
    pod on many versions of a node); None when the pod asks no GPU or an annotation cannot be
    read (`decide` reports that)."""
    if not requests.wants_gpu:
        return None
    try:
        options = parse_pod_gpu_options(pod.annotations)
    except AnnotationError:
        return None
    context = _context(options, settings)

    def fit(usage: NodeUsage, quota: QuotaFit | None) -> PodFit | FitFailure:
        node_context = context
        if quota is not None:
            node_context = replace(context, quota=quota, init_count=requests.init_count)
        return fit_pod(usage, requests, node_context)

    return fit


@dataclass(frozen=True, slots=True)
class _Pod:
    """The pod as one decision reads it: its requests, its options resolved against the
    scheduler defaults, and its shape (`pod_shape`, the fit cache's key)."""

    requests: PodRequests
    context: FitContext
    shape: Hashable
    node_policy: NodePolicy
    gpu_policy: GpuPolicy

    @classmethod
    def resolve(
        cls,
        requests: PodRequests,
        options: PodGpuOptions,
        settings: SchedulerSettings,
        quota: QuotaFit | None,
    ) -> _Pod:
        context = _context(options, settings)
        shape = _signature(requests, context)
        if quota is not None:
            context = replace(context, quota=quota, init_count=requests.init_count)
        return cls(
            requests,
            context,
            shape,
            options.node_policy or settings.node_policy,
            options.gpu_policy or settings.gpu_policy,
        )


class _NodeSearch:
    """The candidates fitted one by one in the node policy's order, as far as a chooser
    iterates: each node that fits is yielded (name and fit) and kept in `fits` and `scores`,
    each that does not is kept in `failed` (with the unregistered candidates); `fitted`
    counts the nodes fitted."""

    __slots__ = ("_cache", "_nodes", "_pod", "failed", "fits", "fitted", "scores")

    def __init__(
        self, ledger: Ledger, names: Iterable[str] | None, pod: _Pod, cache: FitCache | None
    ) -> None:
        self.failed: dict[str, FitFailure] = {}
        self.fits: dict[str, PodFit] = {}
        self.scores: dict[str, float] = {}
        self.fitted = 0
        self._pod = pod
        self._cache = cache
        higher_first = prefers_higher_score(pod.node_policy)
        self._nodes = _candidates(ledger, names, higher_first, self.failed, cache)

    def __iter__(self) -> Iterator[tuple[str, PodFit]]:
        requests, context, shape = self._pod.requests, self._pod.context, self._pod.shape
        cache, failed = self._cache, self.failed
        for usage in self._nodes:
            self.fitted += 1
            if cache is None:
                outcome = fit_pod(usage, requests, context)
            else:
                outcome = cache.fit(usage, requests, context, shape)
            if isinstance(outcome, FitFailure):
                failed[usage.name] = outcome
                continue
            self.fits[usage.name] = outcome
            self.scores[usage.name] = usage.score
            yield usage.name, outcome


def _first_fit(search: _NodeSearch) -> str | None:
    """HAMi's choice: the first node that fits."""
    for name, _ in search:
        return name
    return None


def _all_fits(search: _NodeSearch) -> str | None:
    """Every candidate fitted; HAMi's choice is the first that fits."""
    fitting = [name for name, _ in search]
    return fitting[0] if fitting else None


def _first_fit_without_wait(
    search: _NodeSearch, would_wait: WouldWait, look_ahead: int, shape: Hashable
) -> str | None:
    """The first fitting node on which the bind would not wait, at most `look_ahead` fitting
    nodes past the first; else the first (it is waited for there)."""
    first: str | None = None
    for looked, (name, fit) in enumerate(search):
        if not would_wait(name, fit.devices, shape):
            return name
        if first is None:
            first = name
        if looked >= look_ahead:
            break
    return first


def _result(
    pod: _Pod, search: _NodeSearch, chosen: str | None, now: datetime, exhaustive: bool
) -> FilterResult:
    """The decision as the caller reads it."""
    if chosen is None:
        return FilterResult(
            node=None,
            requests=pod.requests,
            failed_nodes=search.failed,
            node_policy=pod.node_policy,
            gpu_policy=pod.gpu_policy,
            fitted=search.fitted,
            shape=pod.shape,
        )
    fit = search.fits[chosen]
    placements: dict[str, PodDevices] = {}
    mig_placements: dict[str, tuple[MigAllocation, ...]] = {}
    if exhaustive:
        placements = {name: fit.devices for name, fit in search.fits.items()}
        mig_placements = {name: fit.mig for name, fit in search.fits.items() if fit.mig}
    return FilterResult(
        node=chosen,
        requests=pod.requests,
        devices=fit.devices,
        failed_nodes=search.failed,
        scores=search.scores,
        placements=placements,
        node_policy=pod.node_policy,
        gpu_policy=pod.gpu_policy,
        fitted=search.fitted,
        shape=pod.shape,
        fanned_out=not exhaustive and chosen != next(iter(search.fits)),
        mig=fit.mig,
        mig_placements=mig_placements,
        decided_at=now,
    )


def assume(ledger: Ledger, pod_key: str, result: FilterResult) -> None:
    """Book a decision's allocation in the ledger right away (HAMi tracks it before the pod
    update arrives); the later pod event replaces it with the same usage. No-op without node."""
    if result.node is None:
        return
    tallies = collapse_pod_devices(result.devices, result.requests.init_count)
    ledger.track(pod_key, result.node, tallies, mig=result.mig)
