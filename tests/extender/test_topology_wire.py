"""The `topology-aware` policy over the wire: a 4-GPU PCIe node (NVLink bridges 0-1 and 2-3)
whose `hami.io/node-nvidia-score` was measured through the fake NVML preset, `/filter` and
`/bind` over HTTP, and the GPUs the pod is given (HAMi v2.10 device.go Fit, lines 851-868)."""

from __future__ import annotations

from pathlib import Path

from hami_plugin.deviceplugin.topology import measure_links
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import ANNOTATION_DEVICES_TO_ALLOCATE, ANNOTATION_NODE_LOCK
from hami_plugin.protocol.topology import (
    NODE_NVIDIA_SCORE_ANNOTATION,
    DeviceScore,
    calculate_gpu_scores,
    encode_pair_scores,
)
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.fakenvml.nvml import FakeNvml
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import wait_until

POLICY = "hami.io/gpu-scheduler-policy"


def measured_scores(tmp_path: Path, node: str) -> str:
    """The preset's scores, measured through the fake NVML, renamed to the node's GPU UUIDs."""
    nvml_uuids = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(4)]
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "gpus:\n"
        + "".join(f"  - uuid: {u}\n" for u in nvml_uuids)
        + "topology:\n  preset: pcie-4-nvlink-bridges\n"
    )
    nvml = FakeNvml(str(path))
    nvml.nvmlInit()
    scores, _ = calculate_gpu_scores(measure_links(nvml, nvml_uuids))
    rename = {u: f"GPU-{node}-{i}" for i, u in enumerate(nvml_uuids)}
    return encode_pair_scores(
        [DeviceScore(rename[s.uuid], {rename[p]: v for p, v in s.scores.items()}) for s in scores]
    )


def booked(apiserver: FakeApiServer, name: str) -> str | None:
    pod = apiserver.get_pod("default", name)
    assert pod is not None
    value = pod["metadata"].get("annotations", {}).get(ANNOTATION_DEVICES_TO_ALLOCATE)
    return None if value is None else str(value)


def given_gpus(apiserver: FakeApiServer, name: str) -> set[str]:
    """The GPUs `/bind` booked on the pod (the patch may trail the answer)."""
    wait_until(lambda: booked(apiserver, name) is not None, what=f"{name}'s booking")
    value = booked(apiserver, name)
    assert value is not None
    return {d.uuid for entry in codec.decode_pod_devices(value) for d in entry}


def test_a_two_gpu_pod_gets_a_bridged_pair(apiserver: FakeApiServer, tmp_path: Path) -> None:
    for name in ("n1", "n2"):
        scores = {NODE_NVIDIA_SCORE_ANNOTATION: measured_scores(tmp_path, name)}
        apiserver.add_object(gpu_node(name, 4, annotations=scores))
    aware = {POLICY: "binpack,topology-aware"}
    first = apiserver.add_object(gpu_pod("one", gpus=1, annotations=aware))
    pair = apiserver.add_object(gpu_pod("pair", gpus=2, annotations=aware))
    whole = apiserver.add_object(gpu_pod("four", gpus=4, annotations=aware))
    bridged = ({"GPU-n1-0", "GPU-n1-1"}, {"GPU-n1-2", "GPU-n1-3"})
    with running_scheduler(apiserver) as scheduler:
        assert scheduler.schedule(first, ["n1"]) == "n1"
        (taken,) = given_gpus(apiserver, "one")
        # as the device plugin would after Allocate: release the node lock "one" holds
        apiserver.update_object(
            "nodes", "", "n1", lambda n: n["metadata"]["annotations"].pop(ANNOTATION_NODE_LOCK)
        )
        assert scheduler.schedule(pair, ["n1"]) == "n1"
        got = given_gpus(apiserver, "pair")
        assert got in bridged
        assert taken in got  # binpack walks the busy GPU first; its bridge partner joins it
        assert scheduler.schedule(whole, ["n2"]) == "n2"
        assert given_gpus(apiserver, "four") == {f"GPU-n2-{i}" for i in range(4)}
