"""`hami schedule`: where would the scheduler put this pod, and why not elsewhere?

Reads a cluster snapshot (`snapshot.SNAPSHOT_COMMAND`) and a pod, runs the decision the
scheduler runs with every candidate fitted (`decide(exhaustive=True)`), and prints HAMi's answer
as JSON on stdout, with `--explain` a table (and the MIG profiles each MIG device gets, and why
not the smaller ones) on stderr. When no node fits, the victims the scheduler would preempt
for the pod (docs/design.md 11), decided by the scheduler's own book (`Book.filter`) built from
the snapshot, its PodDisruptionBudgets included. What it prints, the exit status and the bad
input it refuses: `docs/scheduling.md`, "Try it on your cluster: `hami schedule`"; the
snapshot's ResourceQuota objects are the namespace GPU quotas (`docs/scheduler.md`, "GPU
quotas").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hami_plugin.protocol.mig import MigAllocation
    from hami_plugin.protocol.model import GpuDevice, MigPlacement
    from hami_plugin.protocol.objects import PodInfo
    from hami_plugin.scheduler.book.preempting import Preemption
    from hami_plugin.scheduler.filter import FilterResult
    from hami_plugin.scheduler.fit import QuotaFit
    from hami_plugin.scheduler.ledger import Ledger
    from hami_plugin.scheduler.requests import PodRequests
    from hami_plugin.scheduler.settings import SchedulerSettings
    from hami_plugin.scheduler.snapshot import ClusterSnapshot
    from hami_plugin.scheduler.usage import NodeUsage

__all__ = ["register", "run"]

EXIT_FITS = 0
EXIT_BAD_INPUT = 1
EXIT_NO_FIT = 2


def register(subparsers: Any) -> None:
    """Add the `schedule` sub-command."""
    parser = subparsers.add_parser(
        "schedule",
        help="dry-run the scheduler on a cluster snapshot",
        description=(
            "Decide where a pod would go on a cluster snapshot and explain why. Prints JSON; "
            "exit 0 when it fits, 2 when no node fits, 1 on bad input (including a GPU request "
            "the scheduler would not read as written, such as nvidia.com/gpumem: 16Gi, a pod "
            "the admission webhook would deny, and a --nodes name the snapshot lacks)."
        ),
    )
    parser.add_argument(
        "--snapshot",
        required=True,
        metavar="CLUSTER.yaml",
        help=(
            "output of `kubectl get nodes,pods,resourcequotas,poddisruptionbudgets,"
            "priorityclasses -A -o yaml` (a v1 List or a YAML stream)"
        ),
    )
    parser.add_argument("--pod", required=True, metavar="POD.yaml", help="the pod to place")
    parser.add_argument(
        "--node-policy", metavar="P", default="binpack", help="default node policy (binpack)"
    )
    parser.add_argument(
        "--gpu-policy", metavar="P", default="spread", help="default GPU policy (spread)"
    )
    parser.add_argument(
        "--nodes", metavar="N1,N2", help="candidate node names (default: every node)"
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also print a per-node table (and the victims preemption would take) on stderr",
    )
    parser.add_argument(
        "--no-webhook",
        action="store_true",
        help="read the pod as given, not as the admission webhook would change it",
    )
    parser.add_argument(
        "--no-preemption",
        action="store_true",
        help=(
            "when no node fits, leave out the victims the scheduler would preempt "
            "(the scheduler's --preemption=false)"
        ),
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=0,
        metavar="N",
        help="time N more decisions and report decision_ms p50/p99",
    )
    parser.add_argument(
        "--default-memory",
        type=int,
        default=0,
        metavar="MIB",
        help="memory of a GPU request that names none (0: the whole card)",
    )
    parser.add_argument(
        "--default-cores",
        type=int,
        default=0,
        metavar="PERCENT",
        help="cores of a GPU request that names none (0)",
    )
    parser.add_argument(
        "--memory-factor",
        type=int,
        default=1,
        metavar="N",
        help="nvidia.com/gpumem is counted in units of N MiB (1)",
    )
    parser.add_argument(
        "--numa-grouped-order",
        action="store_true",
        help="order GPUs NUMA first for every pod (the design note's order)",
    )
    parser.add_argument(
        "--now",
        type=int,
        metavar="UNIX_SECONDS",
        help=(
            "the dry run's clock (default: now): written to hami.io/vgpu-time, and the age "
            "of each node's Requesting_ handshake (read as UTC) is judged against it"
        ),
    )
    parser.set_defaults(func=run)


class _BadInputError(Exception):
    """Bad input; every line of the message is printed as its own `hami schedule:` line."""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read()
    except (OSError, UnicodeDecodeError) as error:
        raise _BadInputError(f"cannot read {path}: {error}") from None


def _shortest_float32(value: float) -> float:
    """The shortest decimal that reads back as the same float32 (`13.333333`, not
    `13.333333015441895`)."""
    from hami_plugin.scheduler.score import float32

    for digits in range(1, 10):
        shortest = float(f"{value:.{digits}g}")
        if float32(shortest) == value:
            return shortest
    return value


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * fraction // 1))  # nearest-rank method
    return ordered[int(rank) - 1]


def run(args: argparse.Namespace) -> int:
    """Run the dry run; returns the exit status."""
    try:
        return _run(args)
    except _BadInputError as error:
        for line in str(error).splitlines():
            print(f"hami schedule: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _run(args: argparse.Namespace) -> int:
    from hami_plugin.protocol.codec import AnnotationError, parse_gpu_policy, parse_node_policy
    from hami_plugin.scheduler.filter import decide
    from hami_plugin.scheduler.fit import render_failure
    from hami_plugin.scheduler.settings import SchedulerSettings
    from hami_plugin.scheduler.snapshot import (
        build_ledger,
        build_quota_book,
        parse_snapshot,
        pod_from_object,
        read_pod_object,
    )

    if args.repeat < 0:
        raise _BadInputError("--repeat must not be negative")
    _check_settings(args)
    try:
        settings = SchedulerSettings(
            node_policy=parse_node_policy(args.node_policy, key="--node-policy"),
            gpu_policy=parse_gpu_policy(args.gpu_policy, key="--gpu-policy"),
            default_memory_mib=args.default_memory,
            default_cores=args.default_cores,
            memory_factor=args.memory_factor,
            numa_grouped_order=args.numa_grouped_order,
        )
        snapshot = parse_snapshot(_read(args.snapshot), what=args.snapshot)
        document = read_pod_object(_read(args.pod), what=args.pod)
        pod = pod_from_object(document, args.pod, snapshot.priority_classes)
        requests = _readable_requests(args.pod, pod, settings)
        patch: tuple[Mapping[str, Any], ...] = ()
        if not args.no_webhook:
            document, patch = _admitted(args.pod, document, settings)
            pod = pod_from_object(document, args.pod, snapshot.priority_classes)
            requests = _readable_requests(args.pod, pod, settings)
    except (AnnotationError, ValueError) as error:
        raise _BadInputError(str(error)) from None
    try:
        now = datetime.fromtimestamp(args.now, UTC) if args.now is not None else datetime.now(UTC)
    except (OverflowError, OSError, ValueError):
        raise _BadInputError(f"--now {args.now} is not a time this machine can represent") from None
    ledger = build_ledger(snapshot, now)
    ledger.untrack(pod.key)  # re-scheduling a tracked pod: its old allocation is released
    quota = build_quota_book(snapshot, ledger, settings.resources).quota_fit(
        pod.namespace, settings.memory_factor
    )
    candidates = _candidates(args, snapshot)

    result = decide(
        ledger, pod, candidates, now, settings, exhaustive=True, requests=requests, quota=quota
    )
    if result.error is not None:
        raise _BadInputError(f"{args.pod}: {result.error}")
    output: dict[str, Any] = {
        "node": result.node,
        "annotations": dict(result.annotations),
        "failedNodes": {name: render_failure(f) for name, f in sorted(result.failed_nodes.items())},
        "scores": {name: _shortest_float32(s) for name, s in sorted(result.scores.items())},
    }
    if patch:
        output["webhook"] = [dict(operation) for operation in patch]
    if result.requests.problems:
        output["problems"] = [str(problem) for problem in result.requests.problems]
    if not result.requests.wants_gpu:
        output["note"] = "the pod asks no GPU: every node passes"
    preemption: tuple[Preemption | None, str] = (None, "")
    if result.node is None and result.requests.wants_gpu and not args.no_preemption:
        preemption = _preempt(snapshot, pod, result, now, settings)
        if preemption[1]:
            output["preemption"] = _preemption_json(*preemption)
    if args.repeat:
        output["decision_ms"] = _time_decisions(
            ledger, pod, candidates, now, settings, args.repeat, quota
        )
    print(json.dumps(output, indent=2), flush=True)
    if args.explain:
        from hami_plugin.scheduler.snapshot import unhealthy_nodes

        gone = set(unhealthy_nodes(snapshot, now))
        from hami_plugin.scheduler.webhook_preview import explain

        text = explain(None if args.no_webhook else document, patch)
        text += "\n" + _explain(ledger, pod, candidates, result, settings, gone)
        if preemption[1]:
            text += "\n" + _explain_preemption(pod, *preemption)
        print(text, file=sys.stderr)
    if result.node is None and result.requests.wants_gpu:
        return EXIT_NO_FIT
    return EXIT_FITS


def _check_settings(args: argparse.Namespace) -> None:
    """The scheduler settings' flags in range, named as the user gave them."""
    if args.default_memory < 0:
        raise _BadInputError(f"--default-memory must not be negative, got {args.default_memory}")
    if not 0 <= args.default_cores <= 100:
        raise _BadInputError(f"--default-cores must be between 0 and 100, got {args.default_cores}")
    if args.memory_factor < 1:
        raise _BadInputError(f"--memory-factor must be at least 1, got {args.memory_factor}")


