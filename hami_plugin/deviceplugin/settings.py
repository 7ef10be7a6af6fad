"""Typed settings of the device-plugin daemon, resolved once at start.

Precedence, highest first: command-line flag > environment variable > the per-node override
entry (HAMi's `nodeconfig`) > the config file > built-in defaults. Every value is parsed with
the grammars of `hami_plugin.config` (Go's booleans and durations, as HAMi's own device plugin
takes them) and validated here; the rest of the daemon reads a frozen `DevicePluginSettings`
and never looks at the environment again (the NVIDIA plugin reads `DP_DISABLE_HEALTHCHECKS`
deep inside its health loop; we read it once). The config files' shapes are
`hami_plugin.deviceplugin.config_file`'s.

Two flags of HAMi's device plugin (v2.10.0 cmd/device-plugin/nvidia/main.go) that its chart and
users pass are taken as it takes them: `-v` (`--v`, klog's verbosity, no variable: 4 and above
logs at debug level) and `--mig-strategy` (`MIG_STRATEGY`, also the node entry's `migstrategy`):
`none` (HAMi's default), `single` or `mixed`, as main.go:238-244 validates them (static MIG:
`deviceplugin.mig.static`).
So are its device list flags (main.go:115-160): `--device-list-strategy` (`DEVICE_LIST_STRATEGY`,
a comma list as urfave's StringSlice reads it), `--cdi-annotation-prefix`, and the
`--gdrcopy-enabled`/`--gds-enabled`/`--mofed-enabled` booleans (`GDRCOPY_ENABLED`, ...; see
`deviceplugin.device_list`). `--cdi-spec-dir` is ours: HAMi writes to `/var/run/cdi` always.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from hami_plugin.config import (
    KLOG_DEBUG_VERBOSITY,
    ConfigError,
    Layer,
    add_bool_flag,
    env_layer,
    flag_dest,
    flag_layer,
    parse_bool,
    parse_duration,
    parse_float,
    parse_int,
    parse_int_set,
    parse_klog_verbosity,
    parse_optional_str,
    parse_setting,
    parse_str,
    parse_str_set,
    pick,
    resolve,
)
from hami_plugin.deviceplugin.config_file import (
    config_file_layer,
    node_config_entries,
    node_layer,
)
from hami_plugin.deviceplugin.device_list import (
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DeviceListConfig,
    DeviceListStrategy,
    parse_device_list_strategies,
)
from hami_plugin.deviceplugin.operating_mode import (
    parse_mig_profile_allowlist,
    parse_operating_mode,
)
from hami_plugin.protocol.mig_allowlist import AllowedMigProfiles
from hami_plugin.protocol.model import RESOURCE_GPU

logger = logging.getLogger(__name__)

DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""Xids that are application errors, not GPU faults (NVIDIA plugin and HAMi ignore them)."""


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
    enable_topology_score: bool = False
    """Publish `hami.io/node-nvidia-score` (HAMi: env ENABLE_TOPOLOGY_SCORE, default off,
    `register.go:279`)."""
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
    booking_key_file: str | None = None
    """The booking keys shared with the scheduler (`config.keys`): only bookings it signed are
    served. None: every booking is trusted, as HAMi's device plugin trusts them (one warning at
    start). Read when the daemon starts (an unreadable file is a start error)."""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """Kubelet's PodResources API (v1). While its `List` answers, Allocate asks it which of
    several not-started pods kubelet is admitting, and the node says
    `hami-plugin.io/allocate-protocol: in-flight/v2` (docs/design.md 5.6). Empty: not used,
    the node says in-flight/v1."""
    only_xids: frozenset[int] | None = None
    """When set, only these Xids mark a GPU unhealthy (`DP_DISABLE_HEALTHCHECKS=all` together
    with a `DP_ENABLE_HEALTHCHECKS` list); None means every Xid outside `ignored_xids` counts."""
    verbosity: int = 0
    """HAMi's `-v` (klog verbosity): from `KLOG_DEBUG_VERBOSITY` up the daemon logs at debug
    level; below it `LOG_LEVEL` (info by default) applies."""
    device_list_strategies: frozenset[DeviceListStrategy] = frozenset({DeviceListStrategy.ENVVAR})
    """How Allocate hands the GPU list to the runtime (HAMi's `--device-list-strategy`)."""
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    cdi_spec_dir: str = "/var/run/cdi"
    """Where the CDI spec of the node's GPUs is written when a CDI strategy is on."""
    gdrcopy_enabled: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    mig_strategy: str = "none"
    """NVIDIA's `--mig-strategy`: `none` (MIG-enabled GPUs left out), `single` (MIG devices under
    `nvidia.com/gpu`) or `mixed` (`nvidia.com/mig-<profile>`); see `deviceplugin.mig.static`."""
    operating_mode: str = "hami-core"
    """The node entry's `operatingmode` (HAMi server.go:149-151): `hami-core`, or `mig` for
    dynamic MIG (`deviceplugin.mig.dynamic`)."""
    mig_profile_allowlist: tuple[AllowedMigProfiles, ...] = ()
    """The device config's `nvidia.migProfileAllowlist`: the profiles each GPU model may be split
    into on a dynamic-MIG node (validated at load as HAMi's `ValidateMigProfileAllowlist`)."""

    @property
    def device_list(self) -> DeviceListConfig:
        """The device list part of the Allocate configuration."""
        return DeviceListConfig(
            strategies=self.device_list_strategies,
            cdi_annotation_prefix=self.cdi_annotation_prefix,
            gdrcopy_enabled=self.gdrcopy_enabled,
            gds_enabled=self.gds_enabled,
            mofed_enabled=self.mofed_enabled,
        )

    @property
    def debug_logging(self) -> bool:
        """True when `-v` asks for debug logging."""
        return self.verbosity >= KLOG_DEBUG_VERBOSITY

    def xid_is_critical(self, xid: int) -> bool:
        """True when an XidCriticalError event with this Xid should mark the GPU unhealthy."""
        if self.healthchecks_disabled:
            return False
        if self.only_xids is not None:
            return xid in self.only_xids
        return xid not in self.ignored_xids


