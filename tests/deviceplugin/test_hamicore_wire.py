"""A node without HAMi-core, over real wires: the daemon with the fake NVML, the test kubelet,
the API server double and `/metrics`; then HAMi-core arrives (as a late postStart or a manual
install would bring it) and the node serves again."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from hami_plugin.deviceplugin.hamicore import HAMI_CORE_VERSION
from hami_plugin.protocol.model import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_LOCK,
    ContainerDevice,
)
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.hamicore import install_fake_hamicore
from tests.deviceplugin.test_daemon import (
    GPU_0,
    GPU_1,
    NODE,
    bind_as_the_scheduler_would,
    healthy_ids,
    registered_health,
)
from tests.deviceplugin.test_metrics_daemon import (
    SPLIT,
    RunningPlugin,
    running_device_plugin,
    scrape,
    value,
)
from tests.processes import wait_until

READY = "hami_device_plugin_hamicore_ready"


def ready_metric(plugin: RunningPlugin) -> float | None:
    return value(scrape(plugin.url), READY, node=NODE)


def test_a_node_without_hami_core_serves_no_vgpu_until_it_is_installed(
    tmp_path: Path, apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    with running_device_plugin(tmp_path, apiserver, hamicore=False) as plugin:
        kubelet, library = plugin.kubelet, f"{plugin.hook}/vgpu/libvgpu.so"
        # The scheduler is told (every GPU unhealthy), /metrics says why; kubelet keeps
        # NVML's health, so a pod bound meanwhile gets our message rather than kubelet's.
        wait_until(lambda: registered_health(apiserver) == [False, False], timeout=30.0)
        assert ready_metric(plugin) == 0
        kubelet.wait_for_list(lambda states: len(healthy_ids(states)) == 2 * SPLIT)
        warnings = [r.getMessage() for r in caplog.records if "HAMi-core" in r.getMessage()]
        assert len(warnings) == 1, warnings  # one line, not one per Allocate or round

        bind_as_the_scheduler_would(
            apiserver, "early", ((ContainerDevice(GPU_0, "NVIDIA", 1000, 10),),)
        )
        with pytest.raises(grpc.RpcError) as caught:
            kubelet.allocate([f"{GPU_0}-0"])
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        expected = (
            f"node {NODE}: HAMi-core is not installed: {library} is missing (nor is "
            f"libvgpu.so.{HAMI_CORE_VERSION} there); it is put there by the DaemonSet's "
            "hami-core initContainer (projecthami/hami vgpu-init.sh) or a pre-installed HAMi-core"
        )
        assert caught.value.details() == f"pod default/early: {expected}"
        early = apiserver.get_pod("default", "early")
        assert early is not None
        assert early["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "failed"
        (event,) = apiserver.events("default")
        assert (event["reason"], event["type"]) == ("AllocateFailed", "Warning")
        assert expected in event["message"]
        node = apiserver.get_node(NODE)
        assert node is not None and ANNOTATION_NODE_LOCK not in node["metadata"]["annotations"]

        install_fake_hamicore(plugin.hook, version=HAMI_CORE_VERSION)
        # The next register round looks again (every 0.3 s here): healthy, and ready.
        wait_until(lambda: registered_health(apiserver) == [True, True], timeout=30.0)
        assert ready_metric(plugin) == 1
        bind_as_the_scheduler_would(
            apiserver, "later", ((ContainerDevice(GPU_1, "NVIDIA", 1000, 10),),)
        )
        answer = kubelet.allocate([f"{GPU_1}-0"]).container_responses[0]
        mounts = {m.container_path: m.host_path for m in answer.mounts}
        assert mounts[library] == f"{library}.{HAMI_CORE_VERSION}"
        assert mounts["/etc/ld.so.preload"] == f"{plugin.hook}/vgpu/ld.so.preload"
        later = apiserver.get_pod("default", "later")
        assert later is not None
        assert later["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == "success"


def test_a_preload_that_goes_missing_stops_the_node_again(
    tmp_path: Path, apiserver: FakeApiServer
) -> None:
    with running_device_plugin(tmp_path, apiserver) as plugin:
        wait_until(lambda: registered_health(apiserver) == [True, True], timeout=30.0)
        assert ready_metric(plugin) == 1
        (plugin.hook / "vgpu" / "ld.so.preload").unlink()
        wait_until(lambda: registered_health(apiserver) == [False, False], timeout=30.0)
        assert ready_metric(plugin) == 0
        bind_as_the_scheduler_would(
            apiserver, "unlimited", ((ContainerDevice(GPU_0, "NVIDIA", 1000, 10),),)
        )
        with pytest.raises(grpc.RpcError) as caught:
            plugin.kubelet.allocate([f"{GPU_0}-0"])
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert f"{plugin.hook}/vgpu/ld.so.preload is missing" in caught.value.details()