def _readable_requests(what: str, pod: PodInfo, settings: SchedulerSettings) -> PodRequests:
    """The pod's GPU requests; _BadInputError (a line per value) for one the scheduler would
    not read as written."""
    from hami_plugin.scheduler.requests import pod_requests

    requests = pod_requests(pod, settings)
    if requests.wrong_answers:
        lines = (f"{what}: {p.render(would=True)}" for p in requests.wrong_answers)
        raise _BadInputError("\n".join(lines))
    return requests


def _admitted(
    what: str, document: Mapping[str, Any], settings: SchedulerSettings
) -> tuple[Mapping[str, Any], tuple[Mapping[str, Any], ...]]:
    """The pod object as the admission webhook would let it in, with its default settings
    and the scheduler's resource names and memory factor, and the webhook's JSON patch.
    _BadInputError when the webhook would refuse the pod."""
    from hami_plugin.scheduler.webhook import WebhookSettings
    from hami_plugin.scheduler.webhook_preview import admit

    webhook = WebhookSettings(resources=settings.resources, memory_factor=settings.memory_factor)
    admitted = admit(document, webhook)
    if not admitted.admission.allowed:
        raise _BadInputError(
            f"{what}: the admission webhook would deny the pod: {admitted.admission.message} "
            "(--no-webhook reads the pod as given, e.g. one taken from the cluster, which "
            "went through the webhook already)"
        )
    return admitted.document, admitted.admission.patch


