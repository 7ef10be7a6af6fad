"""`hami device-plugin`: the node daemon, wired together.

settings → booking keys → NVML backend → inventory → gRPC server + kubelet registration →
health monitor → node register annotation. A booking key file that cannot be read is one log
line and exit status 2; without `--booking-key-file` every booking is trusted, as in HAMi, and
the daemon says so in one warning once NVML is up. NVML failing at start is one log line and
exit status 1, or, with `--fail-on-init-error=false`, the daemon stays up advertising nothing
and retries. SIGTERM or SIGINT stops serving, removes the socket and exits 0.

The node annotation `hami-plugin.io/allocate-protocol` goes out with the register annotation:
`in-flight/v2` while kubelet's PodResources API (`--pod-resources-socket`) answers a `List`,
probed at every register round, else `in-flight/v1`. An Allocate that finds the API failing
wakes the register loop, and that round writes v1 whatever its probe says (the next rounds
probe again), so the scheduler stops sending interchangeable pods together within moments.

HAMi-core (`<hook>/vgpu/libvgpu.so` and its `ld.so.preload`, `deviceplugin.hamicore`) is
looked at when serving starts, on every Allocate, register round and scrape: while it is
missing, the register annotation marks every GPU unhealthy, `/metrics` reports
`hami_device_plugin_hamicore_ready 0` and Allocate fails the pod; kubelet's device list keeps
NVML's health (a pod bound meanwhile gets the message naming the file, not kubelet's).

Heavy imports (grpc, kubernetes, the NVML adapter) happen in `run`, so `hami --help` stays fast.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.config import ConfigError
from hami_plugin.config.keys import BookingKeyFile
from hami_plugin.deviceplugin.settings import (
    DevicePluginSettings,
    add_arguments,
    resolve_settings,
)
from hami_plugin.protocol.hostpaths import VGPU_LOCK_HOST_PATH

if TYPE_CHECKING:
    from hami_plugin.deviceplugin.board import DeviceBoard
    from hami_plugin.deviceplugin.hamicore import HamiCoreCheck, HamiCoreWatch
    from hami_plugin.deviceplugin.health import HealthChange, HealthMonitor
    from hami_plugin.deviceplugin.kubelet import KubeletRegistrar, RestartWatch
    from hami_plugin.deviceplugin.metrics import DevicePluginMetrics
    from hami_plugin.deviceplugin.mig.dynamic import DynamicMig
    from hami_plugin.deviceplugin.migserve import StaticMigServers
    from hami_plugin.deviceplugin.nvml import NvmlBackend, NvmlLoader, PhysicalGpu
    from hami_plugin.deviceplugin.protocol_claim import ProtocolClaim
    from hami_plugin.deviceplugin.register import RegisterPublisher
    from hami_plugin.kube.api import AllocateApi

logger = logging.getLogger(__name__)

_SIGNAL_POLL_SECONDS = 0.5

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
NVML_RETRY_SECONDS = 10.0


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
        kube: AllocateApi | None = None,
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
        self._lock = threading.Lock()
        self._gpus: list[PhysicalGpu] = []
        self._backend: NvmlBackend | None = None
        self._booking_keys: BookingKeyFile | None = None
        self._health: HealthMonitor | None = None
        self._publisher: RegisterPublisher | None = None
        self._register_uuids: tuple[str, ...] = ()
        self.dynamic_mig: DynamicMig | None = None
        """Dynamic MIG (`operatingmode: mig`): the MIG instances of this node's pods."""
        self._scores: tuple[tuple[str, ...], str] | None = None
        """The register UUIDs the last `hami.io/node-nvidia-score` value was measured for."""
        self.hamicore: HamiCoreWatch | None = None
        """Whether HAMi-core is installed under the hook path (while serving)."""
        self.protocol: ProtocolClaim | None = None
        """What the node claims in `hami-plugin.io/allocate-protocol` (while serving)."""
        self.board: DeviceBoard | None = None
        self.registrar: KubeletRegistrar | None = None
        self.static_mig: StaticMigServers | None = None
        """Static MIG (`--mig-strategy single|mixed`): the MIG resources' plugins."""
        self.metrics: DevicePluginMetrics | None = None
        """The `/metrics` endpoint while serving (None when off or unusable)."""
        self.started = threading.Event()
        """Set once the server is up and registration has begun (for tests and benchmarks)."""

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        """Start everything, wait for `stop()`, tear down. Returns the exit status."""
        from hami_plugin.deviceplugin.nvml import NvmlBackend, NvmlUnavailable

        settings = self.settings
        if settings.booking_key_file is not None:
            try:
                self._booking_keys = BookingKeyFile(settings.booking_key_file, clock=self._clock)
            except ConfigError as error:
                logger.error("%s", error)
                return EXIT_USAGE
        try:
            nvml = self._load_nvml(settings.nvml, settings.fake_gpus)
        except (NvmlUnavailable, ValueError) as error:
            logger.error("%s", error)
            return EXIT_FAILURE
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
                    logger.error("%s", error)
                    return EXIT_FAILURE
                if not logged:
                    logger.error(
                        "%s; advertising no GPUs and retrying every %g s "
                        "(--fail-on-init-error=false)",
                        error,
                        self._nvml_retry,
                    )
                    logged = True
                if self._stop.wait(self._nvml_retry):
                    return EXIT_OK
        if logged:
            logger.info("NVML is available now")
        self._backend = backend
        try:
            return self._serve(backend)
        finally:
            backend.shutdown()

    def _serve(self, backend: NvmlBackend) -> int:
        from hami_plugin.deviceplugin.allocate import AllocateConfig
        from hami_plugin.deviceplugin.allocator import PodAllocator
        from hami_plugin.deviceplugin.board import DeviceBoard
        from hami_plugin.deviceplugin.cdi import build_cdi_spec, write_cdi_spec
        from hami_plugin.deviceplugin.hamicore import HamiCoreWatch
        from hami_plugin.deviceplugin.health import HealthMonitor
        from hami_plugin.deviceplugin.kubelet import KubeletRegistrar
        from hami_plugin.deviceplugin.metrics import NodePods, start_device_plugin_metrics
        from hami_plugin.deviceplugin.monitor.containers import ContainerScanner, FeedbackLoop
        from hami_plugin.deviceplugin.nodecache import NodeCache
        from hami_plugin.deviceplugin.nvml import NvmlError
        from hami_plugin.deviceplugin.podresources import PodResourcesClient
        from hami_plugin.deviceplugin.protocol_claim import ProtocolClaim
        from hami_plugin.deviceplugin.register import RegisterPublisher
        from hami_plugin.deviceplugin.server import DevicePluginService
        from hami_plugin.deviceplugin.writebehind import WriteBehind
        from hami_plugin.kube.client import KubeClient
        from hami_plugin.kube.errors import KubeError
        from hami_plugin.protocol.hostpaths import containers_dir

        settings = self.settings
        keys = self._booking_keys
        if keys is None:
            # Once, after NVML: a node that cannot start says only why (one line).
            logger.warning(
                "no --booking-key-file: Allocate serves every pod's hami.io booking "
                "annotations as HAMi does, so anyone who can create a pod can claim GPUs"
            )
        else:
            logger.info("serving only bookings signed by the scheduler (keys from %s)", keys.path)
        try:
            gpus = backend.scan()
        except NvmlError as error:
            logger.error("cannot list GPUs: %s", error)
            return EXIT_FAILURE
        if settings.mig_strategy != "none":  # static MIG: NVIDIA's device map (mig.static)
            from hami_plugin.deviceplugin.cdi import read_mig_minors
            from hami_plugin.deviceplugin.migserve import StaticMigError, StaticMigServers

            try:
                self.static_mig = StaticMigServers.for_daemon(backend, gpus, settings)
            except (StaticMigError, NvmlError) as error:
                logger.error("%s", error)
                return EXIT_FAILURE
        static_mig = self.static_mig
        if settings.device_list.any_cdi:
            # Once at start, as HAMi (plugin-manager.go:78-80): Allocate's CDI names must resolve.
            try:
                mig_devices = static_mig.mig_devices if static_mig is not None else ()
                spec = build_cdi_spec(gpus, mig_devices, read_mig_minors() if mig_devices else {})
                write_cdi_spec(spec, settings.cdi_spec_dir)
            except OSError as error:
                logger.error("unable to create the CDI spec file: %s", error)
                return EXIT_FAILURE
        owned_kube = None
        kube = self._kube
        if kube is None:
            try:
                kube = owned_kube = KubeClient.from_config(settings.kubeconfig, clock=self._clock)
            except KubeError as error:
                logger.error("%s", error)
                return EXIT_FAILURE
        self._set_gpus(gpus)
        board = self.board = DeviceBoard()
        self._refresh_devices()
        # One watch of this node's pods (and one of the Node) serves the metrics, the container
        # scan and Allocate while the API server is away; a `kube` without watches (FakeKube)
        # is asked every time instead, and Allocate writes straight to it.
        cache: NodeCache | None = None
        writes: WriteBehind | None = None
        if isinstance(kube, KubeClient):
            cache = NodeCache(kube, settings.node_name)
            writes = WriteBehind(kube)
            pods = NodePods.from_cache(cache, clock=self._clock)
        else:
            pods = NodePods.from_kube(kube, settings.node_name, clock=self._clock)
        # Kubelet's PodResources API tells interchangeable in-flight pods apart (in-flight/v2).
        kubelet_pods: Callable[[], frozenset[tuple[str, str]]] | None = None
        podresources = None
        if settings.pod_resources_socket:
            podresources = PodResourcesClient(settings.pod_resources_socket)
            kubelet_pods = functools.partial(podresources.without_devices, settings.resource_name)
        protocol = self.protocol = ProtocolClaim(podresources, clock=self._clock)
        if settings.operating_mode == "mig":  # before serving, as HAMi (server.go:290-312)
            from hami_plugin.deviceplugin.mig.dynamic import DynamicMig

            self.dynamic_mig = DynamicMig.for_daemon(
                backend, settings, kube, lambda: self._gpus, cache, keys
            )
            self.dynamic_mig.start(self._stop)
        # Looked at now (one log line either way), on every Allocate, register round and scrape.
        hamicore = self.hamicore = HamiCoreWatch(
            settings.hook_path,
            node_name=settings.node_name,
            clock=self._clock,
            on_change=self._on_hamicore_change,
        )
        hamicore.current()
        allocator = PodAllocator(
            kube,
            settings.node_name,
            AllocateConfig(
                hook_path=settings.hook_path,
                memory_scaling=settings.memory_scaling,
                libcuda_log_level=settings.libcuda_log_level,
                disable_core_limit=settings.disable_core_limit,
                enable_preferred_allocation=settings.enable_preferred_allocation,
                vgpulock_host_path=self._vgpulock_path,
                device_list=settings.device_list,
                mig_mode=self.dynamic_mig is not None,
            ),
            booking_keys=keys.keys if keys is not None else None,
            resource_name=settings.resource_name,
            cache=cache,
            writes=writes,
            clock=self._clock,
            kubelet_pods=kubelet_pods,
            on_kubelet_pods_failed=self._on_kubelet_pods_failed,
            hamicore=hamicore,
            mig=self.dynamic_mig.step if self.dynamic_mig is not None else None,
        )
        service = DevicePluginService(
            board, allocator, preferred_allocation=settings.enable_preferred_allocation
        )
        registrar = self.registrar = KubeletRegistrar(
            service,
            plugin_dir=settings.device_plugin_path,
            socket_name=settings.socket_name,
            resource_name=settings.resource_name,
            watch=self._restart_watch,
        )
        health = self._health = HealthMonitor(
            backend,
            settings,
            self._on_health_change,
            clock=self._clock,
            mig_event=static_mig.on_event if static_mig is not None else None,
        )
        # Our Allocate tells several in-flight pods apart: the scheduler may skip HAMi's lock.
        publisher = self._publisher = RegisterPublisher(
            kube,
            settings.node_name,
            self._register_value,
            interval_seconds=settings.register_interval_seconds,
            also_annotate=(
                self._annotations_with_scores
                if settings.enable_topology_score
                else protocol.annotations
            ),
            on_written=protocol.written,
        )
        # HAMi-core's per-container shared regions: read for /metrics, cleaned up and
        # arbitrated by priority (HAMi's vGPU monitor), over one watch of this node's pods and
        # one set of files.
        scanner = ContainerScanner(
            containers_dir(settings.hook_path),
            pods,
            resync_interval_seconds=settings.vgpu_resync_interval_seconds,
            pod_refresh_seconds=0.0,  # the watch keeps the list current
            clock=self._clock,
        )
        feedback = FeedbackLoop(scanner) if settings.priority_feedback else None
        try:
            if cache is not None and writes is not None:
                cache.start(self._stop)
                writes.start()
            if static_mig is None or static_mig.plan.vgpu_served:
                registrar.start()  # under `single` the MIG devices take nvidia.com/gpu
            if static_mig is not None:
                static_mig.start()
            health.start(gpus)
            publisher.start()
            if feedback is not None:
                feedback.start()
            self.metrics = start_device_plugin_metrics(
                settings,
                backend=backend,
                gpus=lambda: self._gpus,
                devices=lambda: board.devices,
                kube=kube,
                scanner=scanner,
                pods=pods,
                clock=self._clock,
                booking_keys=keys.keys if keys is not None else None,
                hamicore=hamicore.current,
                mig_device_info=(
                    static_mig.device_info_from(podresources)
                    if static_mig is not None and podresources is not None
                    else self.dynamic_mig.device_info
                    if self.dynamic_mig is not None
                    else None
                ),
            )
            self.started.set()
            # Waking twice a second lets the main thread run a signal handler: the kernel may
            # hand the process's SIGTERM to any thread, and then nothing interrupts an untimed
            # wait here (the pod would be SIGKILLed at the end of its grace period).
            while not self._stop.wait(_SIGNAL_POLL_SECONDS):
                pass
            logger.info("stopping: removing %s", registrar.socket_path)
        finally:
            if self.metrics is not None:
                self.metrics.stop()
            if feedback is not None:
                feedback.stop()
            scanner.close()
            if static_mig is not None:
                static_mig.stop()
            registrar.stop()
            if writes is not None:
                writes.stop()
            publisher.stop()
            publisher.withdraw()  # bounded; the scheduler falls back to HAMi's node lock
            health.stop()
            board.close()
            if podresources is not None:
                podresources.close()
            if owned_kube is not None:
                owned_kube.close()
        logger.info("device plugin stopped")
        return EXIT_OK

    # --- state ----------------------------------------------------------------------------

    def _set_gpus(self, gpus: Sequence[PhysicalGpu]) -> bool:
        """Adopt a scan result; True when the GPU list changed."""
        with self._lock:
            if list(gpus) == self._gpus:
                return False
            self._gpus = list(gpus)
        for gpu in gpus:
            if gpu.mig_enabled and self.settings.mig_strategy == "none" and not self._mig_mode:
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

    @property
    def _mig_mode(self) -> bool:
        """Dynamic MIG: MIG-enabled GPUs are this node's to split (`operatingmode: mig`)."""
        return self.settings.operating_mode == "mig"

    def _unhealthy(self) -> frozenset[str]:
        return self._health.unhealthy if self._health is not None else frozenset()

    def _refresh_devices(self) -> None:
        from hami_plugin.deviceplugin.inventory import build_vgpu_devices

        with self._lock:
            gpus = list(self._gpus)
        devices = build_vgpu_devices(gpus, self._unhealthy(), self.settings)
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
        from hami_plugin.deviceplugin.inventory import build_register_devices
        from hami_plugin.deviceplugin.nvml import NvmlError
        from hami_plugin.protocol import codec

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
            self.settings,
            hamicore_ready=hamicore_ready,
            mig_devices=None
            if self.dynamic_mig is None
            else self.dynamic_mig.register_devices(
                gpus, self._unhealthy(), self.settings.mig_profile_allowlist
            ),
        )
        self._register_uuids = tuple(device.uuid for device in devices)
        return codec.encode_node_devices(devices)

    def _annotations_with_scores(self) -> dict[str, str]:
        """The protocol claim plus `hami.io/node-nvidia-score` (`--enable-topology-score`).

        As HAMi's register.go:279-300: the scores of the registered GPUs
        (`CalculateGPUScore(GetDevicesUUIDList(devices))`), measured again only when that list
        changes (HAMi: when the register value changes); a failed measurement fails the round,
        so neither annotation is written until it succeeds.
        """
        from hami_plugin.protocol.topology import (
            NODE_NVIDIA_SCORE_ANNOTATION,
            encode_pair_scores,
        )

        wanted = dict(self.protocol.annotations()) if self.protocol is not None else {}
        uuids = self._register_uuids
        if self._backend is None or not uuids:
            return wanted
        if self._scores is None or self._scores[0] != uuids:
            scores, asymmetric = self._backend.pair_scores(uuids)
            if asymmetric:
                logger.warning(
                    "AsymmetricGPUP2PLink: one or more GPU pairs on this node have asymmetric "
                    "P2P link data; affected pairs scored 0 (possible NVLink hardware or "
                    "driver issue)"
                )
            self._scores = (uuids, encode_pair_scores(scores))
        wanted[NODE_NVIDIA_SCORE_ANNOTATION] = self._scores[1]
        return wanted

    def _rewatch(self, gpus: Sequence[PhysicalGpu]) -> None:
        if self._health is not None and not self._stop.is_set():
            self._health.stop()
            self._health.start(gpus)


# --- the sub-command ------------------------------------------------------------------------------


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], load_nvml: NvmlLoader
) -> None:
    """Add `hami device-plugin`, its daemon getting NVML from `load_nvml`."""
    parser = subparsers.add_parser(
        "device-plugin",
        help="run the node daemon: kubelet device plugin for vGPUs",
        description="Advertise each GPU as vGPU slots to kubelet, answer Allocate with "
        "HAMi-core's environment, and publish the node's GPUs for the scheduler.",
    )
    add_arguments(parser)
    parser.set_defaults(func=functools.partial(run, load_nvml=load_nvml))


def _configure_logging() -> None:
    level_name = os.environ.get("LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level_name, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run(args: argparse.Namespace, load_nvml: NvmlLoader) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the exit status."""
    _configure_logging()
    try:
        settings = resolve_settings(args, os.environ)
    except ConfigError as error:
        logger.error("%s", error)
        return EXIT_USAGE
    if settings.debug_logging:
        logging.getLogger().setLevel(logging.DEBUG)  # HAMi's -v 4 and above
    daemon = DevicePluginDaemon(settings, load_nvml=load_nvml)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s", signal.Signals(signum).name)
        daemon.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return daemon.run()
