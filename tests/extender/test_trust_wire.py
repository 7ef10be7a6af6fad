"""`hami scheduler --booking-key-file` over the real wire: the command as a subprocess, the API
server double, a hog pod written by hand; its flag, its environment variable and its start
errors; the one warning line without a key."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hami_plugin.cli import build_parser
from hami_plugin.clock import ManualClock
from hami_plugin.config import ConfigError
from hami_plugin.extender.settings import resolve_config
from hami_plugin.protocol.model import ANNOTATION_BIND_PHASE, ANNOTATION_VGPU_NODE
from hami_plugin.protocol.signature import ANNOTATION_BOOKING_SIGNATURE
from hami_plugin.testing.apiserver import FakeApiServer, make_pod
from tests.bookings import keys_from, verify_pod
from tests.extender.cluster import running_scheduler
from tests.extender.helpers import gpu_node, gpu_pod
from tests.extender.signing import KEY, KEYS, booking, write_key_file
from tests.processes import LoggedProcess, wait_until

HAMI = str(Path(sys.executable).with_name("hami"))
NO_KEY_WARNING = (
    "no --booking-key-file: pod annotations are trusted as HAMi does; any pod author can book GPUs"
)


def _post(url: str, document: object) -> dict[str, object]:
    request = urllib.request.Request(
        url, json.dumps(document).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        result = json.loads(response.read())
    assert isinstance(result, dict)
    return result


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def scheduler_command(kubeconfig: Path, *extra: str) -> list[str]:
    return [
        HAMI, "scheduler", "--kubeconfig", str(kubeconfig), "--http-bind", "127.0.0.1:0",
        "--metrics-bind-address", "0", *extra,
    ]  # fmt: skip


def test_a_hog_pod_books_nothing_and_binds_are_signed(
    apiserver: FakeApiServer, kubeconfig_path: Path, tmp_path: Path
) -> None:
    every_gpu = [(f"GPU-n1-{i}", 32768, 100) for i in range(2)]
    apiserver.add_object(gpu_node("n1", 2, split=1, protocol=True))
    # asks for no GPU, bound nowhere, books both GPUs in full; skipped the webhook
    apiserver.add_object(
        make_pod(
            "hog",
            annotations=booking("n1", every_gpu, phase="success"),
            labels={"hami.io/webhook": "ignore"},
        )
    )
    pod = apiserver.add_object(gpu_pod("trainer", gpus=2, memory=32768))
    key_file = write_key_file(tmp_path / "booking-keys")
    process = LoggedProcess(
        "scheduler",
        scheduler_command(kubeconfig_path, "--booking-key-file", str(key_file)),
        tmp_path,
    )
    try:
        url = process.wait_for_log(r"serving on (https?://\S+)", timeout=30).group(1)
        wait_until(lambda: _ready(url), timeout=30, what="readyz")
        answer = _post(f"{url}/filter", {"Pod": pod, "NodeNames": ["n1"]})
        assert answer["NodeNames"] == ["n1"], answer  # both GPUs free despite the hog
        bind = {
            "PodName": "trainer",
            "PodNamespace": "default",
            "PodUID": pod["metadata"]["uid"],
            "Node": "n1",
        }
        # the filter's event goes out through a queue: let it land before counting requests
        wait_until(
            lambda: any(e["reason"] == "FilteringSucceed" for e in apiserver.events()),
            what="the filter's event",
        )
        apiserver.clear_requests()
        for bad, error in (
            ({"PodNamespace": "a/b"}, 'invalid PodNamespace "a/b": must be a DNS-1123 label'),
            ({"PodUID": ""}, "invalid PodUID: required"),
        ):
            assert str(_post(f"{url}/bind", {**bind, **bad})["Error"]).startswith(error)
        assert apiserver.requests_matching(path="/api/v1/namespaces/.*") == []
        assert _post(f"{url}/bind", bind) == {"Error": ""}
        stored = apiserver.get_pod("default", "trainer")
        assert stored is not None and stored["spec"]["nodeName"] == "n1"
        annotations = stored["metadata"]["annotations"]
        assert annotations[ANNOTATION_BIND_PHASE] == "allocating"
        assert ANNOTATION_BOOKING_SIGNATURE in annotations
        assert verify_pod(KEYS, stored["metadata"]["uid"], annotations)
        hog = apiserver.get_pod("default", "hog")
        assert hog is not None
        assert not verify_pod(KEYS, hog["metadata"]["uid"], hog["metadata"]["annotations"])
        # the GPUs are the trainer's now: the next whole-GPU pod finds none
        late = apiserver.add_object(gpu_pod("late", gpus=1, memory=32768))
        assert _post(f"{url}/filter", {"Pod": late, "NodeNames": ["n1"]})["NodeNames"] is None
        assert process.stop() == 0
    finally:
        process.kill()
    log = process.log()
    assert log.count("pod default/hog: its GPU booking is ignored") == 1
    assert "it asks for no nvidia.com/gpu" in log
    assert NO_KEY_WARNING not in log


@pytest.mark.parametrize(
    ("content", "reason"), [(None, "No such file or directory"), ("# empty\n", "no booking key")]
)
def test_an_unusable_key_file_is_a_start_error_naming_it(
    kubeconfig_path: Path, tmp_path: Path, content: str | None, reason: str
) -> None:
    key_file = tmp_path / "booking-keys"
    if content is not None:
        key_file.write_text(content)
    process = LoggedProcess(
        "scheduler",
        scheduler_command(kubeconfig_path, "--booking-key-file", str(key_file)),
        tmp_path,
    )
    assert process.wait(30) == 2
    log = process.log()
    assert f"--booking-key-file {key_file}: " in log and reason in log
    assert "serving on" not in log


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["scheduler", *argv])


def test_the_flag_and_its_environment_variable(tmp_path: Path) -> None:
    flagged = str(write_key_file(tmp_path / "flag"))
    env = str(write_key_file(tmp_path / "env"))
    assert resolve_config(parse(), {}).booking_key_file == ""
    assert resolve_config(parse("--booking-key-file", flagged), {}).booking_key_file == flagged
    environment = {"HAMI_BOOKING_KEY_FILE": env}
    assert resolve_config(parse(), environment).booking_key_file == env
    both = resolve_config(parse("--booking-key-file", flagged), environment)
    assert both.booking_key_file == flagged  # flag > environment
    with pytest.raises(ConfigError, match=f"--booking-key-file {tmp_path}/gone: "):
        resolve_config(parse(), {"HAMI_BOOKING_KEY_FILE": str(tmp_path / "gone")})


def test_without_a_key_one_warning_line_and_bookings_unsigned(
    apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    apiserver.add_object(gpu_node("n1", 1))
    pod = apiserver.add_object(gpu_pod("a"))
    with running_scheduler(apiserver) as scheduler:
        assert scheduler.schedule(pod, ["n1"]) == "n1"
    assert [r.getMessage() for r in caplog.records].count(NO_KEY_WARNING) == 1
    stored = apiserver.get_pod("default", "a")
    assert stored is not None
    annotations = stored["metadata"]["annotations"]
    assert annotations[ANNOTATION_VGPU_NODE] == "n1"
    assert ANNOTATION_BOOKING_SIGNATURE not in annotations


def test_with_a_key_no_warning_and_a_rotated_key_is_picked_up_without_a_restart(
    apiserver: FakeApiServer, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING)
    clock = ManualClock(datetime.now(UTC))
    apiserver.add_object(gpu_node("n1", 2, protocol=True))  # no node lock to wait for
    key_file = write_key_file(tmp_path / "keys")
    new_key = "the-next-booking-key-9876543210"
    with running_scheduler(apiserver, clock=clock, booking_key_file=str(key_file)) as scheduler:
        first = apiserver.add_object(gpu_pod("first", created="2026-01-01T00:00:00Z"))
        assert scheduler.schedule(first, ["n1"]) == "n1"
        # rotation: the new key first (it signs), the old one still verifies
        write_key_file(tmp_path / "keys.new", new_key, KEY).replace(key_file)
        clock.advance(6)  # past the key file's recheck interval
        second = apiserver.add_object(gpu_pod("second", created="2026-01-01T00:00:01Z"))
        assert scheduler.schedule(second, ["n1"]) == "n1"
        # the pod bound under the old key still counts: both GPUs' slots are booked
        scheduler.sees_pod("default", "second", lambda p: p.node_name == "n1")
        usage = scheduler.state.node_usage("n1")
        assert usage is not None and sum(usage.used) == 2
    assert NO_KEY_WARNING not in [r.getMessage() for r in caplog.records]
    signatures = {}
    for name in ("first", "second"):
        stored = apiserver.get_pod("default", name)
        assert stored is not None
        signatures[name] = (stored["metadata"]["uid"], stored["metadata"]["annotations"])
    assert verify_pod(KEYS, *signatures["first"])
    assert not verify_pod(KEYS, *signatures["second"])
    assert verify_pod(keys_from(new_key.encode()), *signatures["second"])


@pytest.mark.parametrize("signed", [True, False], ids=["with-a-key", "without-a-key"])
def test_a_bound_signed_pod_stays_counted_whatever_bind_phase_its_author_writes(
    apiserver: FakeApiServer, tmp_path: Path, signed: bool
) -> None:
    """Issue 25, item 9: bind-phase is not signed. After Allocate served the trainer (both GPUs
    of n1, still Pending: its image pulls), its author writes `hami.io/bind-phase: failed`.
    With a key the trainer stays counted until it is Failed, Succeeded or deleted, so the next
    whole-GPU pod finds no room; without one HAMi's rule stands (a failed Pending pod counts for
    nothing: its GPUs look free)."""
    apiserver.add_object(gpu_node("n1", 2, split=1, protocol=True))
    key_file = str(write_key_file(tmp_path / "keys")) if signed else None
    with running_scheduler(apiserver, booking_key_file=key_file) as scheduler:
        trainer = apiserver.add_object(gpu_pod("trainer", gpus=2, memory=32768))
        assert scheduler.schedule(trainer, ["n1"]) == "n1"
        # what our device plugin's Allocate writes, then the author's own patch
        for phase in ("success", "failed"):
            apiserver.update_object("pods", "default", "trainer", _set_bind_phase(phase))
        scheduler.sees_pod("default", "trainer", lambda p: p.booking.failed)
        usage = scheduler.state.node_usage("n1")
        assert usage is not None
        late = apiserver.add_object(gpu_pod("late", gpus=1, memory=32768))
        nodes = scheduler.filter(late, ["n1"])["NodeNames"]
        if signed:
            assert sum(usage.used) == 2
            assert nodes is None  # both GPUs are still the trainer's
        else:
            assert sum(usage.used) == 0
            assert nodes == ["n1"]
        # Failed ends it either way (what stays is `late`'s filter booking, if it got one)
        apiserver.update_object("pods", "default", "trainer", _set_phase("Failed"))
        scheduler.sees_pod("default", "trainer", lambda p: p.phase == "Failed")
        usage = scheduler.state.node_usage("n1")
        assert usage is not None and sum(usage.used) == (0 if signed else 1)


def _set_bind_phase(phase: str) -> Callable[[dict[str, Any]], None]:
    def update(pod: dict[str, Any]) -> None:
        pod["metadata"]["annotations"][ANNOTATION_BIND_PHASE] = phase

    return update


def _set_phase(phase: str) -> Callable[[dict[str, Any]], None]:
    def update(pod: dict[str, Any]) -> None:
        pod.setdefault("status", {})["phase"] = phase

    return update