def _candidates(args: argparse.Namespace, snapshot: ClusterSnapshot) -> list[str]:
    """The `--nodes` names (every node of the snapshot without it); _BadInputError naming
    those the snapshot does not hold."""
    known = [node.name for node in snapshot.nodes]
    if args.nodes is None:
        return known
    candidates = [name.strip() for name in args.nodes.split(",") if name.strip()]
    unknown = [name for name in dict.fromkeys(candidates) if name not in set(known)]
    if unknown:
        shown = ", ".join(known) if len(known) <= 10 else f"{len(known)} nodes"
        raise _BadInputError(
            f"--nodes: no node {', '.join(unknown)} in {args.snapshot} (it holds {shown})"
        )
    if not candidates:
        raise _BadInputError("--nodes names no node")
    return candidates


def _preempt(
    snapshot: ClusterSnapshot,
    pod: PodInfo,
    result: FilterResult,
    now: datetime,
    settings: SchedulerSettings,
) -> tuple[Preemption | None, str]:
    """The scheduler's own preemption decision for a pod that fit nowhere (`result`, the
    decision already made): its book built from the snapshot, the holds of nominated pods
    settled, then `Planner.preempt` over the nodes the pod failed on."""
    from hami_plugin.scheduler.snapshot import build_book

    book = build_book(snapshot, settings, now)
    book.preemption.settle()
    return book.preemption.preempt(pod, result)


def _preemption_json(preemption: Preemption | None, outcome: str) -> dict[str, Any]:
    """The `preemption` member: the decision, or the outcome that says why there is none."""
    from hami_plugin.protocol.codec import encode_pod_devices

    if preemption is None:
        return {"outcome": outcome}
    return {
        "node": preemption.node,
        "victims": [
            {
                "pod": victim.key,
                "priority": victim.priority,
                "gpus": [
                    {"uuid": t.uuid, "memoryMiB": t.memory_mib, "cores": t.cores} for t in tallies
                ],
            }
            for victim, tallies in zip(preemption.victims, preemption.victim_gpus, strict=True)
        ],
        "pdbViolations": preemption.pdb_violations,
        "devices": encode_pod_devices(preemption.devices),
    }


