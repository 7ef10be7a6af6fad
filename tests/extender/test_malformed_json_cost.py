"""A malformed /filter body costs about what a valid one of the same size does (issue 14, attack
5: a 7 MiB malformed body used to cost 6 s of CPU, Go's message rebuilt by a second scan of the
whole body in Python). The bound is CPU time of this process, not wall-clock time, and generous:
a valid body of the same size takes 0.1-0.2 s. (A body of millions of empty lists costs about
0.5 s to parse, valid or not: Python's garbage collector, run by the allocations.)"""

from __future__ import annotations

import json
import time

import pytest

from hami_plugin.extender.bind import Binder
from hami_plugin.extender.http import ExtenderApp
from hami_plugin.extender.state import SchedulerState
from hami_plugin.kube.events import PodEvent
from hami_plugin.kube.fake import FakeKube
from hami_plugin.scheduler.book.book import BookSettings
from hami_plugin.scheduler.settings import SchedulerSettings
from hami_plugin.scheduler.webhook import WebhookSettings

_MIB = 1024 * 1024
_CPU_BOUND_SECONDS = 1.0


class _NoEvents:
    def record(self, event: PodEvent) -> None:
        return None


def _app() -> ExtenderApp:
    state = SchedulerState(BookSettings(SchedulerSettings()))
    events = _NoEvents()
    binder = Binder(state, FakeKube(), events)
    return ExtenderApp(
        state,
        binder,
        WebhookSettings(),
        events,
        lambda: True,
        lambda: None,
        max_body_bytes=8 * _MIB,
    )


def _args_body(size: int) -> bytes:
    """An ExtenderArgs of about `size` bytes: a pod and many candidate node names."""
    names = [f"node-{index:07d}" for index in range(size // 15)]
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}
    body = json.dumps({"Pod": pod, "NodeNames": names}, separators=(",", ":")).encode()
    assert len(body) >= size * 0.99
    return body


_NAMES = _args_body(7 * _MIB)
# Numbers cost Python's parser little and the old Python-level scan of the whole body much.
_NUMBERS = b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":[' + b"1," * (7 * _MIB // 2)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (_NAMES[:-2] + b" x]}", "invalid character 'x' after array element"),
        (_NAMES[:-20], "unexpected EOF"),
        (_NUMBERS + b"1 x]}}", "invalid character 'x' after array element"),
        (_NUMBERS + b'{"a":1 "b"}]}}', "invalid character '\"' after object key:value pair"),
        (_NUMBERS + b"1", "unexpected EOF"),
        (_NUMBERS + b"NaN]}}", "invalid character 'N' looking for beginning of value"),
        (_NUMBERS + b"1.e5]}}", "invalid character 'e' after decimal point in numeric literal"),
        (_NUMBERS + b'"\\q"]}}', "invalid character 'q' in string escape code"),
    ],
)
def test_a_7_mib_malformed_filter_body_costs_little_cpu(body: bytes, error: str) -> None:
    app = _app()
    started = time.process_time()
    reply = app.filter(body)
    spent = time.process_time() - started
    assert reply.status == 200
    answer = json.loads(reply.body)
    assert answer["Error"] == error
    assert answer["NodeNames"] is None
    assert len(body) > 7 * _MIB
    assert spent < _CPU_BOUND_SECONDS, f"{spent:.2f} s of CPU for {len(body)} bytes"
