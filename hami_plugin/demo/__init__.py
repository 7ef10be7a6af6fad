"""`hami demo`: the whole stack on one machine, no GPU and no cluster needed.

For each node policy (binpack, then spread) a fresh cluster: the API server double, two fake
GPU nodes (4 x A100 80 GB on two NUMA nodes, 4 x T4), `hami device-plugin --nvml fake` per node
with a test kubelet, `hami scheduler`. The built-in workload (`workload.SAMPLE_PODS`) goes
through the admission webhook, filter, bind and kubelet's Allocate, one pod at a time; the
demo prints where each container runs and the environment it gets, the reason for the pod that
fits nowhere, both policies side by side and a few /metrics lines, then stops every process.

Exit status: 0 when every pod meant to fit got its GPUs, the others were refused with a reason
and every daemon stopped cleanly; 1 otherwise (the daemons' logs are kept and their path
printed); 130 when interrupted (Ctrl-C or SIGTERM: everything is stopped first); 141 (from
`cli.main`) when the reader of its output goes away (`hami demo | head -3`): everything is
stopped first, quietly. The work directory is removed when nothing went wrong (0, and 141),
kept with its logs otherwise (1, 130: a hang interrupted is diagnosed there) or with `--keep`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hami_plugin.demo.cluster import DemoCluster, PodResult, ProcessGroup

__all__ = ["POLICIES", "register", "run"]

logger = logging.getLogger(__name__)

POLICIES = ("binpack", "spread")
"""Node policies compared; the first is HAMi's default and gets the detailed tables."""
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
_START_SECONDS = 60.0
_METRICS_NODE = "gpu-a100"
_METRICS_POD = "infer-10g"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `hami demo`."""
    parser = subparsers.add_parser(
        "demo",
        help="run the scheduler, two fake GPU nodes and a sample workload on this machine",
        description="Start an API server double, two fake GPU nodes (4 x A100, 4 x T4) with "
        "`hami device-plugin --nvml fake` and a test kubelet each, and `hami scheduler`; "
        "schedule a dozen sample pods under the binpack and spread node policies; print where "
        "each container runs and what it sees; stop everything. No GPU or cluster needed.",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work directory (daemon logs, kubeconfig, fake GPU files) after a success",
    )
    parser.set_defaults(func=run)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C: the cleanup runs, the exit status is 130."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit status (see the module docstring)."""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="hami-demo-"))
    handler = logging.FileHandler(workdir / "demo.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # grpc's C core logs connection teardown to fd 2; the demo's terminal is for the report.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    status = EXIT_FAILURE
    try:
        status = _run(workdir, started)
    except KeyboardInterrupt:
        print("interrupted: everything the demo started is stopped", file=sys.stderr)
        status = EXIT_INTERRUPTED
    except BrokenPipeError:
        status = EXIT_OK  # nobody reads on: the demo stopped what it started, nothing failed
        raise  # cli.main ends quietly
    finally:
        signal.signal(signal.SIGTERM, previous)
        root.removeHandler(handler)
        handler.close()
        if status == EXIT_OK and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work directory and daemon logs kept in {workdir}", file=sys.stderr)
    return status


def _run(workdir: Path, started: float) -> int:
    from hami_plugin.demo.cluster import DemoCluster, DemoError, ProcessGroup
    from hami_plugin.demo.workload import NODES, SAMPLE_PODS

    processes = ProcessGroup()
    clusters = [DemoCluster(policy, workdir / policy, processes) for policy in POLICIES]
    results: dict[str, list[PodResult]] = {}
    texts: dict[str, str] = {}
    failure = ""
    try:
        print(_intro(len(SAMPLE_PODS), workdir))
        for cluster in clusters:
            cluster.launch()
        deadline = time.monotonic() + _START_SECONDS
        for cluster in clusters:
            cluster.wait_ready(deadline)
        for cluster in clusters:
            results[cluster.policy] = [cluster.submit(sample) for sample in SAMPLE_PODS]
        texts = clusters[0].scrape()
    except DemoError as error:
        logger.error("%s", error)
        failure = str(error)
    except BrokenPipeError:
        raise  # the reader went away: stop everything (below), no report
    except Exception as error:  # a bug: one line here, the traceback in the log
        logger.exception("the demo failed")
        failure = f"{type(error).__name__}: {error} (traceback in {workdir / 'demo.log'})"
    finally:
        problems = _stop(clusters, processes)
    if failure:
        print(f"hami demo failed: {failure}", file=sys.stderr)
        return EXIT_FAILURE
    _print_report(results, texts)
    wrong = _unexpected(results) + problems
    for line in wrong:
        print(f"hami demo: {line}", file=sys.stderr)
    daemons = len(POLICIES) * (len(NODES) + 1)
    print(f"\nall {daemons} daemons stopped; done in {time.monotonic() - started:.1f} s")
    return EXIT_FAILURE if wrong else EXIT_OK


def _stop(clusters: Sequence[DemoCluster], processes: ProcessGroup) -> list[str]:
    """Stop everything, in order: pod admission, the daemons, then the kubelets and API
    servers they talk to. A Ctrl-C or SIGTERM meanwhile waits until nothing is left running,
    then interrupts the demo (exit 130, no report) instead of being lost."""
    from hami_plugin.demo.cluster import signals_deferred

    with signals_deferred():
        for cluster in clusters:
            cluster.close()
        problems = processes.stop_all()
        for cluster in clusters:
            cluster.close_after_processes()
    return problems


def _intro(pods: int, workdir: Path) -> str:
    return (
        "hami demo: no GPU, no cluster. Per node policy a fresh laptop cluster: an API server "
        "double,\n2 fake GPU nodes each running `hami device-plugin --nvml fake` with a test "
        "kubelet, and\n`hami scheduler`. "
        f"{pods} pods, one at a time: webhook -> filter -> bind -> kubelet Allocate.\n"
        f"(daemon logs in {workdir}, removed at the end unless --keep)"
    )


def _print_report(results: dict[str, list[PodResult]], texts: dict[str, str]) -> None:
    from hami_plugin.demo import report
    from hami_plugin.demo.workload import NODES

    first = POLICIES[0]
    placed = results[first]
    print(f"\n== node policy {first}, GPU policy spread: where each container runs ==")
    booked = report.scheduler_bookings(texts.get("scheduler", ""))
    print("\n".join(report.gpu_lines(placed, NODES, booked)))
    print("\n== what each container sees (env from the device plugin's Allocate) ==")
    print("\n".join(report.env_lines(placed)))
    print("\n== did not fit (the filter's FailedNodes) ==")
    print("\n".join(report.unfit_lines(placed)))
    print("\n== the same pods under each node policy (a fresh cluster each) ==")
    print("\n".join(report.comparison_lines(results, NODES)))
    print(f"\n== /metrics, one scrape each ({first} cluster, labels trimmed) ==")
    node_labels = {"node": _METRICS_NODE}
    lines = report.metric_lines(
        f"device plugin {_METRICS_NODE}",
        texts.get(_METRICS_NODE, ""),
        {
            "hami_host_gpu_memory_used_bytes": node_labels,
            "hami_host_gpu_vgpu_slots_allocated": node_labels,
        },
        ("node", "device_index"),
    )
    lines += report.metric_lines(
        "scheduler",
        texts.get("scheduler", ""),
        {
            "hami_node_gpu_memory_allocated_ratio": node_labels,
            "hami_vgpu_memory_allocated_bytes": {"pod": _METRICS_POD},
            "hami_vgpu_core_allocated_ratio": {"pod": _METRICS_POD},
            "hami_scheduler_filter_failures_total": {},
        },
        ("node", "device_index", "pod", "reason"),
    )
    print("\n".join(lines))


def _unexpected(results: dict[str, list[PodResult]]) -> list[str]:
    """Pods that did not end as the workload says they should."""
    problems = []
    for policy, placed in results.items():
        for result in placed:
            name = result.sample.name
            if result.error:
                problems.append(f"{policy}: {name}: {result.error}")
            elif result.sample.fits and not result.containers:
                problems.append(f"{policy}: {name} should have got GPUs")
            elif not result.sample.fits and (result.node or not result.failed_nodes):
                problems.append(f"{policy}: {name} should have been refused with reasons")
    return problems
