"""Typed settings of the device-plugin daemon, resolved once at start.

Precedence, highest first: command-line flag > environment variable > the per-node override
entry (HAMi's `nodeconfig`) > the config file > built-in defaults. Every value is parsed and
validated here; the rest of the daemon reads a frozen `DevicePluginSettings` and never looks at
the environment again (the NVIDIA plugin reads `DP_DISABLE_HEALTHCHECKS` deep inside its health
loop; we read it once).

The config file is YAML and accepts two shapes at once:

* HAMi's device ConfigMap (`/device-config.yaml`): a top-level `nvidia:` mapping with
  `deviceSplitCount`, `deviceMemoryScaling`, `deviceCoreScaling`, `libCudaLogLevel`,
  `resourceCountName`, `preConfiguredDeviceMemory` (keys matched case-insensitively, as Go's
  JSON decoding does; the scheduler's keys in the same section are ignored);
* our own flat keys, named like the `DevicePluginSettings` fields (`split_count: 4`), which win
  over the `nvidia:` section.

Per-node overrides use HAMi's shape (reference 4.1): `nodeconfig: [{name, devicesplitcount,
devicememoryscaling, devicecorescaling, ...}]`, either inside the config file or in a separate
`--node-config-file` (HAMi's `/config/config.json`; JSON is valid YAML). The entry whose `name`
equals the node name overrides only the fields it sets.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import yaml

from hami_plugin.protocol.govalues import parse_go_duration
from hami_plugin.protocol.model import RESOURCE_GPU

logger = logging.getLogger(__name__)

DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""Xids that are application errors, not GPU faults (NVIDIA plugin and HAMi ignore them)."""


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names where the bad value came from."""


@dataclass(frozen=True, slots=True)
class DevicePluginSettings:
    """Everything the device-plugin daemon is configured with (see `add_arguments`)."""

    node_name: str
    kubeconfig: str | None = None
    device_plugin_path: str = "/var/lib/kubelet/device-plugins/"
    nvml: str = "nvml"
    fake_gpus: str | None = None
    split_count: int = 10
    memory_scaling: float = 1.0
    cores_scaling: float = 1.0
    enable_numa_topology: bool = False
    resource_name: str = RESOURCE_GPU
    hook_path: str = "/usr/local"
    fail_on_init_error: bool = True
    health_recovery_seconds: float = 300.0
    health_wait_ms: int = 5000
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    healthchecks_disabled: bool = False
    register_interval_seconds: float = 30.0
    socket_name: str = "nvidia-gpu.sock"
    libcuda_log_level: str | None = None
    disable_core_limit: bool = False
    preconfigured_device_memory_mib: int = 0
    filter_uuids: frozenset[str] = frozenset()
    filter_indexes: frozenset[int] = frozenset()
    enable_preferred_allocation: bool = True
    metrics_bind_address: str = ":9394"
    """Where `/metrics` is served: HAMi's `:9394`, `host:port`, or `0` (off). Checked when the
    daemon starts the endpoint (`metrics.server.parse_bind_address`; the pure core imports
    this module, so it must not import the metrics package)."""
    vgpu_resync_interval_seconds: float = 300.0
    """How long the HAMi-core directory of a container whose pod left the node is kept
    (HAMi's monitor `HAMI_RESYNC_INTERVAL`, 5m)."""
    priority_feedback: bool = True
    """Run HAMi's priority feedback loop over the containers' shared regions (every 5 s)."""
    only_xids: frozenset[int] | None = None
    """When set, only these Xids mark a GPU unhealthy (`DP_DISABLE_HEALTHCHECKS=all` together
    with a `DP_ENABLE_HEALTHCHECKS` list); None means every Xid outside `ignored_xids` counts."""

    def xid_is_critical(self, xid: int) -> bool:
        """True when an XidCriticalError event with this Xid should mark the GPU unhealthy."""
        if self.healthchecks_disabled:
            return False
        if self.only_xids is not None:
            return xid in self.only_xids
        return xid not in self.ignored_xids


# --- value parsers: each takes the raw value (str from flags/env, any YAML scalar from files) ---


def _parse_str(raw: object) -> str:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"expected a string, got {raw!r}")
    return str(raw)


