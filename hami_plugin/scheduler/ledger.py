"""The usage ledger: every node's registered GPUs and what tracked pods book on them.

Fed one event at a time (a node or pod added, changed or deleted), it never rescans the
cluster: a pod update subtracts the pod's previous tallies and adds the new ones on its node,
a node update only re-books that node's pods. Rules of docs/hami-reference.md 3.3:

* a pod is tracked when it carries `hami.io/vgpu-node`; its usage is its decoded
  `hami.io/vgpu-devices-allocated` collapsed per GPU (`collapse_pod_devices`);
* Failed and Succeeded pods are dropped (terminating ones are kept);
* once every init container finished with exit code 0 only app containers count, for good;
* a GPU a pod names but the node does not have is ignored;
* dynamic MIG: a pod's `hami.io/vgpu-mig-allocations` (decoded with HAMi's rules, ignored when
  it does not decode, as HAMi ignores the error) gives the reservations in use on the node's
  MIG-mode GPUs and may mark GPUs unhealthy (`usage.mig_booking`, scheduler.go:737-830). Which
  pods count at all is the caller's business: with a booking key only trusted bookings reach
  the ledger (`scheduler.book.trust`, which drops the annotation of an untrusted pod).

Registered nodes are also kept sorted by node score in both directions (ties by name), so a
decision walks them in policy order without sorting; a usage change moves one node.

Not thread-safe: the caller serialises updates and decisions (the extender holds one lock).
"""

from __future__ import annotations

import logging
from bisect import bisect_left, insort
from collections.abc import Iterator, KeysView, Mapping, Sequence
from dataclasses import dataclass, replace

from hami_plugin.protocol.booking import PodBooking
from hami_plugin.protocol.codec import AnnotationError, decode_node_devices, parse_device_cordon
from hami_plugin.protocol.mig import MigAllocation, MigAllocationError
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICE_CORDON,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    GpuDevice,
)
from hami_plugin.protocol.objects import NodeInfo, PodInfo
from hami_plugin.protocol.topology import (
    NODE_NVIDIA_SCORE_ANNOTATION,
    PairScoreError,
    decode_pair_scores,
)
from hami_plugin.protocol.usage import DeviceTally, collapse_pod_devices
from hami_plugin.scheduler.score import node_score
from hami_plugin.scheduler.usage import (
    NodeUsage,
    has_mig_device,
    mig_booking,
    nvidia_candidates,
)

