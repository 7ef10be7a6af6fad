"""The device plugin's config files, read into settings layers.

The config file (`--config-file`) is YAML and accepts two shapes at once:

* HAMi's device ConfigMap (`/device-config.yaml`): a top-level `nvidia:` mapping with
  `deviceSplitCount`, `deviceMemoryScaling`, `deviceCoreScaling`, `libCudaLogLevel`,
  `resourceCountName`, `disableCoreLimit`, `preConfiguredDeviceMemory`, `enableNumaTopology`
  (HAMi's chart writes `devicePlugin.enableNumaTopology` there) and `migProfileAllowlist`
  (dynamic MIG, `deviceplugin.operating_mode`); keys matched case-insensitively with Go's
  field-name folding, `protocol.gojson.fold_name`, as HAMi's decoding does; the scheduler's
  keys in the same section are ignored);
* our own flat keys, named like the `DevicePluginSettings` fields (`split_count: 4`), which win
  over the `nvidia:` section.

Per-node overrides use HAMi's shape (`docs/hami-reference.md` 4.1): `nodeconfig: [{name,
devicesplitcount, devicememoryscaling, devicecorescaling, operatingmode, ...}]`, either inside
the config file or in a separate `--node-config-file` (HAMi's `/config/config.json`; JSON is
valid YAML). The entry whose `name` equals the node name overrides only the fields it sets. Its
keys are folded as Go folds them too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from hami_plugin.config import ConfigError, Layer, read_yaml
from hami_plugin.protocol.gojson import fold_name

__all__ = ["NODE_KEYS", "NVIDIA_KEYS", "config_file_layer", "node_config_entries", "node_layer"]

logger = logging.getLogger(__name__)

NVIDIA_KEYS = {
    "deviceSplitCount": "split_count",
    "deviceMemoryScaling": "memory_scaling",
    "deviceCoreScaling": "cores_scaling",
    "resourceCountName": "resource_name",
    "libCudaLogLevel": "libcuda_log_level",
    "disableCoreLimit": "disable_core_limit",
    "preConfiguredDeviceMemory": "preconfigured_device_memory_mib",
    "enableNumaTopology": "enable_numa_topology",
    "migProfileAllowlist": "mig_profile_allowlist",
}
"""The `nvidia:` keys of HAMi's device ConfigMap and the setting each sets."""

NODE_KEYS = {
    "devicesplitcount": "split_count",
    "devicememoryscaling": "memory_scaling",
    "devicecorescaling": "cores_scaling",
    "enablenumatopology": "enable_numa_topology",
    "libcudaloglevel": "libcuda_log_level",
    "preconfigureddevicememory": "preconfigured_device_memory_mib",
    "enablegetpreferredallocation": "enable_preferred_allocation",
    "migstrategy": "mig_strategy",
    "operatingmode": "operating_mode",
}
"""The keys of a HAMi `nodeconfig` entry and the setting each overrides."""

# The tables by folded key, as a key read from a file is matched (`fold_name`).
_NVIDIA_FIELDS = {fold_name(key): setting for key, setting in NVIDIA_KEYS.items()}
_NODE_FIELDS = {fold_name(key): setting for key, setting in NODE_KEYS.items()}
# HAMi node-config keys we read but that only have one supported value here.
_NODE_FIELDS_CHECKED: dict[str, str] = {}
_NODE_FIELDS_IGNORED = frozenset({fold_name("name")})
_NODE_FILTER_DEVICES = fold_name("filterdevices")
_FILTER_UUID = fold_name("uuid")
_FILTER_INDEX = fold_name("index")


def _filter_devices_values(raw: object, where: str) -> dict[str, object]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping with 'uuid' and 'index' lists")
    values: dict[str, object] = {}
    for key, value in raw.items():
        name = fold_name(str(key))
        if name == _FILTER_UUID:
            values["filter_uuids"] = [] if value is None else value
        elif name == _FILTER_INDEX:
            values["filter_indexes"] = [] if value is None else value
        else:
            raise ConfigError(f"{where}: unknown key {key!r} (known: uuid, index)")
    return values


def config_file_layer(path: str, flat_keys: frozenset[str]) -> tuple[Layer, list[object]]:
    """Read the config file at `path` into its settings layer and its `nodeconfig` entries.

    `flat_keys` are the setting names the file may set directly. Raises ConfigError naming the
    file and the key at fault.
    """
    document = read_yaml(path, "config file")
    layer = Layer(f"config file {path}")
    if document is None:
        return layer, []
    if not isinstance(document, Mapping):
        raise ConfigError(f"{layer.label}: expected a mapping at the top level")
    nvidia = document.get("nvidia")
    if nvidia is not None:
        if not isinstance(nvidia, Mapping):
            raise ConfigError(f"{layer.label}: 'nvidia' must be a mapping")
        for key, value in nvidia.items():
            name = _NVIDIA_FIELDS.get(fold_name(str(key)))
            if name is not None and value is not None:
                layer.put(name, value, f"nvidia.{key}")
    node_entries: list[object] = []
    for key, value in document.items():
        name = str(key)
        if name == "nvidia":
            continue
        if name == "nodeconfig":
            if value is not None and not isinstance(value, list):
                raise ConfigError(f"{layer.label}: 'nodeconfig' must be a list")
            node_entries = list(value or [])
        elif name == "filter_devices":
            for setting, item in _filter_devices_values(value, f"{layer.label}: {name}").items():
                layer.put(setting, item, name)
        elif name in flat_keys:
            layer.put(name, value, name)
        elif not isinstance(value, Mapping | list):
            # Mappings and lists are other vendors' sections of HAMi's ConfigMap; a scalar we
            # do not know is most likely a typo.
            known = ", ".join(sorted(flat_keys))
            raise ConfigError(f"{layer.label}: unknown setting {name!r} (known: {known})")
    return layer, node_entries


def node_layer(entries: Sequence[object], node_name: str, source: str) -> Layer | None:
    """The override layer for `node_name` from HAMi `nodeconfig` entries, if one names it.

    Raises ConfigError for a malformed entry or a mode this plugin does not support.
    """
    label = f"nodeconfig entry for {node_name!r} in {source}"
    for position, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{source}: nodeconfig[{position}] must be a mapping")
        if str(entry.get("name", "")) != node_name:
            continue
        layer = Layer(label)
        for key, value in entry.items():
            name = fold_name(str(key))
            if value is None or name in _NODE_FIELDS_IGNORED:
                continue
            if name in _NODE_FIELDS_CHECKED:
                expected = _NODE_FIELDS_CHECKED[name]
                if str(value).lower() != expected:
                    raise ConfigError(
                        f"{label}: {key}={value!r} is not supported (only {expected!r})"
                    )
            elif name == _NODE_FILTER_DEVICES:
                for setting, item in _filter_devices_values(value, f"{label}: {key}").items():
                    layer.put(setting, item, str(key))
            elif name in _NODE_FIELDS:
                layer.put(_NODE_FIELDS[name], value, str(key))
            else:
                logger.warning("%s: ignoring unknown key %r", label, key)
        return layer
    return None


def node_config_entries(path: str) -> list[object]:
    """The `nodeconfig` entries of the node config file at `path` (HAMi's config.json)."""
    document = read_yaml(path, "node config file")
    if document is None:
        return []
    if not isinstance(document, Mapping):
        raise ConfigError(f"node config file {path}: expected a mapping at the top level")
    entries = document.get("nodeconfig")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ConfigError(f"node config file {path}: 'nodeconfig' must be a list")
    return entries
