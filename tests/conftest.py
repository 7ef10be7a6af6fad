"""Shared pytest configuration, and the thread-leak check every test runs under."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.processes import wait_until

# CI runs on 2 shared cores: no per-example deadline, a stable example budget.
settings.register_profile(
    "hami", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("hami")

pytest_plugins = ["tests.fakes.pytest_fixtures"]

THREAD_GRACE_SECONDS = 5.0
"""How long a thread the test started may take to end after the test's fixtures are torn down:
stop() methods signal their threads and join them, but a request handler answering its last
response needs a moment."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "leaves_threads(*names): threads that a fixture of a wider scope owns and stops, which "
        "the test may start; the thread-leak check leaves threads whose name contains one of "
        "`names` alone",
    )


def _outliving(before: set[threading.Thread], allowed: tuple[str, ...]) -> list[threading.Thread]:
    return [
        thread
        for thread in threading.enumerate()
        if thread not in before
        and thread.is_alive()
        and not any(name in thread.name for name in allowed)
    ]


@pytest.fixture(autouse=True)
def no_thread_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a thread it started running after its fixtures are torn down.

    Autouse fixtures are set up first, so this one is torn down last, after the test's own
    fixtures have stopped what they started.
    """
    allowed = tuple(
        name for marker in request.node.iter_markers("leaves_threads") for name in marker.args
    )
    before = set(threading.enumerate())
    yield
    leaked: list[str] = []
    try:
        wait_until(lambda: not _outliving(before, allowed), "its threads end", THREAD_GRACE_SECONDS)
    except AssertionError:  # failed below, outside the handler: one message, no chained trace
        leaked = sorted(thread.name for thread in _outliving(before, allowed))
    if leaked:
        pytest.fail(f"threads outlive the test: {leaked}", pytrace=False)
