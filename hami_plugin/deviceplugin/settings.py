"""Typed settings of the device-plugin daemon, resolved once at start.

Precedence, highest first: command-line flag > environment variable > the per-node override
entry (HAMi's `nodeconfig`) > the config file > built-in defaults. `OPTIONS` declares every
setting (flag, variable, grammar, HAMi's file keys, help; `config.options`); the rest of the
daemon reads a frozen `DevicePluginSettings`, and each part gets the small view it needs
(`inventory`, `health`, `device_list`). Nothing reads the environment later (the NVIDIA plugin
reads `DP_DISABLE_HEALTHCHECKS` deep inside its health loop; we read it once). The config
files' shapes are `deviceplugin.config_file`'s.

HAMi's device plugin flags (v2.10.0 cmd/device-plugin/nvidia/main.go) that its chart and users
pass are taken as it takes them: `-v` (klog's verbosity: 4 and above logs at debug level),
`--mig-strategy` (`none`, `single` or `mixed`, main.go:238-244; static MIG:
`deviceplugin.mig.static`), the device list flags (main.go:115-160; `deviceplugin.device_list`).
`--cdi-spec-dir` is ours: HAMi writes to `/var/run/cdi` always.
"""

from __future__ import annotations

import argparse
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from hami_plugin.config import (
    KLOG_DEBUG_VERBOSITY,
    ConfigError,
    Layer,
    parse_bool,
    parse_duration,
    parse_float,
    parse_int,
    parse_int_set,
    parse_klog_verbosity,
    parse_optional_str,
    parse_str,
    parse_str_set,
    pick,
    resolve,
)
from hami_plugin.config.options import Option, OptionTable
from hami_plugin.deviceplugin.config_file import (
    ConfigFileShape,
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
from hami_plugin.deviceplugin.health import DEFAULT_IGNORED_XIDS, HealthConfig
from hami_plugin.deviceplugin.inventory import InventoryConfig
from hami_plugin.deviceplugin.mig.static import MigStrategy
from hami_plugin.protocol.mig_allowlist import AllowedMigProfiles, parse_mig_profile_allowlist
from hami_plugin.protocol.model import RESOURCE_GPU, OperatingMode

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "OPTIONS",
    "DevicePluginSettings",
    "NvmlSource",
    "add_arguments",
    "resolve_log_level",
    "resolve_settings",
]

logger = logging.getLogger(__name__)


class NvmlSource(enum.StrEnum):
    """Where the GPUs come from (`--nvml`)."""

    NVML = "nvml"
    """The driver, through pynvml."""
    FAKE = "fake"
    """A YAML file of GPUs (`--fake-gpus`)."""