def _parse_optional_str(raw: object) -> str | None:
    if raw is None:
        return None
    text = _parse_str(raw)
    return text or None


def _parse_int(raw: object) -> int:
    if isinstance(raw, bool):
        raise ValueError(f"expected an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {raw!r}")


def _parse_float(raw: object) -> float:
    if isinstance(raw, bool):
        raise ValueError(f"expected a number, got {raw!r}")
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {raw!r}")


_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def _parse_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str | int):
        word = str(raw).strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"expected true or false, got {raw!r}")


def _split_list(raw: object) -> list[object]:
    if isinstance(raw, str):
        return [item.strip() for item in raw.split(",") if item.strip()]
    if isinstance(raw, list | tuple):
        return list(raw)
    raise ValueError(f"expected a list or a comma-separated string, got {raw!r}")


def _parse_duration_seconds(raw: object) -> float:
    """A Go duration (`5m`, `90s`, `1h30m`) or a number of seconds; not negative."""
    if isinstance(raw, bool):
        raise ValueError(f"expected a duration, got {raw!r}")
    if isinstance(raw, int | float):
        seconds = float(raw)
    else:
        text = str(raw).strip()
        try:
            seconds = float(text)
        except ValueError:
            seconds = parse_go_duration(text).total_seconds()
    if seconds < 0:
        raise ValueError(f"expected a duration that is not negative, got {raw!r}")
    return seconds


def _parse_str_set(raw: object) -> frozenset[str]:
    return frozenset(_parse_str(item) for item in _split_list(raw))


def _parse_int_set(raw: object) -> frozenset[int]:
    return frozenset(_parse_int(item) for item in _split_list(raw))


@dataclass(frozen=True, slots=True)
class _Option:
    """One setting: its flag, env variable and config-file keys."""

    field: str
    flag: str
    env: str | None
    parse: Callable[[object], Any]
    help: str
    nvidia_key: str | None = None
    node_key: str | None = None
    is_bool: bool = False

    @property
    def metavar(self) -> str:
        return _METAVARS.get(self.field, "VALUE")


