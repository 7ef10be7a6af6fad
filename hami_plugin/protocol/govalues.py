"""Go's value grammars, as HAMi's Go code parses and prints them: `strconv.ParseInt`,
`strconv.ParseBool`, `time.ParseDuration`, `Duration.String()`, `time.RFC3339` and `%q`.

One implementation for the annotation codec, both daemons' flags and environment, and error
messages. Pure: every parser raises ValueError with a short reason, which the caller wraps.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone

__all__ = [
    "GO_FALSE",
    "GO_INT",
    "GO_TRUE",
    "excerpt",
    "format_go_duration",
    "format_rfc3339",
    "go_quote",
    "parse_go_bool",
    "parse_go_duration",
    "parse_go_int",
    "parse_rfc3339",
]

GO_INT = re.compile(r"[+-]?[0-9]+")
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?(Z|[+-]\d{2}:\d{2})"
)


def go_quote(text: str) -> str:
    """Quote like Go's %q for the common cases (used in error messages only)."""
    return json.dumps(text, ensure_ascii=False)


def excerpt(text: str, limit: int = 80) -> str:
    """`text` quoted as `%q`, cut to `limit` characters with "..." (for error messages)."""
    return go_quote(text if len(text) <= limit else text[:limit] + "...")


def parse_go_int(text: str, bits: int = 32) -> int:
    """`strconv.ParseInt(text, 10, bits)`: optional sign and decimal digits only, range-checked.

    Raises ValueError with a short reason (callers wrap it into AnnotationError).
    """
    if len(text) > 40 or not GO_INT.fullmatch(text):
        raise ValueError(f"invalid integer {excerpt(text)}")
    value = int(text)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if not low <= value <= high:
        raise ValueError(f"integer {text} out of range for int{bits}")
    return value


def parse_go_bool(text: str) -> bool:
    """`strconv.ParseBool`: 1 t T TRUE true True / 0 f F FALSE false False."""
    if text in GO_TRUE:
        return True
    if text in GO_FALSE:
        return False
    raise ValueError(f"invalid boolean {excerpt(text)}")


# --- Go durations (flags and env such as HAMI_NODELOCK_EXPIRE, HAMI_RESYNC_INTERVAL) ----------

_NANOSECONDS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # Go accepts the micro sign
    "μs": 1_000,  # and the Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_GO_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> timedelta:
    """Go's `time.ParseDuration`: `300ms`, `1.5h`, `2h45m`, `-1m`; `0` alone is zero.

    Raises ValueError naming the text when it is not a duration (a unit is required, as in Go).
    Precision is Go's nanosecond, rounded to Python's microsecond.
    """
    body = text
    sign = 1
    if body[:1] in ("+", "-"):
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body == "0":
        return timedelta(0)
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total_ns = 0
    position = 0
    while position < len(body):
        match = _GO_DURATION_PART.match(body, position)
        if match is None or (not match.group(1) and not match.group(2)):
            raise ValueError(f"invalid duration {text!r} (expected e.g. 30s, 5m, 1m30s)")
        whole, fraction, unit = match.groups()
        scale = _NANOSECONDS[unit]
        total_ns += int(whole or "0") * scale
        if fraction:
            total_ns += int(fraction) * scale // 10 ** len(fraction)
        position = match.end()
    return timedelta(microseconds=sign * total_ns / 1000)


def format_go_duration(duration: timedelta) -> str:
    """Go's `Duration.String()`: `5m0s`, `28s`, `1h0m0s`, `1.5s`, `500ms`, `0s`."""
    total_ns = (
        duration.days * 86_400_000_000_000
        + duration.seconds * 1_000_000_000
        + duration.microseconds * 1_000
    )
    if total_ns == 0:
        return "0s"
    sign = "-" if total_ns < 0 else ""
    total_ns = abs(total_ns)
    if total_ns < 1_000_000_000:
        for unit, scale in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if total_ns >= scale or unit == "ns":
                return sign + _decimal(total_ns, scale) + unit
    hours, rest = divmod(total_ns, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    seconds = _decimal(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return sign + seconds


def _decimal(value: int, scale: int) -> str:
    whole, fraction = divmod(value, scale)
    if not fraction:
        return str(whole)
    digits = str(fraction).rjust(len(str(scale)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def parse_rfc3339(text: str) -> datetime:
    """Go's time.RFC3339 layout, with an optional fraction; raises ValueError."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(f"time {excerpt(text)} is not RFC3339")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    if zone == "Z":
        tz = UTC
    else:
        sign = 1 if zone[0] == "+" else -1
        offset = timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
        if offset >= timedelta(hours=24):
            raise ValueError(f"time {excerpt(text)} has an invalid zone offset")
        tz = timezone(sign * offset)
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    return datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second), micros, tzinfo=tz
    )


def format_rfc3339(when: datetime) -> str:
    """Go's time.RFC3339 layout: seconds precision, `Z` for UTC, else `+hh:mm`."""
    if when.tzinfo is None:
        raise ValueError("an RFC3339 time needs a time zone")
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    offset = when.utcoffset()
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
