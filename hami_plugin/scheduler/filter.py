"""The placement decision: a pod and candidate nodes in, a node and the annotations out.

HAMi's Filter (docs/hami-reference.md 3.4) fits the pod on every candidate and then takes the
best-scored fitting node. The node score does not depend on the pod, and the ledger keeps nodes
sorted by it, so `decide` walks the candidates in policy order (binpack: highest score first,
spread: lowest first; equal scores: smaller node name first) and stops at the first node that fits.
That node is exactly the one HAMi's rule picks, ties made deterministic (docs/design.md 9.5).

What is reported for the other nodes depends on the mode:
* default (the scheduler's hot path): `failed_nodes` holds the candidates that are not
  registered and every node tried and rejected before the chosen one; nodes after it are not
  fitted, so they appear in neither `failed_nodes` nor `scores`. When no node fits, every
  candidate was tried and `failed_nodes` is HAMi's complete map.
* `exhaustive=True` (the dry run): every candidate is fitted; `failed_nodes` is complete and
  `scores`/`placements` cover every fitting node, as HAMi's FilteringSucceed event lists them.

The ledger is only read. After the pod's annotations are written, the caller books the
allocation with `assume` (HAMi tracks it at once, before the informer sees the patch); before
deciding for a pod that is already tracked (re-scheduling), it calls `ledger.untrack`.

A burst fans out only as far as it must (`would_wait`, `look_ahead`): when the node the policy
ranks first would make the pod wait at bind (a node lock another pod holds, or an in-flight pod
kubelet's Allocate could confuse with it: the caller's predicate), the answer is, among the
nodes that fit, in the policy's order, the first that needs no wait, looking at most
`look_ahead` fitting nodes past the first; when every one of them would wait, the first (it is
waited for there). The predicate is asked only of fitting nodes, and only once the first needs
a wait: a pod placed when nothing is in flight goes exactly where HAMi's Filter puts it. The
booking of the node chosen is that node's own fit, so the annotations stay exact.

A `FitCache` passed to `decide` remembers each node's last fit: a node whose usage snapshot is
the very same object (the ledger replaces a node's snapshot on every change) and a pod with
the same requests and placement options get the remembered result. It makes repeated
decisions for pods of one shape (replicas, an unschedulable pod retried) cheap on the nodes
that did not change.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from hami_plugin.protocol.codec import (
    AnnotationError,
    encode_pod_devices,
    parse_pod_gpu_options,
)
from hami_plugin.protocol.mig import MigAllocation, encode_mig_allocations
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_DEVICES_TO_ALLOCATE,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_VGPU_NODE,
    ANNOTATION_VGPU_TIME,
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

__all__ = ["FilterResult", "FitCache", "WouldWait", "assume", "decide", "pod_shape"]

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
    annotations: Mapping[str, str] = field(default_factory=dict)
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
    """Choose a node for the pod among `candidates` (None: every registered node).

    `requests` are the pod's `pod_requests` when the caller has them already (read once per
    call). An invalid GPU annotation on the pod is reported in `FilterResult.error` (it is the
    pod's fault, not the caller's); nothing is raised. `would_wait` and `look_ahead` fan a
    burst out (the module docstring); without them the answer is HAMi's. `quota` is the pod's
    namespace quota check (`QuotaBook.quota_fit`; None when the namespace has no GPU limit):
    its verdict depends on the namespace's usage, so such a pod is fitted without `cache`.
    """
    if requests is None:
        requests = pod_requests(pod, settings)
    if not requests.wants_gpu:
        return FilterResult(node=None, requests=requests)
    try:
        options = parse_pod_gpu_options(pod.annotations)
    except AnnotationError as error:
        return FilterResult(node=None, requests=requests, error=error)
    node_policy = options.node_policy or settings.node_policy
    gpu_policy = options.gpu_policy or settings.gpu_policy
    context = _context(options, settings)
    signature = _signature(requests, context)
    if quota is not None:
        context = replace(context, quota=quota, init_count=requests.init_count)
        cache = None
    fan_out = would_wait is not None and look_ahead > 0 and not exhaustive
    first: str | None = None
    beyond_first = 0
    failed: dict[str, FitFailure] = {}
    scores: dict[str, float] = {}
    placements: dict[str, PodDevices] = {}
    migs: dict[str, tuple[MigAllocation, ...]] = {}
    chosen: str | None = None
    fitted = 0
    for usage in _candidates(ledger, candidates, prefers_higher_score(node_policy), failed, cache):
        fitted += 1
        if cache is None:
            outcome = fit_pod(usage, requests, context)
        else:
            outcome = cache.fit(usage, requests, context, signature)
        if isinstance(outcome, FitFailure):
            failed[usage.name] = outcome
            continue
        scores[usage.name] = usage.score
        placements[usage.name] = outcome.devices
        if outcome.mig:
            migs[usage.name] = outcome.mig
        if exhaustive:
            if chosen is None:
                chosen = usage.name
            continue
        if first is None:
            first = usage.name
            if (
                not fan_out
                or would_wait is None
                or not would_wait(usage.name, outcome.devices, signature)
            ):
                chosen = first
                break
            continue
        # the first fitting node would wait: the next one that would not, within the look-ahead
        beyond_first += 1
        if would_wait is not None and not would_wait(usage.name, outcome.devices, signature):
            chosen = usage.name
            break
        if beyond_first >= look_ahead:
            break
    fanned_out = chosen is not None and chosen != first and not exhaustive
    if chosen is None and first is not None:
        chosen = first  # every node looked at would wait: wait on the policy's choice
    if chosen is None:
        return FilterResult(
            node=None,
            requests=requests,
            failed_nodes=failed,
            node_policy=node_policy,
            gpu_policy=gpu_policy,
            fitted=fitted,
            shape=signature,
        )
    devices = placements[chosen]
    encoded = encode_pod_devices(devices)
    annotations = {
        ANNOTATION_VGPU_NODE: chosen,
        ANNOTATION_VGPU_TIME: str(int(now.timestamp())),
        ANNOTATION_DEVICES_TO_ALLOCATE: encoded,
        ANNOTATION_DEVICES_ALLOCATED: encoded,
    }
    mig = migs.get(chosen, ())
    if mig:
        # HAMi PatchAnnotations (device.go:505-517): only when there are reservations
        annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS] = encode_mig_allocations(mig)
    return FilterResult(
        node=chosen,
        requests=requests,
        annotations=annotations,
        devices=devices,
        failed_nodes=failed,
        scores=scores,
        placements=placements if exhaustive else {},
        node_policy=node_policy,
        gpu_policy=gpu_policy,
        fitted=fitted,
        shape=signature,
        fanned_out=fanned_out,
        mig=mig,
        mig_placements=migs if exhaustive else {},
    )


def assume(ledger: Ledger, pod_key: str, result: FilterResult) -> None:
    """Book a decision's allocation in the ledger right away (HAMi tracks it before the pod
    update arrives); the later pod event replaces it with the same usage. No-op without node."""
    if result.node is None:
        return
    tallies = collapse_pod_devices(result.devices, result.requests.init_count)
    ledger.track(pod_key, result.node, tallies, mig=result.mig)
