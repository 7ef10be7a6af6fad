"""The Grafana dashboard ships with both installs: the ConfigMap `hami-grafana-dashboard`,
labelled `grafana_dashboard: "1"` for Grafana's dashboard sidecar, holding the one dashboard
file, from `kubectl kustomize daemonset/` and from the chart (`grafanaDashboard.enabled`)."""

from __future__ import annotations

import json

from tests.deployment.manifests import (
    CHART,
    NAMESPACE,
    Obj,
    helm_template,
    helm_template_error,
    kustomize,
    named,
    of_kind,
)

DASHBOARD = CHART / "files" / "hami-gpu-dashboard.json"
NAME = "hami-grafana-dashboard"


def config_maps(objects: list[Obj]) -> list[str]:
    return [str(o["metadata"]["name"]) for o in of_kind(objects, "ConfigMap")]


def test_kustomize_and_the_chart_ship_the_same_dashboard() -> None:
    from_kustomize = named(kustomize(), "ConfigMap", NAME)
    from_chart = named(helm_template(), "ConfigMap", NAME)
    for config_map in (from_kustomize, from_chart):
        assert config_map["metadata"]["namespace"] == NAMESPACE
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert set(config_map["data"]) == {"hami-gpu-dashboard.json"}
        # the file itself, byte for byte, and a dashboard Grafana reads
        assert config_map["data"]["hami-gpu-dashboard.json"] == DASHBOARD.read_text()
        assert json.loads(config_map["data"]["hami-gpu-dashboard.json"])["panels"]


def test_the_charts_dashboard_is_a_value() -> None:
    assert NAME not in config_maps(helm_template("grafanaDashboard.enabled=false"))
    moved = named(
        helm_template(
            "grafanaDashboard.namespace=monitoring", "grafanaDashboard.labels.release=kps"
        ),
        "ConfigMap",
        NAME,
    )
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["labels"]["release"] == "kps"
    assert moved["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "grafanaDashboard.enabled" in helm_template_error("grafanaDashboard.enabled=yes")
