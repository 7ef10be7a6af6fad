"""`hami scheduler`'s configuration: flags (HAMi's names), environment and the device config
file, resolved and validated once at start (precedence: flag > environment > file > default).
`OPTIONS` declares every setting (`config.options`); nothing reads the environment after
`resolve_config`: the pod's own name and namespace (for leader election) and `$KUBECONFIG` are
resolved here too.

Booleans and durations are Go's (`--leader-elect=true`, `5m`, `28s`, `1m30s`), as HAMi's pflag
flags take them (`hami_plugin.config.values`). HAMi's underscore spellings `--http_bind`,
`--cert_file`, `--key_file` are accepted as aliases of the kebab-case flags.
`--device-config-file` is HAMi's device ConfigMap (`device-config.yaml`, read as
`config.device_config` reads it); its `nvidia:` section gives the request defaults and resource
names (`docs/hami-reference.md` 3.12).

HAMi's klog and client flags that its users carry in `extraArgs` work too: `--debug` and `-v`
(`--v`) set the log level (`-v` 4 and above, or `--debug`: debug; HAMi's `--debug` sets a
variable nothing reads, pkg/scheduler/config/config.go:478), and `--kube-qps`, `--kube-burst`,
`--kube-timeout` (HAMi v2.10.0 cmd/scheduler/main.go:75-77) set the Kubernetes client's rate
limit and per-request timeout, with client-go's meanings of 0 and negative values.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hami_plugin.config import (
    KLOG_DEBUG_VERBOSITY,
    LOG_LEVELS,
    ConfigError,
    parse_bool,
    parse_duration,
    parse_float,
    parse_int,
    parse_klog_verbosity,
    parse_optional_str,
    parse_setting,
    parse_str,
)
from hami_plugin.config.device_config import DeviceConfig, read_device_config
from hami_plugin.config.keys import KeyRole, load_booking_keys, load_legacy_keys
from hami_plugin.config.options import Option, OptionTable
from hami_plugin.protocol.address import BindAddress, parse_host_port
from hami_plugin.protocol.codec import AnnotationError, parse_gpu_policy, parse_node_policy
from hami_plugin.protocol.mig_allowlist import parse_mig_profile_allowlist
from hami_plugin.protocol.model import GpuPolicyName
from hami_plugin.scheduler.settings import ResourceNames, SchedulerSettings
from hami_plugin.scheduler.webhook import GpuCorePolicy, WebhookSettings

__all__ = ["OPTIONS", "SchedulerConfig", "add_arguments", "resolve_config"]

DEFAULT_HTTP_BIND = "127.0.0.1:8080"
DEFAULT_HTTPS_BIND = "0.0.0.0:443"
ENV_NODE_LOCK_EXPIRE = "HAMI_NODELOCK_EXPIRE"
ENV_BOOKING_KEY_FILE = "HAMI_BOOKING_KEY_FILE"
ENV_LEGACY_BOOKING_KEY_FILE = "HAMI_LEGACY_BOOKING_KEY_FILE"
ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
KUBE_DEFAULT_QPS = 5.0
KUBE_DEFAULT_BURST = 10
"""client-go's `rest.DefaultQPS` and `rest.DefaultBurst`, HAMi's defaults of `--kube-qps` and
`--kube-burst` (pkg/util/client/options.go:30-31): used when either flag is given (or is 0)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Everything `hami scheduler` runs with. Durations in seconds unless typed.

    `pod_namespace`/`pod_name` are this replica's pod (`$POD_NAMESPACE`/`$POD_NAME` from the
    downward API; "" outside a pod): the leader election's default namespace and identity.
    `client_ca_file`: with it the extender listener requires a client certificate signed by
    that CA. `webhook_host`/`webhook_port`: the webhook's own listener (`--webhook-bind`); None
    serves the webhook on the extender listener.
    """

    kubeconfig: str | None = None
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""
    webhook_host: str | None = None
    webhook_port: int = 0
    scheduler_name: str = "hami-scheduler"
    settings: SchedulerSettings = field(default_factory=SchedulerSettings)
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    node_lock_timeout: timedelta = timedelta(minutes=5)
    node_lock_retry_timeout_seconds: float = 28.0
    allocation_timeout_seconds: float = 120.0
    filter_booking_ttl_seconds: float = 30.0
    requeue_qps: float = 20.0
    """`--requeue-qps`: patches a second that ask kube-scheduler to retry parked GPU pods
    (`hami_plugin.extender.requeue`); 0 turns the requeue loop off."""
    requeue_window_seconds: float = 60.0
    burst_look_ahead: int = 16
    """`--burst-look-ahead`: fitting nodes past the policy's first a filter may try for one where
    the bind would not wait (`hami_plugin.scheduler.filter.decide`); 0: HAMi's choice always."""
    preemption: bool = True
    """`--preemption`: a GPU pod that fits nowhere takes GPUs back from pods of lower priority
    (docs/design.md 11); false: HAMi's behaviour, it stays Pending."""
    leader_elect: bool = False
    leader_elect_resource_name: str = ""
    leader_elect_resource_namespace: str = ""
    leader_elect_lease_duration_seconds: int = 15
    leader_elect_renew_deadline_seconds: float = 10.0
    leader_elect_retry_period_seconds: float = 2.0
    node_label_selector: Mapping[str, str] = field(default_factory=dict)
    metrics_bind_address: str = ":9395"
    probe_bind_address: str = "0"
    """`--probe-bind-address`: kubelet's probes on a listener of their own (plain HTTP,
    `hami_plugin.httpserve.probes`); `0`: off, the probes stay on the webhook listener."""
    max_body_bytes: int = 1024 * 1024
    booking_key_file: str = ""
    """`--booking-key-file`: the Ed25519 private keys (the first signs): sign bookings and
    count only signed ones; "" trusts every booking, as HAMi does."""
    legacy_booking_key_file: str = ""
    """`--legacy-booking-key-file`: HMAC keys of the scheme before (v1), for verifying only
    during the upgrade window (a file that does not exist: none)."""
    log_level: str = "info"
    """`--log-level`; debug with `--debug` or `-v` 4 and above (HAMi's klog flags)."""
    kube_qps: float | None = None
    """`--kube-qps`: API calls a second on average (client-side), with `kube_burst` at once;
    None: no client-side limit (neither flag given, or a negative `--kube-qps`)."""
    kube_burst: int | None = None
    kube_timeout_seconds: float | None = None
    """`--kube-timeout`: each API request's timeout; None: the client's own (10 s)."""
    pod_namespace: str = ""
    pod_name: str = ""

    @property
    def tls(self) -> bool:
        return bool(self.cert_file and self.key_file)


