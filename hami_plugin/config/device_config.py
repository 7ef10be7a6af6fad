"""HAMi's device config (its `device-config.yaml` ConfigMap), read one way for both daemons.

HAMi v2.10 reads the file with gopkg.in/yaml.v2 into its `Config` struct, for the scheduler and
the device plugin alike (pkg/scheduler/config/config.go:484-495 `LoadConfig`, called at
config.go:287 and by the device plugin at pkg/device-plugin/nvidiadevice/nvinternal/plugin/
server.go:160). yaml.v2 matches a mapping key to a field's `yaml:` tag exactly, case included,
and ignores the keys no field has: so `nvidia:` and its keys (`NvidiaConfig`,
pkg/device/nvidia/device.go:94-128) count only as spelled there, and `devicesplitcount:` in that
section sets nothing. (HAMi's per-node `nodeconfig` entries are JSON, read with encoding/json,
which matches keys case-insensitively: `deviceplugin.config_file`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hami_plugin.config.sources import read_yaml
from hami_plugin.config.values import ConfigError

__all__ = ["NVIDIA_KEYS", "DeviceConfig", "read_device_config"]

NVIDIA_KEYS = frozenset(
    {
        # NodeDefaultConfig, inline (device.go:117-128)
        "deviceSplitCount",
        "deviceMemoryScaling",
        "deviceCoreScaling",
        "preConfiguredDeviceMemory",
        "libCudaLogLevel",
        "enableNumaTopology",
        # NvidiaConfig (device.go:94-114)
        "resourceCountName",
        "resourceMemoryName",
        "resourceCoreName",
        "resourceMemoryPercentageName",
        "resourcePriorityName",
        "overwriteEnv",
        "defaultMemory",
        "defaultCores",
        "defaultGPUNum",
        "memoryFactor",
        "disableCoreLimit",
        "migProfileAllowlist",
        "gpuCorePolicy",
        "runtimeClassName",
    }
)
"""The `yaml:` tags of HAMi's `NvidiaConfig`: the keys of `nvidia:` that HAMi reads."""


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """One device config file as read.

    `label` says where it came from in messages (`config file /etc/hami/config.yaml`);
    `document` is the whole top-level mapping (other vendors' sections, a file's own keys);
    `nvidia` the keys of `nvidia:` HAMi reads (`NVIDIA_KEYS`), spelled exactly so, with their
    values (a null value is left out: yaml.v2 leaves the field unset).
    """

    label: str
    document: Mapping[str, object]
    nvidia: Mapping[str, object]


def read_device_config(path: str, what: str) -> DeviceConfig:
    """Read the device config at `path`; `what` names it in messages (`config file`,
    `--device-config-file`). Raises ConfigError naming it and what is wrong: unreadable, not
    YAML, not a mapping at the top level, or an `nvidia` that is not a mapping."""
    label = f"{what} {path}"
    document = read_yaml(path, what)
    if document is None:
        return DeviceConfig(label, {}, {})
    if not isinstance(document, Mapping):
        raise ConfigError(f"{label}: expected a mapping at the top level")
    section = document.get("nvidia")
    if section is None:
        return DeviceConfig(label, document, {})
    if not isinstance(section, Mapping):
        raise ConfigError(f"{label}: 'nvidia' must be a mapping")
    nvidia = {
        str(key): value
        for key, value in section.items()
        if key in NVIDIA_KEYS and value is not None
    }
    return DeviceConfig(label, document, nvidia)
