"""GPU pair links and their topology scores, and the `hami.io/node-nvidia-score` annotation.

HAMi v2.10 measures every ordered GPU pair with two probes (`pkg/device/nvidia/calculate_score.go`
`build`, lines ~130-150): the PCIe common-ancestor level (`links.go` `GetP2PLink`) and the NVLink
lane count (`links.go` `GetNVLink`); each probe that is not "unknown" adds one `P2PLinkType` to the
pair's link list. A pair's score is the sum of its links' weights (`calculateGPUPairScore`): 10
(cross CPU) .. 60 (same board) for PCIe, 100 per NVLink lane; a pair whose two directions carry a
different number of links scores 0 and is flagged asymmetric. The device plugin publishes the
scores as JSON `[{"uuid":..., "score":{peer uuid: score}}]` (`register.go:279-300`, Go's
`json.Marshal` of `ListDeviceScore`: fields in that order, map keys sorted, no spaces).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

NODE_NVIDIA_SCORE_ANNOTATION = "hami.io/node-nvidia-score"
"""HAMi `pkg/device/nvidia/device.go:43` `RegisterGPUPairScore`."""


class P2PLinkType(IntEnum):
    """HAMi `links.go` `P2PLinkType`: the nature of one link between two GPUs (same order)."""

    UNKNOWN = 0
    CROSS_CPU = 1
    SAME_CPU = 2
    HOST_BRIDGE = 3
    MULTI_SWITCH = 4
    SINGLE_SWITCH = 5
    SAME_BOARD = 6
    NVLINK_1 = 7
    """SingleNVLINKLink; NVLINK_n = 6 + n up to EighteenNVLINKLinks."""


NVLINK_MAX = 18
"""`nvlinkCountToType` covers 1..18 lanes (links.go); more or fewer is unknown."""

_PCIE_SCORES = {
    P2PLinkType.CROSS_CPU: 10,
    P2PLinkType.SAME_CPU: 20,
    P2PLinkType.HOST_BRIDGE: 30,
    P2PLinkType.MULTI_SWITCH: 40,
    P2PLinkType.SINGLE_SWITCH: 50,
    P2PLinkType.SAME_BOARD: 60,
}

TOPOLOGY_LEVEL_LINKS = {0: 6, 10: 5, 20: 4, 30: 3, 40: 2, 50: 1}
"""NVML_TOPOLOGY_* level -> P2PLinkType value (links.go `GetP2PLink`: INTERNAL same board,
SINGLE single switch, MULTIPLE multi switch, HOSTBRIDGE host bridge, NODE same CPU, SYSTEM cross
CPU). Any other level is an error there."""


def nvlink_type(lanes: int) -> int:
    """links.go `nvlinkCountToType`: the link type value of `lanes` NVLink lanes (0: unknown)."""
    if lanes < 1 or lanes > NVLINK_MAX:
        return P2PLinkType.UNKNOWN
    return P2PLinkType.NVLINK_1 + lanes - 1


def link_score(link: int) -> int:
    """calculateGPUPairScore's weight of one link type value (unknown and others: 0)."""
    if link in _PCIE_SCORES:
        return _PCIE_SCORES[P2PLinkType(link)]
    if P2PLinkType.NVLINK_1 <= link < P2PLinkType.NVLINK_1 + NVLINK_MAX:
        return 100 * (link - P2PLinkType.NVLINK_1 + 1)
    return 0


@dataclass(frozen=True, slots=True)
class GpuLinks:
    """One GPU as HAMi's `Device` sees it: its UUID, NVML index and links to each peer index."""

    uuid: str
    index: int
    links: Mapping[int, Sequence[int]]
    """Peer NVML index -> the link type values measured from this GPU to it."""


@dataclass(frozen=True, slots=True)
class DeviceScore:
    """HAMi `DeviceScore` / `DevicePairScore`: a GPU and its score towards each peer UUID."""

    uuid: str
    scores: Mapping[str, int]


def pair_score(first: GpuLinks, second: GpuLinks) -> tuple[int, bool]:
    """calculateGPUPairScore: (score, asymmetric). Link lists of different lengths score 0."""
    if first.index == second.index and first.uuid == second.uuid:
        return 0, False
    forward = first.links.get(second.index, ())
    backward = second.links.get(first.index, ())
    if len(forward) != len(backward):
        return 0, True
    return sum(link_score(link) for link in forward), False


def calculate_gpu_scores(gpus: Sequence[GpuLinks]) -> tuple[list[DeviceScore], bool]:
    """calculateGPUScore: every GPU's score towards every other, and whether any pair was
    asymmetric (HAMi then emits the node warning event `AsymmetricGPUP2PLink`)."""
    result: list[DeviceScore] = []
    any_asymmetric = False
    for i, gpu in enumerate(gpus):
        scores: dict[str, int] = {}
        for j, peer in enumerate(gpus):
            if i == j:
                continue
            score, asymmetric = pair_score(gpu, peer)
            scores[peer.uuid] = score
            any_asymmetric = any_asymmetric or asymmetric
        result.append(DeviceScore(uuid=gpu.uuid, scores=scores))
    return result, any_asymmetric


def encode_pair_scores(scores: Sequence[DeviceScore]) -> str:
    """The annotation value exactly as Go's `json.Marshal(ListDeviceScore)` writes it."""
    return json.dumps(
        [{"uuid": s.uuid, "score": dict(sorted(s.scores.items()))} for s in scores],
        separators=(",", ":"),
        ensure_ascii=False,
    )


class PairScoreError(ValueError):
    """The annotation is not HAMi's `DevicePairScores` JSON (devices.go `DecodePairScores`)."""


def decode_pair_scores(value: str) -> dict[str, dict[str, int]]:
    """devices.go `DecodePairScores`, keyed by GPU UUID (the first entry of a UUID wins, as in
    `GetNodeDevices`' lookup loop). An entry without `uuid` is the empty UUID, matching no GPU."""
    try:
        document = json.loads(value)
    except ValueError as error:
        raise PairScoreError(f"invalid pair scores: {error}") from None
    if document is None:
        return {}
    if not isinstance(document, list):
        raise PairScoreError("invalid pair scores: expected a JSON array")
    result: dict[str, dict[str, int]] = {}
    for entry in document:
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise PairScoreError("invalid pair scores: each entry must be an object")
        uuid = entry.get("uuid") or ""
        scores = entry.get("score") or {}
        if not isinstance(uuid, str) or not isinstance(scores, dict):
            raise PairScoreError("invalid pair scores: uuid must be a string, score an object")
        clean: dict[str, int] = {}
        for peer, score in scores.items():
            if isinstance(score, bool) or not isinstance(score, int):
                raise PairScoreError(f"invalid pair scores: score of {peer} is not an integer")
            clean[peer] = score
        result.setdefault(uuid, clean)
    return result