_OPTIONS: tuple[_Option, ...] = (
    _Option("node_name", "--node-name", "NODE_NAME", _parse_optional_str,
            "name of this Kubernetes node (required)"),
    _Option("kubeconfig", "--kubeconfig", "KUBECONFIG", _parse_optional_str,
            "kubeconfig file (default: in-cluster config)"),
    _Option("device_plugin_path", "--device-plugin-path", "DEVICE_PLUGIN_PATH", _parse_str,
            "kubelet device-plugin directory (default /var/lib/kubelet/device-plugins/)"),
    _Option("nvml", "--nvml", "NVML_BACKEND", _parse_str,
            "GPU discovery backend: nvml (the driver) or fake (a YAML file) (default nvml)"),
    _Option("fake_gpus", "--fake-gpus", "FAKE_GPUS_FILE", _parse_optional_str,
            "YAML file describing fake GPUs, used with --nvml fake"),
    _Option("split_count", "--device-split-count", "DEVICE_SPLIT_COUNT", _parse_int,
            "vGPU slots advertised per physical GPU (default 10)",
            nvidia_key="deviceSplitCount", node_key="devicesplitcount"),
    _Option("memory_scaling", "--device-memory-scaling", "DEVICE_MEMORY_SCALING", _parse_float,
            "factor applied to each GPU's memory; > 1 oversubscribes (default 1.0)",
            nvidia_key="deviceMemoryScaling", node_key="devicememoryscaling"),
    _Option("cores_scaling", "--device-cores-scaling", "DEVICE_CORES_SCALING", _parse_float,
            "factor applied to each GPU's 100%% of cores (default 1.0)",
            nvidia_key="deviceCoreScaling", node_key="devicecorescaling"),
    _Option("enable_numa_topology", "--enable-numa-topology", "ENABLE_NUMA_TOPOLOGY",
            _parse_bool, "attach the GPU's NUMA node to each kubelet device (default false)",
            node_key="enablenumatopology", is_bool=True),
    _Option("resource_name", "--resource-name", "RESOURCE_NAME", _parse_str,
            "extended resource advertised to kubelet (default nvidia.com/gpu)",
            nvidia_key="resourceCountName"),
    _Option("hook_path", "--hook-path", "HOOK_PATH", _parse_str,
            "host directory holding vgpu/libvgpu.so (default /usr/local)"),
    _Option("fail_on_init_error", "--fail-on-init-error", "FAIL_ON_INIT_ERROR", _parse_bool,
            "exit when NVML cannot start; false: stay up advertising nothing and retry "
            "(default true)", is_bool=True),
    _Option("health_recovery_seconds", "--health-recovery-seconds", "HEALTH_RECOVERY_SECONDS",
            _parse_float, "seconds without errors after which an unhealthy GPU that answers "
            "NVML again is healthy (default 300; 0 disables recovery)"),
    _Option("health_wait_ms", "--health-wait-ms", "HEALTH_WAIT_MS", _parse_int,
            "NVML event wait timeout in milliseconds (default 5000)"),
    _Option("register_interval_seconds", "--register-interval-seconds",
            "REGISTER_INTERVAL_SECONDS", _parse_float,
            "how often the node register annotation is checked (default 30)"),
    _Option("socket_name", "--socket-name", "SOCKET_NAME", _parse_str,
            "socket file name under the device-plugin path (default nvidia-<resource suffix>"
            ".sock)"),
    _Option("libcuda_log_level", "--libcuda-log-level", "LIBCUDA_LOG_LEVEL",
            _parse_optional_str, "LIBCUDA_LOG_LEVEL given to containers (0 error, 1 warn, "
            "3 info, 4 debug)", nvidia_key="libCudaLogLevel", node_key="libcudaloglevel"),
    _Option("disable_core_limit", "--disable-core-limit", "DISABLE_CORE_LIMIT", _parse_bool,
            "tell HAMi-core not to limit SM use (default false)", nvidia_key="disableCoreLimit",
            is_bool=True),
    _Option("preconfigured_device_memory_mib", "--preconfigured-device-memory",
            "PRECONFIGURED_DEVICE_MEMORY", _parse_int,
            "memory in MiB used for a GPU whose memory NVML cannot report (default 0: skip it)",
            nvidia_key="preConfiguredDeviceMemory", node_key="preconfigureddevicememory"),
    _Option("filter_uuids", "--filter-device-uuids", "FILTER_DEVICE_UUIDS", _parse_str_set,
            "comma-separated GPU UUIDs this plugin leaves alone"),
    _Option("filter_indexes", "--filter-device-indexes", "FILTER_DEVICE_INDEXES",
            _parse_int_set, "comma-separated NVML indexes of GPUs this plugin leaves alone"),
    _Option("enable_preferred_allocation", "--enable-preferred-allocation",
            "ENABLE_PREFERRED_ALLOCATION", _parse_bool,
            "offer GetPreferredAllocation to kubelet (default true)",
            node_key="enablegetpreferredallocation", is_bool=True),
    _Option("metrics_bind_address", "--metrics-bind-address", "METRICS_BIND_ADDRESS",
            _parse_str, "where to serve Prometheus metrics at /metrics: :PORT, HOST:PORT, or 0 "
            "(off) (default :9394)"),
    _Option("vgpu_resync_interval_seconds", "--vgpu-resync-interval", "HAMI_RESYNC_INTERVAL",
            _parse_duration_seconds, "keep the HAMi-core directory of a container whose pod "
            "left the node this long (Go duration or seconds, default 5m)"),
    _Option("priority_feedback", "--priority-feedback", "PRIORITY_FEEDBACK", _parse_bool,
            "run HAMi's priority feedback loop over the containers' shared regions every 5 s "
            "(default true)", is_bool=True),
)  # fmt: skip

