"""The chart's `devicePlugin.migStrategy` (HAMi's value, charts/hami/values.yaml:388) reaches the
device plugin as its `--mig-strategy` (static MIG, docs/device-plugin.md "Static MIG")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deployment.exercise import device_plugin_settings
from tests.deployment.manifests import container, helm_template, plain_manifests, workload_running


def test_the_default_is_none(tmp_path: Path) -> None:
    assert device_plugin_settings(helm_template(), tmp_path, "node-a").mig_strategy == "none"


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_a_mig_strategy_reaches_the_device_plugin(tmp_path: Path, strategy: str) -> None:
    objects = helm_template(f"devicePlugin.migStrategy={strategy}")
    assert device_plugin_settings(objects, tmp_path, "node-a").mig_strategy == strategy


def _hami_allowlist() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """HAMi v2.10's chart list (charts/hami/templates/scheduler/device-configmap.yaml:35-53)."""
    return [
        (("A30",), ("1g.6gb", "2g.12gb", "4g.24gb")),
        (
            ("A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"),
            ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"),
        ),
        (
            ("A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"),
            ("1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"),
        ),
        (("H100-PCIE-80GB", "H100-SXM5-80GB"), ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")),
        (("H100-PCIE-94GB", "H100-SXM5-94GB"), ("1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb")),
        (("H20", "H100 on GH200"), ("1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb")),
        (("H200 NVL", "H200-SXM5"), ("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb")),
        (("B200",), ("1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb")),
        (("RTX PRO 6000 Blackwell Server Edition",), ("1g.24gb", "2g.48gb", "4g.96gb")),
    ]


@pytest.mark.parametrize("source", ["chart", "plain"])
def test_the_device_config_ships_hamis_mig_profile_allowlist(tmp_path: Path, source: str) -> None:
    objects = helm_template() if source == "chart" else plain_manifests()
    settings = device_plugin_settings(objects, tmp_path, "node-a")
    assert [
        (entry.models, entry.profiles) for entry in settings.mig_profile_allowlist
    ] == _hami_allowlist()


def test_the_device_plugin_runs_unprivileged_unless_dynamic_mig_asks_for_it() -> None:
    """MIG management (creating GPU instances) needs CAP_SYS_ADMIN and the MIG capability
    devices: `devicePlugin.securityContext` (HAMi's key) replaces our least-privilege default."""
    default = container(workload_running(helm_template(), "device-plugin"), "device-plugin")
    assert default["securityContext"]["privileged"] is False
    assert default["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["DAC_OVERRIDE"],
    }
    objects = helm_template("devicePlugin.securityContext.privileged=true")
    privileged = container(workload_running(objects, "device-plugin"), "device-plugin")
    assert privileged["securityContext"]["privileged"] is True