@dataclass(frozen=True, slots=True)
class DevicePluginSettings:
    """Everything the device-plugin daemon is configured with (see `OPTIONS`)."""

    node_name: str
    kubeconfig: str | None = None
    device_plugin_path: str = "/var/lib/kubelet/device-plugins/"
    nvml: NvmlSource = NvmlSource.NVML
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
    """Where `/metrics` is served: HAMi's `:9394`, `host:port`, or `0` (off); checked when the
    daemon starts the endpoint (`metrics.server.parse_bind_address`)."""
    probe_bind_address: str = "0"
    """Where kubelet's liveness check `/healthz` is served (`httpserve.probes`): `host:port`,
    or `0` (off)."""
    vgpu_resync_interval_seconds: float = 300.0
    """How long the HAMi-core directory of a container whose pod left the node is kept
    (HAMi's monitor `HAMI_RESYNC_INTERVAL`, 5m)."""
    priority_feedback: bool = True
    """Run HAMi's priority feedback loop over the containers' shared regions (every 5 s)."""
    booking_key_file: str | None = None
    """The scheduler's public booking keys (`config.keys`; a private key there is a start
    error): only bookings it signed are served. None: every booking is trusted, as HAMi's
    device plugin trusts them (one warning at start). Read when the daemon starts (an
    unreadable file is a start error)."""
    legacy_booking_key_file: str | None = None
    """HMAC keys of the scheme before (v1): bookings signed with them still verify (the upgrade
    window; a file that does not exist: none)."""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """Kubelet's PodResources API (v1), asked which of several not-started pods kubelet is
    admitting (in-flight/v2, docs/design.md 5.6). Empty: not used, the node says in-flight/v1."""
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
    mig_strategy: MigStrategy = MigStrategy.NONE
    """NVIDIA's `--mig-strategy`; see `deviceplugin.mig.static`."""
    operating_mode: OperatingMode = OperatingMode.HAMI_CORE
    """The node entry's `operatingmode` (HAMi server.go:149-151); `mig` is dynamic MIG
    (`deviceplugin.mig.dynamic`)."""
    mig_profile_allowlist: tuple[AllowedMigProfiles, ...] = ()
    """The device config's `nvidia.migProfileAllowlist`: the profiles each GPU model may be split
    into on a dynamic-MIG node (validated at load as HAMi's `ValidateMigProfileAllowlist`)."""

    @property
    def device_list(self) -> DeviceListConfig:
        """What Allocate needs to hand the GPU list to the runtime."""
        return DeviceListConfig(
            strategies=self.device_list_strategies,
            cdi_annotation_prefix=self.cdi_annotation_prefix,
            gdrcopy_enabled=self.gdrcopy_enabled,
            gds_enabled=self.gds_enabled,
            mofed_enabled=self.mofed_enabled,
        )

    @property
    def inventory(self) -> InventoryConfig:
        """What turns the node's GPUs into kubelet devices and register entries."""
        return InventoryConfig(
            split_count=self.split_count,
            memory_scaling=self.memory_scaling,
            cores_scaling=self.cores_scaling,
            enable_numa_topology=self.enable_numa_topology,
            filter_uuids=self.filter_uuids,
            filter_indexes=self.filter_indexes,
            operating_mode=self.operating_mode,
        )

    @property
    def health(self) -> HealthConfig:
        """What decides a GPU's health."""
        return HealthConfig(
            ignored_xids=self.ignored_xids,
            only_xids=self.only_xids,
            disabled=self.healthchecks_disabled,
            recovery_seconds=self.health_recovery_seconds,
            wait_ms=self.health_wait_ms,
        )

    @property
    def debug_logging(self) -> bool:
        """True when `-v` asks for debug logging."""
        return self.verbosity >= KLOG_DEBUG_VERBOSITY

    def xid_is_critical(self, xid: int) -> bool:
        """True when an XidCriticalError event with this Xid should mark the GPU unhealthy."""
        return self.health.xid_is_critical(xid)


# --- the grammars the table does not share with the scheduler --------------------------------


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


def _parse_nvml(raw: object) -> NvmlSource | str:
    """`nvml` or `fake`; another name stays text, for `_validate` to refuse with the other
    problems."""
    text = parse_str(raw)
    return NvmlSource(text) if text in NvmlSource.__members__.values() else text


def _parse_mig_strategy(raw: object) -> MigStrategy:
    """HAMi's (NVIDIA's) `--mig-strategy`: `none`, `single` or `mixed` (main.go:238-244, whose
    error words `unknown MIG strategy: <s>` are kept)."""
    strategy = parse_str(raw)
    if strategy in MigStrategy.__members__.values():
        return MigStrategy(strategy)
    raise ValueError(f"unknown MIG strategy: {strategy} (none, single or mixed)")


def _parse_operating_mode(raw: object) -> OperatingMode:
    """A node entry's `operatingmode` (HAMi plugin/server.go:128-155, default `hami-core`):
    `hami-core` or `mig`; HAMi's `mps` is not implemented. Raises ValueError otherwise."""
    mode = str(raw)
    if mode not in OperatingMode.__members__.values():
        raise ValueError(f"operating mode {mode!r} is not supported (supported: hami-core, mig)")
    return OperatingMode(mode)


def _parse_log_level(raw: object) -> int:
    """`LOG_LEVEL`: a `logging` level name in any case (`info`, `WARNING`); another is info."""
    return logging.getLevelNamesMapping().get(parse_str(raw).upper(), logging.INFO)


