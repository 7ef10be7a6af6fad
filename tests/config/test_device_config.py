"""HAMi's device config, read one way by both daemons: the `nvidia:` keys as HAMi's yaml.v2
matches them (exactly, case included), other keys and vendors left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_plugin.cli import build_parser
from hami_plugin.config import ConfigError
from hami_plugin.config.device_config import read_device_config
from hami_plugin.deviceplugin.settings import resolve_settings
from hami_plugin.extender.settings import resolve_config

CONFIG = """\
nvidia:
  resourceCountName: example.com/gpu
  deviceSplitCount: 4
  defaultMemory: 2000
  DefaultCores: 30
  devicememoryscaling: 2
  somethingElse: 1
cambricon:
  resourceCountName: cambricon.com/vmlu
"""


def test_both_daemons_read_the_same_keys_of_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    parser = build_parser()
    plugin = resolve_settings(
        parser.parse_args(["device-plugin", "--node-name", "n", "--config-file", str(path)]), {}
    )
    scheduler = resolve_config(
        parser.parse_args(["scheduler", "--device-config-file", str(path)]), {}
    )
    assert plugin.resource_name == scheduler.settings.resources.count == "example.com/gpu"
    assert plugin.split_count == 4
    assert scheduler.settings.default_memory_mib == 2000
    # spelled otherwise than HAMi's tags: ignored by both, as HAMi ignores them
    assert scheduler.settings.default_cores == 0
    assert plugin.memory_scaling == 1.0


def test_the_reader_keeps_hamis_keys_only(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text(CONFIG + "  resourceCoreName: ~\n", encoding="utf-8")
    config = read_device_config(str(path), "config file")
    assert config.label == f"config file {path}"
    assert dict(config.nvidia) == {
        "resourceCountName": "example.com/gpu",
        "deviceSplitCount": 4,
        "defaultMemory": 2000,
    }
    assert set(config.document) == {"nvidia", "cambricon"}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("- a\n", "expected a mapping at the top level"),
        ("nvidia: []\n", "'nvidia' must be a mapping"),
        ("nvidia: [1\n", "not valid YAML at line 2"),
    ],
)
def test_a_file_that_is_no_device_config_says_why(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_device_config(str(path), "--device-config-file")
    assert str(caught.value).startswith(f"--device-config-file {path}: ")
    assert problem in str(caught.value)


def test_an_empty_file_sets_nothing(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text("", encoding="utf-8")
    config = read_device_config(str(path), "config file")
    assert (dict(config.document), dict(config.nvidia)) == ({}, {})
