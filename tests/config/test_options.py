"""The option table: one declaration per setting, built into argparse and resolved once with
flag > environment > file > default."""

from __future__ import annotations

import argparse

import pytest

from hami_plugin.config import ConfigError, Layer, parse_bool, parse_int, parse_str
from hami_plugin.config.options import Option, OptionTable

TABLE = OptionTable(
    (
        Option("split_count", ("--split-count",), parse_int, env="SPLIT", default="10",
               metavar="N", hami_key="deviceSplitCount", help="slots per GPU"),
        Option("verbosity", ("-v", "--v"), parse_int, metavar="N", help="klog verbosity"),
        Option("debug", ("--debug",), parse_bool, default="false", help="debug logging"),
        Option("qps", ("--qps",), parse_int, flag_type=int, help="calls a second"),
        Option("level", ("--level",), parse_str, choices=("info", "debug"), help="log level"),
        Option("pod", (), parse_str, env="POD_NAME", node_key="podname"),
    ),
    env_in_help=True,
)  # fmt: skip


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="t")
    TABLE.add_to(built)
    return built


def test_flags_default_to_not_given_and_say_their_variable() -> None:
    args = parser().parse_args([])
    assert (args.split_count, args.v, args.debug, args.qps, args.level) == (None,) * 5
    assert "slots per GPU [env SPLIT]" in parser().format_help()
    assert parser().parse_args(["--debug"]).debug == "true"  # a Go boolean flag
    assert parser().parse_args(["-v", "3"]).v == "3"


def test_argparse_checks_the_types_and_choices_it_was_given() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--qps", "fast"])
    with pytest.raises(SystemExit):
        parser().parse_args(["--level", "loud"])


def test_flag_beats_environment_beats_file_beats_default() -> None:
    file = Layer("config file f.yaml", {"split_count": 3}, {"split_count": "nvidia.split"})
    env = {"SPLIT": "4", "POD_NAME": "p-0"}
    given = parser().parse_args(["--split-count", "5", "--v=2"])
    none = parser().parse_args([])
    defaults = TABLE.defaults()
    assert TABLE.resolve([defaults])["split_count"] == 10
    assert TABLE.resolve([defaults, file])["split_count"] == 3
    assert TABLE.resolve([defaults, file, TABLE.environment(env)])["split_count"] == 4
    values = TABLE.resolve([defaults, file, TABLE.environment(env), TABLE.flags(given)])
    assert values == {"split_count": 5, "verbosity": 2, "debug": False, "pod": "p-0"}
    assert TABLE.resolve_args(none, {}) == {"split_count": 10, "debug": False}


def test_a_bad_value_names_its_flag_or_variable() -> None:
    with pytest.raises(ConfigError, match=r"^-v: expected an integer, got 'x'$"):
        TABLE.resolve_args(parser().parse_args(["--v", "x"]), {})
    with pytest.raises(ConfigError, match=r"^SPLIT: expected an integer, got 'many'$"):
        TABLE.resolve_args(parser().parse_args([]), {"SPLIT": "many"})


def test_hamis_file_keys_come_from_the_table() -> None:
    assert TABLE.hami_keys() == {"deviceSplitCount": "split_count"}
    assert TABLE.node_keys() == {"podname": "pod"}
