"""The value grammars of every flag, environment variable and config-file key of both daemons.

Booleans and durations are Go's, because HAMi's daemons are Go programs and HAMi users carry
their values over: the scheduler's flags are pflag's (`BoolVar` parses with `strconv.ParseBool`,
spf13/pflag v1.0.10 bool.go:21; `DurationVar` with `time.ParseDuration`, HAMi v2.10.0
cmd/scheduler/main.go:79-83), the device plugin's are urfave/cli's (`BoolFlag` parses the flag
and its env variable with `strconv.ParseBool`, urfave/cli v2.27.7 flag_bool.go:31,115; HAMi
v2.10.0 cmd/device-plugin/nvidia/main.go:91-96, vgpucfg.go:60-65), and HAMi reads
`HAMI_NODELOCK_EXPIRE` and `HAMI_RESYNC_INTERVAL` with `time.ParseDuration`
(pkg/util/nodelock/nodelock.go:119, pkg/monitor/nvidia/cudevshr.go:103). So `on`, `yes`,
`tRUE` or a bare `30` are refused by both daemons alike.

Each parser takes the raw value (a str from a flag or the environment, any YAML scalar from a
file) and raises ValueError with a short reason; `hami_plugin.config.sources` prefixes the flag,
variable or file key it came from and raises ConfigError.
"""

from __future__ import annotations

import re
from datetime import timedelta

from hami_plugin.protocol.govalues import GO_FALSE, GO_TRUE, parse_go_bool, parse_go_duration

__all__ = [
    "BOOL_SPELLINGS",
    "EXIT_USAGE",
    "KLOG_DEBUG_VERBOSITY",
    "LOG_LEVELS",
    "ConfigError",
    "parse_bool",
    "parse_duration",
    "parse_float",
    "parse_int",
    "parse_int_set",
    "parse_klog_verbosity",
    "parse_optional_str",
    "parse_str",
    "parse_str_set",
    "split_list",
]


class ConfigError(ValueError):
    """A flag, environment variable or file value that cannot be used; the message names where
    it came from and the bad value."""


EXIT_USAGE = 2
"""The exit status of every `hami` command stopped by a ConfigError (one line names it)."""


_SPELLING_ORDER = ("1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False")
BOOL_SPELLINGS = "true: {}; false: {}".format(
    ", ".join(s for s in _SPELLING_ORDER if s in GO_TRUE),
    ", ".join(s for s in _SPELLING_ORDER if s in GO_FALSE),
)
"""Every spelling Go's `strconv.ParseBool` takes (`protocol.govalues.GO_TRUE`/`GO_FALSE`), in
its documentation's order, for error messages."""


def parse_bool(raw: object) -> bool:
    """Go's `strconv.ParseBool` over a text value; a YAML boolean is itself, and a YAML 0 or 1
    is Go's `"0"`/`"1"`. Raises ValueError listing the accepted spellings."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int | str):
        try:
            return parse_go_bool(str(raw))
        except ValueError as error:
            raise ValueError(f"{error} ({BOOL_SPELLINGS})") from None
    raise ValueError(f"expected a boolean, got {raw!r}")


def parse_duration(raw: object) -> timedelta:
    """Go's `time.ParseDuration` (`300ms`, `30s`, `5m`, `1h30m`; `0` alone is zero; a unit is
    required otherwise). Negative durations parse, as in Go; callers check the sign."""
    if not isinstance(raw, str):
        raise ValueError(f"expected a Go duration such as 30s, 5m or 1h30m, got {raw!r}")
    return parse_go_duration(raw)


def parse_str(raw: object) -> str:
    """A text value; a YAML number is its text, a YAML boolean or a collection is refused."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"expected a string, got {raw!r}")
    return str(raw)


def parse_optional_str(raw: object) -> str | None:
    """`parse_str`, with null and the empty string meaning unset."""
    if raw is None:
        return None
    return parse_str(raw) or None


def parse_int(raw: object) -> int:
    """A decimal integer (surrounding blanks ignored), or a YAML integer or whole float."""
    if isinstance(raw, bool):
        raise ValueError(f"expected an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {raw!r}")


def parse_float(raw: object) -> float:
    """A decimal number (surrounding blanks ignored), or a YAML number."""
    if isinstance(raw, bool):
        raise ValueError(f"expected a number, got {raw!r}")
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {raw!r}")


LOG_LEVELS = ("debug", "info", "warning", "error")
"""What `--log-level` takes (`hami scheduler`, `hami certs`), the `logging` level names."""

KLOG_DEBUG_VERBOSITY = 4
"""The `-v` from which both daemons log at debug level. HAMi writes its detail at `klog.V(4)`
and `klog.V(5)` (about 370 of its 410 `V()` calls in v2.10.0) and its chart passes `-v=4`; below
4 klog adds a few info lines only, so `-v` 0-3 leaves the log level as it is (info by default)."""

_KLOG_LEVEL = re.compile(r"[+-]?[0-9]+")
_INT32_MAX = 2**31 - 1


def parse_klog_verbosity(raw: object) -> int:
    """klog's `-v` (`Level.Set`: `strconv.ParseInt(value, 10, 32)`, klog v2.140.0 klog.go:242):
    a decimal 32-bit integer, sign allowed. Raises ValueError."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        text = str(raw)
    elif isinstance(raw, str):
        text = raw
    else:
        raise ValueError(f"expected a klog verbosity (a whole number such as 4), got {raw!r}")
    if not _KLOG_LEVEL.fullmatch(text) or not -_INT32_MAX - 1 <= int(text) <= _INT32_MAX:
        raise ValueError(f"expected a klog verbosity (a whole number such as 4), got {raw!r}")
    return int(text)


def split_list(raw: object) -> list[object]:
    """A comma-separated text (blank items dropped) or a YAML list."""
    if isinstance(raw, str):
        return [item.strip() for item in raw.split(",") if item.strip()]
    if isinstance(raw, list | tuple):
        return list(raw)
    raise ValueError(f"expected a list or a comma-separated string, got {raw!r}")


def parse_str_set(raw: object) -> frozenset[str]:
    """`split_list`, each item a string."""
    return frozenset(parse_str(item) for item in split_list(raw))


def parse_int_set(raw: object) -> frozenset[int]:
    """`split_list`, each item an integer."""
    return frozenset(parse_int(item) for item in split_list(raw))
