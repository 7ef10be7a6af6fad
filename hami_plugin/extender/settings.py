"""`hami scheduler`'s configuration: flags (HAMi's names), environment and the device config
file, resolved and validated once at start (precedence: flag > environment > file > default).
Nothing reads the environment after `resolve_config`: the pod's own name and namespace (for
leader election) and `$KUBECONFIG` are resolved here too.

Booleans and durations are Go's (`--leader-elect=true`, `5m`, `28s`, `1m30s`), as HAMi's pflag
flags take them (`hami_plugin.config.values`). HAMi's underscore
spellings `--http_bind`, `--cert_file`, `--key_file` are accepted as aliases of the kebab-case
flags. `--device-config-file` is HAMi's device ConfigMap (`device-config.yaml`); its `nvidia:`
section gives the request defaults and resource names (`docs/hami-reference.md` 3.12).

HAMi's klog and client flags that its users carry in `extraArgs` work too: `--debug` and `-v`
(`--v`) set the log level (`-v` 4 and above, or `--debug`: debug; HAMi's `--debug` sets a
variable nothing reads, pkg/scheduler/config/config.go:478), and `--kube-qps`, `--kube-burst`,
`--kube-timeout` (HAMi v2.10.0 cmd/scheduler/main.go:75-77) set the Kubernetes client's rate
limit and per-request timeout, with client-go's meanings of 0 and negative values.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hami_plugin.config import (
    KLOG_DEBUG_VERBOSITY,
    ConfigError,
    add_bool_flag,
    env_layer,
    flag_layer,
    parse_bool,
    parse_duration,
    parse_float,
    parse_int,
    parse_klog_verbosity,
    parse_optional_str,
    parse_setting,
    read_yaml,
    resolve,
)
from hami_plugin.config.keys import load_booking_keys
from hami_plugin.protocol.codec import (
    AnnotationError,
    parse_gpu_policy,
    parse_node_policy,
)
from hami_plugin.protocol.mig_allowlist import parse_mig_profile_allowlist
from hami_plugin.scheduler.settings import ResourceNames, SchedulerSettings
from hami_plugin.scheduler.webhook import GpuCorePolicy, WebhookSettings

__all__ = [
    "SchedulerConfig",
    "add_arguments",
    "parse_host_port",
    "read_device_config",
    "resolve_config",
]

DEFAULT_HTTP_BIND = "127.0.0.1:8080"
DEFAULT_HTTPS_BIND = "0.0.0.0:443"
ENV_NODE_LOCK_EXPIRE = "HAMI_NODELOCK_EXPIRE"
ENV_BOOKING_KEY_FILE = "HAMI_BOOKING_KEY_FILE"
ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
LOG_LEVELS = ("debug", "info", "warning", "error")
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
    leader_elect: bool = False
    leader_elect_resource_name: str = ""
    leader_elect_resource_namespace: str = ""
    leader_elect_lease_duration_seconds: int = 15
    leader_elect_renew_deadline_seconds: float = 10.0
    leader_elect_retry_period_seconds: float = 2.0
    node_label_selector: Mapping[str, str] = field(default_factory=dict)
    metrics_bind_address: str = ":9395"
    max_body_bytes: int = 1024 * 1024
    booking_key_file: str = ""
    """`--booking-key-file`: sign bookings and count only signed ones; "" trusts every
    booking, as HAMi does."""
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


def parse_host_port(text: str) -> tuple[str, int]:
    """`host:port`, `:port` (every interface) or `[v6]:port`. Raises ConfigError."""
    value = text.strip()
    host, colon, port_text = value.rpartition(":")
    if not colon:
        raise ConfigError(f"address {text!r} has no port (expected host:port)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"address {text!r}: {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise ConfigError(f"address {text!r}: write an IPv6 address in brackets")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"address {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"address {text!r}: port {port} is outside 0..65535")
    return host or "0.0.0.0", port


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


def _duration(text: object, flag: str) -> timedelta:
    return parse_setting(flag, text, _positive_duration)


def _election_timings(args: argparse.Namespace) -> tuple[int, float, float]:
    """Lease duration (whole seconds: what a Lease carries), renew deadline and retry period,
    checked as client-go checks them."""
    from hami_plugin.extender.leader import ElectionConfig

    lease = math.ceil(
        _duration(args.leader_elect_lease_duration, "--leader-elect-lease-duration").total_seconds()
    )
    renew = _duration(args.leader_elect_renew_deadline, "--leader-elect-renew-deadline")
    retry = _duration(args.leader_elect_retry_period, "--leader-elect-retry-period")
    try:
        ElectionConfig(
            namespace="-",
            name="-",
            identity="-",
            lease_duration_seconds=lease,
            renew_deadline_seconds=renew.total_seconds(),
            retry_period_seconds=retry.total_seconds(),
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return lease, renew.total_seconds(), retry.total_seconds()


def _label_selector(text: str) -> dict[str, str]:
    selector: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"--node-label-selector: {item!r} is not key=value")
        selector[key.strip()] = value.strip()
    return selector


_NVIDIA_KEYS: dict[str, type] = {
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


def read_device_config(path: str) -> dict[str, Any]:
    """The `nvidia:` keys the scheduler uses from HAMi's device config YAML (other keys and
    vendors are ignored). Raises ConfigError naming the file and the key."""
    document = read_yaml(path, "--device-config-file")
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(f"--device-config-file {path}: expected a mapping at the top")
    section = document.get("nvidia") or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"--device-config-file {path}: `nvidia` must be a mapping")
    values: dict[str, Any] = {}
    for key, kind in _NVIDIA_KEYS.items():
        if key not in section or section[key] is None:
            continue
        value = section[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"--device-config-file {path}: nvidia.{key} must be an integer")
        if kind is not int and not isinstance(value, kind):
            raise ConfigError(
                f"--device-config-file {path}: nvidia.{key} must be a {kind.__name__}"
            )
        values[key] = value
    allowlist = section.get("migProfileAllowlist")
    if allowlist is not None:
        # Not used to schedule (a MIG GPU registers its profiles), but a bad one stops the
        # scheduler at start, as HAMi's InitNvidiaDevice does (device.go:171-173).
        try:
            parse_mig_profile_allowlist(allowlist)
        except ValueError as error:
            raise ConfigError(
                f"--device-config-file {path}: invalid MIG profile allowlist: {error}"
            ) from None
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every flag of `hami scheduler`, each with its one-line help."""
    add = parser.add_argument
    add(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (env KUBECONFIG, else in-cluster)",
    )
    add(
        "--http-bind",
        "--http_bind",
        metavar="HOST:PORT",
        help=f"filter/bind/webhook/probes address ({DEFAULT_HTTP_BIND}; TLS: {DEFAULT_HTTPS_BIND})",
    )
    add(
        "--cert-file",
        "--cert_file",
        metavar="PATH",
        default="",
        help="TLS certificate (PEM): HTTPS with --key-file",
    )
    add("--key-file", "--key_file", metavar="PATH", default="", help="TLS private key (PEM)")
    add(
        "--client-ca-file",
        metavar="PATH",
        default="",
        help="CA (PEM) whose client certificates alone may call /filter and /bind (needs "
        "--webhook-bind)",
    )
    add(
        "--webhook-bind",
        metavar="HOST:PORT",
        default="",
        help="serve /webhook and the probes on their own TLS listener (same certificate)",
    )
    add(
        "--scheduler-name",
        default="hami-scheduler",
        metavar="NAME",
        help="schedulerName the webhook sets on GPU pods, and the events' source (hami-scheduler)",
    )
    add(
        "--node-scheduler-policy",
        default="binpack",
        metavar="P",
        help="node policy: binpack or spread (binpack)",
    )
    add(
        "--gpu-scheduler-policy",
        default="spread",
        metavar="P",
        help="default GPU policy: binpack, spread, topology-aware, mutex or a chain (spread)",
    )
    add(
        "--node-lock-timeout",
        metavar="DURATION",
        help=f"age at which a node lock is stale (5m; env {ENV_NODE_LOCK_EXPIRE})",
    )
    add(
        "--node-lock-retry-timeout",
        default="28s",
        metavar="DURATION",
        help="how long a bind waits for a node lock or an in-flight pod (28s)",
    )
    add(
        "--allocation-timeout",
        default="2m",
        metavar="DURATION",
        help="a pod still allocating after this is marked failed and its GPUs freed (2m)",
    )
    add(
        "--filter-booking-ttl",
        default="30s",
        metavar="DURATION",
        help="how long a filter booking that no bind follows holds its GPUs (30s)",
    )
    add(
        "--requeue-qps",
        type=float,
        default=20.0,
        metavar="N",
        help="once able to answer again, ask kube-scheduler to retry the GPU pods it parked, at "
        "most N pod patches a second; 0 turns it off (20)",
    )
    add(
        "--burst-look-ahead",
        type=int,
        default=16,
        metavar="N",
        help="when the bind would wait on the node the policy ranks first (a node lock, or a pod "
        "in flight kubelet could confuse with this one), answer the first of the next N fitting "
        "nodes in policy order where it would not; 0 always answers the policy's first (16)",
    )
    add(
        "--requeue-window",
        default="60s",
        metavar="DURATION",
        help="how long after becoming able to answer parked pods are looked for (60s)",
    )
    add_bool_flag(
        parser,
        "--leader-elect",
        default="false",
        help="elect one active replica through a Lease (false)",
    )
    add(
        "--leader-elect-resource-name",
        default="",
        metavar="NAME",
        help="the Lease's name (hami-scheduler-extender)",
    )
    add(
        "--leader-elect-resource-namespace",
        default="",
        metavar="NS",
        help=f"the Lease's namespace (env {ENV_POD_NAMESPACE}, else kube-system)",
    )
    add(
        "--leader-elect-lease-duration",
        default="15s",
        metavar="DURATION",
        help="how long a lease holds after its last renewal; followers wait this long (15s)",
    )
    add(
        "--leader-elect-renew-deadline",
        default="10s",
        metavar="DURATION",
        help="the leader steps down when it could not renew for this long (10s)",
    )
    add(
        "--leader-elect-retry-period",
        default="2s",
        metavar="DURATION",
        help="how often the lease is renewed or tried (2s)",
    )
    add(
        "--node-label-selector",
        default="",
        metavar="K=V,...",
        help="schedule GPUs only on nodes with all these labels (default: every node)",
    )
    add(
        "--metrics-bind-address",
        default=":9395",
        metavar="HOST:PORT",
        help="Prometheus /metrics address; 0 turns it off (:9395)",
    )
    add(
        "--device-config-file",
        metavar="PATH",
        help="HAMi's device config YAML; its nvidia: section sets defaults and resource names",
    )
    add(
        "--booking-key-file",
        metavar="PATH",
        help="booking keys, one per line (the first signs): sign bookings at bind, count only "
        f"signed ones (env {ENV_BOOKING_KEY_FILE}; default: trust every booking, as HAMi)",
    )
    add_bool_flag(
        parser,
        "--force-overwrite-default-scheduler",
        default="true",
        help="the webhook also takes pods of default-scheduler (true)",
    )
    add(
        "--max-body-bytes",
        type=int,
        default=1024 * 1024,
        metavar="N",
        help="largest filter/bind request body (1048576)",
    )
    add("--log-level", default="info", choices=LOG_LEVELS, help="log level (info)")
    add_bool_flag(
        parser,
        "--debug",
        help="log at debug level, as --log-level=debug (HAMi's flag; false)",
    )
    add(
        "-v",
        "--v",
        dest="v",
        metavar="N",
        help=f"klog verbosity, as HAMi's -v: {KLOG_DEBUG_VERBOSITY} and above logs at debug "
        "level, below changes nothing (0)",
    )
    add(
        "--kube-qps",
        metavar="QPS",
        help="client-side limit on Kubernetes API calls a second; 0: client-go's "
        f"{KUBE_DEFAULT_QPS:g}; negative: none (default: none, unless --kube-burst is given)",
    )
    add(
        "--kube-burst",
        metavar="N",
        help="API calls that may go at once under --kube-qps; 0: client-go's "
        f"{KUBE_DEFAULT_BURST} (default {KUBE_DEFAULT_BURST})",
    )
    add(
        "--kube-timeout",
        metavar="SECONDS",
        help="timeout of each Kubernetes API request: whole seconds, as HAMi, or a Go duration; "
        "0: the client's own (10s)",
    )


