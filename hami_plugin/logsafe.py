"""Log lines that callers cannot forge or flood.

Both daemons log strings that strangers choose: the webhook answers anyone (docs/design.md 8.3)
and logs the namespace and name of the AdmissionReview it was sent, pod authors write the
annotations whose decoding errors are logged, workloads name their region files. A newline in
such a string wrote a whole forged line ("... bound pod kube-system/coredns") into the log, and
five requests with a 6 MiB name grew it by 31.5 MB in 0.4 s (issue 25 item 7). Here:

* `safe_text` escapes every character that is not printable (newlines as `\\n`, other control
  and format characters, the Unicode line and paragraph separators, as `\\xNN` / `\\uNNNN`)
  and cuts what is longer than a limit, with a marker that gives the original length;
* `SafeFormatter`, the formatter of both daemons' handlers (`configure_logging`), applies it
  to every record: each string argument is cut before formatting, the formatted message is
  escaped and cut at `MAX_MESSAGE_CHARS`, and every line of a traceback is indented, so no call
  site can forget it and no line of the log starts with text a caller chose (a message a
  call site formats itself is covered too; call sites that embed a caller's string still
  pass it through `safe_text`, so the cut keeps the rest of their message);
* `CallerRateLimit`, a filter on the same handlers, rate-limits the records that callers
  without credentials cause (marked with `extra=from_caller(kind)`): a token bucket per
  message kind (the logger and its format string), and one summary line "suppressed N ..."
  per kind once the interval has passed and another record comes through.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = [
    "CALLER_KIND",
    "MAX_ARG_CHARS",
    "MAX_MESSAGE_CHARS",
    "CallerRateLimit",
    "SafeFormatter",
    "configure_logging",
    "from_caller",
    "safe_handler",
    "safe_text",
]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_ARG_CHARS = 1024
"""`safe_text`'s default: what a log line keeps of one string a caller chose (a Kubernetes
name is at most 253 characters)."""
MAX_MESSAGE_CHARS = 8192
"""A formatted message longer than this is cut."""
_MAX_ARG_CUT = MAX_MESSAGE_CHARS // 2
"""Any one string argument is cut to this before formatting (so its marker, with the original
length, usually survives the message's cut)."""
CALLER_KIND = "hami_caller_kind"
"""The record attribute that marks a record caused by a caller without credentials."""

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_MARKER = "...[cut, {length} characters]"


def _escape_char(char: str) -> str:
    """`char` as it is written when it is not printable: control characters (Cc), format
    characters (Cf: bidi overrides), line and paragraph separators (Zl, Zp), spaces other
    than " " (Zs), surrogates, private use and unassigned code points, i.e. anything a
    terminal or a log shipper could read as a line break or use to hide text."""
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def safe_text(value: object, limit: int = MAX_ARG_CHARS) -> str:
    """`str(value)` with every non-printable character escaped (`\\n`, `\\xNN`, `\\uNNNN`),
    cut to `limit` characters of the original with a marker naming its length."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    head = text[:limit] if cut else text
    if not head.isprintable():
        head = "".join(c if c.isprintable() else _escape_char(c) for c in head)
    return head + _MARKER.format(length=len(text)) if cut else head


def _safe_arg(value: object) -> object:
    # Cut before formatting, so that a 6 MiB argument is not copied into the message; the
    # message is escaped and cut as a whole afterwards.
    if isinstance(value, str):
        return safe_text(value, _MAX_ARG_CUT) if len(value) > _MAX_ARG_CUT else value
    if isinstance(value, bytes | bytearray):
        shown = bytes(value[:MAX_ARG_CHARS])
        return repr(shown) + (_MARKER.format(length=len(value)) if len(value) > len(shown) else "")
    return value  # numbers, exceptions, objects: the formatted message is escaped and cut


def _safe_args(args: Any) -> Any:
    if isinstance(args, tuple):
        return tuple(_safe_arg(arg) for arg in args)
    if isinstance(args, Mapping):
        return {key: _safe_arg(value) for key, value in args.items()}
    return args


def _indented(text: str) -> str:
    """Multi-line text (a traceback, written after the message's line) with every line
    indented and escaped: an exception's message may hold newlines, but no line it makes
    starts at the margin, where a record's own lines start."""
    return "\n".join("  | " + safe_text(line, MAX_MESSAGE_CHARS) for line in text.split("\n"))


class SafeFormatter(logging.Formatter):
    """A `logging.Formatter` whose output has exactly one line per record at the margin (a
    traceback's lines are indented) and a bounded length; see the module docstring."""

    def format(self, record: logging.LogRecord) -> str:
        safe = logging.makeLogRecord(record.__dict__)  # other handlers keep the original
        try:
            safe.msg = str(record.msg) % _safe_args(record.args) if record.args else record.msg
        except (TypeError, ValueError, KeyError):
            safe.msg = f"{record.msg!s} (arguments did not format: {record.args!r})"
        safe.msg = safe_text(safe.msg, MAX_MESSAGE_CHARS)
        safe.args = None
        safe.exc_text = None
        if record.exc_info and not record.exc_text:
            safe.exc_text = self.formatException(record.exc_info)
        elif record.exc_text:
            safe.exc_text = record.exc_text
        if safe.exc_text:
            safe.exc_text = _indented(safe.exc_text)
        safe.exc_info = None  # format() would format it again, unescaped
        if record.stack_info:
            safe.stack_info = _indented(record.stack_info)
        return super().format(safe)


def from_caller(kind: str) -> dict[str, str]:
    """`extra=` for a record that a caller without credentials causes (`kind`: e.g.
    "webhook"), so that `CallerRateLimit` limits it."""
    return {CALLER_KIND: kind}


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    suppressed: int = 0
    first_suppressed: float = 0.0


class CallerRateLimit(logging.Filter):
    """Token bucket per message kind for the records marked `from_caller`; other records
    pass untouched.

    Each kind (the record's caller kind, logger and format string) may log `burst` lines at
    once and `per_second` lines a second after that. Suppressed lines are counted; once
    `summary_seconds` have passed since the first of them, the next record that passes (of
    any kind) is preceded by one WARNING "suppressed N log lines ..." per such kind.
    `clock`: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        *,
        burst: int = 20,
        per_second: float = 1.0,
        summary_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_kinds: int = 1024,
    ) -> None:
        super().__init__()
        self._burst = float(burst)
        self._rate = per_second
        self._summary_seconds = summary_seconds
        self._clock = clock
        self._max_kinds = max_kinds
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}
        self._reentry = threading.local()

    @property
    def kinds(self) -> int:
        """Message kinds remembered now (at most `max_kinds`)."""
        with self._lock:
            return len(self._buckets)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(self._reentry, "active", False):
            return True  # our own summary line
        now = self._clock()
        kind = getattr(record, CALLER_KIND, None)
        passes = True
        with self._lock:
            if isinstance(kind, str):
                passes = self._take(self._bucket((kind, record.name, str(record.msg)), now), now)
            summaries = self._due_summaries(now) if passes else []
        for summary in summaries:
            self._emit(summary)
        return passes

    def _bucket(self, key: tuple[str, str, str], now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._max_kinds:  # forget idle kinds with nothing owed
                for old in [k for k, b in self._buckets.items() if not b.suppressed]:
                    del self._buckets[old]
            while len(self._buckets) >= self._max_kinds:  # then the oldest, count and all
                del self._buckets[next(iter(self._buckets))]
            bucket = self._buckets[key] = _Bucket(tokens=self._burst, updated=now)
        return bucket

    def _take(self, bucket: _Bucket, now: float) -> bool:
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.updated) * self._rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return True
        if not bucket.suppressed:
            bucket.first_suppressed = now
        bucket.suppressed += 1
        return False

    def _due_summaries(self, now: float) -> list[str]:
        due = []
        for (kind, name, message), bucket in self._buckets.items():
            if bucket.suppressed and now - bucket.first_suppressed >= self._summary_seconds:
                due.append(
                    f"suppressed {bucket.suppressed} log lines caused by {kind} callers in the "
                    f"last {now - bucket.first_suppressed:.0f} s ({name}: "
                    f"{safe_text(message, 200)!r})"
                )
                bucket.suppressed = 0
        return due

    def _emit(self, summary: str) -> None:
        self._reentry.active = True
        try:
            logging.getLogger(__name__).warning("%s", summary)
        finally:
            self._reentry.active = False


def safe_handler(
    stream: TextIO | None = None, *, rate_limit: CallerRateLimit | None = None
) -> logging.Handler:
    """A stream handler (stderr when None) with `SafeFormatter` and `rate_limit` (a default
    `CallerRateLimit` when None): what both daemons log through."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(SafeFormatter(LOG_FORMAT))
    handler.addFilter(rate_limit if rate_limit is not None else CallerRateLimit())
    return handler


def configure_logging(level: int | str = logging.WARNING) -> None:
    """Both daemons' logging, in place of `logging.basicConfig`: the root logger at `level`
    with one `safe_handler` on stderr (nothing changes when the root has handlers already)."""
    logging.basicConfig(level=level, handlers=[safe_handler()])
