"""Where a setting comes from: command-line flags, environment variables and config files.

Each source is a `Layer` of raw values keyed by setting name; a daemon stacks its layers lowest
first (defaults < file < environment < flag) and `resolve` parses the value of the highest
layer that sets it, once, at start. A bad value raises ConfigError naming the flag, the
variable or the file and key it came from.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import yaml

from hami_plugin.config.values import ConfigError

__all__ = [
    "Layer",
    "add_bool_flag",
    "env_layer",
    "flag_dest",
    "flag_layer",
    "parse_setting",
    "pick",
    "read_yaml",
    "resolve",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Layer:
    """Raw values from one source, keyed by setting name.

    `keys` says how each value was spelled there (the flag, the variable, the file key) so that
    an error names it; `label` names the source (`config file /etc/hami/config.yaml`), and is
    empty for flags and the environment, whose key alone says where a value came from.
    """

    label: str = ""
    values: dict[str, object] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)

    def put(self, name: str, raw: object, key: str) -> None:
        """Record `raw` for setting `name`, spelled `key` in this source."""
        self.values[name] = raw
        self.keys[name] = key

    def where(self, name: str) -> str:
        """The flag, variable or `file: key` that set `name`, for messages."""
        key = self.keys.get(name, name)
        return f"{self.label}: {key}" if self.label else key


def flag_dest(flag: str) -> str:
    """The argparse destination of `--some-flag`: `some_flag` (of `-v`: `v`)."""
    return flag.lstrip("-").replace("-", "_")


def flag_layer(args: argparse.Namespace, flags: Mapping[str, str]) -> Layer:
    """The flags given on the command line, `flags` mapping setting name to flag; a flag whose
    argparse default is None and that was not given is absent."""
    layer = Layer()
    for name, flag in flags.items():
        raw = getattr(args, flag_dest(flag), None)
        if raw is not None:
            layer.put(name, raw, flag)
    return layer


def env_layer(env: Mapping[str, str], variables: Mapping[str, str]) -> Layer:
    """The variables set in `env`, `variables` mapping setting name to variable. An empty
    variable (a chart's `value: ""`) counts as unset."""
    layer = Layer()
    for name, variable in variables.items():
        raw = env.get(variable)
        if raw:
            layer.put(name, raw, variable)
    return layer


def pick(name: str, layers: Sequence[Layer]) -> tuple[object, str] | None:
    """The raw value of `name` from the highest of `layers` (lowest first) that sets it, and
    where it came from; None when no layer sets it."""
    for layer in reversed(layers):
        if name in layer.values:
            return layer.values[name], layer.where(name)
    return None


def parse_setting(where: str, raw: object, parse: Callable[[object], T]) -> T:
    """`parse(raw)`; its ValueError becomes ConfigError prefixed with `where`."""
    try:
        return parse(raw)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def resolve(name: str, parse: Callable[[object], T], layers: Sequence[Layer]) -> T | None:
    """Parse `name` from the highest of `layers` that sets it; None when none does or that
    layer sets it to null. Raises ConfigError naming the source."""
    found = pick(name, layers)
    if found is None or found[0] is None:
        return None
    raw, where = found
    return parse_setting(where, raw, parse)


def read_yaml(path: str, what: str) -> object:
    """The YAML document in `path` (None when empty). Raises ConfigError naming `what` (the
    flag or kind of file), the path and the line of a syntax error."""
    try:
        with open(path, encoding="utf-8") as stream:
            return yaml.safe_load(stream)
    except OSError as error:
        raise ConfigError(f"{what} {path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{what} {path}: not UTF-8 text: {error.reason}") from None
    except yaml.YAMLError as error:
        where = ""
        mark = getattr(error, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{what} {path}: not valid YAML{where}: {problem}") from None


def add_bool_flag(
    parser: argparse.ArgumentParser, *flags: str, help: str, default: str | None = None
) -> None:
    """A boolean flag as Go's flag packages take it: `--x` alone is true, `--x=false` sets it.
    `--x false` is taken as well (Go would read the `false` as a positional argument; the
    daemons take none). The value stays text until `values.parse_bool` reads it, so that a
    flag, its variable and a file are parsed by one grammar."""
    parser.add_argument(
        *flags,
        dest=flag_dest(flags[0]),
        nargs="?",
        const="true",
        default=default,
        metavar="true|false",
        help=help,
    )