# --- the grammars of the scheduler's own flags ---------------------------------------------------


def _positive_duration(raw: object) -> timedelta:
    value = parse_duration(raw)
    if value <= timedelta(0):
        raise ValueError(f"{raw!r} must be positive")
    return value


def _duration_or_zero(raw: object) -> timedelta:
    value = parse_duration(raw)
    if value < timedelta(0):
        raise ValueError(f"{raw!r} must not be negative")
    return value


def _label_selector(raw: object) -> dict[str, str]:
    selector: dict[str, str] = {}
    for item in parse_str(raw).split(","):
        item = item.strip()
        if not item:
            continue
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        selector[key.strip()] = value.strip()
    return selector


def _kube_qps(raw: object) -> float:
    value = parse_float(raw)
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {raw!r}")
    return value


def _kube_burst(raw: object) -> int:
    value = parse_int(raw)
    if value < 0:
        raise ValueError(f"must not be negative (client-go refuses a negative burst), got {raw!r}")
    return value


def _kube_timeout(raw: object) -> timedelta:
    """HAMi's whole seconds (pflag `IntVar`), or a Go duration; not negative."""
    try:
        value = timedelta(seconds=parse_int(raw))
    except ValueError:
        try:
            value = parse_duration(raw)
        except ValueError:
            raise ValueError(
                f"expected whole seconds (as HAMi: 30) or a Go duration (30s), got {raw!r}"
            ) from None
    if value < timedelta(0):
        raise ValueError(f"{raw!r} must not be negative")
    return value


def _pod_field(raw: object) -> str:
    return parse_str(raw).strip()