def _parse_resync_seconds(raw: object) -> float:
    """A Go duration (`5m`), as HAMi reads `HAMI_RESYNC_INTERVAL`; a YAML number in the config
    file is seconds (the flat key says so). Not negative."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        seconds = float(raw)
    else:
        seconds = parse_duration(raw).total_seconds()
    if seconds < 0:
        raise ValueError(f"expected a duration that is not negative, got {raw!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class _Option:
    """One setting: its field, flag, env variable, grammar and help."""

    field: str
    flag: str
    env: str
    parse: Callable[[object], Any]
    help: str


_OPTIONS: tuple[_Option, ...] = (
    _Option("node_name", "--node-name", "NODE_NAME", parse_optional_str,
            "name of this Kubernetes node (required)"),
    _Option("kubeconfig", "--kubeconfig", "KUBECONFIG", parse_optional_str,
            "kubeconfig file (default: in-cluster config)"),
    _Option("device_plugin_path", "--device-plugin-path", "DEVICE_PLUGIN_PATH", parse_str,
            "kubelet device-plugin directory (default /var/lib/kubelet/device-plugins/)"),
    _Option("nvml", "--nvml", "NVML_BACKEND", parse_str,
            "GPU discovery backend: nvml (the driver) or fake (a YAML file) (default nvml)"),
    _Option("fake_gpus", "--fake-gpus", "FAKE_GPUS_FILE", parse_optional_str,
            "YAML file describing fake GPUs, used with --nvml fake"),
    _Option("split_count", "--device-split-count", "DEVICE_SPLIT_COUNT", parse_int,
            "vGPU slots advertised per physical GPU (default 10)"),
    _Option("memory_scaling", "--device-memory-scaling", "DEVICE_MEMORY_SCALING", parse_float,
            "factor applied to each GPU's memory; > 1 oversubscribes (default 1.0)"),
    _Option("cores_scaling", "--device-cores-scaling", "DEVICE_CORES_SCALING", parse_float,
            "factor applied to each GPU's 100%% of cores (default 1.0)"),
    _Option("enable_numa_topology", "--enable-numa-topology", "ENABLE_NUMA_TOPOLOGY",
            parse_bool, "attach the GPU's NUMA node to each kubelet device (default false)"),
    _Option("enable_topology_score", "--enable-topology-score", "ENABLE_TOPOLOGY_SCORE",
            parse_bool, "measure GPU pair links (PCIe, NVLink) and publish "
            "hami.io/node-nvidia-score for the topology-aware policy (default false)"),
    _Option("resource_name", "--resource-name", "RESOURCE_NAME", parse_str,
            "extended resource advertised to kubelet (default nvidia.com/gpu)"),
    _Option("hook_path", "--hook-path", "HOOK_PATH", parse_str,
            "host directory holding vgpu/libvgpu.so (default /usr/local)"),
    _Option("fail_on_init_error", "--fail-on-init-error", "FAIL_ON_INIT_ERROR", parse_bool,
            "exit when NVML cannot start; false: stay up advertising nothing and retry "
            "(default true)"),
    _Option("health_recovery_seconds", "--health-recovery-seconds", "HEALTH_RECOVERY_SECONDS",
            parse_float, "seconds without errors after which an unhealthy GPU that answers "
            "NVML again is healthy (default 300; 0 disables recovery)"),
    _Option("health_wait_ms", "--health-wait-ms", "HEALTH_WAIT_MS", parse_int,
            "NVML event wait timeout in milliseconds (default 5000)"),
    _Option("register_interval_seconds", "--register-interval-seconds",
            "REGISTER_INTERVAL_SECONDS", parse_float,
            "how often the node register annotation is checked (default 30)"),
    _Option("socket_name", "--socket-name", "SOCKET_NAME", parse_str,
            "socket file name under the device-plugin path (default nvidia-<resource suffix>"
            ".sock)"),
    _Option("libcuda_log_level", "--libcuda-log-level", "LIBCUDA_LOG_LEVEL",
            parse_optional_str, "LIBCUDA_LOG_LEVEL given to containers (0 error, 1 warn, "
            "3 info, 4 debug)"),
    _Option("disable_core_limit", "--disable-core-limit", "DISABLE_CORE_LIMIT", parse_bool,
            "tell HAMi-core not to limit SM use (default false)"),
    _Option("preconfigured_device_memory_mib", "--preconfigured-device-memory",
            "PRECONFIGURED_DEVICE_MEMORY", parse_int,
            "memory in MiB used for a GPU whose memory NVML cannot report (default 0: skip it)"),
    _Option("filter_uuids", "--filter-device-uuids", "FILTER_DEVICE_UUIDS", parse_str_set,
            "comma-separated GPU UUIDs this plugin leaves alone"),
    _Option("filter_indexes", "--filter-device-indexes", "FILTER_DEVICE_INDEXES",
            parse_int_set, "comma-separated NVML indexes of GPUs this plugin leaves alone"),
    _Option("enable_preferred_allocation", "--enable-preferred-allocation",
            "ENABLE_PREFERRED_ALLOCATION", parse_bool,
            "offer GetPreferredAllocation to kubelet (default true)"),
    _Option("metrics_bind_address", "--metrics-bind-address", "METRICS_BIND_ADDRESS",
            parse_str, "where to serve Prometheus metrics at /metrics: :PORT, HOST:PORT, or 0 "
            "(off) (default :9394)"),
    _Option("vgpu_resync_interval_seconds", "--vgpu-resync-interval", "HAMI_RESYNC_INTERVAL",
            _parse_resync_seconds, "keep the HAMi-core directory of a container whose pod "
            "left the node this long (a Go duration, default 5m)"),
    _Option("priority_feedback", "--priority-feedback", "PRIORITY_FEEDBACK", parse_bool,
            "run HAMi's priority feedback loop over the containers' shared regions every 5 s "
            "(default true)"),
    _Option("booking_key_file", "--booking-key-file", "HAMI_BOOKING_KEY_FILE",
            parse_optional_str, "file of booking keys shared with the scheduler, one per line: "
            "Allocate serves only bookings the scheduler signed (default: none, every booking "
            "is trusted as in HAMi)"),
    _Option("pod_resources_socket", "--pod-resources-socket", "POD_RESOURCES_SOCKET",
            parse_str, "kubelet's PodResources API socket, asked which pod kubelet is "
            "admitting when several could be (default "
            "/var/lib/kubelet/pod-resources/kubelet.sock; empty: not used)"),
    _Option("device_list_strategies", "--device-list-strategy", "DEVICE_LIST_STRATEGY",
            parse_device_list_strategies, "how the GPU list reaches the container runtime, a "
            "comma list of envvar, volume-mounts, cdi-annotations, cdi-cri (default envvar)"),
    _Option("cdi_annotation_prefix", "--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX",
            parse_str, "prefix of the CDI annotation keys with cdi-annotations (default "
            "cdi.k8s.io/)"),
    _Option("cdi_spec_dir", "--cdi-spec-dir", "CDI_SPEC_DIR", parse_str,
            "directory the CDI spec of the node's GPUs is written to when a CDI strategy is "
            "on (default /var/run/cdi)"),
    _Option("gdrcopy_enabled", "--gdrcopy-enabled", "GDRCOPY_ENABLED", parse_bool,
            "start GPU containers with NVIDIA_GDRCOPY=enabled (default false)"),
    _Option("gds_enabled", "--gds-enabled", "GDS_ENABLED", parse_bool,
            "start GPU containers with NVIDIA_GDS=enabled (default false)"),
    _Option("mofed_enabled", "--mofed-enabled", "MOFED_ENABLED", parse_bool,
            "start GPU containers with NVIDIA_MOFED=enabled (default false)"),
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
    "booking_key_file": "FILE",
    "pod_resources_socket": "PATH",
    "device_list_strategies": "STRATEGIES",
    "cdi_annotation_prefix": "PREFIX",
    "cdi_spec_dir": "DIR",
}

# Settings that are not fields of DevicePluginSettings but shape them: (flag, env variable).
_SHAPING = {
    "config_file": ("--config-file", "CONFIG_FILE"),
    "node_config_file": ("--node-config-file", "NODE_CONFIG_FILE"),
    "disable_healthchecks": ("--disable-healthchecks", "DP_DISABLE_HEALTHCHECKS"),
    "enable_healthchecks": ("--enable-healthchecks", "DP_ENABLE_HEALTHCHECKS"),
    "mig_strategy": ("--mig-strategy", "MIG_STRATEGY"),
}
_FLAGS = {o.field: o.flag for o in _OPTIONS} | {k: flag for k, (flag, _) in _SHAPING.items()}
_ENV = {o.field: o.env for o in _OPTIONS} | {k: env for k, (_, env) in _SHAPING.items()}

_FLAT_KEYS = frozenset(
    {f.name for f in fields(DevicePluginSettings)}
    - {"ignored_xids", "healthchecks_disabled", "only_xids", "verbosity", "mig_strategy"}
    | {"disable_healthchecks", "enable_healthchecks", "filter_devices"}
)
"""The keys the config file may set directly."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the device-plugin flags; every default is None so that env and files can apply."""
    for option in _OPTIONS:
        help_text = f"{option.help} [env {option.env}]"
        if option.parse is parse_bool:
            add_bool_flag(parser, option.flag, help=help_text)
        else:
            parser.add_argument(
                option.flag,
                dest=flag_dest(option.flag),
                default=None,
                metavar=_METAVARS.get(option.field, "VALUE"),
                help=help_text,
            )
    parser.add_argument(
        "--config-file",
        default=None,
        metavar="FILE",
        help="YAML config file (HAMi device ConfigMap shape or flat keys) [env CONFIG_FILE]",
    )
    parser.add_argument(
        "--node-config-file",
        default=None,
        metavar="FILE",
        help='per-node override file, HAMi\'s config.json {"nodeconfig": [...]} '
        "[env NODE_CONFIG_FILE]",
    )
    parser.add_argument(
        "--disable-healthchecks",
        default=None,
        metavar="all|XIDS",
        help="'all' or 'xids' turns health checks off; a comma list of Xids adds them to the "
        "ignored ones [env DP_DISABLE_HEALTHCHECKS]",
    )
    parser.add_argument(
        "--enable-healthchecks",
        default=None,
        metavar="all|XIDS",
        help="comma list of Xids to count even if ignored by default, or 'all' "
        "[env DP_ENABLE_HEALTHCHECKS]",
    )
    parser.add_argument(
        "--mig-strategy",
        default=None,
        metavar="none|single|mixed",
        help="NVIDIA's MIG strategy: none (the default: MIG-enabled GPUs are left out), "
        "single (MIG devices replace the GPUs under nvidia.com/gpu) or mixed "
        "(nvidia.com/mig-<profile> resources) [env MIG_STRATEGY]",
    )
    parser.add_argument(
        "-v",
        "--v",
        dest="v",
        default=None,
        metavar="N",
        help=f"klog verbosity, as HAMi's -v: {KLOG_DEBUG_VERBOSITY} and above logs at debug "
        "level, below leaves LOG_LEVEL (info) (default 0)",
    )


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


