"""`hami device-plugin`'s choice of NVML module: pynvml for `--nvml nvml`, the fake for `fake`."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.testing.fakenvml.nvml import FakeNvml


def test_load_nvml_module_kinds(tmp_path: Path) -> None:
    assert isinstance(load_nvml_module("fake", str(tmp_path / "g.yaml")), FakeNvml)
    assert load_nvml_module("nvml", None).__name__ == "pynvml"
    with pytest.raises(ValueError, match="needs --fake-gpus"):
        load_nvml_module("fake", None)
    with pytest.raises(ValueError, match="unknown NVML backend 'cuda'"):
        load_nvml_module("cuda", None)
