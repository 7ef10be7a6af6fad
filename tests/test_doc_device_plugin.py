"""docs/device-plugin.md's "anywhere, without a GPU" lines, run as written through bash (in a
scratch directory, with that directory as HOME for `~/.kube/config`): against the API server
double and the test kubelet, every fake GPU is registered healthy, kubelet is offered every
slot healthy, and the metrics listen on 127.0.0.1 only.

Substituted before running: the socket directory `/tmp/dp` (a fresh short one), the metrics
port (a free one, so runs side by side do not collide), and `python` / `hami` (this checkout's,
in this interpreter)."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hami_plugin.protocol import codec
from hami_plugin.protocol.model import ANNOTATION_NODE_REGISTER
from hami_plugin.testing.apiserver import FakeApiServer
from hami_plugin.testing.kubelet import FakeKubelet
from tests.processes import REPO, wait_until

DOC = REPO / "docs" / "device-plugin.md"
NODE = "node-1"
GPUS = [
    {"uuid": "GPU-03f69c50-207a-2038-9b45-23cac89cb67a", "name": "NVIDIA A100-SXM4-80GB"},
    {"uuid": "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae", "name": "Tesla T4", "memory_mib": 15360},
]


def documented_lines() -> list[str]:
    """The commands after the "anywhere, without a GPU" comment, continuations joined."""
    block = re.search(r"^```sh\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)
    assert block is not None
    comment_on = block.group(1).split("# anywhere, without a GPU", 1)[1]
    text = comment_on.split("\n", 1)[1].replace("\\\n", " ")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def sock_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="hami-doc-", dir="/tmp") as path:
        yield path


def registered_health(apiserver: FakeApiServer) -> list[bool]:
    node = apiserver.get_node(NODE) or {}
    value = (node.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_NODE_REGISTER)
    return [] if value is None else [d.healthy for d in codec.decode_node_devices(value)]


def test_the_gpu_less_example_gives_healthy_gpus_and_local_metrics(
    tmp_path: Path, sock_dir: str
) -> None:
    lines = documented_lines()
    assert [shlex.split(line)[0] for line in lines] == ["python", "hami"]
    assert "--metrics-bind-address 127.0.0.1:9394" in lines[1], "metrics on this machine only"
    port = free_port()
    script = "\n".join(
        re.sub(r"^python ", '"$PY" ', re.sub(r"^hami ", 'exec "$PY" -m hami_plugin ', line))
        .replace("/tmp/dp", sock_dir)
        .replace("127.0.0.1:9394", f"127.0.0.1:{port}")
        for line in lines
    )
    (tmp_path / "gpus.yaml").write_text(yaml.safe_dump({"gpus": GPUS}))
    env = {
        "HOME": str(tmp_path),
        "PY": sys.executable,
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
    }
    with FakeApiServer() as apiserver, FakeKubelet(sock_dir) as kubelet:
        apiserver.add_node(NODE)
        (tmp_path / ".kube").mkdir()
        apiserver.write_kubeconfig(tmp_path / ".kube" / "config")
        log = (tmp_path / "device-plugin.log").open("w")
        process = subprocess.Popen(
            ["bash", "-c", script], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_until(
                lambda: registered_health(apiserver) == [True, True] or process.poll() is not None,
                "every GPU registered healthy",
                timeout=60.0,
            )
            assert process.poll() is None, (tmp_path / "device-plugin.log").read_text()
            states = kubelet.wait_for_list(
                lambda s: bool(s) and all(d.health == "Healthy" for d in s)
            )
            assert len(states) >= len(GPUS)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                assert b"hami_host_gpu" in reply.read()
            # 127.0.0.1 only: the port is not open on the machine's other addresses
            with socket.socket() as other:
                other.settimeout(2)
                outside = socket.gethostbyname(socket.gethostname())
                if not outside.startswith("127."):
                    assert other.connect_ex((outside, port)) != 0
        finally:
            process.terminate()
            process.wait(timeout=40)
            log.close()
    assert (Path(sock_dir) / "hook" / "vgpu" / "ld.so.preload").is_file()
