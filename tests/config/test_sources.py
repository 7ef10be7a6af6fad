"""Layers: the highest source that sets a value wins, and errors name that source."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hami_plugin.config import (
    ConfigError,
    Layer,
    add_bool_flag,
    env_layer,
    flag_layer,
    parse_int,
    pick,
    read_yaml,
    resolve,
)


def test_the_highest_layer_that_sets_a_value_wins() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split-count", default=None)
    file = Layer("config file f.yaml", {"split_count": 2, "cores": 30}, {"split_count": "n.split"})
    env = env_layer({"SPLIT": "3", "CORES": ""}, {"split_count": "SPLIT", "cores": "CORES"})
    flags = flag_layer(parser.parse_args([]), {"split_count": "--split-count"})
    assert resolve("split_count", parse_int, [file, env, flags]) == 3
    assert resolve("cores", parse_int, [file, env, flags]) == 30  # an empty variable is unset
    assert resolve("memory", parse_int, [file, env, flags]) is None
    given = flag_layer(parser.parse_args(["--split-count", "4"]), {"split_count": "--split-count"})
    assert pick("split_count", [file, env, given]) == ("4", "--split-count")


def test_a_bad_value_names_its_flag_variable_or_file_key() -> None:
    file = Layer("config file f.yaml", {"split_count": "many"}, {"split_count": "nvidia.split"})
    with pytest.raises(ConfigError, match=r"^config file f\.yaml: nvidia\.split: expected an"):
        resolve("split_count", parse_int, [file])
    env = env_layer({"SPLIT": "x"}, {"split_count": "SPLIT"})
    with pytest.raises(ConfigError, match=r"^SPLIT: expected an integer, got 'x'$"):
        resolve("split_count", parse_int, [file, env])


def test_a_bool_flag_alone_is_true_and_keeps_its_text() -> None:
    parser = argparse.ArgumentParser()
    add_bool_flag(parser, "--leader-elect", default="false", help="elect")
    assert parser.parse_args([]).leader_elect == "false"
    assert parser.parse_args(["--leader-elect"]).leader_elect == "true"
    assert parser.parse_args(["--leader-elect=F"]).leader_elect == "F"


def test_read_yaml_names_the_file_and_the_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1\n", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"--device-config-file .*broken\.yaml: not valid YAML at"
    ):
        read_yaml(str(broken), "--device-config-file")
    with pytest.raises(ConfigError, match=r"config file .*missing\.yaml: cannot read"):
        read_yaml(str(tmp_path / "missing.yaml"), "config file")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        read_yaml(str(binary), "config file")
