"""The chart's `devicePlugin.migStrategy` (HAMi's value, charts/hami/values.yaml:388) reaches the
device plugin as its `--mig-strategy` (static MIG, docs/device-plugin.md "Static MIG")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deployment.exercise import device_plugin_settings
from tests.deployment.manifests import helm_template


def test_the_default_is_none(tmp_path: Path) -> None:
    assert device_plugin_settings(helm_template(), tmp_path, "node-a").mig_strategy == "none"


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_a_mig_strategy_reaches_the_device_plugin(tmp_path: Path, strategy: str) -> None:
    objects = helm_template(f"devicePlugin.migStrategy={strategy}")
    assert device_plugin_settings(objects, tmp_path, "node-a").mig_strategy == strategy