def _listeners(args: argparse.Namespace, http: tuple[str, int]) -> tuple[str, str | None, int]:
    """The client CA and the webhook's own address (None: on the extender listener), checked
    against each other and the TLS pair. Raises ConfigError."""
    client_ca, webhook_bind = args.client_ca_file or "", args.webhook_bind or ""
    tls = bool(args.cert_file and args.key_file)
    if client_ca and not tls:
        raise ConfigError("--client-ca-file needs --cert-file and --key-file")
    if client_ca and not webhook_bind:
        raise ConfigError(
            "--client-ca-file: the API server calls the webhook without a client certificate: "
            "give --webhook-bind"
        )
    if not webhook_bind:
        return client_ca, None, 0
    if not tls:
        raise ConfigError(
            "--webhook-bind: the API server calls webhooks over HTTPS only: "
            "give --cert-file and --key-file"
        )
    host, port = parse_host_port(webhook_bind)
    if port != 0 and (host, port) == http:
        raise ConfigError(f"--webhook-bind {webhook_bind}: the same address as --http-bind")
    return client_ca, host, port


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


def _kube_client(args: argparse.Namespace) -> tuple[float | None, int | None, float | None]:
    """`--kube-qps`, `--kube-burst` and `--kube-timeout` as the client takes them: (qps, burst,
    timeout seconds), None where the client keeps its own behaviour.

    HAMi always limits (client-go's 5 a second, 10 at once: `KUBE_DEFAULT_*`); this daemon
    limits only when one of the two flags is given, and then with HAMi's value for the other.
    client-go's meanings hold: 0 is its default, a negative QPS turns the limit off. A timeout
    of 0 is client-go's "none"; here each request keeps the client's own timeout instead (a
    request without one could hang a bind for ever).
    """
    qps = burst = None
    if args.kube_qps is not None:
        qps = parse_setting("--kube-qps", args.kube_qps, _kube_qps)
    if args.kube_burst is not None:
        burst = parse_setting("--kube-burst", args.kube_burst, _kube_burst)
    timeout = None
    if args.kube_timeout is not None:
        seconds = parse_setting("--kube-timeout", args.kube_timeout, _kube_timeout)
        timeout = seconds.total_seconds() or None
    if (qps is None and burst is None) or (qps is not None and qps < 0):
        return None, None, timeout
    return qps or KUBE_DEFAULT_QPS, burst or KUBE_DEFAULT_BURST, timeout