_METAVARS = {
    "node_name": "NAME",
    "kubeconfig": "FILE",
    "device_plugin_path": "DIR",
    "nvml": "nvml|fake",
    "fake_gpus": "FILE",
    "split_count": "N",
    "memory_scaling": "FACTOR",
    "cores_scaling": "FACTOR",
    "resource_name": "NAME",
    "hook_path": "DIR",
    "health_recovery_seconds": "SECONDS",
    "health_wait_ms": "MS",
    "register_interval_seconds": "SECONDS",
    "socket_name": "NAME",
    "libcuda_log_level": "LEVEL",
    "preconfigured_device_memory_mib": "MIB",
    "filter_uuids": "UUIDS",
    "filter_indexes": "INDEXES",
    "metrics_bind_address": "ADDRESS",
    "vgpu_resync_interval_seconds": "DURATION",
}
_OPTIONS_BY_FIELD = {option.field: option for option in _OPTIONS}
_NVIDIA_KEYS = {o.nvidia_key.lower(): o.field for o in _OPTIONS if o.nvidia_key}
_NODE_KEYS = {o.node_key: o.field for o in _OPTIONS if o.node_key}

# Settings that are not fields of DevicePluginSettings but shape them.
_CONFIG_FILE = ("--config-file", "CONFIG_FILE")
_NODE_CONFIG_FILE = ("--node-config-file", "NODE_CONFIG_FILE")
_DISABLE_HEALTHCHECKS = (
    "--disable-healthchecks",
    "DP_DISABLE_HEALTHCHECKS",
    "disable_healthchecks",
)
_ENABLE_HEALTHCHECKS = ("--enable-healthchecks", "DP_ENABLE_HEALTHCHECKS", "enable_healthchecks")

# HAMi node-config keys we read but that only have one supported value here.
_NODE_KEYS_CHECKED = {"operatingmode": "hami-core", "migstrategy": "none"}
_NODE_KEYS_IGNORED = frozenset({"name"})

