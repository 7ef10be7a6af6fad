"""The Prometheus types the daemons' collectors build their metrics from.

`prometheus_client` is imported only inside `hami_plugin.metrics`; a daemon's collector (the
device plugin's node and vGPU collectors, the scheduler's usage gauges and event metrics) takes
its metric families, metric classes and registry from here.
"""

from __future__ import annotations

from prometheus_client.metrics import Counter, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = [
    "Collector",
    "CollectorRegistry",
    "Counter",
    "GaugeMetricFamily",
    "Histogram",
    "Metric",
]
