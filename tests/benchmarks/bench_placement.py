"""Benchmark of topology-aware and MIG placement in the scheduler core (run by `make bench`).

Two phases, each on its own synthetic cluster built through the scheduler's public inputs (node
events with the register and score annotations, `Ledger.track`/`Ledger.update_pod` for what
running pods book), each timing a stream of decisions with every node a candidate, each
decision booked in the ledger (`assume`, as the extender does):

* `topology` (issue 18): N nodes whose `hami.io/node-nvidia-score` is measured the way the
  device plugin measures it (`NvmlBackend.pair_scores` over the fake NVML, HAMi
  `register.go:279-300`): half `hgx-8-nvswitch` boxes (8 x H100 on NVSwitches), a quarter
  8-GPU PCIe boxes with NVLink bridges 0-1, 2-3, 4-5, 6-7 (the `pcie-4-nvlink-bridges` layout
  twice, written out in the fake file's topology syntax) and a quarter `pcie-4-nvlink-bridges`
  boxes (4 x A100 PCIe). A quarter of the GPUs are nearly full, the others 0-60 % used, so a
  node passes between 0 and 8 GPUs and the `topology-aware` combination search
  (`policy.topology_choice`, HAMi device.go:851-868) has up to C(8,4) = 70 sets to score. The pod
  asks 4 GPUs (16 GiB, 20 % cores each) with `hami.io/gpu-scheduler-policy: topology-aware`.
* `mig`: N nodes of 8 x A100-SXM4-80GB in mixed mode: GPUs 0-3 registered in HAMi's `mig` mode
  (`"mode":"mig"`, the profiles 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb and 7g.80gb with
  memoryMB, core, sliceCount and placements as NVML reports them on that card, `count` the
  largest instance count as HAMi register.go:190-202 sets it), GPUs 4-7 in `hami-core` (split
  10). Half the nodes already run MIG pods: each MIG GPU holds 0-4 instances, chosen with HAMi's
  `selectMigCandidate` (`scheduler.mig.select_mig_candidate`) so their placements never overlap,
  each booked from a pod carrying `hami.io/vgpu-devices-allocated` and
  `hami.io/vgpu-mig-allocations` (runtime identity filled in, as after Allocate); the hami-core
  GPUs are 20-80 % used. Pods ask `nvidia.com/gpu: 1` and `nvidia.com/gpumem` of 8,000-38,000
  MiB, without `nvidia.com/vgpu-mode`, with `mig` and with `hami-core`. Each line says how
  many pods were placed on MIG GPUs and how many on hami-core GPUs, and which failure reasons
  the rejected nodes gave, so the figure shows what it measured (a scheduler without MIG
  fitting rejects every MIG GPU with `CardMigTopologyInfeasible`).

For each phase and node policy one JSON line for `decide` as `/filter` runs it (stops at the
first node that fits) and one for the full decision (`exhaustive=True`, every node fitted, as
HAMi's Filter and the dry run do; not booked). Benchmarks print figures and assert only
correctness.

    python tests/benchmarks/bench_placement.py [--phase all|topology|mig] [--nodes 1000]
        [--decisions 300] [--full-decisions 20] [--seed 7]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from hami_plugin.deviceplugin.nvml import NvmlBackend
from hami_plugin.protocol.codec import encode_node_devices, encode_pod_devices
from hami_plugin.protocol.mig import MigAllocation, encode_mig_allocations
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_GPU_SCHEDULER_POLICY,
    ANNOTATION_NODE_REGISTER,
    ANNOTATION_VGPU_MIG_ALLOCATIONS,
    ANNOTATION_VGPU_MODE,
    ANNOTATION_VGPU_NODE,
    NVIDIA_DEVICE_TYPE,
    ContainerDevice,
    GpuDevice,
    MigPlacement,
    MigProfile,
    NodePolicy,
    OperatingMode,
)
from hami_plugin.protocol.objects import ContainerSpec, NodeInfo, PodInfo
from hami_plugin.protocol.topology import (
    NODE_NVIDIA_SCORE_ANNOTATION,
    DeviceScore,
    encode_pair_scores,
)
from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.filter import FilterResult, assume, decide
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.mig import select_mig_candidate
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.testing.fakenvml.nvml import FakeNvml

PHASES = ("topology", "mig")
SPLIT = 10
MEMORY_MIB = 81920

# --- topology ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BoxKind:
    """One kind of GPU server: its card, GPU count and the fake GPU file's `topology` key."""

    name: str
    card: str
    gpus: int
    topology: Mapping[str, object]


