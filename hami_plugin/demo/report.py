"""The demo's printout, as pure functions from results to lines of text (sorted, aligned).

No I/O: `hami_plugin.demo` prints what these return.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hami_plugin.demo.cluster import ContainerResult, PodResult
from hami_plugin.demo.workload import DemoNode

__all__ = [
    "ENV_SHOWN",
    "MetricSample",
    "comparison_lines",
    "env_lines",
    "gpu_lines",
    "metric_lines",
    "parse_metrics",
    "scheduler_bookings",
    "table",
    "unfit_lines",
]

ENV_SHOWN = ("CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_<i>", "NVIDIA_VISIBLE_DEVICES")
_NO_FIT = "no fit"
_MIB = 1024 * 1024


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    rows = [list(headers), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append((indent + "  ".join([*cells, row[-1]])).rstrip())
    return lines


def _gpu_index(nodes: Sequence[DemoNode], node_name: str, uuid: str) -> str:
    for node in nodes:
        if node.name == node_name:
            index = node.gpu_index(uuid)
            return "?" if index is None else str(index)
    return "?"


def gpu_lines(
    results: Sequence[PodResult],
    nodes: Sequence[DemoNode],
    booked: Mapping[tuple[str, str], tuple[int, int]],
) -> list[str]:
    """Per node and GPU: what the scheduler books on it (`booked`: (node, GPU UUID) -> (MiB,
    cores), from `scheduler_bookings`), and each container on it with its MiB and cores.

    The booking is not always the sum of the rows: init containers run before the app
    containers, so a pod books on each GPU the larger of its init peak and its app sum."""
    on_gpu: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for result in results:
        for container in result.containers:
            for device in container.devices:
                who = f"{result.sample.name}/{container.name}"
                entry = (who, device.used_mem_mib, device.used_cores)
                on_gpu.setdefault((result.node, device.uuid), []).append(entry)
    lines = []
    for node in nodes:
        gpu_names = sorted({gpu.name for gpu in node.gpus})
        lines.append(f"  {node.name}: {len(node.gpus)} x {', '.join(gpu_names)}")
        rows = []
        for index, gpu in enumerate(node.gpus):
            users = sorted(on_gpu.get((node.name, gpu.uuid), []))
            memory, cores = booked.get((node.name, gpu.uuid), (0, 0))
            summary = [str(index), str(gpu.numa_node), f"{memory}/{gpu.memory_mib}", f"{cores} %"]
            if not users:
                rows.append([*summary, "-", "", ""])
            for position, (who, mib, core) in enumerate(users):
                head = summary if position == 0 else ["", "", "", ""]
                rows.append([*head, who, str(mib), f"{core} %"])
        headers = ["GPU", "NUMA", "BOOKED MiB", "CORES", "POD/CONTAINER", "MiB", "CORES"]
        lines += table(headers, rows, "    ")
    return lines


def _env_row(name: str, container: ContainerResult) -> list[list[str]]:
    env = container.env
    limits = [env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(len(container.devices))
              if f"CUDA_DEVICE_MEMORY_LIMIT_{i}" in env]  # fmt: skip
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "(none)").split(",")
    first = [name, env.get("CUDA_DEVICE_SM_LIMIT", "-"), ",".join(limits) or "-"]
    rows = [[*first, visible[0] + ("," if len(visible) > 1 else "")]]
    # One UUID per line keeps a multi-GPU container's row as narrow as the others.
    for position, uuid in enumerate(visible[1:], start=2):
        rows.append(["", "", "", uuid + ("," if position < len(visible) else "")])
    return rows


def env_lines(results: Sequence[PodResult]) -> list[str]:
    """Per container that got GPUs: the HAMi-core environment its Allocate answer carries."""
    rows: list[list[str]] = []
    for result in sorted(results, key=lambda r: r.sample.name):
        for container in result.containers:
            rows += _env_row(f"{result.sample.name}/{container.name}", container)
    return table(["POD/CONTAINER", *ENV_SHOWN], rows)


def unfit_lines(results: Sequence[PodResult]) -> list[str]:
    """The pods that found no node, with the filter's reason per node (HAMi's FailedNodes)."""
    lines = []
    for result in sorted(results, key=lambda r: r.sample.name):
        if result.node or result.error:
            continue
        lines.append(f"  {result.sample.name} ({result.sample.describe()}): no node fits")
        for node, reason in sorted(result.failed_nodes.items()):
            lines.append(f"    {node}: {reason}")
    return lines


def _placement(result: PodResult, nodes: Sequence[DemoNode]) -> str:
    if result.error:
        return f"error: {result.error}"
    if not result.node:
        return _NO_FIT
    gpus = [
        "+".join(_gpu_index(nodes, result.node, d.uuid) for d in container.devices)
        for container in result.containers
    ]
    return f"{result.node} GPU {', '.join(gpus)}"


def _gpus_in_use(results: Sequence[PodResult], nodes: Sequence[DemoNode]) -> str:
    used = {(r.node, d.uuid) for r in results for c in r.containers for d in c.devices}
    return ", ".join(
        f"{node.name} {sum((node.name, g.uuid) in used for g in node.gpus)}/{len(node.gpus)}"
        for node in nodes
    )


def comparison_lines(
    by_policy: Mapping[str, Sequence[PodResult]], nodes: Sequence[DemoNode]
) -> list[str]:
    """The same pods under each node policy, side by side: node and GPU indexes per container
    (`+` joins a container's GPUs, `,` separates containers), and the GPUs in use."""
    policies = list(by_policy)
    names = sorted({r.sample.name for results in by_policy.values() for r in results})
    found = {p: {r.sample.name: r for r in results} for p, results in by_policy.items()}
    rows = []
    for name in names:
        sample = next(found[p][name].sample for p in policies if name in found[p])
        cells = [_placement(found[p][name], nodes) if name in found[p] else "-" for p in policies]
        rows.append([name, sample.describe(), *cells])
    rows.append(["GPUs in use", "", *[_gpus_in_use(by_policy[p], nodes) for p in policies]])
    headers = ["POD", "REQUEST (GPUs x memory, cores)", *[f"node policy {p}" for p in policies]]
    return table(headers, rows)


# --- /metrics ------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One sample line of a Prometheus text exposition."""

    name: str
    labels: Mapping[str, str]
    value: str


def parse_metrics(text: str) -> list[MetricSample]:
    """The sample lines of a text exposition (comments and unreadable lines skipped)."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None or line.startswith("#"):
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        samples.append(MetricSample(match.group(1), labels, match.group(3)))
    return samples


def scheduler_bookings(text: str) -> dict[tuple[str, str], tuple[int, int]]:
    """(node, GPU UUID) -> (MiB, cores percent) booked, from the scheduler's exposition
    (`hami_gpu_memory_allocated_bytes`, `hami_gpu_core_allocated_ratio`)."""
    memory: dict[tuple[str, str], int] = {}
    cores: dict[tuple[str, str], int] = {}
    for sample in parse_metrics(text):
        key = (sample.labels.get("node", ""), sample.labels.get("device_uuid", ""))
        try:
            value = float(sample.value)
        except ValueError:
            continue
        if sample.name == "hami_gpu_memory_allocated_bytes":
            memory[key] = round(value / _MIB)
        elif sample.name == "hami_gpu_core_allocated_ratio":
            cores[key] = round(value)
    return {key: (memory.get(key, 0), cores.get(key, 0)) for key in memory.keys() | cores.keys()}


def _format_value(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        return value
    return str(int(number)) if number.is_integer() else f"{number:.3g}"


def metric_lines(
    source: str, text: str, wanted: Mapping[str, Mapping[str, str]], keep: Sequence[str]
) -> list[str]:
    """Samples of the metrics named in `wanted` whose labels include `wanted[name]`, with only
    the labels in `keep` shown (the rest, such as device_uuid and zone, trimmed for width)."""
    lines = []
    for sample in parse_metrics(text):
        match = wanted.get(sample.name)
        if match is None or any(sample.labels.get(k) != v for k, v in match.items()):
            continue
        shown = ",".join(f'{k}="{sample.labels[k]}"' for k in keep if k in sample.labels)
        label_text = "{" + shown + "}" if shown else ""
        lines.append(f"  {source:<24}{sample.name}{label_text} {_format_value(sample.value)}")
    return lines
