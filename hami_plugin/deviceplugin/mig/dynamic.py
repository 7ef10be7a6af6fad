"""Dynamic MIG on the node, wired: the instance manager, its start, its reconciler, its part of
Allocate and of the register annotation (HAMi v2.10 `operatingmode: mig`, plugin/server.go:
290-352, 492-505).

`DynamicMig` owns one `MigInstanceManager` over the `MigNvml` calls. `start` runs HAMi's MIG
start (`startup.start_dynamic_mig`: reset idle GPUs, adopt live reservations) from an API
listing of the node's pods, before the plugin serves; then a reconciler thread releases, every
`reconcile_seconds` (HAMi: 5 s), the instances whose pod is gone, Succeeded or Failed. It reads
the node's pod watch when the daemon has one (`nodecache.NodeCache`), else the API. A watch
may not have delivered a pod that Allocate just served from an API listing, so an instance
realised at Allocate stays protected until a listing shows its pod once; after that, the pod
missing from a listing means it is gone. Reconciliation fails closed: a listing that fails or
a reservation that does not decode destroys nothing that round (server.go:494-497).

Each round then sweeps the node's GPUs (`MigInstanceManager.sweep`, our addition, as the start
does): an untracked instance no live signed reservation claims is a gone pod's; it is destroyed
once it runs no process. Not when the start was skipped (the allowlist does not name every GPU):
then nothing on the node is known to be this plugin's. Allocate refuses such an instance at its
placement while it runs processes, and adopts it when idle only if no other live reservation
claims it (`mig_claims`, from the round Allocate runs first).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence

from hami_plugin.deviceplugin.device_list import DeviceListConfig
from hami_plugin.deviceplugin.inventory import PhysicalGpu
from hami_plugin.deviceplugin.metrics import MigDeviceInfo
from hami_plugin.deviceplugin.mig.allocate import MigAllocateStep
from hami_plugin.deviceplugin.mig.devices import MigNvml
from hami_plugin.deviceplugin.mig.manager import MigInstanceManager
from hami_plugin.deviceplugin.mig.plan import AllocationKey, Claims
from hami_plugin.deviceplugin.mig.profiles import contains_model, mig_register_device
from hami_plugin.deviceplugin.mig.startup import (
    LiveReservations,
    active_allocation_keys,
    live_reservations,
    mig_claims,
    start_dynamic_mig,
)
from hami_plugin.deviceplugin.nodecache import CacheNotListedError, NodeCache
from hami_plugin.deviceplugin.nvml import NvmlError
from hami_plugin.kube.api import NodeMetricsApi
from hami_plugin.protocol.mig_allowlist import AllowedMigProfiles
from hami_plugin.protocol.model import GpuDevice
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.protocol.signature import BookingKeys

__all__ = ["RECONCILE_SECONDS", "DynamicMig", "mig_allocation_container_name"]

logger = logging.getLogger(__name__)

RECONCILE_SECONDS = 5.0
"""HAMi's `runMigAnnotationReconciler(5 * time.Second)` (server.go:345)."""


def mig_allocation_container_name(pod: PodInfo, container_index: int) -> str | None:
    """The name of the container a MIG allocation's `containerIndex` counts to: init containers
    first, then the app containers; None when out of range (HAMi `migAllocationContainerName`,
    cmd/vGPUmonitor/metrics.go:573-585)."""
    if container_index < 0:
        return None
    containers = (*pod.init_containers, *pod.containers)
    if container_index >= len(containers):
        return None
    return containers[container_index].name