PCIE_8_BRIDGES: Mapping[str, object] = {
    "pcie_default": "system",
    "pcie": [
        {"gpus": [a, b], "level": "node"}
        for half in (range(0, 4), range(4, 8))
        for a in half
        for b in half
        if a < b
    ],
    "nvlink": [{"gpus": [a, a + 1], "links": 12} for a in (0, 2, 4, 6)],
}
"""`pcie-4-nvlink-bridges` twice: NV12 bridges 0-1, 2-3, 4-5, 6-7; 0-3 on CPU 0, 4-7 on CPU 1."""

BOXES = (
    BoxKind("hgx-8-nvswitch", "NVIDIA H100 80GB HBM3", 8, {"preset": "hgx-8-nvswitch"}),
    BoxKind("hgx-8-nvswitch", "NVIDIA H100 80GB HBM3", 8, {"preset": "hgx-8-nvswitch"}),
    BoxKind("pcie-8-nvlink-bridges", "NVIDIA A100 80GB PCIe", 8, PCIE_8_BRIDGES),
    BoxKind(
        "pcie-4-nvlink-bridges", "NVIDIA A100 80GB PCIe", 4, {"preset": "pcie-4-nvlink-bridges"}
    ),
)
"""Node `n` is `BOXES[n % 4]`: half HGX, a quarter 8-GPU PCIe, a quarter 4-GPU PCIe."""


def _fake_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-000000000000"


def measure_box(kind: BoxKind, workdir: Path) -> list[DeviceScore]:
    """The kind's pair scores as the device plugin measures them: a fake GPU file with the
    kind's topology, `NvmlBackend.pair_scores` (links.go probes, calculateGPUScore)."""
    uuids = [_fake_uuid(index) for index in range(kind.gpus)]
    path = workdir / f"{kind.name}.yaml"
    document: dict[str, object] = {
        "gpus": [{"uuid": uuid, "name": kind.card} for uuid in uuids],
        "topology": dict(kind.topology),
    }
    path.write_text(yaml.safe_dump(document))
    backend = NvmlBackend(FakeNvml(str(path)))
    backend.start()
    try:
        scores, asymmetric = backend.pair_scores(uuids)
    finally:
        backend.shutdown()
    if asymmetric:
        raise AssertionError(f"{kind.name}: the fake topology measured asymmetric")
    return scores


def renamed_scores(scores: Sequence[DeviceScore], uuids: Sequence[str]) -> str:
    """The measured scores given to a node's GPUs (`uuids`, by NVML index), as the
    annotation value."""
    index = {_fake_uuid(position): position for position in range(len(scores))}
    return encode_pair_scores(
        [
            DeviceScore(
                uuids[index[score.uuid]],
                {uuids[index[peer]]: value for peer, value in score.scores.items()},
            )
            for score in scores
        ]
    )


def node_name(node: int) -> str:
    return f"node-{node:05d}"


def gpu_uuid(node: int, index: int) -> str:
    return f"GPU-{node:06d}-{index}"


