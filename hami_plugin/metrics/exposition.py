"""The Prometheus text format (0.0.4), byte for byte as prometheus_client's `generate_latest`
writes it, in a fraction of its time.

A node with 1,000 GPU containers exports about 9,000 samples; `generate_latest` escapes and
sorts every sample's labels again (about 15 us a sample, most of a scrape). The collectors
repeat one label set across the eight metrics of a container's device, so here each distinct
label set is rendered once per scrape and reused. Output equality with `generate_latest` is a
property test (tests/metrics/test_exposition.py), so the format stays prometheus_client's.

Only the text format is served, as HAMi's Go endpoints serve it (promhttp without
OpenMetrics); Prometheus asks for it among the formats it accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.utils import floatToGoString

_go_float = cast(Callable[[float], str], floatToGoString)  # untyped in prometheus_client

__all__ = ["CONTENT_TYPE", "render_text"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# OpenMetrics-only samples that the text format moves to gauges of their own, at the end.
_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")
# The text format's type for each prometheus_client metric type, and the name suffix it adds.
_TEXT_TYPES = {
    "counter": ("counter", "_total"),
    "info": ("gauge", "_info"),
    "stateset": ("gauge", ""),
    "gaugehistogram": ("histogram", ""),
    "unknown": ("untyped", ""),
}


class _Renderer:
    """One scrape's caches: escaped names, rendered label sets, formatted values."""

    __slots__ = ("_label_names", "_label_sets", "_names", "_values")

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._label_names: dict[str, str] = {}
        self._label_sets: dict[tuple[tuple[str, str], ...], str] = {}
        self._values: dict[float, str] = {}

    def _label_name(self, name: str) -> str:
        escaped = self._label_names.get(name)
        if escaped is None:
            escaped = self._label_names[name] = escape_label_name(name)
        return escaped

    def value(self, value: float) -> str:
        # 0.0 and -0.0 are equal keys but print differently: zeros are not cached.
        text = self._values.get(value) if value else None
        if text is None:
            text = _go_float(value)
            if value:
                self._values[value] = text
        return text

    def name(self, name: str) -> str:
        escaped = self._names.get(name)
        if escaped is None:
            escaped = self._names[name] = escape_metric_name(name)
        return escaped

    def labels(self, labels: Mapping[str, str]) -> str:
        if not labels:
            return ""
        key = tuple(labels.items())
        text = self._label_sets.get(key)
        if text is None:
            pairs = ",".join(
                f'{self._label_name(name)}="{_escape_value(value)}"'
                for name, value in sorted(labels.items())
            )
            text = self._label_sets[key] = "{" + pairs + "}"
        return text

    def sample(self, name: str, labels: Mapping[str, str], value: float, timestamp: Any) -> str:
        stamp = "" if timestamp is None else f" {int(float(timestamp) * 1000):d}"
        return f"{self.name(name)}{self.labels(labels)} {self.value(value)}{stamp}\n"


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(documentation: str) -> str:
    return documentation.replace("\\", r"\\").replace("\n", r"\n")


def render_text(metrics: Iterable[Metric]) -> bytes:
    """The metric families in the Prometheus text format, UTF-8 encoded."""
    renderer = _Renderer()
    output: list[str] = []
    for metric in metrics:
        text_type, suffix = _TEXT_TYPES.get(metric.type, (metric.type, ""))
        name = renderer.name(metric.name + suffix)
        documentation = _help(metric.documentation)
        output.append(f"# HELP {name} {documentation}\n# TYPE {name} {text_type}\n")
        moved: dict[str, list[str]] = {}
        for sample in metric.samples:
            line = renderer.sample(sample.name, sample.labels, sample.value, sample.timestamp)
            for moved_suffix in _MOVED_SUFFIXES:
                if sample.name == metric.name + moved_suffix:
                    moved.setdefault(moved_suffix, []).append(line)
                    break
            else:
                output.append(line)
        for moved_suffix, lines in sorted(moved.items()):
            gauge = renderer.name(metric.name + moved_suffix)
            output.append(f"# HELP {gauge} {documentation}\n# TYPE {gauge} gauge\n")
            output.extend(lines)
    return "".join(output).encode("utf-8")