OPTIONS = OptionTable(
    (
        Option("node_name", ("--node-name",), parse_optional_str, env="NODE_NAME",
               metavar="NAME", help="name of this Kubernetes node (required)"),
        Option("kubeconfig", ("--kubeconfig",), parse_optional_str, env="KUBECONFIG",
               metavar="FILE", help="kubeconfig file (default: in-cluster config)"),
        Option("device_plugin_path", ("--device-plugin-path",), parse_str,
               env="DEVICE_PLUGIN_PATH", metavar="DIR",
               help="kubelet device-plugin directory (default /var/lib/kubelet/device-plugins/)"),
        Option("nvml", ("--nvml",), _parse_nvml, env="NVML_BACKEND", metavar="nvml|fake",
               help="GPU discovery backend: nvml (the driver) or fake (a YAML file) "
               "(default nvml)"),
        Option("fake_gpus", ("--fake-gpus",), parse_optional_str, env="FAKE_GPUS_FILE",
               metavar="FILE", help="YAML file describing fake GPUs, used with --nvml fake"),
        Option("split_count", ("--device-split-count",), parse_int, env="DEVICE_SPLIT_COUNT",
               metavar="N", hami_key="deviceSplitCount", node_key="devicesplitcount",
               help="vGPU slots advertised per physical GPU (default 10)"),
        Option("memory_scaling", ("--device-memory-scaling",), parse_float,
               env="DEVICE_MEMORY_SCALING", metavar="FACTOR", hami_key="deviceMemoryScaling",
               node_key="devicememoryscaling",
               help="factor applied to each GPU's memory; > 1 oversubscribes (default 1.0)"),
        Option("cores_scaling", ("--device-cores-scaling",), parse_float,
               env="DEVICE_CORES_SCALING", metavar="FACTOR", hami_key="deviceCoreScaling",
               node_key="devicecorescaling",
               help="factor applied to each GPU's 100%% of cores (default 1.0)"),
        Option("enable_numa_topology", ("--enable-numa-topology",), parse_bool,
               env="ENABLE_NUMA_TOPOLOGY", hami_key="enableNumaTopology",
               node_key="enablenumatopology",
               help="attach the GPU's NUMA node to each kubelet device (default false)"),
        Option("enable_topology_score", ("--enable-topology-score",), parse_bool,
               env="ENABLE_TOPOLOGY_SCORE",
               help="measure GPU pair links (PCIe, NVLink) and publish "
               "hami.io/node-nvidia-score for the topology-aware policy (default false)"),
        Option("resource_name", ("--resource-name",), parse_str, env="RESOURCE_NAME",
               metavar="NAME", hami_key="resourceCountName",
               help="extended resource advertised to kubelet (default nvidia.com/gpu)"),
        Option("hook_path", ("--hook-path",), parse_str, env="HOOK_PATH", metavar="DIR",
               help="host directory holding vgpu/libvgpu.so (default /usr/local)"),
        Option("fail_on_init_error", ("--fail-on-init-error",), parse_bool,
               env="FAIL_ON_INIT_ERROR",
               help="exit when NVML cannot start; false: stay up advertising nothing and retry "
               "(default true)"),
        Option("health_recovery_seconds", ("--health-recovery-seconds",), parse_float,
               env="HEALTH_RECOVERY_SECONDS", metavar="SECONDS",
               help="seconds without errors after which an unhealthy GPU that answers NVML "
               "again is healthy (default 300; 0 disables recovery)"),
        Option("health_wait_ms", ("--health-wait-ms",), parse_int, env="HEALTH_WAIT_MS",
               metavar="MS", help="NVML event wait timeout in milliseconds (default 5000)"),
        Option("register_interval_seconds", ("--register-interval-seconds",), parse_float,
               env="REGISTER_INTERVAL_SECONDS", metavar="SECONDS",
               help="how often the node register annotation is checked (default 30)"),
        Option("socket_name", ("--socket-name",), parse_str, env="SOCKET_NAME", metavar="NAME",
               help="socket file name under the device-plugin path (default nvidia-<resource "
               "suffix>.sock)"),
        Option("libcuda_log_level", ("--libcuda-log-level",), parse_optional_str,
               env="LIBCUDA_LOG_LEVEL", metavar="LEVEL", hami_key="libCudaLogLevel",
               node_key="libcudaloglevel",
               help="LIBCUDA_LOG_LEVEL given to containers (0 error, 1 warn, 3 info, 4 debug)"),
        Option("disable_core_limit", ("--disable-core-limit",), parse_bool,
               env="DISABLE_CORE_LIMIT", hami_key="disableCoreLimit",
               help="tell HAMi-core not to limit SM use (default false)"),
        Option("preconfigured_device_memory_mib", ("--preconfigured-device-memory",), parse_int,
               env="PRECONFIGURED_DEVICE_MEMORY", metavar="MIB",
               hami_key="preConfiguredDeviceMemory", node_key="preconfigureddevicememory",
               help="memory in MiB used for a GPU whose memory NVML cannot report (default 0: "
               "skip it)"),
        Option("filter_uuids", ("--filter-device-uuids",), parse_str_set,
               env="FILTER_DEVICE_UUIDS", metavar="UUIDS",
               help="comma-separated GPU UUIDs this plugin leaves alone"),
        Option("filter_indexes", ("--filter-device-indexes",), parse_int_set,
               env="FILTER_DEVICE_INDEXES", metavar="INDEXES",
               help="comma-separated NVML indexes of GPUs this plugin leaves alone"),
        Option("enable_preferred_allocation", ("--enable-preferred-allocation",), parse_bool,
               env="ENABLE_PREFERRED_ALLOCATION", node_key="enablegetpreferredallocation",
               help="offer GetPreferredAllocation to kubelet (default true)"),
        Option("metrics_bind_address", ("--metrics-bind-address",), parse_str,
               env="METRICS_BIND_ADDRESS", metavar="ADDRESS",
               help="where to serve Prometheus metrics at /metrics: :PORT, HOST:PORT, or 0 "
               "(off) (default :9394)"),
        Option("probe_bind_address", ("--probe-bind-address",), parse_str,
               env="PROBE_BIND_ADDRESS", metavar="ADDRESS",
               help="where to serve kubelet's /healthz (the gRPC server and every listener "
               "alive) and /readyz: :PORT, HOST:PORT, or 0 (off, the default)"),
        Option("vgpu_resync_interval_seconds", ("--vgpu-resync-interval",),
               _parse_resync_seconds, env="HAMI_RESYNC_INTERVAL", metavar="DURATION",
               help="keep the HAMi-core directory of a container whose pod left the node this "
               "long (a Go duration, default 5m)"),
        Option("priority_feedback", ("--priority-feedback",), parse_bool,
               env="PRIORITY_FEEDBACK",
               help="run HAMi's priority feedback loop over the containers' shared regions "
               "every 5 s (default true)"),
        Option("booking_key_file", ("--booking-key-file",), parse_optional_str,
               env="HAMI_BOOKING_KEY_FILE", metavar="FILE",
               help="the scheduler's public booking keys, one ed25519-public line each: "
               "Allocate serves only bookings the scheduler signed (default: none, every "
               "booking is trusted as in HAMi)"),
        Option("legacy_booking_key_file", ("--legacy-booking-key-file",), parse_optional_str,
               env="HAMI_LEGACY_BOOKING_KEY_FILE", metavar="FILE",
               help="HMAC keys of the scheme before (v1), one per line: bookings signed with "
               "them are still served (the upgrade window; a missing file: none)"),
        Option("pod_resources_socket", ("--pod-resources-socket",), parse_str,
               env="POD_RESOURCES_SOCKET", metavar="PATH",
               help="kubelet's PodResources API socket, asked which pod kubelet is admitting "
               "when several could be (default /var/lib/kubelet/pod-resources/kubelet.sock; "
               "empty: not used)"),
        Option("device_list_strategies", ("--device-list-strategy",),
               parse_device_list_strategies, env="DEVICE_LIST_STRATEGY", metavar="STRATEGIES",
               help="how the GPU list reaches the container runtime, a comma list of envvar, "
               "volume-mounts, cdi-annotations, cdi-cri (default envvar)"),
        Option("cdi_annotation_prefix", ("--cdi-annotation-prefix",), parse_str,
               env="CDI_ANNOTATION_PREFIX", metavar="PREFIX",
               help="prefix of the CDI annotation keys with cdi-annotations (default "
               "cdi.k8s.io/)"),
        Option("cdi_spec_dir", ("--cdi-spec-dir",), parse_str, env="CDI_SPEC_DIR",
               metavar="DIR",
               help="directory the CDI spec of the node's GPUs is written to when a CDI "
               "strategy is on (default /var/run/cdi)"),
        Option("gdrcopy_enabled", ("--gdrcopy-enabled",), parse_bool, env="GDRCOPY_ENABLED",
               help="start GPU containers with NVIDIA_GDRCOPY=enabled (default false)"),
        Option("gds_enabled", ("--gds-enabled",), parse_bool, env="GDS_ENABLED",
               help="start GPU containers with NVIDIA_GDS=enabled (default false)"),
        Option("mofed_enabled", ("--mofed-enabled",), parse_bool, env="MOFED_ENABLED",
               help="start GPU containers with NVIDIA_MOFED=enabled (default false)"),
        Option("config_file", ("--config-file",), parse_optional_str, env="CONFIG_FILE",
               metavar="FILE",
               help="YAML config file (HAMi device ConfigMap shape or flat keys)"),
        Option("node_config_file", ("--node-config-file",), parse_optional_str,
               env="NODE_CONFIG_FILE", metavar="FILE",
               help='per-node override file, HAMi\'s config.json {"nodeconfig": [...]}'),
        Option("disable_healthchecks", ("--disable-healthchecks",), str,
               env="DP_DISABLE_HEALTHCHECKS", metavar="all|XIDS",
               help="'all' or 'xids' turns health checks off; a comma list of Xids adds them "
               "to the ignored ones"),
        Option("enable_healthchecks", ("--enable-healthchecks",), str,
               env="DP_ENABLE_HEALTHCHECKS", metavar="all|XIDS",
               help="comma list of Xids to count even if ignored by default, or 'all'"),
        Option("mig_strategy", ("--mig-strategy",), _parse_mig_strategy, env="MIG_STRATEGY",
               metavar="none|single|mixed", node_key="migstrategy",
               help="NVIDIA's MIG strategy: none (the default: MIG-enabled GPUs are left out), "
               "single (MIG devices replace the GPUs under nvidia.com/gpu) or mixed "
               "(nvidia.com/mig-<profile> resources)"),
        Option("operating_mode", (), _parse_operating_mode, node_key="operatingmode"),
        Option("mig_profile_allowlist", (), parse_mig_profile_allowlist,
               hami_key="migProfileAllowlist"),
        Option("verbosity", ("-v", "--v"), parse_klog_verbosity, metavar="N",
               help=f"klog verbosity, as HAMi's -v: {KLOG_DEBUG_VERBOSITY} and above logs at "
               "debug level, below leaves LOG_LEVEL (info) (default 0)"),
    ),
    env_in_help=True,
)  # fmt: skip
"""Every setting of `hami device-plugin`, in `--help` order."""

