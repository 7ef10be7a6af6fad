"""Settings: precedence flag > env > per-node override > config file > defaults, validation."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from hami_plugin.config import ConfigError
from hami_plugin.deviceplugin.device_list import DeviceListConfig, DeviceListStrategy
from hami_plugin.deviceplugin.settings import (
    DEFAULT_IGNORED_XIDS,
    DevicePluginSettings,
    NvmlSource,
    add_arguments,
    resolve_settings,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "deviceplugin"
HAMI_CONFIG = str(FIXTURES / "hami-device-config.yaml")
NODE_CONFIG = str(FIXTURES / "node-config.json")
DEVICE_CONFIG_MAP = Path(__file__).parents[2] / "daemonset" / "device-config.yaml"


def resolve(argv: list[str], env: dict[str, str] | None = None) -> DevicePluginSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve_settings(parser.parse_args(argv), env or {})


def test_defaults_need_only_a_node_name() -> None:
    settings = resolve(["--node-name", "n1"])
    assert settings == DevicePluginSettings(node_name="n1")
    assert settings.split_count == 10
    assert settings.memory_scaling == 1.0
    assert settings.resource_name == "nvidia.com/gpu"
    assert settings.socket_name == "nvidia-gpu.sock"
    assert settings.hook_path == "/usr/local"
    assert settings.ignored_xids == frozenset({13, 31, 43, 45, 68, 109})
    assert settings.fail_on_init_error is True
    assert settings.health_recovery_seconds == 300.0


def test_node_name_is_required() -> None:
    with pytest.raises(ConfigError, match=r"node name is required: set --node-name or NODE_NAME"):
        resolve([])


def test_every_flag_has_an_env_variable() -> None:
    env = {
        "NODE_NAME": "n1",
        "KUBECONFIG": "/k",
        "DEVICE_PLUGIN_PATH": "/dp/",
        "NVML_BACKEND": "fake",
        "FAKE_GPUS_FILE": "/gpus.yaml",
        "DEVICE_SPLIT_COUNT": "3",
        "DEVICE_MEMORY_SCALING": "1.25",
        "DEVICE_CORES_SCALING": "0.5",
        "ENABLE_NUMA_TOPOLOGY": "true",
        "RESOURCE_NAME": "nvidia.com/vgpu",
        "HOOK_PATH": "/opt/hook",
        "FAIL_ON_INIT_ERROR": "false",
        "HEALTH_RECOVERY_SECONDS": "0",
        "HEALTH_WAIT_MS": "100",
        "REGISTER_INTERVAL_SECONDS": "5",
        "LIBCUDA_LOG_LEVEL": "4",
        "DISABLE_CORE_LIMIT": "t",
        "PRECONFIGURED_DEVICE_MEMORY": "1024",
        "FILTER_DEVICE_UUIDS": "GPU-a, GPU-b",
        "FILTER_DEVICE_INDEXES": "1,2",
        "ENABLE_PREFERRED_ALLOCATION": "False",
    }
    settings = resolve([], env)
    assert settings == DevicePluginSettings(
        node_name="n1",
        kubeconfig="/k",
        device_plugin_path="/dp/",
        nvml=NvmlSource.FAKE,
        fake_gpus="/gpus.yaml",
        split_count=3,
        memory_scaling=1.25,
        cores_scaling=0.5,
        enable_numa_topology=True,
        resource_name="nvidia.com/vgpu",
        hook_path="/opt/hook",
        fail_on_init_error=False,
        health_recovery_seconds=0.0,
        health_wait_ms=100,
        register_interval_seconds=5.0,
        socket_name="nvidia-vgpu.sock",
        libcuda_log_level="4",
        disable_core_limit=True,
        preconfigured_device_memory_mib=1024,
        filter_uuids=frozenset({"GPU-a", "GPU-b"}),
        filter_indexes=frozenset({1, 2}),
        enable_preferred_allocation=False,
    )


def test_empty_env_variables_count_as_unset() -> None:
    settings = resolve([], {"NODE_NAME": "n", "DEVICE_SPLIT_COUNT": "", "KUBECONFIG": ""})
    assert settings.split_count == 10
    assert settings.kubeconfig is None
    with pytest.raises(ConfigError, match="node name is required"):
        resolve([], {"NODE_NAME": ""})


def test_flag_beats_env() -> None:
    settings = resolve(
        ["--node-name", "from-flag", "--device-split-count", "7", "--fail-on-init-error=false"],
        {"NODE_NAME": "from-env", "DEVICE_SPLIT_COUNT": "3", "FAIL_ON_INIT_ERROR": "true"},
    )
    assert settings.node_name == "from-flag"
    assert settings.split_count == 7
    assert settings.fail_on_init_error is False


def test_the_booking_key_file_comes_from_the_flag_or_the_environment() -> None:
    assert resolve(["--node-name", "n"]).booking_key_file is None
    from_env = resolve([], {"NODE_NAME": "n", "HAMI_BOOKING_KEY_FILE": "/keys/env"})
    assert from_env.booking_key_file == "/keys/env"
    from_flag = resolve(
        ["--node-name", "n", "--booking-key-file", "/keys/flag"],
        {"HAMI_BOOKING_KEY_FILE": "/keys/env"},
    )
    assert from_flag.booking_key_file == "/keys/flag"


def test_the_pod_resources_socket_defaults_to_kubelets_and_an_empty_flag_turns_it_off() -> None:
    kubelets = "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert resolve(["--node-name", "n"]).pod_resources_socket == kubelets
    assert resolve(["--node-name", "n", "--pod-resources-socket", ""]).pod_resources_socket == ""
    # an empty variable counts as unset, as every variable does
    assert resolve([], {"NODE_NAME": "n", "POD_RESOURCES_SOCKET": ""}).pod_resources_socket == (
        kubelets
    )
    from_env = resolve([], {"NODE_NAME": "n", "POD_RESOURCES_SOCKET": "/k0s/pod-resources/k.sock"})
    assert from_env.pod_resources_socket == "/k0s/pod-resources/k.sock"
    with pytest.raises(ConfigError, match="--pod-resources-socket must be an absolute path"):
        resolve(["--node-name", "n", "--pod-resources-socket", "kubelet.sock"])


def test_bool_flag_without_value_means_true() -> None:
    assert resolve(["--node-name", "n", "--enable-numa-topology"]).enable_numa_topology is True
    assert (
        resolve(["--node-name", "n", "--enable-numa-topology", "false"]).enable_numa_topology
        is False
    )


def test_hami_configmap_shape_and_node_override_in_the_same_file() -> None:
    settings = resolve(["--node-name", "node-a", "--config-file", HAMI_CONFIG])
    # nodeconfig entry for node-a overrides the nvidia section ...
    assert settings.split_count == 6
    assert settings.memory_scaling == 2.0
    assert settings.filter_uuids == frozenset({"GPU-filtered"})
    assert settings.filter_indexes == frozenset({3})
    # ... and leaves what it does not set to the nvidia section.
    assert settings.cores_scaling == 1.0
    assert settings.libcuda_log_level == "2"
    assert settings.resource_name == "nvidia.com/gpu"


def test_node_without_override_entry_gets_the_file_values() -> None:
    settings = resolve(["--node-name", "node-z", "--config-file", HAMI_CONFIG])
    assert settings.split_count == 4
    assert settings.memory_scaling == 1.5
    assert settings.filter_uuids == frozenset()


def test_separate_node_config_file_wins_over_the_config_file_entry() -> None:
    settings = resolve(
        ["--node-name", "node-a", "--config-file", HAMI_CONFIG],
        {"NODE_CONFIG_FILE": NODE_CONFIG},
    )
    assert settings.split_count == 8
    assert settings.memory_scaling == 3.0
    assert settings.libcuda_log_level == "3"
    assert settings.enable_numa_topology is True
    assert settings.enable_preferred_allocation is False
    # the JSON sets empty filter lists, which replace the config file's
    assert settings.filter_uuids == frozenset()


def test_env_beats_node_override_and_flag_beats_env(tmp_path: Path) -> None:
    env = {"DEVICE_SPLIT_COUNT": "2", "CONFIG_FILE": HAMI_CONFIG}
    assert resolve(["--node-name", "node-a"], env).split_count == 2
    assert resolve(["--node-name", "node-a", "--device-split-count", "9"], env).split_count == 9


def test_flat_keys_beat_the_nvidia_section(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "nvidia:\n  deviceSplitCount: 4\n"
        "split_count: 5\nnode_name: from-file\nhook_path: /h\n"
        "disable_healthchecks: '48'\n"
        "filter_devices: {uuid: [GPU-x], index: [0]}\n"
    )
    settings = resolve(["--config-file", str(config)])
    assert settings.split_count == 5
    assert settings.node_name == "from-file"
    assert settings.hook_path == "/h"
    assert settings.ignored_xids == DEFAULT_IGNORED_XIDS | {48}
    assert settings.filter_uuids == frozenset({"GPU-x"})
    assert settings.filter_indexes == frozenset({0})


def test_nvidia_keys_match_exactly_as_hamis_yaml_reader_matches_them(tmp_path: Path) -> None:
    # HAMi reads the device config with gopkg.in/yaml.v2, whose keys match the `yaml:` tags
    # exactly (pkg/scheduler/config/config.go:484-495): a key spelled otherwise sets nothing.
    config = tmp_path / "config.yaml"
    config.write_text("nvidia:\n  devicesplitcount: 3\n  DEVICEMEMORYSCALING: 0.5\n")
    settings = resolve(["--node-name", "n", "--config-file", str(config)])
    assert (settings.split_count, settings.memory_scaling) == (10, 1.0)
    config.write_text("nvidia:\n  deviceSplitCount: 3\n  deviceMemoryScaling: 0.5\n")
    settings = resolve(["--node-name", "n", "--config-file", str(config)])
    assert (settings.split_count, settings.memory_scaling) == (3, 0.5)


def test_config_keys_fold_as_go_folds_them(tmp_path: Path) -> None:
    # The nodeconfig entries are JSON to HAMi (encoding/json, plugin/server.go:128-137), matched
    # with Go's field-name folding (protocol.gojson.fold_name), not Python's lower(): the long s
    # (U+017F) folds to S and the dotted capital I (U+0130) to I, where lower() leaves the one
    # and turns the other into two characters.
    config = tmp_path / "config.yaml"
    config.write_text(
        "nodeconfig:\n  - name: n\n    device\u017fplitCount: 3\n    dev\u0130ceCoreScaling: 0.5\n"
        "    dev\u0130cememoryscaling: 2\n"
        "    filterdevices: {uu\u0130d: [GPU-x]}\n",
        encoding="utf-8",
    )
    settings = resolve(["--node-name", "n", "--config-file", str(config)])
    assert (settings.split_count, settings.cores_scaling) == (3, 0.5)
    assert settings.memory_scaling == 2
    assert settings.filter_uuids == frozenset({"GPU-x"})


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--device-split-count", "0"], {}, "--device-split-count must be at least 1, got 0"),
        (["--device-split-count", "ten"], {}, "--device-split-count: expected an integer"),
        ([], {"DEVICE_MEMORY_SCALING": "-1"}, "--device-memory-scaling must be > 0"),
        ([], {"DEVICE_MEMORY_SCALING": "lots"}, "DEVICE_MEMORY_SCALING: expected a number"),
        (["--device-cores-scaling", "0"], {}, "--device-cores-scaling must be > 0"),
        (["--fail-on-init-error", "maybe"], {}, '--fail-on-init-error: invalid boolean "maybe"'),
        ([], {"FAIL_ON_INIT_ERROR": "on"}, 'FAIL_ON_INIT_ERROR: invalid boolean "on"'),
        (["--nvml", "cuda"], {}, "--nvml must be 'nvml' or 'fake'"),
        (["--nvml", "fake"], {}, "--nvml fake needs --fake-gpus FILE"),
        (["--resource-name", "gpu"], {}, "--resource-name must look like <domain>/<name>"),
        (["--health-recovery-seconds", "-5"], {}, "--health-recovery-seconds must be >= 0"),
        (["--health-wait-ms", "0"], {}, "--health-wait-ms must be at least 1, got 0"),
        (["--socket-name", "a/b.sock"], {}, "--socket-name must be a plain file name"),
    ],
)
def test_invalid_values_name_their_source(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(["--node-name", "n", *argv], env)


def test_bad_value_in_config_file_names_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("nvidia:\n  deviceSplitCount: many\n")
    with pytest.raises(ConfigError) as caught:
        resolve(["--node-name", "n", "--config-file", str(config)])
    assert str(caught.value) == (
        f"config file {config}: nvidia.deviceSplitCount: expected an integer, got 'many'"
    )


def test_bad_value_in_node_entry_names_the_entry(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("nodeconfig:\n  - name: n\n    devicesplitcount: true\n")
    with pytest.raises(ConfigError, match=r"nodeconfig entry for 'n' .*devicesplitcount"):
        resolve(["--node-name", "n", "--config-file", str(config)])


def test_unsupported_operating_mode_for_this_node_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("nodeconfig:\n  - {name: n, operatingmode: mps}\n  - {name: m}\n")
    with pytest.raises(ConfigError, match=r"operating mode 'mps' is not supported"):
        resolve(["--node-name", "n", "--config-file", str(config)])
    assert resolve(["--node-name", "m", "--config-file", str(config)]).operating_mode == "hami-core"


def test_dynamic_mig_mode_and_the_allowlist_come_from_hamis_config(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "nvidia:\n  migProfileAllowlist:\n    - {models: [A100], profiles: [1g.10gb, 7g.80gb]}\n"
        "nodeconfig:\n  - {name: n, operatingmode: mig}\n"
    )
    settings = resolve(["--node-name", "n", "--config-file", str(config)])
    assert settings.operating_mode == "mig"
    assert [(a.models, a.profiles) for a in settings.mig_profile_allowlist] == [
        (("A100",), ("1g.10gb", "7g.80gb"))
    ]
    config.write_text("nvidia:\n  migProfileAllowlist:\n    - {models: [A100], profiles: [10gb]}\n")
    bad = r'nvidia\.migProfileAllowlist.*invalid MIG profile "10gb"'
    with pytest.raises(ConfigError, match=bad):
        resolve(["--node-name", "n", "--config-file", str(config)])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("split_count: [1\n", r"not valid YAML at line 2"),
        ("- a\n- b\n", r"expected a mapping at the top level"),
        ("splitcount: 3\n", r"unknown setting 'splitcount'"),
        ("nvidia: 3\n", r"'nvidia' must be a mapping"),
        ("nodeconfig: {name: n}\n", r"'nodeconfig' must be a list"),
    ],
)
def test_bad_config_files_give_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(content)
    with pytest.raises(ConfigError, match=message) as caught:
        resolve(["--node-name", "n", "--config-file", str(config)])
    assert str(config) in str(caught.value)


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=rf"config file {missing}: cannot read"):
        resolve(["--node-name", "n", "--config-file", str(missing)])


@pytest.mark.parametrize(
    ("disable", "enable", "disabled", "ignored", "only"),
    [
        (None, None, False, DEFAULT_IGNORED_XIDS, None),
        ("all", None, True, DEFAULT_IGNORED_XIDS, None),
        ("xids", None, True, DEFAULT_IGNORED_XIDS, None),
        ("XIDS", None, True, DEFAULT_IGNORED_XIDS, None),
        ("48, 94,oops", None, False, DEFAULT_IGNORED_XIDS | {48, 94}, None),
        (None, "13,43", False, DEFAULT_IGNORED_XIDS - {13, 43}, None),
        ("48", "48,31", False, DEFAULT_IGNORED_XIDS - {31}, None),
        (None, "all", False, frozenset(), None),
        ("all", "all", False, frozenset(), None),
        ("all", "79", False, DEFAULT_IGNORED_XIDS, frozenset({79})),
    ],
)
def test_dp_healthcheck_variables(
    disable: str | None,
    enable: str | None,
    disabled: bool,
    ignored: frozenset[int],
    only: frozenset[int] | None,
) -> None:
    env = {"NODE_NAME": "n"}
    if disable is not None:
        env["DP_DISABLE_HEALTHCHECKS"] = disable
    if enable is not None:
        env["DP_ENABLE_HEALTHCHECKS"] = enable
    settings = resolve([], env)
    assert settings.healthchecks_disabled is disabled
    assert settings.ignored_xids == ignored
    assert settings.only_xids == only


def test_xid_is_critical_follows_the_settings() -> None:
    default = DevicePluginSettings(node_name="n")
    assert default.xid_is_critical(79)
    assert not default.xid_is_critical(13)
    only = resolve([], {"NODE_NAME": "n", "DP_DISABLE_HEALTHCHECKS": "all",
                        "DP_ENABLE_HEALTHCHECKS": "79"})  # fmt: skip
    assert only.xid_is_critical(79)
    assert not only.xid_is_critical(48)
    off = resolve(["--node-name", "n", "--disable-healthchecks", "all"])
    assert not off.xid_is_critical(79)


def test_healthcheck_flag_beats_env() -> None:
    settings = resolve(
        ["--node-name", "n", "--disable-healthchecks", "48"], {"DP_DISABLE_HEALTHCHECKS": "all"}
    )
    assert settings.healthchecks_disabled is False
    assert 48 in settings.ignored_xids


def test_the_resync_interval_is_a_go_duration(tmp_path: Path) -> None:
    flagged = resolve(["--node-name", "n", "--vgpu-resync-interval", "1m30s"])
    assert flagged.vgpu_resync_interval_seconds == 90.0
    # HAMi reads HAMI_RESYNC_INTERVAL with time.ParseDuration, which wants a unit.
    with pytest.raises(ConfigError, match=r"HAMI_RESYNC_INTERVAL: invalid duration '45'"):
        resolve(["--node-name", "n"], {"HAMI_RESYNC_INTERVAL": "45"})
    with pytest.raises(ConfigError, match=r"--vgpu-resync-interval: expected a duration that is"):
        resolve(["--node-name", "n", "--vgpu-resync-interval=-1m"])
    # In the config file a YAML number is seconds: the key says so.
    config = tmp_path / "config.yaml"
    config.write_text("vgpu_resync_interval_seconds: 45\n")
    from_file = resolve(["--node-name", "n", "--config-file", str(config)])
    assert from_file.vgpu_resync_interval_seconds == 45.0


# --- HAMi's flags its users carry: --mig-strategy, -v; nvidia.enableNumaTopology ------------


def test_mig_strategy_none_is_accepted_from_the_flag_or_the_environment() -> None:
    assert resolve(["--node-name", "n", "--mig-strategy=none"]) == DevicePluginSettings("n")
    assert resolve(["--node-name", "n"], {"MIG_STRATEGY": "none"}) == DevicePluginSettings("n")


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--mig-strategy=mixed"], {}, "mixed"),
        (["--mig-strategy", "single"], {}, "single"),
        ([], {"MIG_STRATEGY": "mixed"}, "mixed"),
        (["--mig-strategy=none"], {"MIG_STRATEGY": "mixed"}, "none"),  # the flag wins
        ([], {}, "none"),
    ],
)
def test_the_three_mig_strategies_are_accepted(
    argv: list[str], env: dict[str, str], expected: str
) -> None:
    assert resolve(["--node-name", "n", *argv], env).mig_strategy == expected


def test_an_unknown_mig_strategy_is_one_line_and_exit_two(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hami_plugin.cli import main

    assert main(["device-plugin", "--node-name", "n", "--mig-strategy=None"]) == 2
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == (
        "--mig-strategy: unknown MIG strategy: None (none, single or mixed)"
    )


@pytest.mark.parametrize(
    ("argv", "verbosity", "debug"),
    [
        ([], 0, False),
        (["-v=4"], 4, True),  # HAMi's chart: devicePlugin.extraArgs [-v=4]
        (["-v", "5"], 5, True),
        (["--v=3"], 3, False),
        (["--v", "-2"], -2, False),
    ],
)
def test_klog_verbosity_four_and_above_is_debug_logging(
    argv: list[str], verbosity: int, debug: bool
) -> None:
    settings = resolve(["--node-name", "n", *argv])
    assert (settings.verbosity, settings.debug_logging) == (verbosity, debug)


def test_a_bad_verbosity_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^-v: expected a klog verbosity .* got '4x'$"):
        resolve(["--node-name", "n", "-v=4x"])


def test_verbosity_is_not_a_config_file_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("verbosity: 4\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown setting 'verbosity'"):
        resolve(["--node-name", "n", "--config-file", str(path)])


def test_numa_topology_is_read_from_the_device_config(tmp_path: Path) -> None:
    # Where HAMi's chart puts devicePlugin.enableNumaTopology (device-configmap.yaml:31).
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  deviceSplitCount: 4\n  enableNumaTopology: true\n", "utf-8")
    settings = resolve(["--node-name", "n", "--config-file", str(path)])
    assert settings.enable_numa_topology is True
    path.write_text("nvidia:\n  enableNumaTopology: on\n", "utf-8")  # YAML 1.1: a boolean
    assert resolve(["--node-name", "n", "--config-file", str(path)]).enable_numa_topology
    path.write_text("nvidia:\n  enableNumaTopology: sometimes\n", "utf-8")
    with pytest.raises(ConfigError, match=r"nvidia\.enableNumaTopology: invalid boolean"):
        resolve(["--node-name", "n", "--config-file", str(path)])


def test_the_manifests_device_config_reads_numa_topology_off(tmp_path: Path) -> None:
    text = next(
        doc["data"]["device-config.yaml"]
        for doc in yaml.safe_load_all(DEVICE_CONFIG_MAP.read_text("utf-8"))
        if "device-config.yaml" in (doc.get("data") or {})
    )
    assert "enableNumaTopology: false" in text
    config = tmp_path / "device-config.yaml"
    config.write_text(text, "utf-8")
    assert resolve(["--node-name", "n", "--config-file", str(config)]).enable_numa_topology is False
    turned_on = text.replace("enableNumaTopology: false", "enableNumaTopology: true")
    config.write_text(turned_on, "utf-8")
    assert resolve(["--node-name", "n", "--config-file", str(config)]).enable_numa_topology


def test_device_list_flags_and_env_take_hamis_names() -> None:
    # HAMi v2.10 cmd/device-plugin/nvidia/main.go:115-160: flags and their variables.
    from_env = resolve(
        [],
        {
            "NODE_NAME": "n1",
            "DEVICE_LIST_STRATEGY": "cdi-annotations,envvar",
            "CDI_ANNOTATION_PREFIX": "nvidia.cdi.k8s.io/",
            "CDI_SPEC_DIR": "/etc/cdi",
            "GDRCOPY_ENABLED": "true",
            "GDS_ENABLED": "1",
            "MOFED_ENABLED": "false",
        },
    )
    assert from_env.device_list_strategies == {
        DeviceListStrategy.CDI_ANNOTATIONS,
        DeviceListStrategy.ENVVAR,
    }
    assert from_env.device_list == DeviceListConfig(
        strategies=from_env.device_list_strategies,
        cdi_annotation_prefix="nvidia.cdi.k8s.io/",
        gdrcopy_enabled=True,
        gds_enabled=True,
        mofed_enabled=False,
    )
    assert from_env.cdi_spec_dir == "/etc/cdi"
    from_flags = resolve(
        ["--node-name", "n1", "--device-list-strategy", "cdi-cri", "--mofed-enabled"],
        {"DEVICE_LIST_STRATEGY": "volume-mounts"},
    )
    assert from_flags.device_list_strategies == {DeviceListStrategy.CDI_CRI}
    assert from_flags.mofed_enabled and not from_flags.gdrcopy_enabled
    defaults = resolve(["--node-name", "n1"])
    assert defaults.device_list == DeviceListConfig()
    assert defaults.cdi_spec_dir == "/var/run/cdi"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device-list-strategy", "envvar,cdi"], "--device-list-strategy: invalid strategy: cdi"),
        (["--device-list-strategy", ""], "no device list strategy given"),
        (
            ["--device-list-strategy", "cdi-cri", "--cdi-spec-dir", "run/cdi"],
            "--cdi-spec-dir must be an absolute path",
        ),
    ],
)
def test_bad_device_list_settings_are_refused_at_start(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(["--node-name", "n1", *argv])


def test_the_device_list_strategy_from_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump({"device_list_strategies": ["volume-mounts", "cdi-cri"]}), "utf-8"
    )
    settings = resolve(["--node-name", "n1", "--config-file", str(path)])
    assert settings.device_list_strategies == {
        DeviceListStrategy.VOLUME_MOUNTS,
        DeviceListStrategy.CDI_CRI,
    }