def build_topology_cluster(nodes: int, rng: random.Random) -> tuple[Ledger, list[str]]:
    """The topology phase's cluster: nodes registered through node events carrying the register
    and pair-score annotations, GPU usage booked per GPU (a quarter nearly full)."""
    with tempfile.TemporaryDirectory(prefix="bench-topology-") as workdir:
        measured = {kind.name: measure_box(kind, Path(workdir)) for kind in BOXES}
    ledger = Ledger()
    names = []
    for node in range(nodes):
        kind = BOXES[node % len(BOXES)]
        name = node_name(node)
        names.append(name)
        devices = [
            GpuDevice(
                uuid=gpu_uuid(node, index),
                index=index,
                split_count=SPLIT,
                memory_mib=MEMORY_MIB,
                cores_percent=100,
                type=kind.card,
                numa_node=index * 2 // kind.gpus,
                mode=OperatingMode.HAMI_CORE,
                healthy=True,
            )
            for index in range(kind.gpus)
        ]
        annotations = {
            ANNOTATION_NODE_REGISTER: encode_node_devices(devices),
            NODE_NVIDIA_SCORE_ANNOTATION: renamed_scores(
                measured[kind.name], [device.uuid for device in devices]
            ),
        }
        ledger.update_node(NodeInfo(name=name, annotations=annotations))
        for index in range(kind.gpus):
            fill = rng.uniform(0.85, 1.0) if rng.random() < 0.25 else rng.uniform(0.0, 0.6)
            slots = round(fill * SPLIT)
            if slots == 0:
                continue
            tally = DeviceTally(
                gpu_uuid(node, index), slots, int(fill * MEMORY_MIB), int(fill * 100)
            )
            ledger.track(f"default/fill-{node}-{index}", name, (tally,))
    return ledger, names


def topology_pod(name: str, aware: bool = True) -> PodInfo:
    """The 4-GPU pod; `aware=False` is the same pod under the default GPU policy."""
    limits = {"nvidia.com/gpu": "4", "nvidia.com/gpumem": "16384", "nvidia.com/gpucores": "20"}
    annotations = {ANNOTATION_GPU_SCHEDULER_POLICY: "topology-aware"} if aware else {}
    return PodInfo(
        namespace="bench",
        name=name,
        annotations=annotations,
        containers=(ContainerSpec("main", limits=limits),),
    )


