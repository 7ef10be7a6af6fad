"""The one boolean and duration grammar: Go's, for every flag and variable of both daemons."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.cli import build_parser
from hami_plugin.config import ConfigError, parse_bool, parse_duration
from hami_plugin.deviceplugin.settings import DevicePluginSettings, resolve_settings
from hami_plugin.extender.settings import SchedulerConfig, resolve_config

# strconv.ParseBool, written out here rather than imported, so that the test checks the set.
GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
NEAR_MISSES = ["on", "off", "yes", "no", "y", "n", "tRUE", "fALSE", "TrUe", " true", "true ",
               "2", "-1", "01", "", "enabled", "ON", "Yes"]  # fmt: skip


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def device_plugin(argv: list[str], env: dict[str, str] | None = None) -> DevicePluginSettings:
    return resolve_settings(parse("device-plugin", "--node-name", "n", *argv), env or {})


def scheduler(argv: list[str], env: dict[str, str] | None = None) -> SchedulerConfig:
    return resolve_config(parse("scheduler", *argv), env or {})


def outcome(read: Callable[[], bool]) -> bool | str:
    """The boolean a resolution gave, or "refused"."""
    try:
        return read()
    except ConfigError:
        return "refused"


def seconds(read: Callable[[], float]) -> float | str:
    """The duration a resolution gave, or "refused"."""
    try:
        return read()
    except ConfigError:
        return "refused"


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [*((word, True) for word in sorted(GO_TRUE)), *((word, False) for word in sorted(GO_FALSE)),
     *((word, "refused") for word in NEAR_MISSES)],
)  # fmt: skip
def test_every_boolean_flag_of_both_daemons_takes_the_same_spellings(
    spelling: str, expected: bool | str
) -> None:
    results = {
        "--fail-on-init-error": outcome(
            lambda: device_plugin([f"--fail-on-init-error={spelling}"]).fail_on_init_error
        ),
        "FAIL_ON_INIT_ERROR": outcome(
            lambda: device_plugin([], {"FAIL_ON_INIT_ERROR": spelling}).fail_on_init_error
        ),
        "--priority-feedback": outcome(
            lambda: device_plugin([f"--priority-feedback={spelling}"]).priority_feedback
        ),
        "--leader-elect": outcome(lambda: scheduler([f"--leader-elect={spelling}"]).leader_elect),
        "--force-overwrite-default-scheduler": outcome(
            lambda: (
                scheduler(
                    [f"--force-overwrite-default-scheduler={spelling}"]
                ).webhook.force_overwrite_default_scheduler
            )
        ),
    }
    if spelling == "":
        # An empty variable (a chart's `value: ""`) is unset: the default, true, applies.
        assert results.pop("FAIL_ON_INIT_ERROR") is True
    assert results == dict.fromkeys(results, expected)


def test_a_boolean_flag_alone_is_true_in_both_daemons() -> None:
    assert device_plugin(["--fail-on-init-error"]).fail_on_init_error is True
    assert scheduler(["--leader-elect"]).leader_elect is True
    assert scheduler([]).leader_elect is False
    assert scheduler([]).webhook.force_overwrite_default_scheduler is True


def test_a_bad_boolean_names_the_flag_the_value_and_the_spellings() -> None:
    with pytest.raises(ConfigError) as device_error:
        device_plugin(["--fail-on-init-error=on"])
    with pytest.raises(ConfigError) as scheduler_error:
        scheduler(["--leader-elect=on"])
    spellings = "(true: 1, t, T, TRUE, true, True; false: 0, f, F, FALSE, false, False)"
    assert str(device_error.value) == f'--fail-on-init-error: invalid boolean "on" {spellings}'
    assert str(scheduler_error.value) == f'--leader-elect: invalid boolean "on" {spellings}'


@given(st.one_of(st.text(max_size=8), st.sampled_from(NEAR_MISSES + sorted(GO_TRUE | GO_FALSE))))
def test_the_boolean_grammar_is_exactly_gos(text: str) -> None:
    if text in GO_TRUE | GO_FALSE:
        assert parse_bool(text) is (text in GO_TRUE)
    else:
        with pytest.raises(ValueError, match="invalid boolean"):
            parse_bool(text)


def test_yaml_booleans_and_zero_one_are_booleans() -> None:
    assert parse_bool(True) is True
    assert parse_bool(0) is False
    assert parse_bool(1) is True
    for raw in (2, 1.0, None, ["true"]):
        with pytest.raises(ValueError):
            parse_bool(raw)


DURATIONS = [
    ("5m", timedelta(minutes=5)),
    ("1h30m", timedelta(hours=1, minutes=30)),
    ("1.5h", timedelta(hours=1, minutes=30)),
    ("300ms", timedelta(milliseconds=300)),
    ("28s", timedelta(seconds=28)),
    ("0", timedelta(0)),
    ("45", None),  # Go wants a unit
    ("5 m", None),
    ("5M", None),
    ("", None),
    ("-1m", None),  # negative: refused by both daemons
    ("soon", None),
]


@pytest.mark.parametrize(("text", "expected"), DURATIONS)
def test_every_duration_of_both_daemons_takes_the_same_spellings(
    text: str, expected: timedelta | None
) -> None:
    want = "refused" if expected is None else expected.total_seconds()
    results = {
        "--vgpu-resync-interval": seconds(
            lambda: device_plugin([f"--vgpu-resync-interval={text}"]).vgpu_resync_interval_seconds
        ),
        "--node-lock-retry-timeout": seconds(
            lambda: scheduler([f"--node-lock-retry-timeout={text}"]).node_lock_retry_timeout_seconds
        ),
    }
    if text:
        # Both variables: an empty one is unset, so only non-empty text is compared.
        results["HAMI_RESYNC_INTERVAL"] = seconds(
            lambda: device_plugin([], {"HAMI_RESYNC_INTERVAL": text}).vgpu_resync_interval_seconds
        )
    assert results == dict.fromkeys(results, want)


def test_durations_are_text_only() -> None:
    assert parse_duration("2m") == timedelta(minutes=2)
    with pytest.raises(ValueError, match="expected a Go duration"):
        parse_duration(30)
