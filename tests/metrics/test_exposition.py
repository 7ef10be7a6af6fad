"""Our text exposition is prometheus_client's `generate_latest`, byte for byte."""

from __future__ import annotations

import gzip
import math
import urllib.request
from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from hami_plugin.metrics.exposition import CONTENT_TYPE, render_text
from hami_plugin.metrics.server import MetricsServer
from hami_plugin.protocol.address import BindAddress

TYPES = [
    "gauge",
    "counter",
    "histogram",
    "summary",
    "info",
    "stateset",
    "gaugehistogram",
    "unknown",
]
names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True) | st.sampled_from(
    ["hami_vgpu_memory_used_bytes", "", "weird.name-1", "ünïcode"]
)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True) | st.sampled_from(
    ["device_uuid", "le", "odd-label", "ë"]
)
label_values = st.text(max_size=12) | st.sampled_from(['a"b', "c\\d", "e\nf", "GPU-0", ""])
values = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(10**20), 10**20)
    | st.sampled_from([0.0, -0.0, 1.0, 1e21, 123456789.0, 0.1])
)
timestamps = st.none() | st.floats(0, 4e9, allow_nan=False) | st.integers(0, 4_000_000_000)


@st.composite
def families(draw: st.DrawFn) -> Metric:
    name = draw(names)
    metric = Metric(name or "x", draw(st.text(max_size=20)), draw(st.sampled_from(TYPES)))
    keys = draw(st.lists(label_names, max_size=4, unique=True))
    shared = draw(st.lists(label_values, min_size=len(keys), max_size=len(keys)))
    suffixes = ["", "_total", "_created", "_gsum", "_gcount", "_bucket", "_sum"]
    for _ in range(draw(st.integers(0, 6))):
        # label sets repeat, as in the collectors, and sometimes differ
        labels = dict(zip(keys, shared, strict=True))
        if draw(st.booleans()):
            labels = dict(
                zip(
                    keys,
                    draw(st.lists(label_values, min_size=len(keys), max_size=len(keys))),
                    strict=True,
                )
            )
        metric.add_sample(
            metric.name + draw(st.sampled_from(suffixes)),
            labels,
            draw(values),
            draw(timestamps),
        )
    return metric


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics


@given(st.lists(families(), max_size=5))
def test_render_text_is_generate_latest(metrics: list[Metric]) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(metrics))
    assert render_text(metrics) == generate_latest(registry)


def test_the_server_serves_text_and_gzip() -> None:
    registry = CollectorRegistry(auto_describe=False)
    gauge = Metric("hami_test_gauge", "A test gauge.", "gauge")
    gauge.add_sample("hami_test_gauge", {"device_uuid": "GPU-0", "node": 'n"1'}, 2.5)
    registry.register(_Fixed([gauge]))
    with MetricsServer(BindAddress("127.0.0.1", 0), registry).start() as server:
        with urllib.request.urlopen(server.url) as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            plain = response.read()
        request = urllib.request.Request(server.url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(response.read()) == plain
    assert plain == generate_latest(registry)
    (family,) = text_string_to_metric_families(plain.decode())
    (sample,) = family.samples
    assert sample.labels == {"device_uuid": "GPU-0", "node": 'n"1'}
    assert math.isclose(sample.value, 2.5)
