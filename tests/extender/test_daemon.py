"""`hami scheduler` as a command: SIGTERM of a real subprocess (its flags and configuration:
`test_settings.py`)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK, ANNOTATION_VGPU_NODE
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.helpers import gpu_node, gpu_pod
from tests.processes import LoggedProcess, wait_until

HAMI = str(Path(sys.executable).with_name("hami"))


def _post(url: str, document: object, timeout: float = 60) -> dict[str, object]:
    request = urllib.request.Request(
        url, json.dumps(document).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result = json.loads(response.read())
    assert isinstance(result, dict)
    return result


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False


def test_sigterm_finishes_the_bind_in_progress_and_exits_0(
    apiserver: FakeApiServer, kubeconfig_path: Path, tmp_path: Path
) -> None:
    lock = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ},default,holder"
    apiserver.add_object(gpu_node("n1", 2, annotations={ANNOTATION_NODE_LOCK: lock}))
    apiserver.add_object(gpu_pod("holder"))
    pod = apiserver.add_object(gpu_pod("waiting"))
    process = LoggedProcess(
        "scheduler",
        [
            HAMI, "scheduler", "--kubeconfig", str(kubeconfig_path), "--http-bind",
            "127.0.0.1:0", "--metrics-bind-address", "0", "--node-lock-retry-timeout", "60s",
        ],
        tmp_path,
    )  # fmt: skip
    try:
        url = process.wait_for_log(r"serving on (http://\S+)", timeout=30).group(1)
        wait_until(lambda: _ready(url), timeout=30, what="readyz")
        assert _post(f"{url}/filter", {"Pod": pod, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
        answer: list[dict[str, object]] = []
        binder = threading.Thread(
            target=lambda: answer.append(
                _post(
                    f"{url}/bind",
                    {"PodName": "waiting", "PodNamespace": "default",
                     "PodUID": pod["metadata"]["uid"], "Node": "n1"},
                )
            )
        )  # fmt: skip
        binder.start()
        wait_until(
            lambda: len(apiserver.requests_matching("GET", "/api/v1/nodes/n1")) >= 1,
            what="the bind to find the lock held",
        )
        process.process.send_signal(signal.SIGTERM)
        binder.join(30)
        assert answer and "node lock contention" in str(answer[0]["Error"])
        assert process.wait(30) == 0
    finally:
        process.kill()  # only when something above failed: the exit status is kept
    log = process.log()
    assert "received SIGTERM" in log and "hami scheduler stopped" in log
    stored = apiserver.get_pod("default", "waiting")
    assert stored is not None
    assert ANNOTATION_VGPU_NODE not in stored["metadata"]["annotations"]
    node = apiserver.get_node("n1")
    assert node is not None and node["metadata"]["annotations"][ANNOTATION_NODE_LOCK] == lock