_LOGGING = OptionTable((Option("log_level", (), _parse_log_level, env="LOG_LEVEL"),))
"""`LOG_LEVEL`, resolved before the rest so that their resolution logs in its format."""

_FILE_SHAPE = ConfigFileShape(
    flat_keys=frozenset(
        {f.name for f in fields(DevicePluginSettings)}
        - {"ignored_xids", "healthchecks_disabled", "only_xids", "verbosity", "mig_strategy"}
        | {"disable_healthchecks", "enable_healthchecks", "filter_devices"}
    ),
    hami_keys=OPTIONS.hami_keys(),
    node_keys=OPTIONS.node_keys(),
)
"""The keys the config file may set directly, and HAMi's keys of its `nvidia:` section and
its `nodeconfig` entries."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the device-plugin flags; every default is None so that env and files can apply."""
    OPTIONS.add_to(parser)


def resolve_log_level(env: Mapping[str, str] | None = None) -> int:
    """`LOG_LEVEL` from `env` (the process's environment when None): a `logging` level, info
    when unset or unknown."""
    return int(_LOGGING.resolve([_LOGGING.environment(env)]).get("log_level", logging.INFO))


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


def _health_fields(layers: list[Layer]) -> dict[str, Any]:
    """`DP_DISABLE_HEALTHCHECKS` and `DP_ENABLE_HEALTHCHECKS` (or their flags, or file keys)
    as the settings' health fields."""
    disable = pick("disable_healthchecks", layers) or (None, "")
    enable = pick("enable_healthchecks", layers) or (None, "")
    disabled = _parse_xid_tokens("" if disable[0] is None else str(disable[0]), disable[1])
    enabled = _parse_xid_tokens("" if enable[0] is None else str(enable[0]), enable[1])
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


