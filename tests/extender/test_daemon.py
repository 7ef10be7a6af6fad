"""`hami scheduler` as a command: flags, configuration, and SIGTERM of a real subprocess."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hami_plugin.cli import build_parser
from hami_plugin.extender.settings import ConfigError, resolve_config
from hami_plugin.protocol.model import ANNOTATION_NODE_LOCK, ANNOTATION_VGPU_NODE
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.cluster import wait_until
from tests.extender.helpers import gpu_node, gpu_pod

HAMI = str(Path(sys.executable).with_name("hami"))


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["scheduler", *argv])


def test_defaults_are_hamis() -> None:
    config = resolve_config(parse(), {})
    assert (config.http_host, config.http_port) == ("127.0.0.1", 8080)
    assert config.scheduler_name == "hami-scheduler"
    assert config.settings.node_policy.value == "binpack"
    assert config.settings.gpu_policy.text == "spread"
    assert config.node_lock_timeout == timedelta(minutes=5)
    assert config.node_lock_retry_timeout_seconds == 28
    assert config.allocation_timeout_seconds == 120
    assert config.filter_booking_ttl_seconds == 30
    assert config.metrics_bind_address == ":9395"
    assert config.max_body_bytes == 1024 * 1024
    assert not config.leader_elect


def test_tls_moves_the_default_address_and_hamis_spellings_work(tmp_path: Path) -> None:
    config = resolve_config(parse("--cert_file", "c.pem", "--key_file", "k.pem"), {})
    assert (config.http_host, config.http_port) == ("0.0.0.0", 443)
    assert config.tls
    config = resolve_config(parse("--http_bind", "[::1]:9000"), {})
    assert (config.http_host, config.http_port) == ("::1", 9000)


def test_go_durations_and_the_lock_timeout_precedence() -> None:
    args = parse("--node-lock-retry-timeout", "1m30s", "--allocation-timeout", "90s")
    config = resolve_config(args, {"HAMI_NODELOCK_EXPIRE": "7m"})
    assert config.node_lock_retry_timeout_seconds == 90
    assert config.allocation_timeout_seconds == 90
    assert config.node_lock_timeout == timedelta(minutes=7)  # env, no flag
    flagged = resolve_config(parse("--node-lock-timeout", "1h"), {"HAMI_NODELOCK_EXPIRE": "7m"})
    assert flagged.node_lock_timeout == timedelta(hours=1)  # flag > env


def test_leader_election_timings() -> None:
    default = resolve_config(parse(), {})
    assert (
        default.leader_elect_lease_duration_seconds,
        default.leader_elect_renew_deadline_seconds,
        default.leader_elect_retry_period_seconds,
    ) == (15, 10.0, 2.0)  # client-go's and kube-scheduler's defaults
    fast = resolve_config(
        parse(
            "--leader-elect-lease-duration=4.5s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=500ms",
        ),
        {},
    )
    assert fast.leader_elect_lease_duration_seconds == 5  # a Lease holds whole seconds
    assert fast.leader_elect_renew_deadline_seconds == 3.0
    assert fast.leader_elect_retry_period_seconds == 0.5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--node-lock-timeout", "5"), "--node-lock-timeout: invalid duration"),
        (("--allocation-timeout=-1m",), "must be positive"),
        (("--http-bind", "8080"), "has no port"),
        (("--cert-file", "x"), "go together"),
        (("--node-scheduler-policy", "densest"), "unknown node scheduler policy"),
        (("--node-label-selector", "gpu"), "is not key=value"),
        (("--leader-elect-renew-deadline", "20s"), "must be greater than the renew deadline"),
        (("--leader-elect-retry-period", "9s"), "must be greater than retry period"),
        (("--leader-elect-lease-duration", "soon"), "--leader-elect-lease-duration"),
    ],
)
def test_bad_flags_are_one_clear_error(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_config(parse(*argv), {})


def test_device_config_file(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text(
        "nvidia:\n"
        "  resourceCountName: example.com/gpu\n"
        "  defaultMemory: 2000\n"
        "  defaultCores: 20\n"
        "  defaultGPUNum: 2\n"
        "  memoryFactor: 4\n"
        "  overwriteEnv: true\n"
        "  gpuCorePolicy: force\n"
        "  runtimeClassName: nvidia\n"
        "  deviceSplitCount: 10\n"
        "cambricon:\n"
        "  resourceCountName: cambricon.com/vmlu\n",
        encoding="utf-8",
    )
    config = resolve_config(parse("--device-config-file", str(path)), {})
    assert config.settings.resources.count == "example.com/gpu"
    assert config.settings.default_memory_mib == 2000
    assert config.settings.default_cores == 20
    assert config.settings.memory_factor == 4
    assert config.webhook.default_gpu_num == 2
    assert config.webhook.overwrite_env
    assert config.webhook.gpu_core_policy.value == "force"
    assert config.webhook.runtime_class_name == "nvidia"
    assert config.webhook.resources.count == "example.com/gpu"
    path.write_text("nvidia:\n  defaultMemory: lots\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"nvidia\.defaultMemory must be an integer"):
        resolve_config(parse("--device-config-file", str(path)), {})


def test_every_flag_has_a_help_line() -> None:
    parser = build_parser()
    actions = parser._subparsers._group_actions[0].choices["scheduler"]._actions  # type: ignore[union-attr]
    for action in actions:
        assert action.help, action.option_strings


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
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    lock = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ},default,holder"
    apiserver.add_object(gpu_node("n1", 2, annotations={ANNOTATION_NODE_LOCK: lock}))
    apiserver.add_object(gpu_pod("holder"))
    pod = apiserver.add_object(gpu_pod("waiting"))
    process = subprocess.Popen(
        [
            HAMI, "scheduler", "--kubeconfig", str(kubeconfig_path), "--http-bind",
            "127.0.0.1:0", "--metrics-bind-address", "0", "--node-lock-retry-timeout", "60s",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until(lambda: any("serving on" in line for line in lines), timeout=30)
        match = re.search(r"serving on (http://\S+)", "".join(lines))
        assert match is not None
        url = match.group(1)
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
        process.send_signal(signal.SIGTERM)
        binder.join(30)
        assert answer and "node lock contention" in str(answer[0]["Error"])
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(10)
    log = "".join(lines)
    assert "received SIGTERM" in log and "hami scheduler stopped" in log
    stored = apiserver.get_pod("default", "waiting")
    assert stored is not None
    assert ANNOTATION_VGPU_NODE not in stored["metadata"]["annotations"]
    node = apiserver.get_node("n1")
    assert node is not None and node["metadata"]["annotations"][ANNOTATION_NODE_LOCK] == lock
