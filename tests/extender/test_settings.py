"""`hami scheduler`'s flags and configuration: HAMi's defaults and spellings, Go durations and
booleans, flag > environment precedence, the device config file, one clear error per bad value."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import pytest

from hami_plugin.cli import build_parser
from hami_plugin.config import ConfigError
from hami_plugin.extender.settings import resolve_config


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
        (("--kube-qps", "fast"), r"^--kube-qps: expected a number, got 'fast'"),
        (("--kube-qps=inf",), r"^--kube-qps: expected a finite number"),
        (("--kube-burst=1.5",), r"^--kube-burst: expected an integer, got '1.5'"),
        (("--kube-burst=-1",), r"^--kube-burst: must not be negative"),
        (("--kube-timeout=soon",), r"^--kube-timeout: expected whole seconds \(as HAMi: 30\)"),
        (("--kube-timeout=-5",), r"^--kube-timeout: '-5' must not be negative"),
        (("-v=high",), r"^-v: expected a klog verbosity \(a whole number such as 4\)"),
        (("--v", "4.5"), r"^-v: expected a klog verbosity"),
        (("--debug=yes",), r'^--debug: invalid boolean "yes"'),
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


def test_device_config_mig_profile_allowlist_is_validated_at_start(tmp_path: Path) -> None:
    # HAMi's InitNvidiaDevice stops on a bad allowlist (device.go:171-173); a good one, as
    # HAMi's chart ships it, is accepted.
    path = tmp_path / "device-config.yaml"
    path.write_text(
        "nvidia:\n"
        "  migProfileAllowlist:\n"
        "  - models: [A100-SXM4-80GB]\n"
        "    profiles: [1g.10gb, 2g.20gb, 3g.40gb, 7g.79gb]\n",
        encoding="utf-8",
    )
    resolve_config(parse("--device-config-file", str(path)), {})
    path.write_text(
        "nvidia:\n  migProfileAllowlist:\n  - models: [A100]\n    profiles: [big]\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        resolve_config(parse("--device-config-file", str(path)), {})
    assert str(caught.value) == (
        f'--device-config-file {path}: invalid MIG profile allowlist: invalid MIG profile "big"'
    )
    path.write_text("nvidia:\n  migProfileAllowlist:\n  - models: [A100]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="must define models and profiles"):
        resolve_config(parse("--device-config-file", str(path)), {})


def test_every_flag_has_a_help_line() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = commands.choices["scheduler"]._actions
    for action in actions:
        assert action.help, action.option_strings


def test_the_environment_is_read_here_once() -> None:
    env = {"POD_NAME": " hami-scheduler-0 ", "POD_NAMESPACE": "hami", "KUBECONFIG": "/env/kube"}
    config = resolve_config(parse(), env)
    assert (config.pod_namespace, config.pod_name) == ("hami", "hami-scheduler-0")
    assert config.kubeconfig == "/env/kube"
    assert resolve_config(parse("--kubeconfig", "/flag/kube"), env).kubeconfig == "/flag/kube"
    outside = resolve_config(parse(), {"KUBECONFIG": ""})
    assert (outside.pod_namespace, outside.pod_name, outside.kubeconfig) == ("", "", None)


def test_hamis_chart_spelling_of_the_boolean_flags() -> None:
    # HAMi v2.10.0 charts/hami/templates/scheduler/deployment.yaml:57,114 pass pflag's `=value`.
    config = resolve_config(
        parse("--leader-elect=true", "--force-overwrite-default-scheduler=false"), {}
    )
    assert config.leader_elect
    assert not config.webhook.force_overwrite_default_scheduler
    assert resolve_config(parse("--leader-elect"), {}).leader_elect
    with pytest.raises(ConfigError, match=r'^--leader-elect: invalid boolean "yes"'):
        resolve_config(parse("--leader-elect=yes"), {})


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        ((), "info"),
        (("--debug",), "debug"),
        (("--debug=true",), "debug"),
        (("--debug=false",), "info"),
        (("-v=4",), "debug"),  # HAMi's chart: extraArgs [--debug, -v=4]
        (("-v", "5"), "debug"),
        (("-v4",), "debug"),
        (("--v=10",), "debug"),
        (("--v", "3"), "info"),
        (("-v=-1",), "info"),  # klog takes a sign
        (("-v=2", "--log-level=warning"), "warning"),  # below 4: --log-level stands
        (("--log-level=error", "--debug"), "debug"),
    ],
)
def test_hamis_debug_and_klog_verbosity_set_the_log_level(
    argv: tuple[str, ...], level: str
) -> None:
    assert resolve_config(parse(*argv), {}).log_level == level


def test_the_kube_client_flags_default_to_no_limit_and_the_clients_timeout() -> None:
    config = resolve_config(parse(), {})
    assert (config.kube_qps, config.kube_burst, config.kube_timeout_seconds) == (None, None, None)


@pytest.mark.parametrize(
    ("argv", "qps", "burst"),
    [
        (("--kube-qps=20", "--kube-burst=40"), 20.0, 40),
        (("--kube-qps", "2.5"), 2.5, 10),  # HAMi's burst: client-go's 10
        (("--kube-burst", "3"), 5.0, 3),  # HAMi's QPS: client-go's 5
        (("--kube-qps=0", "--kube-burst=0"), 5.0, 10),  # client-go: 0 is its default
        (("--kube-qps=-1", "--kube-burst=50"), None, None),  # client-go: negative is no limit
    ],
)
def test_the_kube_rate_limit_takes_hamis_values_and_client_gos_meanings(
    argv: tuple[str, ...], qps: float | None, burst: int | None
) -> None:
    config = resolve_config(parse(*argv), {})
    assert (config.kube_qps, config.kube_burst) == (qps, burst)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("0", None), ("0s", None)],
)
def test_the_kube_timeout_is_hamis_seconds_or_a_go_duration(
    value: str, seconds: float | None
) -> None:
    assert resolve_config(parse("--kube-timeout", value), {}).kube_timeout_seconds == seconds


def test_a_bad_klog_flag_is_one_line_and_exit_two(caplog: pytest.LogCaptureFixture) -> None:
    from hami_plugin.cli import main

    assert main(["scheduler", "-v=high"]) == 2
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == (
        "-v: expected a klog verbosity (a whole number such as 4), got 'high'"
    )