def _log_level(args: argparse.Namespace) -> str:
    """`--log-level`, raised to debug by HAMi's `--debug` or `-v` 4 and above."""
    debug = args.debug is not None and parse_setting("--debug", args.debug, parse_bool)
    verbosity = 0
    if args.v is not None:
        verbosity = parse_setting("-v", args.v, parse_klog_verbosity)
    if debug or verbosity >= KLOG_DEBUG_VERBOSITY:
        return "debug"
    return str(args.log_level)


# The settings a flag or the environment may set (flag > environment).
_FLAGS = {
    "node_lock_timeout": "--node-lock-timeout",
    "kubeconfig": "--kubeconfig",
    "booking_key_file": "--booking-key-file",
}
_ENV = {
    "node_lock_timeout": ENV_NODE_LOCK_EXPIRE,
    "kubeconfig": "KUBECONFIG",
    "booking_key_file": ENV_BOOKING_KEY_FILE,
}


def resolve_config(args: argparse.Namespace, env: Mapping[str, str]) -> SchedulerConfig:
    """Turn parsed flags, the environment and the device config into a validated config.
    Raises ConfigError with one line naming what is wrong."""
    cert, key = args.cert_file or "", args.key_file or ""
    if bool(cert) != bool(key):
        raise ConfigError("--cert-file and --key-file go together")
    bind_text = args.http_bind or (DEFAULT_HTTPS_BIND if cert else DEFAULT_HTTP_BIND)
    host, port = parse_host_port(bind_text)
    client_ca, webhook_host, webhook_port = _listeners(args, (host, port))
    try:
        node_policy = parse_node_policy(args.node_scheduler_policy, key="--node-scheduler-policy")
        gpu_policy = parse_gpu_policy(args.gpu_scheduler_policy, key="--gpu-scheduler-policy")
    except AnnotationError as error:
        raise ConfigError(str(error)) from None
    layers = [env_layer(env, _ENV), flag_layer(args, _FLAGS)]
    lock_timeout = resolve("node_lock_timeout", _positive_duration, layers) or timedelta(minutes=5)
    retry = parse_setting(
        "--node-lock-retry-timeout", args.node_lock_retry_timeout, _duration_or_zero
    )
    allocation = _duration(args.allocation_timeout, "--allocation-timeout")
    ttl = _duration(args.filter_booking_ttl, "--filter-booking-ttl")
    requeue_window = _duration(args.requeue_window, "--requeue-window")
    if not math.isfinite(args.requeue_qps) or args.requeue_qps < 0:
        raise ConfigError("--requeue-qps must be a number >= 0")
    if args.burst_look_ahead < 0:
        raise ConfigError("--burst-look-ahead must be a whole number >= 0")
    lease, renew, retry_period = _election_timings(args)
    kube_qps, kube_burst, kube_timeout = _kube_client(args)
    if args.max_body_bytes < 1024:
        raise ConfigError("--max-body-bytes must be at least 1024")
    device = read_device_config(args.device_config_file) if args.device_config_file else {}
    booking_key_file = resolve("booking_key_file", parse_optional_str, layers) or ""
    if booking_key_file:
        load_booking_keys(booking_key_file)  # unreadable or no valid key: a start error
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
            scheduler_name=args.scheduler_name,
            force_overwrite_default_scheduler=parse_setting(
                "--force-overwrite-default-scheduler",
                args.force_overwrite_default_scheduler,
                parse_bool,
            ),
            default_gpu_num=device.get("defaultGPUNum", 1),
            overwrite_env=device.get("overwriteEnv", False),
            gpu_core_policy=GpuCorePolicy(device.get("gpuCorePolicy", "default")),
            runtime_class_name=device.get("runtimeClassName", ""),
            resources=resources,
            memory_factor=device.get("memoryFactor", 1),
        )
    except ValueError as error:
        raise ConfigError(f"device config: {error}") from None
    return SchedulerConfig(
        kubeconfig=resolve("kubeconfig", parse_optional_str, layers),
        http_host=host,
        http_port=port,
        cert_file=cert,
        key_file=key,
        client_ca_file=client_ca,
        webhook_host=webhook_host,
        webhook_port=webhook_port,
        scheduler_name=args.scheduler_name,
        settings=settings,
        webhook=webhook,
        node_lock_timeout=lock_timeout,
        node_lock_retry_timeout_seconds=retry.total_seconds(),
        allocation_timeout_seconds=allocation.total_seconds(),
        filter_booking_ttl_seconds=ttl.total_seconds(),
        requeue_qps=args.requeue_qps,
        requeue_window_seconds=requeue_window.total_seconds(),
        burst_look_ahead=args.burst_look_ahead,
        leader_elect=parse_setting("--leader-elect", args.leader_elect, parse_bool),
        leader_elect_resource_name=args.leader_elect_resource_name,
        leader_elect_resource_namespace=args.leader_elect_resource_namespace,
        leader_elect_lease_duration_seconds=lease,
        leader_elect_renew_deadline_seconds=renew,
        leader_elect_retry_period_seconds=retry_period,
        node_label_selector=_label_selector(args.node_label_selector),
        metrics_bind_address=args.metrics_bind_address,
        max_body_bytes=args.max_body_bytes,
        booking_key_file=booking_key_file,
        log_level=_log_level(args),
        kube_qps=kube_qps,
        kube_burst=kube_burst,
        kube_timeout_seconds=kube_timeout,
        pod_namespace=env.get(ENV_POD_NAMESPACE, "").strip(),
        pod_name=env.get(ENV_POD_NAME, "").strip(),
    )