def judge_topology(result: FilterResult) -> dict[str, int]:
    """What the 4 GPUs given are worth: on an HGX node whether they share one CPU (pairs
    `node` + NV18, 1,820 each, against 1,810 across), on an 8-GPU PCIe node whether they are
    whole NVLink-bridged pairs (NV12 + `node`, 1,220, against 20 or 10 without a bridge)."""
    assert result.node is not None
    kind = BOXES[int(result.node.rsplit("-", 1)[1]) % len(BOXES)]
    indexes = {int(d.uuid.rsplit("-", 1)[1]) for entry in result.devices for d in entry}
    if kind.name == "hgx-8-nvswitch":
        return {"hgx_placed": 1, "hgx_one_cpu": len({i // 4 for i in indexes}) == 1}
    if kind.name == "pcie-8-nvlink-bridges":
        return {"pcie8_placed": 1, "pcie8_bridged_pairs": all(i ^ 1 in indexes for i in indexes)}
    return {"pcie4_placed": 1}


# --- MIG ----------------------------------------------------------------------------------------

A100_80GB = "NVIDIA A100-SXM4-80GB"
MIG_GPUS = (0, 1, 2, 3)
"""GPUs registered in `mig` mode on every node of the MIG phase (4-7 are hami-core)."""


def _placements(starts: Sequence[int], size: int) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(start, size) for start in starts)


A100_80GB_PROFILES = (
    MigProfile("1g.10gb", 9728, 15, 1, _placements(range(7), 1)),
    MigProfile("1g.20gb", 19968, 15, 1, _placements((0, 2, 4, 6), 2)),
    MigProfile("2g.20gb", 19968, 29, 2, _placements((0, 2, 4), 2)),
    MigProfile("3g.40gb", 40192, 43, 3, _placements((0, 4), 4)),
    MigProfile("4g.40gb", 40192, 58, 4, _placements((0,), 4)),
    MigProfile("7g.80gb", 81152, 100, 7, _placements((0,), 8)),
)
"""The A100-SXM4-80GB GPU instance profiles as NVML reports them (NVIDIA MIG user guide,
`nvidia-smi mig -lgip` / `-lgipp`: 9.50, 19.50, 39.25 and 79.25 GiB; 14, 28, 42, 56 and 98 SMs;
placements {0..6}:1, {0,2,4,6}:2, {0,2,4}:2, {0,4}:4, {0}:4, {0}:8), `core` as HAMi's
`discoverMigProfiles` computes it (register.go:209-254: SMs x 100 / the 7g's 98, rounded up).
Each profile carries its own NVML numbers; HAMi's device plugin looks a profile up by its slice
prefix (migmgr.go:23-31, `profileSliceKey` 109-114), so on HAMi an allowlisted `1g.20gb` would
carry the 1-slice profile's (1g.10gb's) numbers."""

MIG_INSTANCE_COUNT = 7
"""The largest `InstanceCount` (1g.10gb's): HAMi registers it as the MIG GPU's `count`."""


def mig_gpu(node: int, index: int) -> GpuDevice:
    return GpuDevice(
        uuid=gpu_uuid(node, index),
        index=index,
        split_count=MIG_INSTANCE_COUNT,
        memory_mib=MEMORY_MIB,
        cores_percent=100,
        type=A100_80GB,
        numa_node=index // 4,
        mode=OperatingMode.MIG,
        healthy=True,
        mig_profiles=A100_80GB_PROFILES,
    )


def core_gpu(node: int, index: int) -> GpuDevice:
    return GpuDevice(
        uuid=gpu_uuid(node, index),
        index=index,
        split_count=SPLIT,
        memory_mib=MEMORY_MIB,
        cores_percent=100,
        type=A100_80GB,
        numa_node=index // 4,
        mode=OperatingMode.HAMI_CORE,
        healthy=True,
    )


def _running_pod(name: str, node: str, devices: ContainerDevice, mig: str | None) -> PodInfo:
    annotations = {
        ANNOTATION_VGPU_NODE: node,
        ANNOTATION_DEVICES_ALLOCATED: encode_pod_devices(((devices,),)),
    }
    if mig is not None:
        annotations[ANNOTATION_VGPU_MIG_ALLOCATIONS] = mig
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(devices.used_mem_mib)}
    return PodInfo(
        namespace="default",
        name=name,
        annotations=annotations,
        containers=(ContainerSpec("main", limits=limits),),
        phase="Running",
        node_name=node,
    )


def mig_instances(rng: random.Random, wanted: int) -> list[tuple[MigProfile, MigPlacement]]:
    """Up to `wanted` MIG instances on one empty GPU, each where HAMi's `selectMigCandidate`
    puts a request of a random size: placements that never overlap."""
    placed: list[tuple[MigProfile, MigPlacement]] = []
    for _ in range(wanted):
        memory = rng.choice((5000, 10000, 18000, 30000))
        chosen = select_mig_candidate(A100_80GB_PROFILES, [p for _, p in placed], memory)
        if chosen is not None:
            placed.append(chosen)
    return placed


def build_mig_cluster(
    nodes: int, rng: random.Random
) -> tuple[Ledger, list[str], dict[str, str], dict[str, int]]:
    """The MIG phase's cluster: (ledger, names, GPU UUID -> mode, counts of what is booked)."""
    ledger = Ledger()
    names = []
    modes: dict[str, str] = {}
    counts = {"mig_pods": 0, "mig_gpus_in_use": 0, "hami_core_pods": 0}
    for node in range(nodes):
        name = node_name(node)
        names.append(name)
        devices = [mig_gpu(node, i) if i in MIG_GPUS else core_gpu(node, i) for i in range(8)]
        modes.update((device.uuid, device.mode) for device in devices)
        register = {ANNOTATION_NODE_REGISTER: encode_node_devices(devices)}
        ledger.update_node(NodeInfo(name=name, annotations=register))
        busy = node % 2 == 0
        for index in MIG_GPUS if busy else ():
            instances = mig_instances(rng, rng.randrange(5))
            counts["mig_gpus_in_use"] += bool(instances)
            for number, (profile, placement) in enumerate(instances):
                uuid = gpu_uuid(node, index)
                allocation = MigAllocation(0, 0, uuid, profile.name, placement).with_runtime(
                    f"MIG-{node:06d}-{index}-{number}", number + 1, 0
                )
                device = ContainerDevice(
                    uuid, NVIDIA_DEVICE_TYPE, profile.memory_mib, profile.cores
                )
                pod = _running_pod(
                    f"mig-{node}-{index}-{number}",
                    name,
                    device,
                    encode_mig_allocations([allocation]),
                )
                ledger.update_pod(pod)
                counts["mig_pods"] += 1
        for index in range(8):
            if index in MIG_GPUS:
                continue
            fill = rng.uniform(0.2, 0.8)
            uuid = gpu_uuid(node, index)
            device = ContainerDevice(
                uuid, NVIDIA_DEVICE_TYPE, int(fill * MEMORY_MIB), int(fill * 100)
            )
            ledger.update_pod(_running_pod(f"core-{node}-{index}", name, device, None))
            counts["hami_core_pods"] += 1
    return ledger, names, modes, counts


MIG_SIZES = (8000, 10000, 18000, 20000, 38000)


def mig_pod(name: str, memory_mib: int, mode: str | None) -> PodInfo:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_mib)}
    annotations = {} if mode is None else {ANNOTATION_VGPU_MODE: mode}
    return PodInfo(
        namespace="bench",
        name=name,
        annotations=annotations,
        containers=(ContainerSpec("main", limits=limits),),
    )