_NO_PREEMPTION = {
    "never": "its preemptionPolicy is Never",
    "no_victims": "no node frees enough GPU capacity by taking pods of lower priority",
    "waiting": "pods of lower priority are still terminating on its nominated node",
    "no_gpu": "its GPU request cannot be read",
}


def _explain_preemption(pod: PodInfo, preemption: Preemption | None, outcome: str) -> str:
    """The `--explain` lines of preemption: the outcome, and what each victim frees on each
    GPU and what the pod would get there."""
    if preemption is None:
        return f"preemption: {outcome}: {_NO_PREEMPTION.get(outcome, 'none')}"
    count = len(preemption.victims)
    lines = [
        f"preemption: preempted: {count} victim{'' if count == 1 else 's'} on "
        f"{preemption.node}, {preemption.pdb_violations} PodDisruptionBudget violation"
        f"{'' if preemption.pdb_violations == 1 else 's'}"
    ]
    rows = [("GPU", "VICTIM", "PRIORITY", "FREES")]
    # by GPU, each GPU's victims in the decision's order (most important first)
    freed = sorted(
        (
            (tally.uuid, position, tally)
            for position, tallies in enumerate(preemption.victim_gpus)
            for tally in tallies
        ),
        key=lambda row: (row[0], row[1]),
    )
    for uuid, position, tally in freed:
        victim = preemption.victims[position]
        rows.append(
            (uuid, victim.key, str(victim.priority), f"{tally.memory_mib}MiB {tally.cores}%")
        )
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        cells = "  ".join(cell.ljust(widths[column]) for column, cell in enumerate(row[:3]))
        lines.append(f"  {cells}  {row[3]}")
    names = [c.name for c in (*pod.init_containers, *pod.containers)]
    gets = "; ".join(
        f"{names[index]}: "
        + ", ".join(f"{d.uuid} {d.used_mem_mib}MiB {d.used_cores}%" for d in devices)
        for index, devices in enumerate(preemption.devices)
        if devices
    )
    lines.append(f"  the pod would get {gets}")
    return "\n".join(lines)


def _time_decisions(
    ledger: Ledger,
    pod: PodInfo,
    candidates: list[str],
    now: datetime,
    settings: SchedulerSettings,
    repeat: int,
    quota: QuotaFit | None,
) -> dict[str, float]:
    import time

    from hami_plugin.scheduler.filter import decide

    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        decide(ledger, pod, candidates, now, settings, quota=quota)
        samples.append((time.perf_counter() - start) * 1000.0)
    return {
        "p50": round(_percentile(samples, 0.50), 3),
        "p99": round(_percentile(samples, 0.99), 3),
    }


def _explain(
    ledger: Ledger,
    pod: PodInfo,
    candidates: list[str],
    result: FilterResult,
    settings: SchedulerSettings,
    unhealthy: set[str],
) -> str:
    from hami_plugin.scheduler.fit import render_failure
    from hami_plugin.scheduler.policy import prefers_higher_score

    if not result.requests.wants_gpu:
        return "the pod asks no GPU: every candidate node passes"
    node_policy = result.node_policy or settings.node_policy
    gpu_policy = result.gpu_policy or settings.gpu_policy
    names = [*pod.init_containers, *pod.containers]
    usages = [ledger.node(name) for name in dict.fromkeys(candidates)]
    registered = [usage for usage in usages if usage is not None]
    sign = -1.0 if prefers_higher_score(node_policy) else 1.0
    registered.sort(key=lambda usage: (sign * usage.score, usage.name))
    rows = [("NODE", "SCORE", "RESULT", "GPUS")]
    for usage in registered:
        name = usage.name
        placement = result.placements.get(name)
        gpus = ""
        if placement is not None:
            mig = {
                (m.container_index, m.device_index): m for m in result.mig_placements.get(name, ())
            }
            gpus = "; ".join(
                f"{names[index].name}: "
                + ", ".join(
                    f"{d.uuid} {d.used_mem_mib}MiB {d.used_cores}%"
                    + _mig_label(mig.get((index, device_index)))
                    for device_index, d in enumerate(devices)
                )
                for index, devices in enumerate(placement)
                if devices
            )
        verdict = "fits" if placement is not None else render_failure(result.failed_nodes[name])
        mark = " <- chosen" if name == result.node else ""
        rows.append((name, repr(_shortest_float32(usage.score)), verdict + mark, gpus))
    for name, failure in sorted(result.failed_nodes.items()):
        if ledger.node(name) is None:
            why = "device plugin gone (handshake expired, no GPU allocatable)"
            rows.append((name, "-", render_failure(failure), why if name in unhealthy else ""))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [
        f"node policy {node_policy.value} (nodes in the order they are tried), "
        f"GPU policy {gpu_policy.text}",
    ]
    for row in rows:
        lines.append(
            "  ".join(cell.ljust(widths[column]) for column, cell in enumerate(row[:3]))
            + "  "
            + row[3]
        )
    lines.extend(_explain_mig(registered, result, [c.name for c in names]))
    return "\n".join(line.rstrip() for line in lines)


