"""The device plugin's config files, read into settings layers.

The config file (`--config-file`) is YAML and accepts two shapes at once:

* HAMi's device ConfigMap (`/device-config.yaml`), read as HAMi reads it
  (`config.device_config`: the `nvidia:` keys spelled exactly as HAMi's): the keys of its
  `nvidia:` section that the `OptionTable` names (`hami_key`: `deviceSplitCount`,
  `resourceCountName`, `migProfileAllowlist`, ...); the scheduler's keys there and other
  vendors' sections are ignored;
* our own flat keys, named like the `DevicePluginSettings` fields (`split_count: 4`), which win
  over the `nvidia:` section.

Per-node overrides use HAMi's shape (`docs/hami-reference.md` 4.1): `nodeconfig: [{name,
devicesplitcount, devicememoryscaling, devicecorescaling, operatingmode, ...}]`, either inside
the config file or in a separate `--node-config-file` (HAMi's `/config/config.json`; JSON is
valid YAML). The entry whose `name` equals the node name overrides only the fields it sets.
HAMi reads these entries with encoding/json (plugin/server.go:128-137), which matches keys
case-insensitively, so they are matched with Go's folding (`protocol.gojson.fold_name`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hami_plugin.config import ConfigError, Layer, read_yaml
from hami_plugin.config.device_config import read_device_config
from hami_plugin.protocol.gojson import fold_name

__all__ = ["ConfigFileShape", "config_file_layer", "node_config_entries", "node_layer"]

logger = logging.getLogger(__name__)

_NODE_NAME = fold_name("name")
_NODE_FILTER_DEVICES = fold_name("filterdevices")
_FILTER_UUID = fold_name("uuid")
_FILTER_INDEX = fold_name("index")


@dataclass(frozen=True, slots=True)
class ConfigFileShape:
    """Which keys the files may set: `flat_keys` (setting names, at the top of the config
    file), `hami_keys` (HAMi's `nvidia:` key -> setting) and `node_keys` (a `nodeconfig`
    entry's key -> setting)."""

    flat_keys: frozenset[str]
    hami_keys: Mapping[str, str]
    node_keys: Mapping[str, str]

    @property
    def folded_node_keys(self) -> dict[str, str]:
        """`node_keys` by folded key, as a key read from a file is matched."""
        return {fold_name(key): setting for key, setting in self.node_keys.items()}


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


def config_file_layer(path: str, shape: ConfigFileShape) -> tuple[Layer, list[object]]:
    """Read the config file at `path` into its settings layer and its `nodeconfig` entries.

    Raises ConfigError naming the file and the key at fault.
    """
    config = read_device_config(path, "config file")
    layer = Layer(config.label)
    for key, value in config.nvidia.items():
        if key in shape.hami_keys:
            layer.put(shape.hami_keys[key], value, f"nvidia.{key}")
    node_entries: list[object] = []
    for key, value in config.document.items():
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
        elif name in shape.flat_keys:
            layer.put(name, value, name)
        elif not isinstance(value, Mapping | list):
            # Mappings and lists are other vendors' sections of HAMi's ConfigMap; a scalar we
            # do not know is most likely a typo.
            known = ", ".join(sorted(shape.flat_keys))
            raise ConfigError(f"{layer.label}: unknown setting {name!r} (known: {known})")
    return layer, node_entries


def node_layer(
    entries: Sequence[object], node_name: str, source: str, shape: ConfigFileShape
) -> Layer | None:
    """The override layer for `node_name` from HAMi `nodeconfig` entries, if one names it.

    Raises ConfigError for a malformed entry or a value the setting's grammar refuses later.
    """
    label = f"nodeconfig entry for {node_name!r} in {source}"
    settings = shape.folded_node_keys
    for position, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{source}: nodeconfig[{position}] must be a mapping")
        if str(entry.get("name", "")) != node_name:
            continue
        layer = Layer(label)
        for key, value in entry.items():
            name = fold_name(str(key))
            if value is None or name == _NODE_NAME:
                continue
            if name == _NODE_FILTER_DEVICES:
                for setting, item in _filter_devices_values(value, f"{label}: {key}").items():
                    layer.put(setting, item, str(key))
            elif name in settings:
                layer.put(settings[name], value, str(key))
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
