"""Benchmark of the scheduler decision and the usage ledger (run by `make bench`).

Builds a ledger of N nodes x 8 GPUs (split 10, 80 GiB, GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1)
with random existing usage around 50 %, then times a stream of decisions for a 1-GPU pod and
a 4-GPU `numa-bind` pod, every node a candidate, under both node policies. Each decision is
booked in the ledger (as the extender does), so the cluster changes as the stream goes on.
Prints one JSON line per case, then the worst case (a pod no node can take, so every node is
fitted to report why) without and with a warm `FitCache`, then one line for ledger updates.
The decision cases use no fit cache.

    python tests/benchmarks/bench_scheduler.py [--sizes 1000,5000,10000] [--decisions 300]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
import tracemalloc
from datetime import UTC, datetime

from hami_plugin.protocol.codec import encode_pod_devices
from hami_plugin.protocol.model import (
    ANNOTATION_DEVICES_ALLOCATED,
    ANNOTATION_VGPU_NODE,
    ContainerDevice,
    GpuDevice,
    NodePolicy,
)
from hami_plugin.protocol.objects import ContainerSpec, PodInfo
from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.filter import FitCache, assume, decide
from hami_plugin.scheduler.ledger import Ledger
from hami_plugin.scheduler.settings import SchedulerSettings

GPUS_PER_NODE = 8
SPLIT = 10
MEMORY_MIB = 81920


def _gpu(node: int, index: int) -> GpuDevice:
    return GpuDevice(
        uuid=f"GPU-{node:06d}-{index}",
        index=index,
        split_count=SPLIT,
        memory_mib=MEMORY_MIB,
        cores_percent=100,
        type="NVIDIA A100-SXM4-80GB",
        numa_node=index // 4,
        mode="hami-core",
        healthy=True,
    )


def build_ledger(nodes: int, rng: random.Random) -> tuple[Ledger, list[str]]:
    """Nodes with pods booking ~50 % of slots, memory and cores on average (20-80 % each)."""
    ledger = Ledger()
    names = []
    pods = 0
    for node in range(nodes):
        name = f"node-{node:05d}"
        names.append(name)
        ledger.set_node(name, [_gpu(node, index) for index in range(GPUS_PER_NODE)])
        for index in range(GPUS_PER_NODE):
            fill = rng.uniform(0.2, 0.8)
            slots = round(fill * SPLIT)
            if slots == 0:
                continue
            # one pod per GPU carrying `slots` containers: same booking as `slots` pods
            memory = int(fill * MEMORY_MIB)
            cores = int(fill * 100)
            tally = DeviceTally(f"GPU-{node:06d}-{index}", slots, memory, cores)
            ledger.track(f"default/fill-{node}-{index}", name, (tally,))
            pods += 1
    return ledger, names


def _pod(name: str, gpus: int, memory_mib: int, cores: int, numa_bind: bool) -> PodInfo:
    limits = {
        "nvidia.com/gpu": str(gpus),
        "nvidia.com/gpumem": str(memory_mib),
        "nvidia.com/gpucores": str(cores),
    }
    annotations = {"nvidia.com/numa-bind": "true"} if numa_bind else {}
    return PodInfo(
        namespace="bench",
        name=name,
        annotations=annotations,
        containers=(ContainerSpec("main", limits=limits),),
    )


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[int(rank) - 1]


def time_decisions(
    ledger: Ledger,
    names: list[str],
    policy: NodePolicy,
    shape: str,
    decisions: int,
    cache: FitCache | None = None,
) -> dict[str, object]:
    settings = SchedulerSettings(node_policy=policy)
    now = datetime.now(UTC)
    samples = []
    fitted = []
    placed = 0
    for number in range(decisions):
        if shape == "1gpu":
            pod = _pod(f"one-{policy}-{number}", 1, 8192, 20, numa_bind=False)
        elif shape == "unschedulable":
            pod = _pod(f"huge-{policy}-{number}", 1, MEMORY_MIB + 1, 20, numa_bind=False)
        else:
            pod = _pod(f"four-{policy}-{number}", 4, 12288, 15, numa_bind=True)
        start = time.perf_counter()
        result = decide(ledger, pod, names, now, settings, cache=cache)
        samples.append((time.perf_counter() - start) * 1000.0)
        fitted.append(result.fitted)
        if result.node is not None:
            placed += 1
            assume(ledger, pod.key, result)
    return {
        "p50_ms": round(_percentile(samples, 0.5), 3),
        "p99_ms": round(_percentile(samples, 0.99), 3),
        "mean_ms": round(statistics.fmean(samples), 3),
        "decisions_per_s": round(len(samples) / (sum(samples) / 1000.0), 1),
        "placed": placed,
        "nodes_fitted_p50": _percentile([float(n) for n in fitted], 0.5),
        "nodes_fitted_max": max(fitted),
    }


def time_updates(
    ledger: Ledger, names: list[str], rng: random.Random, count: int
) -> dict[str, float]:
    """Pod add (from a pod object with annotations, as a watch event delivers it) and delete."""
    pods = []
    for number in range(count):
        node = rng.randrange(len(names))
        index = rng.randrange(GPUS_PER_NODE)
        devices = ((ContainerDevice(f"GPU-{node:06d}-{index}", "NVIDIA", 1024, 5),),)
        value = encode_pod_devices(devices)
        pods.append(
            PodInfo(
                namespace="updates",
                name=f"p-{number}",
                annotations={
                    ANNOTATION_VGPU_NODE: names[node],
                    ANNOTATION_DEVICES_ALLOCATED: value,
                },
                containers=(ContainerSpec("main"),),
                phase="Running",
            )
        )
    adds, deletes = [], []
    for pod in pods:
        start = time.perf_counter()
        ledger.update_pod(pod)
        adds.append((time.perf_counter() - start) * 1e6)
    for pod in pods:
        start = time.perf_counter()
        ledger.delete_pod(pod.key)
        deletes.append((time.perf_counter() - start) * 1e6)
    return {
        "pod_add_p50_us": round(_percentile(adds, 0.5), 1),
        "pod_add_p99_us": round(_percentile(adds, 0.99), 1),
        "pod_delete_p50_us": round(_percentile(deletes, 0.5), 1),
        "pod_delete_p99_us": round(_percentile(deletes, 0.99), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--decisions", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    for nodes in (int(size) for size in args.sizes.split(",")):
        rng = random.Random(args.seed)
        gc.collect()
        tracemalloc.start()
        start = time.perf_counter()
        ledger, names = build_ledger(nodes, rng)
        build_s = time.perf_counter() - start
        ledger_mib = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        common = {
            "nodes": nodes,
            "gpus": nodes * GPUS_PER_NODE,
            "tracked_pods": ledger.pod_count,
            "ledger_build_s": round(build_s, 2),
            "ledger_mib": round(ledger_mib, 1),
        }
        for shape in ("1gpu", "4gpu-numa"):
            for policy in (NodePolicy.BINPACK, NodePolicy.SPREAD):
                row = time_decisions(ledger, names, policy, shape, args.decisions)
                print(json.dumps({**common, "pod": shape, "node_policy": str(policy), **row}))
                sys.stdout.flush()
        # fits nowhere: every node is fitted for HAMi's complete FailedNodes (policy-neutral)
        row = time_decisions(ledger, names, NodePolicy.BINPACK, "unschedulable", 20)
        print(json.dumps({**common, "pod": "unschedulable", "fit_cache": "none", **row}))
        # the same with the extender's fit cache: after the first, nodes are not refitted
        cache = FitCache()
        time_decisions(ledger, names, NodePolicy.BINPACK, "unschedulable", 1, cache)
        row = time_decisions(ledger, names, NodePolicy.BINPACK, "unschedulable", 20, cache)
        print(json.dumps({**common, "pod": "unschedulable", "fit_cache": "warm", **row}))
        updates = time_updates(ledger, names, rng, 2000)
        print(json.dumps({**common, "case": "ledger-update", **updates}))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
