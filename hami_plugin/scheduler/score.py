"""Node and GPU scores, computed in IEEE float32 exactly as HAMi's Go code does
(docs/hami-reference.md 3.6).

Every ratio is a float32 division of two integers converted to float32, each weighted term a
float32 product, the three terms summed left to right in float32 and the sum multiplied by
the weight 10 in float32. Python floats are doubles; rounding each double result of `+ - * /`
on float32 operands back to float32 gives the correctly rounded float32 result (double has
more than 2*24+2 bits), so the values below are bit-for-bit Go's (without fused multiply-add).

A higher score means a fuller node or GPU.
"""

from __future__ import annotations

import struct

from hami_plugin.protocol.model import ScoringWeights
from hami_plugin.scheduler.requests import PERCENTAGE_UNSET, ContainerRequest

__all__ = ["WEIGHT", "device_score", "float32", "node_score"]

WEIGHT = 10
"""HAMi's `util.Weight`."""

_FLOAT32 = struct.Struct("f")
_EXACT_INT = 1 << 24
_DEFAULT_WEIGHTS = ScoringWeights()


def float32(value: float) -> float:
    """Round a double to the nearest float32 (ties to even), returned as a Python float."""
    result: float = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    return result


def _f32_int(value: int) -> float:
    # Integers up to 2**24 are exact in float32; only larger ones need rounding.
    if -_EXACT_INT <= value <= _EXACT_INT:
        return float(value)
    return float32(float(value))


def _ratio(numerator: int, denominator: int) -> float:
    return float32(_f32_int(numerator) / _f32_int(denominator))


def _weighted(weight: int, ratio: float) -> float:
    if weight == 1:
        return ratio
    return float32(_f32_int(weight) * ratio)


def _combine(slot: float, core: float, memory: float) -> float:
    return float32(WEIGHT * float32(float32(slot + core) + memory))


def node_score(
    total_slots: int,
    total_cores: int,
    total_memory_mib: int,
    used_slots: int,
    used_cores: int,
    used_memory_mib: int,
) -> float:
    """`10 * (used/total + usedCores/totalCores + usedMem/totalMem)` over all GPUs of a node,
    before the pod being placed; 0 when any total is 0."""
    if total_slots == 0 or total_cores == 0 or total_memory_mib == 0:
        return 0.0
    return _combine(
        _ratio(used_slots, total_slots),
        _ratio(used_cores, total_cores),
        _ratio(used_memory_mib, total_memory_mib),
    )


def device_score(
    split_count: int,
    total_cores: int,
    total_memory_mib: int,
    used_slots: int,
    used_cores: int,
    used_memory_mib: int,
    request: ContainerRequest | None,
    weights: ScoringWeights = _DEFAULT_WEIGHTS,
) -> float:
    """One GPU's score including the container's request, as the design note writes it
    (docs/design.md 9.3): `request` is the number of GPUs asked, the memory a percentage of this
    card when a percentage was asked (even next to MiB, as HAMi scores it), else the MiB. 0 when
    the GPU has no slots, cores or memory."""
    if split_count == 0 or total_cores == 0 or total_memory_mib == 0:
        return 0.0
    asked, cores, memory = 0, 0, 0
    if request is not None:
        asked = request.count
        cores = request.cores_percent
        if request.memory_percent not in (0, PERCENTAGE_UNSET):
            memory = total_memory_mib * request.memory_percent // 100
        else:
            memory = request.memory_mib
    return _combine(
        _weighted(weights.slot, _ratio(asked + used_slots, split_count)),
        _weighted(weights.core, _ratio(cores + used_cores, total_cores)),
        _weighted(weights.memory, _ratio(memory + used_memory_mib, total_memory_mib)),
    )