def judge_mig(result: FilterResult) -> dict[str, int]:
    """The MIG profiles the pod was given (`FilterResult.mig`, absent from a scheduler that
    predates MIG fitting: then nothing)."""
    allocations: Sequence[MigAllocation] = getattr(result, "mig", ())
    return dict(Counter(f"profile_{allocation.profile}" for allocation in allocations))


# --- timing -------------------------------------------------------------------------------------


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[int(rank) - 1]


def time_stream(
    ledger: Ledger,
    names: list[str],
    policy: NodePolicy,
    pods: Sequence[PodInfo],
    *,
    exhaustive: bool = False,
    modes: Mapping[str, str] | None = None,
    judge: Callable[[FilterResult], Mapping[str, int]] | None = None,
) -> dict[str, object]:
    """Time `decide` for each pod (every node a candidate); book the answer unless
    `exhaustive`. With `modes` (GPU UUID -> mode) count where the placed pods went; `judge`
    adds its own counts of each placed pod's answer to the line."""
    settings = SchedulerSettings(node_policy=policy)
    now = datetime.now(UTC)
    samples: list[float] = []
    fitted: list[int] = []
    placed = 0
    by_mode: Counter[str] = Counter()
    judged: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for pod in pods:
        start = time.perf_counter()
        result = decide(ledger, pod, names, now, settings, exhaustive=exhaustive)
        samples.append((time.perf_counter() - start) * 1000.0)
        fitted.append(result.fitted)
        if result.error is not None:
            raise AssertionError(f"{pod.key}: {result.error}")
        _count_reasons(result, reasons)
        if result.node is None:
            continue
        placed += 1
        if modes is not None:
            by_mode.update({modes[d.uuid] for entry in result.devices for d in entry})
        if judge is not None:
            judged.update(judge(result))
        if not exhaustive:
            assume(ledger, pod.key, result)
    row: dict[str, object] = {
        "p50_ms": round(percentile(samples, 0.5), 3),
        "p99_ms": round(percentile(samples, 0.99), 3),
        "mean_ms": round(statistics.fmean(samples), 3),
        "decisions_per_s": round(len(samples) / (sum(samples) / 1000.0), 1),
        "decisions": len(samples),
        "placed": placed,
        "nodes_fitted_p50": percentile([float(n) for n in fitted], 0.5),
        "nodes_fitted_max": max(fitted),
    }
    if modes is not None:
        row["placed_mig"] = by_mode[OperatingMode.MIG]
        row["placed_hami_core"] = by_mode[OperatingMode.HAMI_CORE]
    row.update(sorted(judged.items()))
    row["failure_reasons"] = dict(sorted(reasons.items()))
    return row