def _parse_mig_strategy(raw: object) -> str:
    """HAMi's (NVIDIA's) `--mig-strategy`: `none`, `single` or `mixed` (main.go:238-244, whose
    error words `unknown MIG strategy: <s>` are kept)."""
    strategy = parse_str(raw)
    if strategy in ("none", "single", "mixed"):
        return strategy
    raise ValueError(f"unknown MIG strategy: {strategy} (none, single or mixed)")


def _default_socket_name(resource_name: str) -> str:
    # HAMi names the socket nvidia-<resource suffix>: nvidia.com/gpu -> nvidia-gpu.sock.
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"


def resolve_settings(args: argparse.Namespace, env: Mapping[str, str]) -> DevicePluginSettings:
    """Merge flags > env > per-node override > config file > defaults, then validate.

    `args` comes from a parser set up by `add_arguments`. Raises ConfigError naming the
    flag, env variable or file key whose value is wrong.
    """
    flags = flag_layer(args, _FLAGS)
    environment = env_layer(env, _ENV)
    config_path = resolve("config_file", parse_optional_str, [environment, flags])
    file_layers: list[Layer] = []
    node_entries: list[object] = []
    if config_path is not None:
        file_layer, node_entries = config_file_layer(config_path, _FLAT_KEYS)
        file_layers.append(file_layer)

    # The node name picks the override entry, so it is resolved from the other layers first.
    node_name = resolve("node_name", parse_optional_str, [*file_layers, environment, flags])
    if not node_name:
        raise ConfigError("node name is required: set --node-name or NODE_NAME")
    node_layers: list[Layer] = []
    if config_path is not None:
        found = node_layer(node_entries, node_name, f"config file {config_path}")
        if found is not None:
            node_layers.append(found)
    node_path = resolve("node_config_file", parse_optional_str, [environment, flags])
    if node_path is not None:
        source = f"node config file {node_path}"
        found = node_layer(node_config_entries(node_path), node_name, source)
        if found is not None:
            node_layers.append(found)

    ordered = [*file_layers, *node_layers, environment, flags]
    values: dict[str, Any] = {"node_name": node_name}
    for option in _OPTIONS:
        if option.field == "node_name":
            continue
        resolved = resolve(option.field, option.parse, ordered)
        if resolved is not None:
            values[option.field] = resolved
    if "socket_name" not in values:
        values["socket_name"] = _default_socket_name(values.get("resource_name", RESOURCE_GPU))

    mig_strategy = resolve("mig_strategy", _parse_mig_strategy, [*node_layers, environment, flags])
    if mig_strategy is not None:
        values["mig_strategy"] = mig_strategy
    for name, parse in (
        ("operating_mode", parse_operating_mode),
        ("mig_profile_allowlist", parse_mig_profile_allowlist),
    ):
        mig_value = resolve(name, parse, ordered)  # dynamic MIG: the files only
        if mig_value is not None:
            values[name] = mig_value
    if args.v is not None:
        values["verbosity"] = parse_setting("-v", args.v, parse_klog_verbosity)

    health_layers = [*file_layers, environment, flags]
    disable = pick("disable_healthchecks", health_layers) or (None, "")
    enable = pick("enable_healthchecks", health_layers) or (None, "")
    values.update(
        _health_fields(
            None if disable[0] is None else str(disable[0]),
            None if enable[0] is None else str(enable[0]),
            (disable[1], enable[1]),
        )
    )

    settings = DevicePluginSettings(**values)
    _validate(settings)
    return settings


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
    if settings.pod_resources_socket and not settings.pod_resources_socket.startswith("/"):
        problems.append(
            "pod resources socket must be an absolute path (or empty: not used), got "
            f"{settings.pod_resources_socket!r}"
        )
    if settings.device_list.any_cdi and not settings.cdi_spec_dir.startswith("/"):
        problems.append(f"CDI spec dir must be an absolute path, got {settings.cdi_spec_dir!r}")
    if settings.mig_strategy != "none" and settings.operating_mode != "hami-core":
        # Static MIG serves pre-made MIG devices; dynamic MIG makes its own on the same GPUs.
        problems.append(
            f"--mig-strategy {settings.mig_strategy} (static MIG) cannot be combined with "
            f"operatingmode {settings.operating_mode}"
        )
    if problems:
        raise ConfigError("; ".join(problems))