_FLAT_KEYS = frozenset(
    {f.name for f in fields(DevicePluginSettings)}
    - {"ignored_xids", "healthchecks_disabled", "only_xids"}
    | {_DISABLE_HEALTHCHECKS[2], _ENABLE_HEALTHCHECKS[2], "filter_devices"}
)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the device-plugin flags; every default is None so that env and files can apply."""
    for option in _OPTIONS:
        help_text = f"{option.help} [env {option.env}]" if option.env else option.help
        if option.is_bool:
            parser.add_argument(
                option.flag,
                dest=_dest(option.flag),
                nargs="?",
                const="true",
                default=None,
                metavar="true|false",
                help=help_text,
            )
        else:
            parser.add_argument(
                option.flag,
                dest=_dest(option.flag),
                default=None,
                metavar=option.metavar,
                help=help_text,
            )
    parser.add_argument(
        _CONFIG_FILE[0],
        dest=_dest(_CONFIG_FILE[0]),
        default=None,
        metavar="FILE",
        help="YAML config file (HAMi device ConfigMap shape or flat keys) [env CONFIG_FILE]",
    )
    parser.add_argument(
        _NODE_CONFIG_FILE[0],
        dest=_dest(_NODE_CONFIG_FILE[0]),
        default=None,
        metavar="FILE",
        help='per-node override file, HAMi\'s config.json {"nodeconfig": [...]} '
        "[env NODE_CONFIG_FILE]",
    )
    parser.add_argument(
        _DISABLE_HEALTHCHECKS[0],
        dest=_dest(_DISABLE_HEALTHCHECKS[0]),
        default=None,
        metavar="all|XIDS",
        help="'all' or 'xids' turns health checks off; a comma list of Xids adds them to the "
        "ignored ones [env DP_DISABLE_HEALTHCHECKS]",
    )
    parser.add_argument(
        _ENABLE_HEALTHCHECKS[0],
        dest=_dest(_ENABLE_HEALTHCHECKS[0]),
        default=None,
        metavar="all|XIDS",
        help="comma list of Xids to count even if ignored by default, or 'all' "
        "[env DP_ENABLE_HEALTHCHECKS]",
    )


# --- config files -------------------------------------------------------------------------------


def _read_yaml(path: str, what: str) -> object:
    try:
        with open(path, encoding="utf-8") as stream:
            return yaml.safe_load(stream)
    except OSError as error:
        raise SettingsError(f"{what} {path}: cannot read: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        where = ""
        mark = getattr(error, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(error, "problem", None) or str(error)
        raise SettingsError(f"{what} {path}: not valid YAML{where}: {problem}") from None


@dataclass(frozen=True, slots=True)
class _Layer:
    """Raw values from one source, keyed by field name; `keys` says how each was spelled."""

    label: str
    values: dict[str, object]
    keys: dict[str, str]


def _filter_devices_values(raw: object, where: str) -> dict[str, object]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SettingsError(f"{where}: expected a mapping with 'uuid' and 'index' lists")
    values: dict[str, object] = {}
    for key, value in raw.items():
        name = str(key).lower()
        if name == "uuid":
            values["filter_uuids"] = [] if value is None else value
        elif name == "index":
            values["filter_indexes"] = [] if value is None else value
        else:
            raise SettingsError(f"{where}: unknown key {key!r} (known: uuid, index)")
    return values


def _config_file_layer(path: str, document: object) -> tuple[_Layer, list[object]]:
    """Split a config file into its settings layer and its `nodeconfig` entries."""
    label = f"config file {path}"
    if document is None:
        return _Layer(label, {}, {}), []
    if not isinstance(document, Mapping):
        raise SettingsError(f"{label}: expected a mapping at the top level")
    values: dict[str, object] = {}
    keys: dict[str, str] = {}
    nvidia = document.get("nvidia")
    if nvidia is not None:
        if not isinstance(nvidia, Mapping):
            raise SettingsError(f"{label}: 'nvidia' must be a mapping")
        for key, value in nvidia.items():
            field_name = _NVIDIA_KEYS.get(str(key).lower())
            if field_name is not None and value is not None:
                values[field_name] = value
                keys[field_name] = f"nvidia.{key}"
    node_entries: list[object] = []
    for key, value in document.items():
        name = str(key)
        if name == "nvidia":
            continue
        if name == "nodeconfig":
            if value is not None and not isinstance(value, list):
                raise SettingsError(f"{label}: 'nodeconfig' must be a list")
            node_entries = list(value or [])
        elif name == "filter_devices":
            for field_name, item in _filter_devices_values(value, f"{label}: {name}").items():
                values[field_name] = item
                keys[field_name] = name
        elif name in _FLAT_KEYS:
            values[name] = value
            keys[name] = name
        elif not isinstance(value, Mapping | list):
            # Mappings and lists are other vendors' sections of HAMi's ConfigMap; a scalar we
            # do not know is most likely a typo.
            known = ", ".join(sorted(_FLAT_KEYS))
            raise SettingsError(f"{label}: unknown setting {name!r} (known: {known})")
    return _Layer(label, values, keys), node_entries


def _node_layer(entries: Sequence[object], node_name: str, source: str) -> _Layer | None:
    """The override layer for `node_name` from HAMi `nodeconfig` entries, if one names it."""
    label = f"nodeconfig entry for {node_name!r} in {source}"
    for position, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise SettingsError(f"{source}: nodeconfig[{position}] must be a mapping")
        if str(entry.get("name", "")) != node_name:
            continue
        values: dict[str, object] = {}
        keys: dict[str, str] = {}
        for key, value in entry.items():
            name = str(key).lower()
            if value is None or name in _NODE_KEYS_IGNORED:
                continue
            if name in _NODE_KEYS_CHECKED:
                expected = _NODE_KEYS_CHECKED[name]
                if str(value).lower() != expected:
                    raise SettingsError(
                        f"{label}: {key}={value!r} is not supported (only {expected!r})"
                    )
            elif name == "filterdevices":
                for field_name, item in _filter_devices_values(value, f"{label}: {key}").items():
                    values[field_name] = item
                    keys[field_name] = str(key)
            elif name in _NODE_KEYS:
                values[_NODE_KEYS[name]] = value
                keys[_NODE_KEYS[name]] = str(key)
            else:
                logger.warning("%s: ignoring unknown key %r", label, key)
        return _Layer(label, values, keys)
    return None


def _node_config_entries(path: str) -> list[object]:
    document = _read_yaml(path, "node config file")
    if document is None:
        return []
    if not isinstance(document, Mapping):
        raise SettingsError(f"node config file {path}: expected a mapping at the top level")
    entries = document.get("nodeconfig")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise SettingsError(f"node config file {path}: 'nodeconfig' must be a list")
    return entries


# --- health-check Xid lists -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _XidTokens:
    all: bool
    xids: frozenset[int]


def _parse_xid_tokens(raw: str, label: str) -> _XidTokens:
    """Parse a DP_*_HEALTHCHECKS value; malformed entries are skipped (NVIDIA behaviour)."""
    everything = False
    xids: set[int] = set()
    for token in raw.split(","):
        word = token.strip().lower()
        if not word:
            continue
        if word in ("all", "xids"):
            everything = True
            continue
        try:
            xids.add(int(word))
        except ValueError:
            logger.warning("%s: skipping %r, not an Xid number", label, token.strip())
    return _XidTokens(everything, frozenset(xids))


def _health_fields(
    disable: str | None, enable: str | None, labels: tuple[str, str]
) -> dict[str, Any]:
    disabled = _parse_xid_tokens(disable or "", labels[0])
    enabled = _parse_xid_tokens(enable or "", labels[1])
    if enabled.all:
        # "all" in the enable list counts every Xid, including the default ignored ones.
        return {"healthchecks_disabled": False, "ignored_xids": frozenset(), "only_xids": None}
    if disabled.all:
        if enabled.xids:
            return {
                "healthchecks_disabled": False,
                "ignored_xids": DEFAULT_IGNORED_XIDS | disabled.xids,
                "only_xids": enabled.xids,
            }
        return {
            "healthchecks_disabled": True,
            "ignored_xids": DEFAULT_IGNORED_XIDS,
            "only_xids": None,
        }
    ignored = (DEFAULT_IGNORED_XIDS | disabled.xids) - enabled.xids
    return {"healthchecks_disabled": False, "ignored_xids": frozenset(ignored), "only_xids": None}


# --- resolution -------------------------------------------------------------------------------


def _first(*candidates: tuple[object, str]) -> tuple[object, str] | None:
    for value, label in candidates:
        if value is not None:
            return value, label
    return None


def _default_socket_name(resource_name: str) -> str:
    # HAMi names the socket nvidia-<resource suffix>: nvidia.com/gpu -> nvidia-gpu.sock.
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"


def resolve_settings(args: argparse.Namespace, env: Mapping[str, str]) -> DevicePluginSettings:
    """Merge flags > env > per-node override > config file > defaults, then validate.

    `args` comes from a parser set up by `add_arguments`. Raises SettingsError naming the
    flag, env variable or file key whose value is wrong.
    """

    def flag_value(flag: str) -> object:
        return getattr(args, _dest(flag), None)

    def env_value(name: str | None) -> str | None:
        return env.get(name) if name else None

    config_file = _first(
        (flag_value(_CONFIG_FILE[0]), _CONFIG_FILE[0]),
        (env_value(_CONFIG_FILE[1]), _CONFIG_FILE[1]),
    )
    layers: list[_Layer] = []
    node_entries: list[object] = []
    config_path: str | None = None
    if config_file is not None and str(config_file[0]):
        config_path = str(config_file[0])
        file_layer, node_entries = _config_file_layer(
            config_path, _read_yaml(config_path, "config file")
        )
        layers.append(file_layer)

    env_layer = _Layer("environment", {}, {})
    flag_layer = _Layer("command line", {}, {})
    for option in _OPTIONS:
        raw_env = env_value(option.env)
        # An empty variable (a chart's `value: ""`) counts as unset.
        if raw_env and option.env is not None:
            env_layer.values[option.field] = raw_env
            env_layer.keys[option.field] = option.env
        raw_flag = flag_value(option.flag)
        if raw_flag is not None:
            flag_layer.values[option.field] = raw_flag
            flag_layer.keys[option.field] = option.flag

    # The node name picks the override entry, so it is resolved from the other layers first.
    node_name = _resolve_field("node_name", [*layers, env_layer, flag_layer])
    if not node_name:
        raise SettingsError("node name is required: set --node-name or NODE_NAME")
    node_layers: list[_Layer] = []
    if config_path is not None:
        found = _node_layer(node_entries, node_name, f"config file {config_path}")
        if found is not None:
            node_layers.append(found)
    node_file = _first(
        (flag_value(_NODE_CONFIG_FILE[0]), _NODE_CONFIG_FILE[0]),
        (env_value(_NODE_CONFIG_FILE[1]), _NODE_CONFIG_FILE[1]),
    )
    if node_file is not None and str(node_file[0]):
        path = str(node_file[0])
        found = _node_layer(_node_config_entries(path), node_name, f"node config file {path}")
        if found is not None:
            node_layers.append(found)

    ordered = [*layers, *node_layers, env_layer, flag_layer]
    values: dict[str, Any] = {"node_name": node_name}
    for option in _OPTIONS:
        if option.field == "node_name":
            continue
        resolved = _resolve_field(option.field, ordered)
        if resolved is not None:
            values[option.field] = resolved
    if "socket_name" not in values:
        values["socket_name"] = _default_socket_name(values.get("resource_name", RESOURCE_GPU))

    health_raw: list[str | None] = []
    health_labels: list[str] = []
    for flag, env_name, file_key in (_DISABLE_HEALTHCHECKS, _ENABLE_HEALTHCHECKS):
        file_value = layers[0].values.get(file_key) if layers else None
        chosen = _first(
            (flag_value(flag), flag),
            (env_value(env_name), env_name),
            (file_value, f"config file {config_path}: {file_key}"),
        )
        health_raw.append(None if chosen is None else str(chosen[0]))
        health_labels.append("" if chosen is None else chosen[1])
    values.update(
        _health_fields(health_raw[0], health_raw[1], (health_labels[0], health_labels[1]))
    )

    settings = DevicePluginSettings(**values)
    _validate(settings)
    return settings


def _resolve_field(field_name: str, ordered_layers: Sequence[_Layer]) -> Any:
    """Parse the value of one field from the highest layer that sets it (None if none does)."""
    for layer in reversed(ordered_layers):
        if field_name in layer.values:
            raw = layer.values[field_name]
            if raw is None:
                return None
            try:
                return _OPTIONS_BY_FIELD[field_name].parse(raw)
            except ValueError as error:
                where = layer.keys.get(field_name, field_name)
                label = (
                    where
                    if layer.label in ("environment", "command line")
                    else (f"{layer.label}: {where}")
                )
                raise SettingsError(f"{label}: {error}") from None
    return None


def _validate(settings: DevicePluginSettings) -> None:
    problems: list[str] = []
    if settings.split_count < 1:
        problems.append(f"device split count must be at least 1, got {settings.split_count}")
    if settings.memory_scaling <= 0:
        problems.append(f"device memory scaling must be > 0, got {settings.memory_scaling}")
    if settings.cores_scaling <= 0:
        problems.append(f"device cores scaling must be > 0, got {settings.cores_scaling}")
    if settings.nvml not in ("nvml", "fake"):
        problems.append(f"--nvml must be 'nvml' or 'fake', got {settings.nvml!r}")
    if settings.nvml == "fake" and not settings.fake_gpus:
        problems.append("--nvml fake needs --fake-gpus FILE (or FAKE_GPUS_FILE)")
    if settings.health_recovery_seconds < 0:
        problems.append(
            f"health recovery seconds must be >= 0, got {settings.health_recovery_seconds}"
        )
    if settings.health_wait_ms < 1:
        problems.append(f"health wait must be at least 1 ms, got {settings.health_wait_ms}")
    if settings.register_interval_seconds <= 0:
        problems.append(
            f"register interval must be > 0 seconds, got {settings.register_interval_seconds}"
        )
    if "/" not in settings.resource_name or settings.resource_name.startswith("/"):
        problems.append(
            f"resource name must look like <domain>/<name>, got {settings.resource_name!r}"
        )
    if not settings.socket_name or "/" in settings.socket_name:
        problems.append(f"socket name must be a plain file name, got {settings.socket_name!r}")
    if settings.preconfigured_device_memory_mib < 0:
        problems.append(
            "preconfigured device memory must be >= 0 MiB, got "
            f"{settings.preconfigured_device_memory_mib}"
        )
    if any(index < 0 for index in settings.filter_indexes):
        problems.append("filtered device indexes must be >= 0")
    if problems:
        raise SettingsError("; ".join(problems))
