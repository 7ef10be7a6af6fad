"""Benchmark of the per-container vGPU metrics (run by `make bench`; prints figures only).

Builds, in a temporary directory, a node with 8 GPUs and N containers (default 1,000), each
with a HAMi-core region file written sparse by tests/deviceplugin/monitor/region_writer.py (90 %
v1, 10 % v0; one GPU each, every 10th two; 1-3 used process slots), the pods on the node, and a
`VgpuCollector` in a fresh registry. Prints one JSON line per figure:

* `scrape_cold`: the first scrape (opens every region file);
* `scrape`: one full scrape (scan + collect + text exposition with
  `hami_plugin.metrics.exposition.render_text`, what the HTTP endpoint runs) over `--scrapes`
  runs: wall p50/p99/max and CPU p50 in ms (target <= 100 ms); `load_1m` is the machine's
  load when the line was printed;
* `scrape_generate_latest`: the same with prometheus_client's `generate_latest` encoder, for
  comparison (same bytes);
* `scan`: the region scan alone, and `collect`: scan + building the metric families (no text
  encoding), same statistics; the rest of `scrape` is the text encoder;
* `feedback_round`: one `apply_feedback` round (every container active, priorities 0-2);
* `memory`: resident memory (VmRSS) and open descriptors before and after `--rss-scrapes`
  scrapes (target: no growth).

    python tests/benchmarks/bench_metrics.py [--containers 1000] [--scrapes 50] [--rss-scrapes 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from hami_plugin.clock import ManualClock  # noqa: E402
from hami_plugin.deviceplugin.monitor.containers import ContainerScanner  # noqa: E402
from hami_plugin.deviceplugin.monitor.vgpu import VgpuCollector  # noqa: E402
from hami_plugin.metrics.exposition import render_text  # noqa: E402
from hami_plugin.protocol.hostpaths import containers_dir  # noqa: E402
from hami_plugin.protocol.objects import PodInfo  # noqa: E402
from tests.deviceplugin.monitor.helpers import NODE, pod, region_file  # noqa: E402
from tests.deviceplugin.monitor.region_writer import DeviceMemory, Proc, RegionSpec  # noqa: E402

GPUS = [f"GPU-{index:08x}-0000-4000-8000-{index:012x}" for index in range(8)]


def build_node(hook: Path, containers: int) -> list[PodInfo]:
    pods = []
    for index in range(containers):
        gpus = [GPUS[index % 8]] + ([GPUS[(index + 1) % 8]] if index % 10 == 0 else [])
        procs = [
            Proc(
                pid=slot + 1,
                hostpid=10_000 + index * 4 + slot,
                used=[DeviceMemory(1 << 20, 2 << 20, 100 << 20, 0, 103 << 20)] * len(gpus),
                sm_util=[7] * len(gpus),
            )
            for slot in range(1 + index % 3)
        ]
        spec = RegionSpec(
            version=0 if index % 10 == 5 else 1,
            uuids=gpus,
            limits=[4096 << 20] * len(gpus),
            sm_limits=[25] * len(gpus),
            procs=procs,
            priority=index % 3,
            recent_kernel=5,
            last_kernel_time=int(time.time()) - 3,
        )
        uid = f"{index:08x}-aaaa-4bbb-8ccc-{index:012x}"
        region_file(hook, uid, "main", spec, name=f"{uid}.cache")
        pods.append(
            pod(
                uid,
                f"job-{index}",
                namespace=f"team-{index % 20}",
                booked={"main": gpus},
                env={"main": {"CUDA_TASK_PRIORITY": str(index % 3)}},
            )
        )
    return pods


def timed(action: Callable[[], object], runs: int) -> dict[str, float]:
    """Wall-clock p50/p99/max and the CPU-time p50 (the machine may be shared)."""
    wall, cpu = [], []
    for _ in range(runs):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        action()
        wall.append((time.perf_counter() - start_wall) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    wall.sort()
    return {
        "runs": runs,
        "p50_ms": round(statistics.median(wall), 2),
        "p99_ms": round(wall[min(len(wall) - 1, int(len(wall) * 0.99))], 2),
        "max_ms": round(wall[-1], 2),
        "cpu_p50_ms": round(statistics.median(cpu), 2),
    }


def resident_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--rss-scrapes", type=int, default=1000)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        hook = Path(tmp)
        start = time.perf_counter()
        pods = build_node(hook, args.containers)
        common = {"containers": args.containers, "gpus": 8, "load_1m": os.getloadavg()[0]}
        print(
            json.dumps(
                {**common, "case": "setup", "write_s": round(time.perf_counter() - start, 2)}
            )
        )

        scanner = ContainerScanner(containers_dir(str(hook)), lambda: pods)
        registry = CollectorRegistry()
        # one instant for every scrape: the last-kernel age is in whole seconds of `now`, so two
        # scrapes across a second boundary would differ and not compare
        collector = VgpuCollector(scanner, NODE, clock=ManualClock(datetime.now(UTC)))
        registry.register(collector)

        def serve() -> bytes:
            return render_text(registry.collect())

        print(json.dumps({**common, "case": "scrape_cold", **timed(serve, 1)}))
        exposition = serve()
        assert exposition == generate_latest(registry)
        samples = sum(1 for line in exposition.splitlines() if not line.startswith(b"#"))
        scrape = timed(serve, args.scrapes)
        print(
            json.dumps(
                {**common, "case": "scrape", "samples": samples, "bytes": len(exposition), **scrape}
            )
        )
        reference = timed(lambda: generate_latest(registry), max(1, args.scrapes // 5))
        print(json.dumps({**common, "case": "scrape_generate_latest", **reference}))
        print(json.dumps({**common, "case": "scan", **timed(scanner.scan, args.scrapes)}))
        collect = timed(lambda: list(collector.collect()), args.scrapes)
        print(json.dumps({**common, "case": "collect", **collect}))
        print(json.dumps({**common, "case": "feedback_round", **timed(scanner.apply_feedback, 5)}))

        gc.collect()
        before_kib, before_fds = resident_kib(), open_descriptors()
        start = time.perf_counter()
        for _ in range(args.rss_scrapes):
            serve()
        elapsed = time.perf_counter() - start
        gc.collect()
        after_kib, after_fds = resident_kib(), open_descriptors()
        print(
            json.dumps(
                {
                    **common,
                    "case": "memory",
                    "scrapes": args.rss_scrapes,
                    "mean_scrape_ms": round(elapsed * 1000 / args.rss_scrapes, 2),
                    "rss_before_kib": before_kib,
                    "rss_after_kib": after_kib,
                    "rss_growth_kib": after_kib - before_kib,
                    "fds_before": before_fds,
                    "fds_after": after_fds,
                }
            )
        )
        scanner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
