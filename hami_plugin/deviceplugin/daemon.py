"""`hami device-plugin`: the node daemon, wired together.

settings → booking keys → NVML backend → inventory → gRPC server + kubelet registration →
health monitor → node register annotation → `/metrics`, probes. An unreadable booking key file
is one log line and exit 2; without `--booking-key-file` every booking is trusted, as in HAMi,
and the daemon says so once NVML is up. NVML failing at start is one log line and exit 1, or,
with `--fail-on-init-error=false`, the daemon stays up advertising nothing and retries. SIGTERM
or SIGINT stops serving, removes the socket and exits 0.

The node annotation `hami-plugin.io/allocate-protocol` goes out with the register annotation:
`in-flight/v2` while kubelet's PodResources API (`--pod-resources-socket`) answers a `List`,
probed at every register round, else `in-flight/v1`. An Allocate that finds the API failing
wakes the register loop, and that round writes v1 whatever its probe says (the next rounds
probe again), so the scheduler stops sending interchangeable pods together within moments.

HAMi-core (`<hook>/vgpu/libvgpu.so` and its `ld.so.preload`, `deviceplugin.hamicore`) is
looked at when serving starts, on every Allocate, register round and scrape: while it is
missing, the register annotation marks every GPU unhealthy, `/metrics` reports
`hami_device_plugin_hamicore_ready 0` and Allocate fails the pod; kubelet's device list keeps
NVML's health (a pod bound meanwhile gets the message naming the file, not kubelet's). The
sub-command (`deviceplugin.command`) imports this module only when it runs. Another plugin
serving `--resource-name` on the node (the GPU Operator's) is one warning and a node Event.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.config import EXIT_USAGE, ConfigError
from hami_plugin.config.keys import BookingKeyFile
from hami_plugin.deviceplugin.admitting import KubeletAdmission, log_trust
from hami_plugin.deviceplugin.allocate import AllocateConfig
from hami_plugin.deviceplugin.allocator import ApiFallback, PodAllocator
from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.cdi import build_cdi_spec, read_mig_minors, write_cdi_spec
from hami_plugin.deviceplugin.gpu_admin import gpu_admin_reader
from hami_plugin.deviceplugin.hamicore import HamiCoreCheck, HamiCoreWatch
from hami_plugin.deviceplugin.health import HealthChange, HealthMonitor
from hami_plugin.deviceplugin.inventory import build_register_devices, build_vgpu_devices
from hami_plugin.deviceplugin.kubelet import KubeletRegistrar, RestartWatch
from hami_plugin.deviceplugin.liveness import ProbeListener, start_probes
from hami_plugin.deviceplugin.metrics import (
    DevicePluginMetrics,
    MetricsConfig,
    NodePods,
    start_device_plugin_metrics,
)
from hami_plugin.deviceplugin.mig.dynamic import DynamicMig
from hami_plugin.deviceplugin.mig.nvml import NvmlMig
from hami_plugin.deviceplugin.mig.static import MigStrategy
from hami_plugin.deviceplugin.migserve import StaticMigError, StaticMigServers
from hami_plugin.deviceplugin.monitor.containers import ContainerScanner, FeedbackLoop
from hami_plugin.deviceplugin.nodecache import NodeCache
from hami_plugin.deviceplugin.nvml import (
    NvmlBackend,
    NvmlError,
    NvmlLoader,
    NvmlUnavailable,
    PhysicalGpu,
)
from hami_plugin.deviceplugin.podresources import PodResourcesClient
from hami_plugin.deviceplugin.protocol_claim import ProtocolClaim
from hami_plugin.deviceplugin.register import PairScores, RegisterPublisher
from hami_plugin.deviceplugin.rivals import RivalWatch
from hami_plugin.deviceplugin.server import DevicePluginService
from hami_plugin.deviceplugin.settings import DevicePluginSettings
from hami_plugin.deviceplugin.writebehind import WriteBehind
from hami_plugin.kube.api import DevicePluginApi
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import KubeError
from hami_plugin.lifecycle import StopSignal
from hami_plugin.protocol import codec
from hami_plugin.protocol.hostpaths import VGPU_LOCK_HOST_PATH, containers_dir
from hami_plugin.protocol.model import OperatingMode
from hami_plugin.protocol.signature import signature_announcement

logger = logging.getLogger(__name__)


EXIT_OK = 0
EXIT_FAILURE = 1
NVML_RETRY_SECONDS = 10.0


class _ServeError(Exception):
    """A part serving needs could not be built: the one line logged before exit status 1."""


@dataclass(frozen=True, slots=True)
class _Serving:
    """The parts `_serve` starts and stops (`_build`)."""

    fallback: ApiFallback
    pods: NodePods
    podresources: PodResourcesClient | None
    registrar: KubeletRegistrar
    health: HealthMonitor
    publisher: RegisterPublisher
    scanner: ContainerScanner
    feedback: FeedbackLoop | None


class DevicePluginDaemon:
    """The running device plugin. `run()` blocks until `stop()` (thread-safe, idempotent).

    `load_nvml` gives the NVML module for `--nvml` (the entry point's choice: pynvml or the fake
    NVML); `kube` and `restart_watch` replace the production adapters in tests;
    `vgpulock_path` is the host directory mounted at /tmp/vgpulock in containers. `clock` is the
    one clock every part reads (health recovery, pod lists, directory ages, metrics, the
    Kubernetes client it creates); the system clock when None.
    """

    def __init__(
        self,
        settings: DevicePluginSettings,
        *,
        load_nvml: NvmlLoader,
        kube: DevicePluginApi | None = None,
        restart_watch: RestartWatch | None = None,
        vgpulock_path: str = VGPU_LOCK_HOST_PATH,
        sysfs_root: str = "/sys",
        nvml_retry_seconds: float = NVML_RETRY_SECONDS,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self._clock: Clock = clock or SystemClock()
        self._kube = kube
        self._load_nvml = load_nvml
        self._restart_watch = restart_watch
        self._vgpulock_path = vgpulock_path
        self._sysfs_root = sysfs_root
        self._nvml_retry = nvml_retry_seconds
        self._stop = threading.Event()
        self.stop_signal = StopSignal(self.stop, self._stop)
        self._lock = threading.Lock()
        self._gpus: list[PhysicalGpu] = []
        self._backend: NvmlBackend | None = None
        self._booking_keys: BookingKeyFile | None = None
        self._health: HealthMonitor | None = None
        self._publisher: RegisterPublisher | None = None
        self._register_uuids: tuple[str, ...] = ()
        self.dynamic_mig: DynamicMig | None = None
        """Dynamic MIG (`operatingmode: mig`): the MIG instances of this node's pods."""
        self._scores: PairScores | None = None
        """`hami.io/node-nvidia-score` (`--enable-topology-score`, while serving)."""
        self.hamicore: HamiCoreWatch | None = None
        """Whether HAMi-core is installed under the hook path (while serving)."""
        self.protocol: ProtocolClaim | None = None
        """What the node claims in `hami-plugin.io/allocate-protocol` (while serving)."""
        self.board: DeviceBoard | None = None
        self.registrar: KubeletRegistrar | None = None
        self.rivals: RivalWatch | None = None  # another plugin on our resource (while serving)
        self.static_mig: StaticMigServers | None = None
        """Static MIG (`--mig-strategy single|mixed`): the MIG resources' plugins."""
        self.metrics: DevicePluginMetrics | None = None  # `/metrics` (None: off or unusable)
        self.probes: ProbeListener | None = None  # `--probe-bind-address`, while serving
        self.started = threading.Event()
        """Set once the server is up and registration has begun (for tests and benchmarks)."""

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        """Start everything, wait for `stop()`, tear down. Returns the exit status."""
        if self.settings.booking_key_file is not None:
            try:
                self._booking_keys = BookingKeyFile(
                    self.settings.booking_key_file,
                    legacy_path=self.settings.legacy_booking_key_file or "",
                    clock=self._clock,
                )
            except ConfigError as error:
                logger.error("%s", error)
                return EXIT_USAGE
        try:
            backend = self._start_nvml()
        except _ServeError as error:
            logger.error("%s", error)
            return EXIT_FAILURE
        if backend is None:
            return EXIT_OK  # stopped while waiting for NVML
        self._backend = backend
        try:
            return self._serve(backend)
        finally:
            backend.shutdown()

    def _start_nvml(self) -> NvmlBackend | None:
        """NVML, started; None when `stop()` came while waiting for it
        (`--fail-on-init-error=false`). Raises _ServeError."""
        settings = self.settings
        try:
            nvml = self._load_nvml(settings.nvml, settings.fake_gpus)
        except (NvmlUnavailable, ValueError) as error:
            raise _ServeError(str(error)) from error
        backend = NvmlBackend(
            nvml,
            self._sysfs_root,
            preconfigured_memory_mib=settings.preconfigured_device_memory_mib,
        )
        logged = False
        while True:
            try:
                backend.start()
                break
            except NvmlUnavailable as error:
                if settings.fail_on_init_error:
                    raise _ServeError(str(error)) from error
                if not logged:
                    logger.error(
                        "%s; advertising no GPUs and retrying every %g s "
                        "(--fail-on-init-error=false)",
                        error,
                        self._nvml_retry,
                    )
                    logged = True
                if self.stop_signal.wait(self._nvml_retry):
                    return None
        if logged:
            logger.info("NVML is available now")
        return backend

    def _serve(self, backend: NvmlBackend) -> int:
        """Serve the GPUs NVML lists until `stop()`; returns the exit status."""
        log_trust(self._booking_keys, self.settings.pod_resources_socket)
        try:
            gpus = self._scan(backend)
            self.static_mig = self._static_mig(backend, gpus)
            self._write_cdi_spec(gpus)
            kube, owned_kube = self._kube_client()
        except _ServeError as error:
            logger.error("%s", error)
            return EXIT_FAILURE
        self._set_gpus(gpus)
        self.board = DeviceBoard()
        self._refresh_devices()
        serving = self._build(backend, kube)
        try:
            self._start(serving, gpus)
            self.metrics = self._start_metrics(backend, kube, serving)
            vgpu_served = self.static_mig is None or self.static_mig.plan.vgpu_served
            socket = serving.registrar.socket_path if vgpu_served else None
            self.probes = start_probes(self.settings, self.started, socket, self.metrics)
            self.started.set()
            self.stop_signal.wait(math.inf)
            logger.info("stopping: removing %s", serving.registrar.socket_path)
        finally:
            self._teardown(serving, owned_kube)
        logger.info("device plugin stopped")
        return EXIT_OK

    # --- what serving needs, one builder each ----------------------------------------------

    @staticmethod
    def _scan(backend: NvmlBackend) -> list[PhysicalGpu]:
        try:
            return backend.scan()
        except NvmlError as error:
            raise _ServeError(f"cannot list GPUs: {error}") from error

    def _static_mig(
        self, backend: NvmlBackend, gpus: Sequence[PhysicalGpu]
    ) -> StaticMigServers | None:
        """Static MIG (`--mig-strategy single|mixed`): NVIDIA's device map (`mig.static`)."""
        if self.settings.mig_strategy == MigStrategy.NONE:
            return None
        try:
            return StaticMigServers.for_daemon(backend, gpus, self.settings)
        except (StaticMigError, NvmlError) as error:
            raise _ServeError(str(error)) from error

    def _write_cdi_spec(self, gpus: Sequence[PhysicalGpu]) -> None:
        """With a CDI strategy, once at start, as HAMi (plugin-manager.go:78-80): Allocate's CDI
        names must resolve."""
        if not self.settings.device_list.any_cdi:
            return
        static_mig = self.static_mig
        try:
            mig_devices = static_mig.mig_devices if static_mig is not None else ()
            spec = build_cdi_spec(gpus, mig_devices, read_mig_minors() if mig_devices else {})
            write_cdi_spec(spec, self.settings.cdi_spec_dir)
        except OSError as error:
            raise _ServeError(f"unable to create the CDI spec file: {error}") from error

    def _kube_client(self) -> tuple[DevicePluginApi, KubeClient | None]:
        """The client given, or one from the kubeconfig (returned second: closed at the end)."""
        if self._kube is not None:
            return self._kube, None
        try:
            kube = KubeClient.from_config(self.settings.kubeconfig, clock=self._clock)
        except KubeError as error:
            raise _ServeError(str(error)) from error
        return kube, kube

    def _build(self, backend: NvmlBackend, kube: DevicePluginApi) -> _Serving:
        """Every part that serves, built (none started). One watch of this node's pods (and
        one of the Node) serves the metrics, the container scan and Allocate while the API
        server is away."""
        settings, clock = self.settings, self._clock
        fallback = ApiFallback(NodeCache(kube, settings.node_name), WriteBehind(kube))
        pods = NodePods.from_cache(fallback.cache, clock=clock)
        # Kubelet's PodResources API tells interchangeable in-flight pods apart (in-flight/v2).
        podresources = None
        if settings.pod_resources_socket:
            podresources = PodResourcesClient(settings.pod_resources_socket)
        self.protocol = ProtocolClaim(podresources, clock=clock)
        if settings.operating_mode == OperatingMode.MIG:  # before serving, as HAMi (server.go:290)
            self.dynamic_mig = self._dynamic_mig(backend, kube, fallback.cache)
            self.dynamic_mig.start(self._stop)
        # Looked at now (one log line either way), on every Allocate, register round and scrape.
        self.hamicore = HamiCoreWatch(
            settings.hook_path,
            node_name=settings.node_name,
            clock=clock,
            on_change=self._on_hamicore_change,
        )
        self.hamicore.current()
        static_mig = self.static_mig
        self._health = HealthMonitor(
            backend,
            settings.health,
            self._on_health_change,
            clock=clock,
            mig_event=static_mig.on_event if static_mig is not None else None,
        )
        # HAMi-core's per-container shared regions: read for /metrics, cleaned up and
        # arbitrated by priority (HAMi's vGPU monitor), over the node's one pod watch.
        scanner = ContainerScanner(
            containers_dir(settings.hook_path),
            pods,
            resync_interval_seconds=settings.vgpu_resync_interval_seconds,
            pod_refresh_seconds=0.0,  # the watch keeps the list current
            clock=clock,
            booking_keys=self._booking_keys.keys if self._booking_keys is not None else None,
        )
        return _Serving(
            fallback=fallback,
            pods=pods,
            podresources=podresources,
            registrar=self._registrar(kube, fallback, podresources),
            health=self._health,
            publisher=self._register_publisher(backend, kube),
            scanner=scanner,
            feedback=FeedbackLoop(scanner) if settings.priority_feedback else None,
        )

    def _dynamic_mig(
        self, backend: NvmlBackend, kube: DevicePluginApi, cache: NodeCache
    ) -> DynamicMig:
        """Dynamic MIG (`operatingmode: mig`) over NVML's MIG calls on the daemon's session."""
        keys = self._booking_keys
        return DynamicMig(
            NvmlMig(backend.nvml),
            node_name=self.settings.node_name,
            kube=kube,
            gpus=lambda: self._gpus,
            device_list=self.settings.device_list,
            keys=keys.keys if keys is not None else None,
            cache=cache,
            allowlist=self.settings.mig_profile_allowlist,
        )

    def _registrar(
        self,
        kube: DevicePluginApi,
        fallback: ApiFallback,
        podresources: PodResourcesClient | None,
    ) -> KubeletRegistrar:
        """Allocate and its gRPC service, registered with kubelet as `--resource-name`."""
        settings, keys, dynamic_mig = self.settings, self._booking_keys, self.dynamic_mig
        kubelet = None
        if podresources is not None:
            kubelet = KubeletAdmission(
                functools.partial(podresources.kubelet_pods, settings.resource_name),
                self._on_kubelet_pods_failed,
            )
        config = AllocateConfig(
            gpu_admin_namespace=gpu_admin_reader(kube),
            hook_path=settings.hook_path,
            memory_scaling=settings.memory_scaling,
            libcuda_log_level=settings.libcuda_log_level,
            disable_core_limit=settings.disable_core_limit,
            enable_preferred_allocation=settings.enable_preferred_allocation,
            vgpulock_host_path=self._vgpulock_path,
            device_list=settings.device_list,
            mig_mode=dynamic_mig is not None,
        )
        allocator = PodAllocator(
            kube,
            settings.node_name,
            config,
            booking_keys=keys.keys if keys is not None else None,
            resource_name=settings.resource_name,
            fallback=fallback,
            kubelet=kubelet,
            hamicore=self.hamicore,
            mig=dynamic_mig.step if dynamic_mig is not None else None,
            clock=self._clock,
        )
        assert self.board is not None
        service = DevicePluginService(
            self.board, allocator, preferred_allocation=settings.enable_preferred_allocation
        )
        self.rivals = RivalWatch.for_settings(
            kube, settings, self.board, lambda: self._gpus, stop=self._stop
        )
        self.registrar = KubeletRegistrar(
            service,
            plugin_dir=settings.device_plugin_path,
            socket_name=settings.socket_name,
            resource_name=settings.resource_name,
            watch=self._restart_watch,
            on_registered=self.rivals.registered,
        )
        return self.registrar

    def _register_publisher(self, backend: NvmlBackend, kube: DevicePluginApi) -> RegisterPublisher:
        """The node's register annotation and the protocol claim: our Allocate tells several
        in-flight pods apart, so the scheduler may skip HAMi's lock."""
        assert self.protocol is not None
        if self.settings.enable_topology_score:
            self._scores = PairScores(backend.pair_scores)
        self._publisher = RegisterPublisher(
            kube,
            self.settings.node_name,
            self._register_value,
            interval_seconds=self.settings.register_interval_seconds,
            also_annotate=self._node_annotations,
            on_written=self.protocol.written,
        )
        return self._publisher

    def _start(self, serving: _Serving, gpus: Sequence[PhysicalGpu]) -> None:
        serving.fallback.cache.start(self._stop)
        serving.fallback.writes.start()
        static_mig = self.static_mig
        if static_mig is None or static_mig.plan.vgpu_served:
            serving.registrar.start()  # under `single` the MIG devices take nvidia.com/gpu
        if static_mig is not None:
            static_mig.start()
        serving.health.start(gpus)
        serving.publisher.start()
        if serving.feedback is not None:
            serving.feedback.start()

    def _start_metrics(
        self, backend: NvmlBackend, kube: DevicePluginApi, serving: _Serving
    ) -> DevicePluginMetrics | None:
        """`/metrics`, over the parts serving (None: off or unusable, logged)."""
        keys, board, hamicore = self._booking_keys, self.board, self.hamicore
        assert board is not None and hamicore is not None
        mig_device_info = None
        if self.static_mig is not None and serving.podresources is not None:
            mig_device_info = self.static_mig.device_info_from(serving.podresources)
        elif self.dynamic_mig is not None:
            mig_device_info = self.dynamic_mig.device_info
        settings = self.settings
        return start_device_plugin_metrics(
            MetricsConfig(settings.node_name, settings.hook_path, settings.metrics_bind_address),
            backend=backend,
            gpus=lambda: self._gpus,
            devices=lambda: board.devices,
            kube=kube,
            scanner=serving.scanner,
            pods=serving.pods,
            clock=self._clock,
            booking_keys=keys.keys if keys is not None else None,
            hamicore=hamicore.current,
            mig_device_info=mig_device_info,
        )

    def _teardown(self, serving: _Serving, owned_kube: KubeClient | None) -> None:
        if self.probes is not None:
            self.probes.stop()
        if self.metrics is not None:
            self.metrics.stop()
        if serving.feedback is not None:
            serving.feedback.stop()
        serving.scanner.close()
        if self.static_mig is not None:
            self.static_mig.stop()
        serving.registrar.stop()
        serving.fallback.writes.stop()
        serving.publisher.stop()
        serving.publisher.withdraw()  # bounded; the scheduler falls back to HAMi's node lock
        serving.health.stop()
        if self.board is not None:
            self.board.close()
        if serving.podresources is not None:
            serving.podresources.close()
        if owned_kube is not None:
            owned_kube.close()

    # --- state ----------------------------------------------------------------------------

    def _set_gpus(self, gpus: Sequence[PhysicalGpu]) -> bool:
        """Adopt a scan result; True when the GPU list changed."""
        with self._lock:
            if list(gpus) == self._gpus:
                return False
            self._gpus = list(gpus)
        for gpu in gpus:
            if (
                gpu.mig_enabled
                and self.settings.mig_strategy == MigStrategy.NONE
                and self.settings.operating_mode != OperatingMode.MIG  # dynamic MIG splits them
            ):
                logger.warning(
                    "GPU %s (index %d) has MIG enabled: not advertised (--mig-strategy none)",
                    gpu.uuid,
                    gpu.index,
                )
        logger.info(
            "GPUs: %s",
            ", ".join(f"{g.index}:{g.uuid} {g.name} {g.memory_mib} MiB" for g in gpus) or "none",
        )
        return True

    def _unhealthy(self) -> frozenset[str]:
        return self._health.unhealthy if self._health is not None else frozenset()

    def _refresh_devices(self) -> None:
        with self._lock:
            gpus = list(self._gpus)
        devices = build_vgpu_devices(gpus, self._unhealthy(), self.settings.inventory)
        if self.board is not None and self.board.publish(devices):
            unhealthy = sum(1 for d in devices if not d.healthy)
            logger.info("advertising %d devices (%d unhealthy)", len(devices), unhealthy)
        if self.static_mig is not None:
            self.static_mig.update_health(self._unhealthy())

    def _on_health_change(self, change: HealthChange) -> None:
        self._refresh_devices()
        if self._publisher is not None:
            self._publisher.poke()

    def _on_hamicore_change(self, check: HamiCoreCheck) -> None:
        """HAMi-core went missing or came back: write the register annotation's health now."""
        if self._publisher is not None:
            self._publisher.poke()

    def _on_kubelet_pods_failed(self, error: Exception) -> bool:
        """An Allocate found kubelet's PodResources API failing: claim v1 at once. Returns
        whether the node claimed v2 recently (pods bound under it may be waiting)."""
        protocol, publisher = self.protocol, self._publisher
        if protocol is None:
            return False
        if protocol.failed_at_allocate() and publisher is not None:
            publisher.poke()
        return protocol.recently_v2()

    def _register_value(self) -> str:
        """Rescan the GPUs (inventory changes show up here) and encode the register value."""
        if self._backend is not None:
            try:
                gpus = self._backend.scan()
            except NvmlError as error:
                logger.warning("GPU rescan failed, keeping the last inventory: %s", error)
            else:
                if self._set_gpus(gpus):
                    self._rewatch(gpus)
                    self._refresh_devices()
        with self._lock:
            gpus = list(self._gpus)
        # Each round looks at the hook directory again: HAMi-core installed later is seen here.
        hamicore_ready = self.hamicore is None or self.hamicore.current().ready
        devices = build_register_devices(
            gpus,
            self._unhealthy(),
            self.settings.inventory,
            hamicore_ready=hamicore_ready,
            mig_devices=None
            if self.dynamic_mig is None
            else self.dynamic_mig.register_devices(
                gpus, self._unhealthy(), self.settings.mig_profile_allowlist
            ),
        )
        self._register_uuids = tuple(device.uuid for device in devices)
        return codec.encode_node_devices(devices)

    def _node_annotations(self) -> dict[str, str]:
        """Protocol claim, booking signatures verified here, `register.PairScores`' scores."""
        wanted = dict(self.protocol.annotations()) if self.protocol is not None else {}
        key_file = self._booking_keys
        wanted.update(signature_announcement(key_file.keys() if key_file is not None else None))
        if self._scores is not None:
            wanted.update(self._scores.annotation(self._register_uuids))
        return wanted

    def _rewatch(self, gpus: Sequence[PhysicalGpu]) -> None:
        if self._health is not None and not self._stop.is_set():
            self._health.stop()
            self._health.start(gpus)