OPTIONS = OptionTable(
    (
        Option("kubeconfig", ("--kubeconfig",), parse_optional_str, env="KUBECONFIG",
               metavar="PATH", help="kubeconfig file (env KUBECONFIG, else in-cluster)"),
        Option("http_bind", ("--http-bind", "--http_bind"), parse_optional_str,
               metavar="HOST:PORT", help=f"filter/bind/webhook/probes address "
               f"({DEFAULT_HTTP_BIND}; TLS: {DEFAULT_HTTPS_BIND})"),
        Option("cert_file", ("--cert-file", "--cert_file"), parse_str, default="",
               metavar="PATH", help="TLS certificate (PEM): HTTPS with --key-file"),
        Option("key_file", ("--key-file", "--key_file"), parse_str, default="", metavar="PATH",
               help="TLS private key (PEM)"),
        Option("client_ca_file", ("--client-ca-file",), parse_str, default="", metavar="PATH",
               help="CA (PEM) whose client certificates alone may call /filter and /bind (needs "
               "--webhook-bind)"),
        Option("webhook_bind", ("--webhook-bind",), parse_str, default="", metavar="HOST:PORT",
               help="serve /webhook and the probes on their own TLS listener (same "
               "certificate)"),
        Option("scheduler_name", ("--scheduler-name",), parse_str, default="hami-scheduler",
               metavar="NAME", help="schedulerName the webhook sets on GPU pods, and the "
               "events' source (hami-scheduler)"),
        Option("node_scheduler_policy", ("--node-scheduler-policy",), parse_str,
               default="binpack", metavar="P", help="node policy: binpack or spread (binpack)"),
        Option("gpu_scheduler_policy", ("--gpu-scheduler-policy",), parse_str,
               default="spread", metavar="P", help=f"default GPU policy: "
               f"{', '.join(GpuPolicyName)}, or a comma chain such as numa,binpack (spread)"),
        Option("node_lock_timeout", ("--node-lock-timeout",), _positive_duration,
               env=ENV_NODE_LOCK_EXPIRE, default="5m", metavar="DURATION",
               help=f"age at which a node lock is stale (5m; env {ENV_NODE_LOCK_EXPIRE})"),
        Option("node_lock_retry_timeout", ("--node-lock-retry-timeout",), _duration_or_zero,
               default="28s", metavar="DURATION",
               help="how long a bind waits for a node lock or an in-flight pod (28s)"),
        Option("allocation_timeout", ("--allocation-timeout",), _positive_duration,
               default="2m", metavar="DURATION", help="a pod still allocating after this is "
               "marked failed (its GPUs freed; with a booking key once it ends) (2m)"),
        Option("filter_booking_ttl", ("--filter-booking-ttl",), _positive_duration,
               default="30s", metavar="DURATION",
               help="how long a filter booking that no bind follows holds its GPUs (30s)"),
        Option("requeue_qps", ("--requeue-qps",), parse_float, flag_type=float, default=20.0,
               metavar="N", help="once able to answer again, ask kube-scheduler to retry the "
               "GPU pods it parked, at most N pod patches a second; 0 turns it off (20)"),
        Option("burst_look_ahead", ("--burst-look-ahead",), parse_int, flag_type=int,
               default=16, metavar="N", help="when the bind would wait on the node the policy "
               "ranks first (a node lock, or a pod in flight kubelet could confuse with this "
               "one), answer the first of the next N fitting nodes in policy order where it "
               "would not; 0 always answers the policy's first (16)"),
        Option("requeue_window", ("--requeue-window",), _positive_duration, default="60s",
               metavar="DURATION", help="how long after becoming able to answer parked pods "
               "are looked for (60s)"),
        Option("preemption", ("--preemption",), parse_bool, default="true",
               help="a GPU pod that fits nowhere evicts pods of lower priority whose GPUs it "
               "needs, as kube-scheduler preempts for CPU and memory (true)"),
        Option("leader_elect", ("--leader-elect",), parse_bool, default="false",
               help="elect one active replica through a Lease (false)"),
        Option("leader_elect_resource_name", ("--leader-elect-resource-name",), parse_str,
               default="", metavar="NAME", help="the Lease's name (hami-scheduler-extender)"),
        Option("leader_elect_resource_namespace", ("--leader-elect-resource-namespace",),
               parse_str, default="", metavar="NS",
               help=f"the Lease's namespace (env {ENV_POD_NAMESPACE}, else kube-system)"),
        Option("leader_elect_lease_duration", ("--leader-elect-lease-duration",),
               _positive_duration, default="15s", metavar="DURATION", help="how long a lease "
               "holds after its last renewal; followers wait this long (15s)"),
        Option("leader_elect_renew_deadline", ("--leader-elect-renew-deadline",),
               _positive_duration, default="10s", metavar="DURATION",
               help="the leader steps down when it could not renew for this long (10s)"),
        Option("leader_elect_retry_period", ("--leader-elect-retry-period",),
               _positive_duration, default="2s", metavar="DURATION",
               help="how often the lease is renewed or tried (2s)"),
        Option("node_label_selector", ("--node-label-selector",), _label_selector, default="",
               metavar="K=V,...", help="schedule GPUs only on nodes with all these labels "
               "(default: every node)"),
        Option("metrics_bind_address", ("--metrics-bind-address",), parse_str, default=":9395",
               metavar="HOST:PORT", help="Prometheus /metrics address; 0 turns it off (:9395)"),
        Option("probe_bind_address", ("--probe-bind-address",), parse_str, default="0",
               metavar="HOST:PORT", help="kubelet's /healthz and /readyz on a plain-HTTP "
               "listener of their own, which no other client can fill; 0 (default) serves them "
               "on the webhook listener only"),
        Option("device_config_file", ("--device-config-file",), parse_optional_str,
               metavar="PATH", help="HAMi's device config YAML; its nvidia: section sets "
               "defaults and resource names"),
        Option("booking_key_file", ("--booking-key-file",), parse_optional_str,
               env=ENV_BOOKING_KEY_FILE, metavar="PATH", help="Ed25519 private booking keys, "
               "one ed25519-private line each (the first signs): sign bookings at bind, count "
               f"only signed ones (env {ENV_BOOKING_KEY_FILE}; default: trust every booking, "
               "as HAMi)"),
        Option("legacy_booking_key_file", ("--legacy-booking-key-file",), parse_optional_str,
               env=ENV_LEGACY_BOOKING_KEY_FILE, metavar="PATH", help="HMAC keys of the "
               "scheme before (v1), one per line: bookings signed with them still count, "
               "none is signed (the upgrade window; a missing file: none)"),
        Option("force_overwrite_default_scheduler", ("--force-overwrite-default-scheduler",),
               parse_bool, default="true",
               help="the webhook also takes pods of default-scheduler (true)"),
        Option("max_body_bytes", ("--max-body-bytes",), parse_int, flag_type=int,
               default=1024 * 1024, metavar="N",
               help="largest filter/bind request body (1048576)"),
        Option("log_level", ("--log-level",), parse_str, choices=LOG_LEVELS, default="info",
               help="log level (info)"),
        Option("debug", ("--debug",), parse_bool, default="false",
               help="log at debug level, as --log-level=debug (HAMi's flag; false)"),
        Option("verbosity", ("-v", "--v"), parse_klog_verbosity, default=0, metavar="N",
               help=f"klog verbosity, as HAMi's -v: {KLOG_DEBUG_VERBOSITY} and above logs at "
               "debug level, below changes nothing (0)"),
        Option("kube_qps", ("--kube-qps",), _kube_qps, metavar="QPS",
               help="client-side limit on Kubernetes API calls a second; 0: client-go's "
               f"{KUBE_DEFAULT_QPS:g}; negative: none (default: none, unless --kube-burst is "
               "given)"),
        Option("kube_burst", ("--kube-burst",), _kube_burst, metavar="N",
               help="API calls that may go at once under --kube-qps; 0: client-go's "
               f"{KUBE_DEFAULT_BURST} (default {KUBE_DEFAULT_BURST})"),
        Option("kube_timeout", ("--kube-timeout",), _kube_timeout, metavar="SECONDS",
               help="timeout of each Kubernetes API request: whole seconds, as HAMi, or a Go "
               "duration; 0: the client's own (10s)"),
        Option("pod_name", (), _pod_field, env=ENV_POD_NAME, default=""),
        Option("pod_namespace", (), _pod_field, env=ENV_POD_NAMESPACE, default=""),
    )
)  # fmt: skip
"""Every setting of `hami scheduler`, in `--help` order."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every flag of `hami scheduler`, each with its one-line help."""
    OPTIONS.add_to(parser)


