"""hami_plugin.kube.informer against the API server double, over HTTP through the real client."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.informer import Informer, ListWatchOptions
from hami_plugin.kube.retry import RetryPolicy
from hami_plugin.protocol.objects import PodInfo, read_pod
from hami_plugin.testing.apiserver import FakeApiServer
from tests.fakes.pytest_fixtures import apiserver  # noqa: F401 - fixture
from tests.processes import wait_until

FAST = RetryPolicy(
    attempts=2, initial_backoff_seconds=0.001, max_backoff_seconds=0.01, timeout_seconds=5.0
)
WATCH = ".*watch=true.*"


def pod_key(pod: PodInfo) -> str:
    return f"{pod.namespace}/{pod.name}"


class Recorder:
    """An informer handler that mirrors what it is told and notes every inconsistency: an
    `old` that is not what it was last told for that key, or a version going backwards."""

    def __init__(self, fail_on: str = "") -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, str]] = []
        self.mirror: dict[str, PodInfo] = {}
        self.violations: list[str] = []
        self.synced = 0
        self.fail_on = fail_on

    def on_upsert(self, new: PodInfo, old: PodInfo | None) -> None:
        key = pod_key(new)
        with self.lock:
            if self.mirror.get(key) != old:
                self.violations.append(f"upsert {key}: old {old} is not {self.mirror.get(key)}")
            if old is not None and int(new.resource_version) <= int(old.resource_version):
                self.violations.append(f"upsert {key}: version went back to {new.resource_version}")
            self.mirror[key] = new
            self.calls.append(("upsert", key, new.resource_version))
        if new.name == self.fail_on:
            raise RuntimeError(f"handler bug on {key}")

    def on_delete(self, old: PodInfo) -> None:
        key = pod_key(old)
        with self.lock:
            if self.mirror.get(key) != old:
                self.violations.append(f"delete {key}: old {old} is not {self.mirror.get(key)}")
            self.mirror.pop(key, None)
            self.calls.append(("delete", key, old.resource_version))

    def on_synced(self) -> None:
        with self.lock:
            self.synced += 1
            self.calls.append(("synced", "", ""))

    def state(self) -> dict[str, str]:
        with self.lock:
            return {key: pod.resource_version for key, pod in self.mirror.items()}


def server_pods(server: FakeApiServer, label: str | None = None) -> dict[str, str]:
    """key -> resourceVersion of the pods on the server (with the label `label`=on)."""
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["resourceVersion"]
        for p in server.objects("pods")
        if label is None or p["metadata"].get("labels", {}).get(label) == "on"
    }


def store_of(informer: Informer[PodInfo]) -> dict[str, str]:
    return {pod_key(p): p.resource_version for p in informer.items()}


def make_informer(
    kube: KubeClient, handler: Recorder, *, label_selector: str | None = None, **options: Any
) -> Informer[PodInfo]:
    """An informer of every pod; `options` are `ListWatchOptions` fields."""
    timing: dict[str, Any] = {"initial_backoff_seconds": 0.01, "max_backoff_seconds": 0.05}
    return Informer(
        kube,
        "/api/v1/pods",
        read_pod,
        pod_key,
        handler,
        name="pods",
        label_selector=label_selector,
        options=ListWatchOptions(**(timing | options)),
        rng=random.Random(3),
    )


@contextlib.contextmanager
def running(informer: Informer[PodInfo]) -> Iterator[threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), name="informer")
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive(), "Informer.run did not return after stop"


def converged(
    server: FakeApiServer,
    informer: Informer[PodInfo],
    handler: Recorder,
    label: str | None = None,
) -> Callable[[], bool]:
    def check() -> bool:
        expected = server_pods(server, label)
        return store_of(informer) == expected and handler.state() == expected

    return check


@pytest.fixture
def kube(apiserver: FakeApiServer) -> Iterator[KubeClient]:  # noqa: F811
    with KubeClient(apiserver.api_client(), FAST) as client:
        yield client


def away_until_expired(server: FakeApiServer, change: Callable[[], object]) -> None:
    """Cut the watch and keep it failing while `change` happens and the history is compacted:
    the informer comes back with a version older than the server keeps, so it must relist."""
    fault = server.inject_fault("GET", query=WATCH, status=500, times=None)
    server.drop_watches()
    change()
    wait_until(lambda: fault.fired > 0, "a failed watch attempt", timeout=30.0)
    server.expire_history()
    server.clear_faults()


def _list_requests(server: FakeApiServer) -> list[dict[str, list[str]]]:
    return [
        r.query for r in server.requests_matching("GET", "/api/v1/pods") if "watch" not in r.query
    ]


def _watch_versions(server: FakeApiServer) -> list[str]:
    return [
        r.query["resourceVersion"][0]
        for r in server.requests_matching("GET", "/api/v1/pods")
        if "watch" in r.query
    ]


# --- the normal path ---------------------------------------------------------------------------


def test_lists_then_watches_and_tells_the_handler_in_order(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    base = apiserver.resource_version

    def v(writes: int) -> str:
        return str(base + writes)

    apiserver.add_pod("a")
    apiserver.add_pod("b", "ml")
    handler = Recorder()
    informer = make_informer(kube, handler)

    with running(informer):
        wait_until(informer.synced.is_set, "the first list", timeout=30.0)
        assert sorted(handler.calls) == sorted(
            [("upsert", "default/a", v(1)), ("upsert", "ml/b", v(2)), ("synced", "", "")]
        )
        assert informer.last_resource_version == v(2)
        wait_until(lambda: apiserver.watch_count == 1, "the watch", timeout=30.0)
        handler.calls.clear()
        apiserver.add_pod("c")
        apiserver.update_object(
            "pods", "default", "a", lambda p: p["metadata"]["labels"].update(x="1")
        )
        apiserver.delete_pod("ml", "b")
        wait_until(
            converged(apiserver, informer, handler), "the store to follow the server", timeout=30.0
        )

    assert handler.calls == [
        ("upsert", "default/c", v(3)),
        ("upsert", "default/a", v(4)),
        ("delete", "ml/b", v(2)),
    ]
    a = informer.get("default/a")
    assert a is not None and a.labels == {"x": "1"}
    assert informer.get("ml/b") is None
    assert informer.last_resource_version == v(5)
    assert handler.violations == []
    assert _watch_versions(apiserver) == [v(2)]


def test_a_dropped_watch_resumes_from_the_last_version_without_loss_or_duplicates(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    handler = Recorder()
    informer = make_informer(kube, handler)

    with running(informer):
        wait_until(informer.synced.is_set, "the first list", timeout=30.0)
        for round_ in range(5):
            wait_until(lambda: apiserver.watch_count == 1, "a watch", timeout=30.0)
            apiserver.add_pod(f"p{round_}")
            if round_:
                apiserver.delete_pod("default", f"p{round_ - 1}")
            apiserver.drop_watches()
            apiserver.add_pod(f"while-away-{round_}")
        wait_until(
            converged(apiserver, informer, handler), "the store to follow the server", timeout=30.0
        )

    assert handler.violations == []
    changes = [c for c in handler.calls if c[0] != "synced"]
    assert len(changes) == len(set(changes)), "an event was handled twice"
    # Every write reached the handler: 10 pods added, 4 deleted.
    assert len(changes) == 14
    assert len(_list_requests(apiserver)) == 1  # resumed, never relisted
    versions = [int(v) for v in _watch_versions(apiserver)]
    assert versions == sorted(versions)
    assert len(versions) >= 2


def test_bookmarks_advance_the_version_past_objects_the_selector_hides(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.bookmark_interval_seconds = 0.05
    handler = Recorder()
    informer = make_informer(kube, handler, label_selector="gpu=on")

    with running(informer):
        wait_until(informer.synced.is_set, "the first list", timeout=30.0)
        for name in "abc":
            apiserver.add_pod(name)  # not selected: no event, only bookmarks move on
        current = str(apiserver.resource_version)
        wait_until(
            lambda: informer.last_resource_version == current, "a bookmark at the tip", timeout=30.0
        )
        # The history is gone, but the informer's version is current: it resumes, no relist.
        apiserver.expire_history()
        apiserver.drop_watches()
        apiserver.add_pod("gpu", labels={"gpu": "on"})
        wait_until(converged(apiserver, informer, handler, "gpu"), "the selected pod", timeout=30.0)

    assert len(_list_requests(apiserver)) == 1
    assert current in _watch_versions(apiserver)
    assert [c[1] for c in handler.calls if c[0] == "upsert"] == ["default/gpu"]


# --- relist ------------------------------------------------------------------------------------


def test_gone_relists_and_reports_what_changed_while_away(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.add_pod("stays")
    deleted = apiserver.add_pod("deleted")["metadata"]["resourceVersion"]
    apiserver.add_pod("changed")
    handler = Recorder()
    informer = make_informer(kube, handler)

    with running(informer):
        wait_until(informer.synced.is_set, "the first list", timeout=30.0)
        wait_until(lambda: apiserver.watch_count == 1, "the watch", timeout=30.0)

        def while_away() -> None:
            apiserver.delete_pod("default", "deleted")
            apiserver.update_object(
                "pods", "default", "changed", lambda p: p["spec"].update(nodeName="n")
            )
            apiserver.add_pod("new")

        away_until_expired(apiserver, while_away)
        wait_until(converged(apiserver, informer, handler), "the relist", timeout=30.0)
        wait_until(lambda: handler.synced == 2, "on_synced after the relist", timeout=30.0)

    after_first_sync = handler.calls[handler.calls.index(("synced", "", "")) + 1 :]
    assert sorted(after_first_sync[:-1]) == [
        ("delete", "default/deleted", deleted),
        ("upsert", "default/changed", str(int(deleted) + 3)),
        ("upsert", "default/new", str(int(deleted) + 4)),
    ]
    assert after_first_sync[-1] == ("synced", "", "")
    assert handler.violations == []
    assert len(_list_requests(apiserver)) == 2
    changed = informer.get("default/changed")
    assert changed is not None and changed.node_name == "n"


def test_an_expired_continue_token_lists_again_in_one_page(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    for name in "abcd":
        apiserver.add_pod(name)
    apiserver.inject_fault("GET", "/api/v1/pods", query=".*continue=.*", status=410)
    handler = Recorder()
    informer = make_informer(kube, handler, page_size=2)

    with running(informer):
        wait_until(informer.synced.is_set, "the list", timeout=30.0)
        wait_until(converged(apiserver, informer, handler), "the store", timeout=30.0)

    lists = _list_requests(apiserver)
    assert [q.get("limit") for q in lists] == [["2"], ["2"], None]
    assert handler.synced == 1


# --- failures ----------------------------------------------------------------------------------


def test_api_errors_for_a_while_then_recovery(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.add_pod("a")
    apiserver.inject_fault(status=500, times=None)
    handler = Recorder()
    informer = make_informer(kube, handler)

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.informer"), running(informer):
        wait_until(lambda: len(apiserver.requests) >= 3 * FAST.attempts, "retries", timeout=30.0)
        assert not informer.synced.is_set()
        apiserver.clear_faults()
        wait_until(informer.synced.is_set, "the list after recovery", timeout=30.0)
        apiserver.add_pod("b")
        # Now the watch fails for a while; the store catches up once it recovers.
        before = len(apiserver.requests)
        apiserver.inject_fault("GET", query=WATCH, status=503, times=None)
        apiserver.drop_watches()
        apiserver.add_pod("c")
        wait_until(
            lambda: len(apiserver.requests) >= before + 2 * FAST.attempts, "retries", timeout=30.0
        )
        apiserver.clear_faults()
        wait_until(
            converged(apiserver, informer, handler), "the store after recovery", timeout=30.0
        )

    assert handler.violations == []
    assert any("HTTP 500" in r.getMessage() for r in caplog.records)


def test_objects_that_stop_matching_the_selector_are_deleted(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    a = apiserver.add_pod("a", labels={"gpu": "on"})["metadata"]["resourceVersion"]
    b = apiserver.add_pod("b", labels={"gpu": "on"})["metadata"]["resourceVersion"]
    handler = Recorder()
    informer = make_informer(kube, handler, label_selector="gpu=on")

    with running(informer):
        wait_until(informer.synced.is_set, "the list", timeout=30.0)
        wait_until(lambda: apiserver.watch_count == 1, "the watch", timeout=30.0)
        apiserver.update_object("pods", "default", "a", lambda p: p["metadata"]["labels"].clear())
        wait_until(
            converged(apiserver, informer, handler, "gpu"), "a to leave the store", timeout=30.0
        )

    assert store_of(informer) == {"default/b": b}
    assert handler.calls[-1] == ("delete", "default/a", a)


def test_untransformable_objects_are_logged_once_per_version_and_skipped(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = apiserver.add_pod("bad")
    apiserver.update_object(
        "pods", "default", "bad", lambda p: p["metadata"].update(annotations=[])
    )
    apiserver.add_pod("good")
    handler = Recorder()
    informer = make_informer(kube, handler)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "skipping default/bad" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="hami_plugin.kube.informer"), running(informer):
        wait_until(informer.synced.is_set, "the list", timeout=30.0)
        wait_until(lambda: apiserver.watch_count == 1, "the watch", timeout=30.0)
        # A relist sees the same bad version again: no second line.
        away_until_expired(apiserver, lambda: apiserver.add_pod("other"))
        wait_until(lambda: handler.synced == 2, "the relist", timeout=30.0)
        assert len(warnings()) == 1
        # A new bad version is logged again; a good one is stored.
        apiserver.update_object(
            "pods", "default", "bad", lambda p: p["metadata"].update(annotations=["x"])
        )
        wait_until(lambda: len(warnings()) == 2, "the second bad version", timeout=30.0)
        apiserver.update_object(
            "pods", "default", "bad", lambda p: p["metadata"].update(annotations={})
        )
        wait_until(
            lambda: informer.get("default/bad") is not None, "the fixed version", timeout=30.0
        )

    assert "annotations" in warnings()[0]
    assert f"resourceVersion {int(bad['metadata']['resourceVersion']) + 1}" in warnings()[0]
    assert handler.violations == []


def test_a_failing_handler_is_logged_and_the_informer_goes_on(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = Recorder(fail_on="boom")
    informer = make_informer(kube, handler)

    with caplog.at_level(logging.ERROR, logger="hami_plugin.kube.informer"), running(informer):
        wait_until(informer.synced.is_set, "the list", timeout=30.0)
        apiserver.add_pod("boom")
        apiserver.add_pod("after")
        wait_until(
            converged(apiserver, informer, handler), "the events after the failure", timeout=30.0
        )

    [record] = caplog.records
    assert "on_upsert failed for 'default/boom'" in record.getMessage()
    assert record.exc_info is not None


def test_run_returns_when_stopped_while_backing_off(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    apiserver.inject_fault(status=503, times=None)
    informer = make_informer(kube, Recorder(), initial_backoff_seconds=60, max_backoff_seconds=60)

    with running(informer):
        wait_until(lambda: len(apiserver.requests) >= FAST.attempts, "a failed list", timeout=30.0)

    assert not informer.synced.is_set()


def test_run_returns_when_stopped_while_watching(
    apiserver: FakeApiServer,  # noqa: F811
    kube: KubeClient,
) -> None:
    informer = make_informer(kube, Recorder())

    with running(informer):
        wait_until(lambda: apiserver.watch_count == 1, "the watch", timeout=30.0)

    wait_until(lambda: apiserver.watch_count == 0, "the watch to be closed", timeout=30.0)


# --- property ----------------------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "c", "d"])
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["add", "modify", "delete", "relabel"]), NAMES),
        st.tuples(st.sampled_from(["drop", "expire", "settle", "settle+drop"]), st.just("")),
    ),
    max_size=20,
)


def _apply(server: FakeApiServer, operation: str, name: str, settle: Callable[[], None]) -> None:
    exists = server.get_pod("default", name) is not None
    if operation == "add" and not exists:
        server.add_pod(name, labels={"gpu": "on"})
    elif operation == "modify" and exists:
        server.update_object(
            "pods",
            "default",
            name,
            lambda p: p["metadata"]["annotations"].update(n=str(server.resource_version)),
        )
    elif operation == "relabel" and exists:

        def flip(pod: dict[str, Any]) -> None:
            labels = pod["metadata"]["labels"]
            labels["gpu"] = "off" if labels.get("gpu") == "on" else "on"

        server.update_object("pods", "default", name, flip)
    elif operation == "delete" and exists:
        server.delete_pod("default", name)
    elif operation == "drop":
        server.drop_watches()
    elif operation == "expire":
        server.expire_history()
        server.drop_watches()
    elif operation == "settle":
        settle()
    elif operation == "settle+drop":
        # The informer has seen everything, then loses its stream: what it resumes from matters.
        settle()
        server.drop_watches()


@settings(max_examples=60)
@given(operations=OPERATIONS, selected=st.booleans(), initial=st.sets(NAMES))
def test_store_and_handler_follow_the_server_under_drops_and_expiries(
    operations: list[tuple[str, str]], selected: bool, initial: set[str]
) -> None:
    label = "gpu" if selected else None
    with FakeApiServer(history_size=8) as server, KubeClient(server.api_client(), FAST) as kube:
        for name in sorted(initial):
            server.add_pod(name, labels={"gpu": "on"})
        handler = Recorder()
        informer = make_informer(kube, handler, label_selector="gpu=on" if selected else None)
        check = converged(server, informer, handler, label)
        with running(informer):
            wait_until(informer.synced.is_set, "the first list", timeout=30.0)
            for operation, name in operations:
                _apply(server, operation, name, lambda: wait_until(check, "settling", timeout=30.0))
            wait_until(check, "the store to follow the server", timeout=30.0)

    assert handler.violations == []
    changes = [c for c in handler.calls if c[0] != "synced"]
    assert len(changes) == len(set(changes)), "a change was handled twice"