def _count_reasons(result: FilterResult, reasons: Counter[str]) -> None:
    """Rejected nodes by reason (a node with several reasons counts once for each)."""
    for failure in result.failed_nodes.values():
        if failure.node_reason is not None:
            reasons[failure.node_reason.value] += 1
        for reason, _ in failure.counts:
            reasons[reason.value] += 1


def _built(build: Callable[[], Ledger]) -> tuple[dict[str, object], Ledger]:
    gc.collect()
    tracemalloc.start()
    start = time.perf_counter()
    ledger = build()
    build_s = time.perf_counter() - start
    ledger_mib = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    facts: dict[str, object] = {
        "nodes": len(ledger),
        "tracked_pods": ledger.pod_count,
        "build_s": round(build_s, 2),
        "ledger_mib": round(ledger_mib, 1),
    }
    return facts, ledger


def emit(row: Mapping[str, object]) -> None:
    print(json.dumps(row))
    sys.stdout.flush()


def run_topology(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    holder: list[list[str]] = []

    def build() -> Ledger:
        ledger, names = build_topology_cluster(args.nodes, rng)
        holder.append(names)
        return ledger

    common, ledger = _built(build)
    names = holder[0]
    common = {"phase": "topology", **common, "gpus": sum(len(u.devices) for u in ledger.usages())}
    for aware in (True, False):
        label = "4gpu-topology-aware" if aware else "4gpu-default-policy"
        for policy in (NodePolicy.BINPACK, NodePolicy.SPREAD):
            pods = [topology_pod(f"{label}-{policy}-{n}", aware) for n in range(args.decisions)]
            row = time_stream(ledger, names, policy, pods, judge=judge_topology)
            emit({**common, "pod": label, "decide": "filter", "node_policy": str(policy), **row})
        pods = [topology_pod(f"{label}-full-{n}", aware) for n in range(args.full_decisions)]
        row = time_stream(
            ledger, names, NodePolicy.BINPACK, pods, exhaustive=True, judge=judge_topology
        )
        emit({**common, "pod": label, "decide": "full", "node_policy": "binpack", **row})


def run_mig(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    holder: list[tuple[list[str], dict[str, str], dict[str, int]]] = []

    def build() -> Ledger:
        ledger, names, modes, counts = build_mig_cluster(args.nodes, rng)
        holder.append((names, modes, counts))
        return ledger

    common, ledger = _built(build)
    names, modes, counts = holder[0]
    common = {"phase": "mig", **common, **counts}
    for mode in (None, OperatingMode.MIG, OperatingMode.HAMI_CORE):
        label = f"1gpu-vgpu-mode-{mode}" if mode is not None else "1gpu-no-vgpu-mode"
        for policy in (NodePolicy.BINPACK, NodePolicy.SPREAD):
            pods = [
                mig_pod(f"mig-{label}-{policy}-{n}", MIG_SIZES[n % len(MIG_SIZES)], mode)
                for n in range(args.decisions)
            ]
            row = time_stream(ledger, names, policy, pods, modes=modes, judge=judge_mig)
            emit({**common, "pod": label, "decide": "filter", "node_policy": str(policy), **row})
        pods = [
            mig_pod(f"mig-full-{label}-{n}", MIG_SIZES[n % len(MIG_SIZES)], mode)
            for n in range(args.full_decisions)
        ]
        row = time_stream(
            ledger, names, NodePolicy.BINPACK, pods, exhaustive=True, modes=modes, judge=judge_mig
        )
        emit({**common, "pod": label, "decide": "full", "node_policy": "binpack", **row})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--phase", choices=("all", *PHASES), default="all")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--decisions", type=int, default=300, help="per node policy (300)")
    parser.add_argument("--full-decisions", type=int, default=20, help="exhaustive ones (20)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.phase in ("all", "topology"):
        run_topology(args)
    if args.phase in ("all", "mig"):
        run_mig(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
