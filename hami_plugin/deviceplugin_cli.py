"""`hami device-plugin` on the command line: the node daemon with the NVML module `--nvml` names.

The device plugin holds only what runs on a GPU node; the fake NVML is a test double
(`hami_plugin.testing.fakenvml`, a floor above the daemons), so the entry point chooses:
pynvml for `--nvml nvml`, the fake for `--nvml fake --fake-gpus FILE`.
"""

from __future__ import annotations

import argparse
from typing import Any

from hami_plugin.deviceplugin import command


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `hami device-plugin`."""
    command.register(subparsers, load_nvml_module)


def load_nvml_module(kind: str, fake_gpus_path: str | None) -> Any:
    """The NVML module to use: `pynvml` for "nvml", a `FakeNvml` for "fake".

    Raises NvmlUnavailable when pynvml is not installed, ValueError for an unknown kind or a
    fake without a file.
    """
    if kind == "nvml":
        from hami_plugin.deviceplugin.nvml import load_pynvml

        return load_pynvml()
    if kind == "fake":
        if not fake_gpus_path:
            raise ValueError("--nvml fake needs --fake-gpus FILE")
        from hami_plugin.testing.fakenvml.nvml import FakeNvml

        return FakeNvml(fake_gpus_path)
    raise ValueError(f"unknown NVML backend {kind!r} (expected nvml or fake)")