def _mig_label(allocation: MigAllocation | None) -> str:
    if allocation is None:
        return ""
    return f" MIG {allocation.profile} {_slices(allocation.placement)}"


def _slices(placement: MigPlacement) -> str:
    last = placement.start + placement.size - 1
    if placement.size == 1:
        return f"slice {placement.start}"
    return f"slices {placement.start}-{last}"


def _profile_reasons(
    device: GpuDevice, occupied: list[MigPlacement], memory_mib: int, chosen: str | None
) -> list[str]:
    """Why each profile of the GPU, in HAMi's order of preference (memory, then slices;
    device.go:621-639), up to the chosen one, does not take `memory_mib`."""
    from hami_plugin.scheduler.mig import select_mig_placement

    reasons = []
    for profile in sorted(device.mig_profiles, key=lambda p: (p.memory_mib, p.slice_count)):
        if profile.name == chosen:
            break
        if profile.memory_mib < memory_mib:
            reasons.append(
                f"{profile.name}: too little memory ({profile.memory_mib} < {memory_mib} MiB)"
            )
        elif select_mig_placement(device.mig_profiles, occupied, profile.name) is None:
            used = ", ".join(_slices(p) for p in occupied) or "none"
            reasons.append(f"{profile.name}: no free placement (in use: {used})")
    return reasons


def _explain_mig(
    registered: list[NodeUsage], result: FilterResult, container_names: list[str]
) -> list[str]:
    """The MIG lines of `--explain`: for each fitting node, each MIG device's profile and
    placement and why the profiles before it in HAMi's order did not do; for each node that
    does not fit, why no profile of its MIG GPUs takes the pod's first GPU request."""
    from hami_plugin.protocol.model import OperatingMode
    from hami_plugin.scheduler.mig import MigView

    requests = result.requests.containers
    lines: list[str] = []
    for usage in registered:
        if not usage.has_mig:
            continue
        positions = {device.uuid: p for p, device in enumerate(usage.devices)}
        allocations = result.mig_placements.get(usage.name)
        if usage.name in result.placements:
            # replay the reservations in order, each phase on its own view as the fit does
            init_count = result.requests.init_count
            views: dict[int, MigView] = {}
            for allocation in allocations or ():
                phase = (
                    allocation.container_index if allocation.container_index < init_count else -1
                )
                view = views.setdefault(phase, MigView(usage))
                position = positions[allocation.gpu_uuid]
                device = usage.devices[position]
                request = requests[allocation.container_index]
                memory = request.memory_on(device.memory_mib) if request is not None else 0
                occupied = view.occupied(position)
                why = _profile_reasons(device, occupied, memory, allocation.profile)
                lines.append(
                    f"  MIG {usage.name} {container_names[allocation.container_index]} "
                    f"{allocation.gpu_uuid}: {allocation.profile} at "
                    f"{_slices(allocation.placement)} for {memory} MiB"
                    + (f"; not {'; '.join(why)}" if why else "")
                )
                view.add(position, allocation.placement)
            continue
        first = next((r for r in requests if r is not None), None)
        if first is None:
            continue
        for position, device in enumerate(usage.devices):
            if device.mode != OperatingMode.MIG:
                continue
            memory = first.memory_on(device.memory_mib)
            why = _profile_reasons(device, list(usage.occupied(position)), memory, None)
            lines.append(
                f"  MIG {usage.name} {device.uuid}: no profile for {memory} MiB"
                + (f": {'; '.join(why)}" if why else " (the GPU reports no MIG profile)")
            )
    if lines:
        lines.insert(0, "MIG devices (profiles in HAMi's order: memory, then slices):")
    return lines
