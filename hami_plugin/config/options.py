"""A command's settings as one declarative table: each `Option` says how a user gives one
setting (its flags, its environment variable, HAMi's config-file keys), its grammar, its
default and its help line. `OptionTable` builds the table into argparse and resolves it once:
flag > environment > file > default, each value parsed by its grammar, a bad one a
ConfigError naming the flag, the variable or the file and key it came from (`sources`).

The environment is read here, and nowhere else in the package: `OptionTable.environment` with
no mapping given reads the process's.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_plugin.config.sources import Layer, add_bool_flag, env_layer, flag_dest, flag_layer
from hami_plugin.config.sources import resolve as resolve_one
from hami_plugin.config.values import parse_bool

__all__ = ["Option", "OptionTable"]


@dataclass(frozen=True, slots=True)
class Option:
    """One setting, as the user gives it.

    `name` is the setting it fills. `flags` set it on the command line (the first names it in
    messages; none: the environment or a file only); a `parse_bool` setting is a Go boolean
    flag (`--x` alone is true). `env` is its environment variable. `default` is the raw value
    used when no source sets it, parsed by `parse` like a given one (None: the setting is
    unset, and the settings' own default applies). `flag_type` and `choices` are checked by
    argparse itself, before `parse` (argparse's own message and exit status 2). `hami_key` is
    its key in the `nvidia:` section of HAMi's device config, `node_key` in a HAMi
    `nodeconfig` entry.
    """

    name: str
    flags: tuple[str, ...]
    parse: Callable[[object], Any]
    help: str = ""
    env: str = ""
    default: object = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    flag_type: Callable[[str], Any] | None = None
    hami_key: str = ""
    node_key: str = ""


@dataclass(frozen=True, slots=True)
class OptionTable:
    """Every setting of one command, in the order `--help` lists them.

    `env_in_help` ends each help line with `[env VARIABLE]`.
    """

    options: tuple[Option, ...]
    env_in_help: bool = False

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add a flag per option that has flags. Every flag defaults to None (not given), so
        that the environment, files and defaults below it can apply."""
        for option in self.options:
            if not option.flags:
                continue
            help_text = option.help
            if self.env_in_help and option.env:
                help_text = f"{help_text} [env {option.env}]"
            if option.parse is parse_bool:
                add_bool_flag(parser, *option.flags, help=help_text)
                continue
            extra: dict[str, Any] = {}
            if option.flag_type is not None:
                extra["type"] = option.flag_type
            if option.choices is not None:
                extra["choices"] = option.choices
            parser.add_argument(
                *option.flags,
                dest=flag_dest(option.flags[0]),
                default=None,
                metavar=option.metavar,
                help=help_text,
                **extra,
            )

    def name_of(self, setting: str) -> str:
        """How a message names `setting` to the user: its first flag, else its environment
        variable, else its key in HAMi's node config; the setting's own name when the table
        does not hold it."""
        for option in self.options:
            if option.name == setting:
                return option.flags[0] if option.flags else option.env or option.node_key or setting
        return setting

    def flags(self, args: argparse.Namespace) -> Layer:
        """The flags given on the command line `args` was parsed from (`add_to`'s parser)."""
        return flag_layer(
            args, {option.name: option.flags[0] for option in self.options if option.flags}
        )

    def environment(self, env: Mapping[str, str] | None = None) -> Layer:
        """The options' variables set in `env` (the process's environment when None); an empty
        variable counts as unset."""
        variables = {option.name: option.env for option in self.options if option.env}
        return env_layer(os.environ if env is None else env, variables)

    def defaults(self) -> Layer:
        """The options' defaults, the lowest layer."""
        layer = Layer()
        for option in self.options:
            if option.default is not None:
                layer.put(option.name, option.default, option.name)
        return layer

    def hami_keys(self) -> dict[str, str]:
        """HAMi's device config `nvidia:` key -> the setting it sets."""
        return {option.hami_key: option.name for option in self.options if option.hami_key}

    def node_keys(self) -> dict[str, str]:
        """HAMi's `nodeconfig` entry key -> the setting it overrides."""
        return {option.node_key: option.name for option in self.options if option.node_key}

    def resolve(self, layers: Sequence[Layer]) -> dict[str, Any]:
        """Every option that one of `layers` (lowest first) sets to a value, parsed from the
        highest that sets it, in table order. Raises ConfigError naming the source."""
        values: dict[str, Any] = {}
        for option in self.options:
            value = resolve_one(option.name, option.parse, layers)
            if value is not None:
                values[option.name] = value
        return values

    def resolve_args(
        self, args: argparse.Namespace, env: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """`resolve` over the defaults, the environment (`env`, else the process's) and the
        flags of `args`: for a command that reads no file."""
        return self.resolve([self.defaults(), self.environment(env), self.flags(args)])