class DynamicMig:
    """The dynamic MIG side of the device plugin daemon (module docstring).

    `gpus` returns the node's GPUs as last scanned (their UUIDs and NVML indexes); `keys` the
    current booking keys (None: every reservation trusted, as HAMi).
    """

    def __init__(
        self,
        nvml: MigNvml,
        *,
        node_name: str,
        kube: NodeMetricsApi,
        gpus: Callable[[], Sequence[PhysicalGpu]],
        device_list: DeviceListConfig,
        keys: Callable[[], BookingKeys] | None = None,
        cache: NodeCache | None = None,
        allowlist: Sequence[AllowedMigProfiles] = (),
        reconcile_seconds: float = RECONCILE_SECONDS,
    ) -> None:
        self._allowlist = tuple(allowlist)
        self.nvml = nvml
        self.manager = MigInstanceManager(nvml)
        self._node_name = node_name
        self._kube = kube
        self._gpus = gpus
        self._keys = keys
        self._cache = cache
        self._reconcile_seconds = reconcile_seconds
        self._lock = threading.Lock()
        self._rounds = threading.RLock()
        """Held by a reconciliation round and by Allocate's MIG step (`MigAllocateStep`)."""
        self._unseen: dict[AllocationKey, str] = {}
        """Keys realised at Allocate whose pod (UID) no listing has shown yet."""
        self._thread: threading.Thread | None = None
        self._sweeping = False
        """Whether the rounds sweep unclaimed instances (the start ran)."""
        self._live = LiveReservations()
        """The counted reservations of the last round (for `claims`)."""
        self._skipped: set[str] = set()
        """GPUs logged once as registering no profile."""
        self._told: set[str] = set()
        """`device_info` problems already logged (HAMi logs them at every scrape)."""
        self.step = MigAllocateStep(
            self.manager,
            self.gpu_index_of,
            device_list,
            reconcile=self.reconcile,
            on_realised=self._realised,
            guard=self._rounds,
            claims=self.claims,
        )

    # --- lookups ----------------------------------------------------------------------------

    def gpu_index_of(self, gpu_uuid: str) -> int | None:
        """HAMi's `gpuUUIDToIndex` over the last scan."""
        return next((gpu.index for gpu in self._gpus() if gpu.uuid == gpu_uuid), None)

    def _models(self) -> tuple[str, ...]:
        return tuple(model for entry in self._allowlist for model in entry.models)

    def _booking_keys(self) -> BookingKeys | None:
        return self._keys() if self._keys is not None else None

    def _list_pods(self) -> list[PodInfo]:
        """This node's pods: from the watch once it listed, else from the API."""
        if self._cache is not None:
            try:
                return self._cache.pods()
            except CacheNotListedError:
                pass
        return self._kube.list_pods_on_node(self._node_name)

    def register_devices(
        self,
        gpus: Sequence[PhysicalGpu],
        unhealthy: Collection[str],
        allowlist: Sequence[AllowedMigProfiles],
    ) -> dict[str, GpuDevice]:
        """Each GPU's register entry (`mig.profiles.mig_register_device`, from the profiles
        NVML reports for it), by UUID; a GPU NVML cannot answer for, or with no allowlisted
        profile, has none (HAMi: "skip MIG device with no discovered profile capacity")."""
        out: dict[str, GpuDevice] = {}
        for gpu in gpus:
            try:
                profiles = self.nvml.profiles(gpu.index)
            except NvmlError as error:
                logger.warning("GPU %s: cannot list its MIG profiles: %s", gpu.uuid, error)
                continue
            device = mig_register_device(
                uuid=gpu.uuid,
                index=gpu.index,
                card_type=gpu.card_type,
                memory_mib=gpu.memory_mib,
                numa_node=max(gpu.numa_node, 0),
                healthy=gpu.uuid not in unhealthy,
                profiles=profiles,
                allowlist=allowlist,
            )
            if device is None:
                if gpu.uuid not in self._skipped:
                    self._skipped.add(gpu.uuid)
                    logger.info(
                        "skip MIG device with no discovered profile capacity: %s (%s)",
                        gpu.uuid,
                        gpu.card_type,
                    )
                continue
            out[gpu.uuid] = device
        return out

    def device_info(self) -> list[MigDeviceInfo]:
        """`hami_mig_device_info` rows (HAMi cmd/vGPUmonitor/metrics.go:526-571): one per
        realised reservation of a live signed pod, with the runtime identity this manager
        tracks (NVML's, not the pod's unsigned copy of it); the container named by its index,
        init containers first (metrics.go:573-585). A reservation that does not decode or
        names no container is left out, logged with HAMi's words (metrics.go:538-551) once."""
        rows: list[MigDeviceInfo] = []
        live = live_reservations(self._list_pods(), self._node_name, self._booking_keys())
        for line in live.problems:
            self._tell(f"failed to {line}")
        for pod, allocations in live.pods:
            for allocation in allocations:
                container = mig_allocation_container_name(pod, allocation.container_index)
                if container is None:
                    self._tell(
                        f"MIG allocation container index {allocation.container_index} out of "
                        f"range for Pod {pod.namespace}/{pod.name}"
                    )
                    continue
                index = self.gpu_index_of(allocation.gpu_uuid)
                if index is None:
                    continue
                instance = self.manager.runtime_info(
                    index, allocation.profile, allocation.placement
                )
                if instance is None:
                    continue
                rows.append(
                    MigDeviceInfo(
                        namespace=pod.namespace,
                        pod=pod.name,
                        container=container,
                        vdevice_index=allocation.device_index,
                        device_uuid=allocation.gpu_uuid,
                        mig_uuid=instance.mig_uuid,
                        profile=allocation.profile,
                        gpu_instance_id=instance.gpu_instance_id,
                        compute_instance_id=instance.compute_instance_id,
                    )
                )
        return rows

    def _tell(self, message: str) -> None:
        with self._lock:
            if message in self._told:
                return
            self._told.add(message)
        logger.error("hami_mig_device_info: %s", message)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, stop: threading.Event) -> None:
        """HAMi's MIG start, then the reconciler thread (until `stop` is set). Never raises.

        As HAMi (server.go:276-290), the start (reset, adoption) runs only when every GPU's
        model is named by the allowlist; the reconciler runs either way."""
        gpus = self._gpus()
        outside = [g.name for g in gpus if not contains_model(g.name, self._models())]
        if gpus and not outside:
            start_dynamic_mig(
                self.manager,
                self.nvml,
                len(gpus),
                lambda: self._kube.list_pods_on_node(self._node_name),
                self._node_name,
                self._booking_keys(),
                self.gpu_index_of,
            )
            self._sweeping = True
        else:
            logger.warning(
                "mig init skipped: no GPU reset or adopted, as %s the MIG profile allowlist "
                "(migProfileAllowlist)",
                f"{', '.join(sorted(set(outside)))} is not in" if outside else "no GPU is in",
            )
        self._thread = threading.Thread(
            target=self._run, args=(stop,), name="mig-reconciler", daemon=True
        )
        self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self._reconcile_seconds):
            try:
                self.reconcile()
            except Exception as error:
                # Reconciliation destroys instances: on any doubt it leaves them.
                logger.info("periodic MIG reconciliation skipped: %s", error)

    def _realised(self, uid: str, keys: Sequence[AllocationKey]) -> None:
        with self._lock:
            for key in keys:
                self._unseen[key] = uid

    def reconcile(self) -> tuple[AllocationKey, ...]:
        """One reconciliation round: release the instances no live signed reservation needs.
        Returns the keys released; raises (destroying nothing more) when the pods cannot be
        listed or read, or NVML fails."""
        with self._rounds:
            return self._reconcile_round()

    def _reconcile_round(self) -> tuple[AllocationKey, ...]:
        pods = self._list_pods()
        live = live_reservations(pods, self._node_name, self._booking_keys())
        active = set(active_allocation_keys(live, self.gpu_index_of))
        listed = {pod.uid for pod in pods}
        with self._lock:
            for key, uid in list(self._unseen.items()):
                if uid in listed:
                    del self._unseen[key]
                else:
                    active.add(key)
            self._live = live
        released = self.manager.reconcile(active)
        if self._sweeping:
            self.manager.sweep(
                [gpu.index for gpu in self._gpus()], mig_claims(live, self.gpu_index_of)
            )
        return released

    def claims(self, uid: str) -> Claims:
        """The instances the live reservations of pods other than `uid` hold, as of the last
        round (`startup.mig_claims`)."""
        with self._lock:
            live = self._live
        return mig_claims(live, self.gpu_index_of, except_uid=uid)