def _default_socket_name(resource_name: str) -> str:
    # HAMi names the socket nvidia-<resource suffix>: nvidia.com/gpu -> nvidia-gpu.sock.
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"


def resolve_settings(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> DevicePluginSettings:
    """Merge flags > env > per-node override > config file > defaults, then validate.

    `args` comes from a parser set up by `add_arguments`; `env` is the process's environment
    when None. Raises ConfigError naming the flag, env variable or file key whose value is
    wrong.
    """
    flags = OPTIONS.flags(args)
    environment = OPTIONS.environment(env)
    config_path = resolve("config_file", parse_optional_str, [environment, flags])
    file_layers: list[Layer] = []
    node_entries: list[object] = []
    if config_path is not None:
        file_layer, node_entries = config_file_layer(config_path, _FILE_SHAPE)
        file_layers.append(file_layer)
    # The node name picks the override entry, so it is resolved from the other layers first.
    node_name = resolve("node_name", parse_optional_str, [*file_layers, environment, flags])
    if not node_name:
        raise ConfigError("node name is required: set --node-name or NODE_NAME")
    if config_path is not None:
        source = f"config file {config_path}"
        file_layers.extend(_node_layers(node_entries, node_name, source))
    node_path = resolve("node_config_file", parse_optional_str, [environment, flags])
    if node_path is not None:
        source = f"node config file {node_path}"
        file_layers.extend(_node_layers(node_config_entries(node_path), node_name, source))

    layers = [*file_layers, environment, flags]
    values = OPTIONS.resolve(layers)
    settable = {f.name for f in fields(DevicePluginSettings)}
    chosen = {name: value for name, value in values.items() if name in settable}
    chosen.setdefault(
        "socket_name", _default_socket_name(chosen.get("resource_name", RESOURCE_GPU))
    )
    chosen.update(_health_fields(layers))
    settings = DevicePluginSettings(**chosen)
    _validate(settings)
    return settings


def _node_layers(entries: list[object], node_name: str, source: str) -> list[Layer]:
    found = node_layer(entries, node_name, source, _FILE_SHAPE)
    return [] if found is None else [found]


_RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("split_count", lambda value: value < 1, "must be at least 1"),
    ("memory_scaling", lambda value: value <= 0, "must be > 0"),
    ("cores_scaling", lambda value: value <= 0, "must be > 0"),
    ("health_recovery_seconds", lambda value: value < 0, "must be >= 0"),
    ("health_wait_ms", lambda value: value < 1, "must be at least 1"),
    ("register_interval_seconds", lambda value: value <= 0, "must be > 0"),
    ("resource_name", lambda name: "/" not in name or name.startswith("/"),
     "must look like <domain>/<name>"),
    ("socket_name", lambda name: not name or "/" in name, "must be a plain file name"),
    ("preconfigured_device_memory_mib", lambda value: value < 0, "must be >= 0 MiB"),
    ("pod_resources_socket", lambda path: path and not path.startswith("/"),
     "must be an absolute path (or empty: not used)"),
)  # fmt: skip
"""Settings out of range: the setting, the test that finds it bad, the rule it breaks."""