__all__ = ["Ledger", "TrackedPod"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrackedPod:
    """A pod's booked usage. `app_only`: its init containers are done and no longer count.
    `mig`: its MIG reservations (`hami.io/vgpu-mig-allocations`)."""

    key: str
    node: str
    tallies: tuple[DeviceTally, ...]
    app_only: bool = False
    mig: tuple[MigAllocation, ...] = ()


class _NodeEntry:
    """Mutable bookkeeping of one registered node; `usage` is its current immutable snapshot."""

    __slots__ = (
        "candidates",
        "cordoned",
        "devices",
        "has_mig",
        "mig_in_use",
        "pair_scores",
        "positions",
        "total_cores",
        "total_memory_mib",
        "total_slots",
        "unhealthy",
        "usage",
        "used",
        "used_cores",
        "used_memory_mib",
    )

    def __init__(
        self,
        name: str,
        devices: tuple[GpuDevice, ...],
        cordoned: frozenset[str],
        pair_scores: Mapping[str, Mapping[str, int]] | None = None,
    ):
        self.devices = devices
        self.cordoned = cordoned
        self.pair_scores = {} if pair_scores is None else pair_scores
        self.positions = {device.uuid: position for position, device in enumerate(devices)}
        self.candidates = nvidia_candidates(devices)
        self.has_mig = has_mig_device(devices, self.candidates)
        # MIG reservations in use per GPU and, per GPU, how many pods mark it unhealthy;
        # None until a pod's MIG state touches the node (a node without MIG costs nothing)
        self.mig_in_use: list[list[MigAllocation]] | None = None
        self.unhealthy: list[int] | None = None
        self.total_slots = sum(device.split_count for device in devices)
        self.total_cores = sum(device.cores_percent for device in devices)
        self.total_memory_mib = sum(device.memory_mib for device in devices)
        self.used = [0] * len(devices)
        self.used_memory_mib = [0] * len(devices)
        self.used_cores = [0] * len(devices)
        self.usage = self._snapshot(name)

    def book(self, pod: TrackedPod, sign: int) -> None:
        """Add (`sign` 1) or take back (-1) a pod's tallies and MIG reservations; `refresh()`
        publishes them."""
        for tally in pod.tallies:
            position = self.positions.get(tally.uuid)
            if position is None:
                logger.debug(
                    "pod %s books GPU %s, not on node %s", pod.key, tally.uuid, self.usage.name
                )
                continue
            self.used[position] += sign * tally.slots
            self.used_memory_mib[position] += sign * tally.memory_mib
            self.used_cores[position] += sign * tally.cores
        if pod.mig or self.has_mig:
            self._book_mig(pod, sign)

    def _book_mig(self, pod: TrackedPod, sign: int) -> None:
        booking = mig_booking(
            self.devices, self.positions, [tally.uuid for tally in pod.tallies], pod.mig
        )
        if not booking.in_use and not booking.unhealthy:
            return
        if self.mig_in_use is None or self.unhealthy is None:
            self.mig_in_use = [[] for _ in self.devices]
            self.unhealthy = [0] * len(self.devices)
        for position, allocation in booking.in_use:
            if sign > 0:
                self.mig_in_use[position].append(allocation)
            else:
                self.mig_in_use[position].remove(allocation)
        for position in booking.unhealthy:
            self.unhealthy[position] += sign
        if sign > 0 and booking.unhealthy:
            logger.warning(
                "pod %s: its MIG reservations do not match its devices on node %s; GPU(s) %s "
                "marked unhealthy",
                pod.key,
                self.usage.name,
                ",".join(sorted({self.devices[p].uuid for p in booking.unhealthy})),
            )

    def _snapshot(self, name: str) -> NodeUsage:
        devices = self.devices
        mig_in_use: tuple[tuple[MigAllocation, ...], ...] = ()
        if self.mig_in_use is not None and self.unhealthy is not None:
            mig_in_use = tuple(tuple(allocations) for allocations in self.mig_in_use)
            if any(self.unhealthy):
                devices = tuple(
                    replace(device, healthy=False) if marks else device
                    for device, marks in zip(devices, self.unhealthy, strict=True)
                )
        return NodeUsage(
            name=name,
            devices=devices,
            used=tuple(self.used),
            used_memory_mib=tuple(self.used_memory_mib),
            used_cores=tuple(self.used_cores),
            cordoned=self.cordoned,
            candidates=self.candidates,
            pair_scores=self.pair_scores,
            mig_in_use=mig_in_use,
            has_mig=self.has_mig,
            score=node_score(
                self.total_slots,
                self.total_cores,
                self.total_memory_mib,
                sum(self.used),
                sum(self.used_cores),
                sum(self.used_memory_mib),
            ),
        )

    def refresh(self) -> None:
        self.usage = self._snapshot(self.usage.name)


def _pod_mig(key: str, booking: PodBooking) -> tuple[MigAllocation, ...]:
    """The pod's MIG reservations; none when the annotation is absent or does not decode
    (HAMi getNodesUsage ignores the error, scheduler.go:741-747; a MIG GPU the pod books then
    turns unhealthy)."""
    try:
        return booking.mig or ()
    except MigAllocationError as error:
        logger.warning("pod %s: %s ignored: %s", key, ANNOTATION_VGPU_MIG_ALLOCATIONS, error)
        return ()


def _device_order(device: GpuDevice) -> tuple[int, str]:
    return device.index, device.uuid


class Ledger:
    """Registered nodes and tracked pods, updated incrementally."""

    def __init__(self) -> None:
        self._nodes: dict[str, _NodeEntry] = {}
        self.membership = 0  # bumped whenever a node is registered or unregistered
        self._pods: dict[str, TrackedPod] = {}
        self._pods_on: dict[str, set[str]] = {}
        # (register, cordon) annotation values last applied per node, to skip no-op events
        self._node_sources: dict[str, tuple[str | None, str, str | None]] = {}
        self._ascending: list[tuple[float, str]] = []  # (score, name)
        self._descending: list[tuple[float, str]] = []  # (-score, name)

    # --- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of registered nodes."""
        return len(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def node(self, name: str) -> NodeUsage | None:
        """The node's current usage snapshot, or None when it is not registered."""
        entry = self._nodes.get(name)
        return None if entry is None else entry.usage

    def registered_names(self) -> KeysView[str]:
        """A live view of the registered node names (set operations on it run in C)."""
        return self._nodes.keys()

    def node_names(self) -> list[str]:
        """Registered node names, sorted."""
        return sorted(self._nodes)

    def usages(self) -> list[NodeUsage]:
        """Every registered node's current usage snapshot, by node name."""
        return [self._nodes[name].usage for name in sorted(self._nodes)]

    def tracked_pods(self) -> list[TrackedPod]:
        """Every tracked pod's booking, by pod key."""
        return [self._pods[key] for key in sorted(self._pods)]

    def tracked(self, key: str) -> TrackedPod | None:
        """The usage booked for pod `<namespace>/<name>`, if it is tracked."""
        return self._pods.get(key)

    @property
    def pod_count(self) -> int:
        return len(self._pods)

    def keys_on(self, node: str) -> list[str]:
        """The keys of the pods tracked on `node` (registered or not), sorted."""
        return sorted(self._pods_on.get(node, ()))

    def by_preference(self, higher_score_first: bool) -> Iterator[NodeUsage]:
        """Registered nodes, fullest first (binpack) or emptiest first (spread); equal scores
        by node name. Do not update the ledger while iterating."""
        order = self._descending if higher_score_first else self._ascending
        nodes = self._nodes
        for _, name in order:
            yield nodes[name].usage

    # --- nodes -------------------------------------------------------------------------------

    def set_node(
        self, name: str, devices: Sequence[GpuDevice], cordoned: frozenset[str] = frozenset()
    ) -> None:
        """Register (or re-register) a node's GPUs; no GPUs unregisters it. The node's tracked
        pods are booked again on the new device list."""
        self._node_sources.pop(name, None)
        self._register(name, devices, cordoned)

    def remove_node(self, name: str) -> None:
        """Apply a node delete event: forget its GPUs (its pods stay tracked and are booked
        again if it returns)."""
        self._node_sources.pop(name, None)
        self._unregister(name)

    def update_node(self, info: NodeInfo) -> None:
        """Apply a node add/update event: register from `hami.io/node-nvidia-register` and
        `hami.io/device-cordon`. A missing or malformed register annotation unregisters the
        node (a malformed one is logged once per value). Events that leave both annotations
        as they were cost one comparison (nodes change on every kubelet heartbeat)."""
        value = info.annotations.get(ANNOTATION_NODE_REGISTER)
        cordon = info.annotations.get(ANNOTATION_DEVICE_CORDON, "")
        scores = info.annotations.get(NODE_NVIDIA_SCORE_ANNOTATION)
        if self._node_sources.get(info.name) == (value, cordon, scores):
            return
        self._node_sources[info.name] = (value, cordon, scores)
        if value is None:
            self._unregister(info.name)
            return
        try:
            devices = decode_node_devices(value)
            cordoned = parse_device_cordon(cordon)
            # HAMi GetNodeDevices (device.go:321-327): a score annotation that does not decode
            # fails the node's device list, as a bad register value does.
            pair_scores = decode_pair_scores(scores) if scores is not None else {}
        except (AnnotationError, PairScoreError) as error:
            logger.warning("node %s not registered: %s", info.name, error)
            self._unregister(info.name)
            return
        uuids = {device.uuid for device in devices}
        kept = {uuid: peers for uuid, peers in pair_scores.items() if uuid in uuids}
        self._register(info.name, devices, cordoned, kept)

    def _register(
        self,
        name: str,
        devices: Sequence[GpuDevice],
        cordoned: frozenset[str],
        pair_scores: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        ordered = tuple(sorted(devices, key=_device_order))
        scores = {} if pair_scores is None else pair_scores
        entry = self._nodes.get(name)
        if (
            entry is not None
            and entry.devices == ordered
            and entry.cordoned == cordoned
            and entry.pair_scores == scores
        ):
            return
        self._unregister(name)
        if not ordered:
            return
        entry = _NodeEntry(name, ordered, cordoned, scores)
        for key in self._pods_on.get(name, ()):
            entry.book(self._pods[key], 1)
        entry.refresh()
        self._nodes[name] = entry
        self.membership += 1
        self._list(entry)

    def _unregister(self, name: str) -> None:
        entry = self._nodes.pop(name, None)
        self.membership += 1
        if entry is not None:
            self._unlist(entry)

    # --- pods --------------------------------------------------------------------------------

    def track(
        self,
        key: str,
        node: str,
        tallies: tuple[DeviceTally, ...],
        app_only: bool = False,
        mig: tuple[MigAllocation, ...] = (),
    ) -> None:
        """Book a pod's usage (and MIG reservations) on a node, replacing what it booked
        before."""
        previous = self._pods.get(key)
        pod = TrackedPod(key, node, tallies, app_only, mig)
        if previous == pod:
            return
        if previous is not None:
            self._unbook(previous)
        self._pods[key] = pod
        self._pods_on.setdefault(node, set()).add(key)
        entry = self._nodes.get(node)
        if entry is not None:
            entry.book(pod, 1)
            self._moved(entry)

    def untrack(self, key: str) -> None:
        """Release a pod's usage (no-op for an untracked pod)."""
        previous = self._pods.pop(key, None)
        if previous is not None:
            self._unbook(previous)

    def update_pod(self, info: PodInfo) -> None:
        """Apply a pod add/update event (docs/hami-reference.md 3.3). A malformed allocation
        annotation makes the pod untracked (logged)."""
        booking = info.booking
        if booking is None or not booking.node or booking.allocated_text is None or info.finished:
            self.untrack(info.key)
            return
        node = booking.node
        try:
            devices = booking.allocated or ()
        except AnnotationError as error:
            logger.warning("pod %s not tracked: %s", info.key, error)
            self.untrack(info.key)
            return
        previous = self._pods.get(info.key)
        # Once shrunk to the app containers, a pod is never re-inflated (HAMi does the same).
        app_only = info.init_containers_done or (
            previous is not None and previous.node == node and previous.app_only
        )
        tallies = collapse_pod_devices(devices, len(info.init_containers), app_only)
        self.track(info.key, node, tallies, app_only, _pod_mig(info.key, booking))

    def delete_pod(self, pod: PodInfo | str) -> None:
        """Apply a pod delete event (by pod or `<namespace>/<name>` key)."""
        self.untrack(pod if isinstance(pod, str) else pod.key)

    # --- internals ---------------------------------------------------------------------------

    def _unbook(self, pod: TrackedPod) -> None:
        keys = self._pods_on.get(pod.node)
        if keys is not None:
            keys.discard(pod.key)
            if not keys:
                del self._pods_on[pod.node]
        entry = self._nodes.get(pod.node)
        if entry is not None:
            entry.book(pod, -1)
            self._moved(entry)

    def _moved(self, entry: _NodeEntry) -> None:
        before = entry.usage.score
        entry.refresh()
        if entry.usage.score != before:
            name = entry.usage.name
            self._remove_key(self._ascending, (before, name))
            self._remove_key(self._descending, (-before, name))
            insort(self._ascending, (entry.usage.score, name))
            insort(self._descending, (-entry.usage.score, name))

    def _list(self, entry: _NodeEntry) -> None:
        insort(self._ascending, (entry.usage.score, entry.usage.name))
        insort(self._descending, (-entry.usage.score, entry.usage.name))

    def _unlist(self, entry: _NodeEntry) -> None:
        self._remove_key(self._ascending, (entry.usage.score, entry.usage.name))
        self._remove_key(self._descending, (-entry.usage.score, entry.usage.name))

    @staticmethod
    def _remove_key(order: list[tuple[float, str]], key: tuple[float, str]) -> None:
        index = bisect_left(order, key)
        if index == len(order) or order[index] != key:
            raise AssertionError(f"ledger order lost node {key[1]}")  # a bug, never input
        del order[index]
