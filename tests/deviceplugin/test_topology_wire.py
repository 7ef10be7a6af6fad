"""The daemon on the fake NVML HGX preset publishes `hami.io/node-nvidia-score` (API double).

HAMi v2.10 `register.go:279-300`: with ENABLE_TOPOLOGY_SCORE the scores go out with the register
annotation; without it the node carries no score annotation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hami_plugin.deviceplugin.daemon import DevicePluginDaemon
from hami_plugin.deviceplugin.settings import DevicePluginSettings, NvmlSource
from hami_plugin.deviceplugin_cli import load_nvml_module
from hami_plugin.kube.client import KubeClient
from hami_plugin.protocol.inflight import ANNOTATION_ALLOCATE_PROTOCOL
from hami_plugin.protocol.topology import NODE_NVIDIA_SCORE_ANNOTATION
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from tests.deviceplugin.daemons import serving
from tests.processes import wait_until

NODE = "hgx-node-1"
UUIDS = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(8)]


def node_annotations(apiserver: FakeApiServer) -> dict[str, str]:
    node = apiserver.get_node(NODE)
    assert node is not None
    return dict(node["metadata"]["annotations"])


@pytest.mark.parametrize("enabled", [True, False])
def test_hgx_node_publishes_pair_scores(
    enabled: bool, sock_dir: str, tmp_path: Path, apiserver: FakeApiServer, kube: KubeClient
) -> None:
    apiserver.add_node(NODE)
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(
        "gpus:\n"
        + "".join(f"  - {{uuid: {u}, numa_node: {i // 4}}}\n" for i, u in enumerate(UUIDS))
        + "topology:\n  preset: hgx-8-nvswitch\n"
    )
    hook = str(tmp_path / "hook")
    install_fake_hamicore(hook)
    settings = DevicePluginSettings(
        metrics_bind_address="0",
        node_name=NODE,
        device_plugin_path=sock_dir,
        nvml=NvmlSource.FAKE,
        fake_gpus=str(gpus),
        hook_path=hook,
        register_interval_seconds=0.3,
        enable_topology_score=enabled,
    )
    daemon = DevicePluginDaemon(
        settings, load_nvml=load_nvml_module, kube=kube, vgpulock_path=str(tmp_path / "vgpulock")
    )
    with serving(daemon, sock_dir):
        wait_until(
            lambda: ANNOTATION_ALLOCATE_PROTOCOL in node_annotations(apiserver), timeout=30.0
        )
        value = node_annotations(apiserver).get(NODE_NVIDIA_SCORE_ANNOTATION)
    if not enabled:
        assert value is None
        return
    assert value is not None
    scores = json.loads(value)
    assert [entry["uuid"] for entry in scores] == UUIDS
    assert scores[0]["score"] == {
        **{u: 1820 for u in UUIDS[1:4]},
        **{u: 1810 for u in UUIDS[4:]},
    }
    assert value.startswith(f'[{{"uuid":"{UUIDS[0]}","score":{{"{UUIDS[1]}":1820,')