def _validate(settings: DevicePluginSettings) -> None:
    """Raises ConfigError listing every setting out of range, named by its flag (`name_of`)."""
    flag = OPTIONS.name_of
    problems = [
        f"{flag(name)} {rule}, got {getattr(settings, name)!r}"
        for name, bad, rule in _RANGES
        if bad(getattr(settings, name))
    ]
    if not isinstance(settings.nvml, NvmlSource):
        problems.append(f"--nvml must be 'nvml' or 'fake', got {settings.nvml!r}")
    if settings.nvml == NvmlSource.FAKE and not settings.fake_gpus:
        problems.append("--nvml fake needs --fake-gpus FILE (or FAKE_GPUS_FILE)")
    if any(index < 0 for index in settings.filter_indexes):
        problems.append(f"{flag('filter_indexes')} must be >= 0")
    if settings.device_list.any_cdi and not settings.cdi_spec_dir.startswith("/"):
        problems.append(
            f"{flag('cdi_spec_dir')} must be an absolute path, got {settings.cdi_spec_dir!r}"
        )
    if (
        settings.mig_strategy != MigStrategy.NONE
        and settings.operating_mode != OperatingMode.HAMI_CORE
    ):
        # Static MIG serves pre-made MIG devices; dynamic MIG makes its own on the same GPUs.
        problems.append(
            f"--mig-strategy {settings.mig_strategy} (static MIG) cannot be combined with "
            f"operatingmode {settings.operating_mode}"
        )
    if problems:
        raise ConfigError("; ".join(problems))
