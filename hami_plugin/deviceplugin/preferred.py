"""What the device plugin answers to kubelet's GetPreferredAllocation (docs/hami-reference.md 4.5).

Pure, no I/O, never fails: the answer follows the GPUs the scheduler booked for the pending pod
(`deviceplugin.pending` picks it), and falls back to a valid choice from what kubelet offers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hami_plugin.deviceplugin.allocate import AllocateFailure, entries_to_allocate
from hami_plugin.deviceplugin.inventory import physical_uuid_of
from hami_plugin.protocol.model import ContainerDevices
from hami_plugin.protocol.objects import PodInfo


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One ContainerPreferredAllocationRequest."""

    available: Sequence[str]
    must_include: Sequence[str] = ()
    size: int = 0


@dataclass(frozen=True, slots=True)
class PreferredAnswer:
    """The device IDs for one request; `fallback_note` is set when the hint could not be used."""

    device_ids: tuple[str, ...]
    fallback_note: str | None = None


def pending_entries(pod: PodInfo | None) -> tuple[ContainerDevices, ...]:
    """The non-empty to-allocate entries of `pod`, in order; () when none or unreadable."""
    if pod is None:
        return ()
    try:
        return tuple(entry for entry in entries_to_allocate(pod) if entry)
    except AllocateFailure:
        return ()


def _prefer_one(request: PreferredRequest, wanted: ContainerDevices) -> PreferredAnswer:
    size = max(request.size, 0)
    chosen: list[str] = list(dict.fromkeys(request.must_include))
    if len(chosen) >= size:
        return PreferredAnswer(device_ids=tuple(chosen))
    taken = set(chosen)
    # Each must-include ID already covers one annotated device on its GPU.
    covered: dict[str, int] = {}
    for device_id in chosen:
        gpu = physical_uuid_of(device_id)
        covered[gpu] = covered.get(gpu, 0) + 1
    missing: list[str] = []
    for device in wanted[:size]:
        if covered.get(device.uuid, 0) > 0:
            covered[device.uuid] -= 1
            continue
        pick = next(
            (
                device_id
                for device_id in request.available
                if device_id not in taken and physical_uuid_of(device_id) == device.uuid
            ),
            None,
        )
        if pick is None:
            missing.append(device.uuid)
            continue
        chosen.append(pick)
        taken.add(pick)
        if len(chosen) >= size:
            break
    note = None
    if missing:
        note = "no available device on GPU(s) " + ",".join(missing)
    elif not wanted:
        note = "no pending allocation to follow"
    if len(chosen) < size:
        _top_up(chosen, taken, request.available, size)
    return PreferredAnswer(device_ids=tuple(chosen), fallback_note=note)


def _top_up(chosen: list[str], taken: set[str], available: Sequence[str], size: int) -> None:
    # Fallback: first IDs on GPUs not used yet (a vGPU count means distinct GPUs), then any.
    used_gpus = {physical_uuid_of(device_id) for device_id in chosen}
    for device_id in available:
        if len(chosen) >= size:
            return
        gpu = physical_uuid_of(device_id)
        if device_id not in taken and gpu not in used_gpus:
            chosen.append(device_id)
            taken.add(device_id)
            used_gpus.add(gpu)
    for device_id in available:
        if len(chosen) >= size:
            return
        if device_id not in taken:
            chosen.append(device_id)
            taken.add(device_id)


def decide_preferred(
    pod: PodInfo | None, requests: Sequence[PreferredRequest]
) -> tuple[PreferredAnswer, ...]:
    """Answer GetPreferredAllocation; never fails.

    The i-th request follows the i-th non-empty to-allocate entry of `pod`
    (docs/hami-reference.md 4.5): must-include IDs first, then for each annotated GPU the first
    available ID on it. When the pod is unknown, its annotation unreadable or a chosen GPU has no
    available ID (it died), the answer is topped up from `available` (distinct GPUs first), so
    it always holds `size` IDs when `available` has that many, and always every must-include ID.
    """
    entries = pending_entries(pod)
    answers = []
    for position, request in enumerate(requests):
        wanted = entries[position] if position < len(entries) else ()
        answers.append(_prefer_one(request, wanted))
    return tuple(answers)
