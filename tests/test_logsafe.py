"""logsafe: one line per record whatever the arguments say, bounded, rate-limited by kind."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from hami_plugin.logsafe import (
    MAX_MESSAGE_CHARS,
    CallerRateLimit,
    from_caller,
    safe_handler,
    safe_text,
)

FORGED = "x\n2026-12-06 08:00:00,000 INFO hami_plugin.extender.bind: pod kube-system/coredns bound"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, FakeClock]]:
    """A logger whose records go only through a daemon's handler (burst 3, 1 line/s)."""
    stream, clock = io.StringIO(), FakeClock()
    handler = safe_handler(stream, rate_limit=CallerRateLimit(burst=3, clock=clock))
    logger = logging.Logger("tests.logsafe", logging.INFO)  # outside the hierarchy: only ours
    logger.addHandler(handler)
    summaries = logging.getLogger("hami_plugin.logsafe")  # where the summary lines go
    summaries.addHandler(handler)
    summaries.propagate = False
    yield logger, stream, clock
    summaries.removeHandler(handler)
    summaries.propagate = True


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name", "plain name"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("bell\x07 del\x7f c1\x85", "bell\\x07 del\\x7f c1\\x85"),
        ("ls\u2028ps\u2029rlo\u202e", "ls\\u2028ps\\u2029rlo\\u202e"),
        ("nbsp\u00a0", "nbsp\\xa0"),
        ("ünïcode ok", "ünïcode ok"),
    ],
)
def test_escapes_what_is_not_printable(text: str, shown: str) -> None:
    assert safe_text(text) == shown


def test_cuts_with_the_original_length() -> None:
    assert safe_text("a" * 5000, 10) == "a" * 10 + "...[cut, 5000 characters]"
    assert safe_text("\n" * 20, 3) == "\\n\\n\\n...[cut, 20 characters]"


def test_a_newline_in_an_argument_forges_no_line(
    logged: tuple[logging.Logger, io.StringIO, FakeClock],
) -> None:
    logger, stream, _ = logged
    logger.warning("denying pod %s", FORGED)
    logger.warning(f"formatted at the call site: {FORGED}")  # the case the formatter covers
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert all(" WARNING tests.logsafe: " in line for line in lines)
    assert "x\\n2026-12-06 08:00:00,000 INFO" in lines[0]


def test_a_traceback_keeps_its_lines_but_none_starts_at_the_margin(
    logged: tuple[logging.Logger, io.StringIO, FakeClock],
) -> None:
    logger, stream, _ = logged
    try:
        raise ValueError(FORGED)
    except ValueError:
        logger.exception("failed")
    first, *rest = stream.getvalue().splitlines()
    assert " ERROR tests.logsafe: failed" in first
    assert rest and all(line.startswith("  | ") for line in rest)
    assert "  | 2026-12-06 08:00:00,000 INFO hami_plugin.extender.bind: pod kube-system" in rest[-1]


def test_a_huge_argument_is_cut_before_it_is_written(
    logged: tuple[logging.Logger, io.StringIO, FakeClock],
) -> None:
    logger, stream, _ = logged
    logger.warning("pod %s", "n" * (6 << 20))
    output = stream.getvalue()
    assert len(output) < MAX_MESSAGE_CHARS + 200
    assert f"[cut, {6 << 20} characters]" in output


def test_bad_arguments_still_make_one_line(
    logged: tuple[logging.Logger, io.StringIO, FakeClock],
) -> None:
    logger, stream, _ = logged
    logger.warning("%d pods", "not a number\n")
    [line] = stream.getvalue().splitlines()
    assert "arguments did not format" in line


def test_caller_lines_are_rate_limited_per_kind_with_a_summary(
    logged: tuple[logging.Logger, io.StringIO, FakeClock],
) -> None:
    logger, stream, clock = logged
    caller = from_caller("webhook")
    for index in range(10):
        logger.info("denying pod %s", f"p{index}", extra=caller)
    logger.info("other message %s", "o", extra=caller)  # its own bucket
    logger.info("own line, not a caller's")  # never limited
    lines = stream.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "denying pod p0",
        "denying pod p1",
        "denying pod p2",
        "other message o",
        "own line, not a caller's",
    ]
    clock.now += 30.0  # not yet due: no summary, the bucket has refilled
    logger.info("denying pod %s", "later", extra=caller)
    assert "suppressed" not in stream.getvalue()
    clock.now += 31.0
    logger.info("own line again")
    tail = stream.getvalue().splitlines()[-2:]
    assert (
        "WARNING hami_plugin.logsafe: suppressed 7 log lines caused by webhook callers" in (tail[0])
    )
    assert "'denying pod %s'" in tail[0]
    assert tail[1].endswith("own line again")
    logger.info("own line once more")
    assert stream.getvalue().count("suppressed") == 1  # said once


def test_the_kinds_remembered_are_bounded() -> None:
    clock = FakeClock()
    limit = CallerRateLimit(burst=1, clock=clock, max_kinds=4)
    for index in range(50):
        for _ in range(2):  # the second of each kind is suppressed: every bucket owes a line
            record = logging.LogRecord("t", logging.INFO, "f", 1, f"kind {index}", None, None)
            record.__dict__.update(from_caller("webhook"))
            limit.filter(record)
    assert limit.kinds <= 4