# --- what the resolved values make ----------------------------------------------------------


def _bind_address(flag: str, text: str) -> BindAddress:
    """`text` as a listen address (`protocol.address`), `:port` as every IPv4 interface.
    Raises ConfigError naming `flag`."""
    address = parse_setting(flag, text, lambda raw: parse_host_port(str(raw)))
    return BindAddress(address.host or "0.0.0.0", address.port)


@dataclass(frozen=True, slots=True)
class _Listeners:
    http: BindAddress
    client_ca_file: str
    webhook: BindAddress | None


def _listeners(values: Mapping[str, Any]) -> _Listeners:
    """The extender's address, the client CA and the webhook's own address (None: on the
    extender listener), checked against each other and the TLS pair. Raises ConfigError."""
    cert, key = values["cert_file"], values["key_file"]
    if bool(cert) != bool(key):
        raise ConfigError("--cert-file and --key-file go together")
    bind_text = values.get("http_bind") or (DEFAULT_HTTPS_BIND if cert else DEFAULT_HTTP_BIND)
    http = _bind_address("--http-bind", bind_text)
    client_ca, webhook_bind = values["client_ca_file"], values["webhook_bind"]
    if client_ca and not cert:
        raise ConfigError("--client-ca-file needs --cert-file and --key-file")
    if client_ca and not webhook_bind:
        raise ConfigError(
            "--client-ca-file: the API server calls the webhook without a client certificate: "
            "give --webhook-bind"
        )
    if not webhook_bind:
        return _Listeners(http, client_ca, None)
    if not cert:
        raise ConfigError(
            "--webhook-bind: the API server calls webhooks over HTTPS only: "
            "give --cert-file and --key-file"
        )
    webhook = _bind_address("--webhook-bind", webhook_bind)
    if webhook.port != 0 and webhook == http:
        raise ConfigError(f"--webhook-bind {webhook_bind}: the same address as --http-bind")
    return _Listeners(http, client_ca, webhook)


