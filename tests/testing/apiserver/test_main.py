"""`python -m hami_plugin.testing.apiserver`: the double in a process of its own, as the
extender benchmark runs it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import urllib3
import yaml

from hami_plugin.testing.apiserver import make_node
from tests.processes import LoggedProcess

COMMAND = [sys.executable, "-m", "hami_plugin.testing.apiserver"]


def test_serves_the_loaded_objects_until_sigterm(tmp_path: Path) -> None:
    load = tmp_path / "objects.json"
    load.write_text(json.dumps([make_node("gpu-1"), make_node("gpu-2")]), encoding="utf-8")
    kubeconfig = tmp_path / "kubeconfig"
    process = LoggedProcess(
        "apiserver",
        [*COMMAND, "--load", str(load), "--kubeconfig", str(kubeconfig)],
        tmp_path,
    )
    try:
        url = process.wait_for_log(r"serving on (http://127\.0\.0\.1:\d+)\n").group(1)
        response = urllib3.request("GET", url + "/api/v1/nodes", retries=False, timeout=5.0)
        names = [node["metadata"]["name"] for node in json.loads(response.data)["items"]]
        server = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))["clusters"][0]
    finally:
        status = process.stop()

    assert names == ["gpu-1", "gpu-2"]
    assert server["cluster"]["server"] == url
    assert status == 0


def test_an_unusable_load_file_exits_2(tmp_path: Path) -> None:
    load = tmp_path / "objects.json"
    load.write_text("[1]", encoding="utf-8")

    process = LoggedProcess("apiserver", [*COMMAND, "--load", str(load)], tmp_path)

    assert process.wait() == 2
    assert "cannot load" in process.log()