def _election_timings(values: Mapping[str, Any]) -> tuple[int, float, float]:
    """Lease duration (whole seconds: what a Lease carries), renew deadline and retry period,
    checked as client-go checks them."""
    from hami_plugin.extender.leader import ElectionConfig

    lease = math.ceil(values["leader_elect_lease_duration"].total_seconds())
    renew = values["leader_elect_renew_deadline"].total_seconds()
    retry = values["leader_elect_retry_period"].total_seconds()
    try:
        ElectionConfig(
            namespace="-",
            name="-",
            identity="-",
            lease_duration_seconds=lease,
            renew_deadline_seconds=renew,
            retry_period_seconds=retry,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return lease, renew, retry


def _kube_client(values: Mapping[str, Any]) -> tuple[float | None, int | None, float | None]:
    """`--kube-qps`, `--kube-burst` and `--kube-timeout` as the client takes them: (qps, burst,
    timeout seconds), None where the client keeps its own behaviour.

    HAMi always limits (client-go's 5 a second, 10 at once: `KUBE_DEFAULT_*`); this daemon
    limits only when one of the two flags is given, and then with HAMi's value for the other.
    client-go's meanings hold: 0 is its default, a negative QPS turns the limit off. A timeout
    of 0 is client-go's "none"; here each request keeps the client's own timeout instead (a
    request without one could hang a bind for ever).
    """
    qps, burst = values.get("kube_qps"), values.get("kube_burst")
    timeout = None
    if "kube_timeout" in values:
        timeout = values["kube_timeout"].total_seconds() or None
    if (qps is None and burst is None) or (qps is not None and qps < 0):
        return None, None, timeout
    return qps or KUBE_DEFAULT_QPS, burst or KUBE_DEFAULT_BURST, timeout


def _log_level(values: Mapping[str, Any]) -> str:
    """`--log-level`, raised to debug by HAMi's `--debug` or `-v` 4 and above."""
    if values["debug"] or values["verbosity"] >= KLOG_DEBUG_VERBOSITY:
        return "debug"
    return str(values["log_level"])


_NVIDIA_KINDS: dict[str, type] = {
    "resourceCountName": str,
    "resourceMemoryName": str,
    "resourceMemoryPercentageName": str,
    "resourceCoreName": str,
    "resourcePriorityName": str,
    "overwriteEnv": bool,
    "defaultMemory": int,
    "defaultCores": int,
    "defaultGPUNum": int,
    "memoryFactor": int,
    "gpuCorePolicy": str,
    "runtimeClassName": str,
}
"""The `nvidia:` keys the scheduler uses, and the YAML type each must have."""


def _device_values(config: DeviceConfig) -> dict[str, Any]:
    """The `nvidia:` values the scheduler uses from HAMi's device config (other keys and
    vendors are ignored). Raises ConfigError naming the file and the key."""
    values: dict[str, Any] = {}
    for key, kind in _NVIDIA_KINDS.items():
        if key not in config.nvidia:
            continue
        value = config.nvidia[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{config.label}: nvidia.{key} must be an integer")
        if kind is not int and not isinstance(value, kind):
            raise ConfigError(f"{config.label}: nvidia.{key} must be a {kind.__name__}")
        values[key] = value
    _check_device_values(values, config.label)
    allowlist = config.nvidia.get("migProfileAllowlist")
    if allowlist is not None:
        # Not used to schedule (a MIG GPU registers its profiles), but a bad one stops the
        # scheduler at start, as HAMi's InitNvidiaDevice does (device.go:171-173).
        try:
            parse_mig_profile_allowlist(allowlist)
        except ValueError as error:
            raise ConfigError(f"{config.label}: invalid MIG profile allowlist: {error}") from None
    return values


_DEVICE_RANGES: dict[str, tuple[int, int, str]] = {
    "defaultMemory": (0, 2**63 - 1, "must not be negative"),
    "defaultCores": (0, 100, "must be between 0 and 100"),
    "memoryFactor": (1, 2**63 - 1, "must be at least 1"),
    "defaultGPUNum": (0, 2**31 - 1, "must be between 0 and 2147483647"),
}


def _check_device_values(values: Mapping[str, Any], label: str) -> None:
    """The device config's values in range, named by their keys. Raises ConfigError."""
    for key, (low, high, rule) in _DEVICE_RANGES.items():
        if key in values and not low <= values[key] <= high:
            raise ConfigError(f"{label}: nvidia.{key} {rule}, got {values[key]}")
    if "resourceCountName" in values and not values["resourceCountName"]:
        raise ConfigError(f"{label}: nvidia.resourceCountName must not be empty")
    policy = values.get("gpuCorePolicy", GpuCorePolicy.DEFAULT)
    if policy not in set(GpuCorePolicy):
        choices = ", ".join(GpuCorePolicy)
        raise ConfigError(f"{label}: nvidia.gpuCorePolicy must be one of {choices}, got {policy!r}")


def _placement(values: Mapping[str, Any]) -> tuple[SchedulerSettings, WebhookSettings]:
    """The scheduler's and the webhook's settings: the policy flags and the device config."""
    try:
        node_policy = parse_node_policy(
            values["node_scheduler_policy"], key="--node-scheduler-policy"
        )
        gpu_policy = parse_gpu_policy(values["gpu_scheduler_policy"], key="--gpu-scheduler-policy")
    except AnnotationError as error:
        raise ConfigError(str(error)) from None
    path = values.get("device_config_file")
    device = _device_values(read_device_config(path, "--device-config-file")) if path else {}
    defaults = ResourceNames()
    resources = ResourceNames(
        count=device.get("resourceCountName", defaults.count),
        memory=device.get("resourceMemoryName", defaults.memory),
        memory_percentage=device.get("resourceMemoryPercentageName", defaults.memory_percentage),
        cores=device.get("resourceCoreName", defaults.cores),
        priority=device.get("resourcePriorityName", defaults.priority),
    )
    try:
        settings = SchedulerSettings(
            node_policy=node_policy,
            gpu_policy=gpu_policy,
            default_memory_mib=device.get("defaultMemory", 0),
            default_cores=device.get("defaultCores", 0),
            memory_factor=device.get("memoryFactor", 1),
            resources=resources,
        )
        webhook = WebhookSettings(
            scheduler_name=values["scheduler_name"],
            force_overwrite_default_scheduler=values["force_overwrite_default_scheduler"],
            default_gpu_num=device.get("defaultGPUNum", 1),
            overwrite_env=device.get("overwriteEnv", False),
            gpu_core_policy=GpuCorePolicy(device.get("gpuCorePolicy", "default")),
            runtime_class_name=device.get("runtimeClassName", ""),
            resources=resources,
            memory_factor=device.get("memoryFactor", 1),
        )
    except ValueError as error:
        raise ConfigError(f"device config: {error}") from None
    return settings, webhook


def _check_limits(values: Mapping[str, Any]) -> None:
    """The numeric flags argparse read: in range. Raises ConfigError."""
    if not math.isfinite(values["requeue_qps"]) or values["requeue_qps"] < 0:
        raise ConfigError("--requeue-qps must be a number >= 0")
    if values["burst_look_ahead"] < 0:
        raise ConfigError("--burst-look-ahead must be a whole number >= 0")
    if values["max_body_bytes"] < 1024:
        raise ConfigError("--max-body-bytes must be at least 1024")


def resolve_config(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> SchedulerConfig:
    """Turn parsed flags, the environment (`env`, else the process's) and the device config
    into a validated config. Raises ConfigError with one line naming what is wrong."""
    values = OPTIONS.resolve_args(args, env)
    listeners = _listeners(values)
    _check_limits(values)
    lease, renew, retry_period = _election_timings(values)
    kube_qps, kube_burst, kube_timeout = _kube_client(values)
    settings, webhook = _placement(values)
    booking_key_file = values.get("booking_key_file") or ""
    legacy_booking_key_file = values.get("legacy_booking_key_file") or ""
    if booking_key_file:  # unreadable or no valid key: a start error
        load_booking_keys(booking_key_file, KeyRole.SIGN)
    if legacy_booking_key_file:
        load_legacy_keys(legacy_booking_key_file)
    return SchedulerConfig(
        kubeconfig=values.get("kubeconfig"),
        http_host=listeners.http.host,
        http_port=listeners.http.port,
        cert_file=values["cert_file"],
        key_file=values["key_file"],
        client_ca_file=listeners.client_ca_file,
        webhook_host=listeners.webhook.host if listeners.webhook is not None else None,
        webhook_port=listeners.webhook.port if listeners.webhook is not None else 0,
        scheduler_name=values["scheduler_name"],
        settings=settings,
        webhook=webhook,
        node_lock_timeout=values["node_lock_timeout"],
        node_lock_retry_timeout_seconds=values["node_lock_retry_timeout"].total_seconds(),
        allocation_timeout_seconds=values["allocation_timeout"].total_seconds(),
        filter_booking_ttl_seconds=values["filter_booking_ttl"].total_seconds(),
        requeue_qps=values["requeue_qps"],
        requeue_window_seconds=values["requeue_window"].total_seconds(),
        burst_look_ahead=values["burst_look_ahead"],
        leader_elect=values["leader_elect"],
        leader_elect_resource_name=values["leader_elect_resource_name"],
        leader_elect_resource_namespace=values["leader_elect_resource_namespace"],
        leader_elect_lease_duration_seconds=lease,
        leader_elect_renew_deadline_seconds=renew,
        leader_elect_retry_period_seconds=retry_period,
        node_label_selector=values["node_label_selector"],
        metrics_bind_address=values["metrics_bind_address"],
        probe_bind_address=values["probe_bind_address"],
        max_body_bytes=values["max_body_bytes"],
        booking_key_file=booking_key_file,
        legacy_booking_key_file=legacy_booking_key_file,
        log_level=_log_level(values),
        kube_qps=kube_qps,
        kube_burst=kube_burst,
        kube_timeout_seconds=kube_timeout,
        pod_namespace=values["pod_namespace"],
        pod_name=values["pod_name"],
    )
