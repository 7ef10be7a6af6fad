"""Another device plugin serving our resource on this node: noticed, logged, and told as a
node Event, never fought silently.

On a GPU Operator cluster NVIDIA's device plugin registers `nvidia.com/gpu` too. Kubelet keeps
every plugin that registered a resource connected (kubelet
`pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go`, `registerClient` appends to the
resource's clients), sends Allocate to the one that connected last (`manager.go`,
`PluginConnected`), and replaces the resource's device list with whichever plugin's
ListAndWatch answered last (`genericDeviceUpdateCallback`), which it then writes to its
checkpoint. Pods then get GPUs HAMi never booked, or none.

Kubelet's device-plugins directory (`--device-plugin-path`) tells, cheaply:

* `kubelet_internal_checkpoint` (JSON, kubelet `pkg/kubelet/cm/devicemanager/checkpoint/
  checkpoint.go`: `{"Data": {"PodDeviceEntries": [...], "RegisteredDevices": {resource: [IDs]}},
  "Checksum": n}`): device IDs registered for our resource that are not ours. Only a checkpoint
  written after our latest registration counts (before it, it still lists what the previous
  plugin had: the operator's plugin just turned off, say).
* a socket with NVIDIA's name for our resource (`nvidia-<name>.sock`, NVIDIA
  `internal/plugin/server.go`, `NewNvidiaDevicePlugin`) beside ours, when ours is named
  otherwise;
* our socket replaced by another process (the registrar's restart reason `SOCKET_REPLACED`):
  with the same socket name (ours defaults to NVIDIA's, as HAMi's), the other plugin takes our
  path and we take it back.

`find_rival` is the pure decision; `RivalWatch` looks at start and every `interval_seconds`,
logs one line and records one Warning Event (`AnotherDevicePlugin`) on the Node per change, one
line when it is gone, and one line per distinct problem with the checkpoint (never raises).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from hami_plugin.deviceplugin.board import DeviceBoard
from hami_plugin.deviceplugin.inventory import PhysicalGpu, VgpuDevice
from hami_plugin.deviceplugin.kubelet import KUBELET_SOCKET_NAME, SOCKET_REPLACED
from hami_plugin.deviceplugin.settings import DevicePluginSettings
from hami_plugin.kube.api import ObjectEventApi
from hami_plugin.kube.records import ObjectRef

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
"""Kubelet's device manager checkpoint, in the device-plugins directory (`manager.go`,
`kubeletDeviceManagerCheckpoint`)."""
EVENT_REASON = "AnotherDevicePlugin"
EVENT_COMPONENT = "hami-device-plugin"
CHECK_INTERVAL_SECONDS = 30.0
SHOWN_IDS = 3
"""Foreign device IDs named in the message; the rest are counted."""

_OUR_ID = re.compile(r"^(?P<uuid>.+)-(?P<n>[0-9]+)$")


class CheckpointError(ValueError):
    """Kubelet's checkpoint is not the JSON `checkpoint.go` writes."""


def nvidia_socket_name(resource_name: str) -> str:
    """The socket NVIDIA's device plugin serves `resource_name` on: `nvidia-<name>.sock`."""
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"


def registered_devices(checkpoint: bytes, resource_name: str) -> tuple[str, ...]:
    """The device IDs kubelet's checkpoint registers for `resource_name` (none when it lists
    no such resource). The checksum is not verified: kubelet's own read does that. Raises
    CheckpointError naming what is wrong."""
    try:
        document = json.loads(checkpoint)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"not JSON ({error})") from error
    data = document.get("Data") if isinstance(document, dict) else None
    if not isinstance(data, dict):
        raise CheckpointError("no Data object")
    registered = data.get("RegisteredDevices")  # null: Go's nil map
    if registered is None:
        return ()
    if not isinstance(registered, dict):
        raise CheckpointError("Data.RegisteredDevices is not an object")
    ids = registered.get(resource_name)
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise CheckpointError(f"Data.RegisteredDevices[{resource_name!r}] is not a list of IDs")
    return tuple(ids)


def is_ours(device_id: str, own_ids: Collection[str], own_gpu_uuids: Collection[str]) -> bool:
    """A device ID we advertise now, or `<UUID>-<n>` of one of our GPUs (what we advertised
    under another split count; NVIDIA's IDs are the bare UUID, `<UUID>::<n>` or an index)."""
    if device_id in own_ids:
        return True
    match = _OUR_ID.match(device_id)
    return match is not None and match["uuid"] in own_gpu_uuids


@dataclass(frozen=True, slots=True)
class Rival:
    """What shows another plugin serving our resource (at least one part is set)."""

    socket: str = ""
    """NVIDIA's socket for our resource, beside ours."""
    foreign_devices: tuple[str, ...] = ()
    """Registered for our resource in kubelet's checkpoint, not ours (sorted)."""
    socket_replaced: int = 0
    """Times our socket was replaced by another process since the last look."""

    def message(self, resource_name: str, plugin_dir: str, own_socket: str) -> str:
        """The one line logged and sent as the Event's message."""
        seen = []
        if self.socket:
            seen.append(f"socket {self.socket} in {plugin_dir}")
        if self.foreign_devices:
            shown = ", ".join(self.foreign_devices[:SHOWN_IDS])
            more = len(self.foreign_devices) - SHOWN_IDS
            seen.append(
                f"kubelet lists {len(self.foreign_devices)} {resource_name} device(s) that are "
                f"not ours ({shown}{f' and {more} more' if more > 0 else ''})"
            )
        if self.socket_replaced:
            seen.append(
                f"our socket {own_socket} was replaced by another process "
                f"{self.socket_replaced} time(s)"
            )
        return (
            f"another device plugin serves {resource_name} on this node: {'; '.join(seen)}. "
            "Kubelet sends each pod to whichever plugin registered last, so GPUs go unbooked "
            "or unserved; turn the other plugin off (GPU Operator: "
            "--set devicePlugin.enabled=false, docs/install.md)"
        )


def find_rival(
    sockets: Iterable[str],
    registered: Sequence[str] | None,
    *,
    resource_name: str,
    own_socket: str,
    own_ids: Collection[str],
    own_gpu_uuids: Collection[str],
    socket_replaced: int = 0,
) -> Rival | None:
    """Whether another plugin serves `resource_name`: from the socket file names in kubelet's
    directory, the IDs its checkpoint registers for the resource (None: no fresh checkpoint to
    go by), and how often our socket was replaced since the last look. None when nothing
    shows one."""
    nvidia = nvidia_socket_name(resource_name)
    socket = nvidia if nvidia != own_socket and nvidia in set(sockets) else ""
    foreign = tuple(sorted({i for i in registered or () if not is_ours(i, own_ids, own_gpu_uuids)}))
    if not (socket or foreign or socket_replaced):
        return None
    return Rival(socket, foreign, socket_replaced)


# --- the adapter: kubelet's directory, the log, the node Event --------------------------------


@dataclass(frozen=True, slots=True)
class OwnDevices:
    """What we serve under the resource: device IDs and the GPUs' UUIDs."""

    ids: frozenset[str]
    gpu_uuids: frozenset[str]

    @classmethod
    def of(cls, devices: Iterable[VgpuDevice], gpus: Iterable[PhysicalGpu]) -> OwnDevices:
        return cls(frozenset(d.id for d in devices), frozenset(g.uuid for g in gpus))


class RivalWatch:
    """Looks at kubelet's device-plugins directory for another plugin serving our resource.

    `own` gives our devices at each look. `registered(reasons)` is the registrar's hook, called
    after each successful registration with the restart reasons that led to it; the first call
    starts the looking (`start()`): at once, then every `interval_seconds` on a thread until
    `stop` is set (`stop()`). `check()` is one look.
    """

    def __init__(
        self,
        kube: ObjectEventApi,
        node_name: str,
        *,
        plugin_dir: str,
        resource_name: str,
        own_socket: str,
        own: Callable[[], OwnDevices],
        interval_seconds: float = CHECK_INTERVAL_SECONDS,
        stop: threading.Event | None = None,
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._plugin_dir = plugin_dir
        self._resource_name = resource_name
        self._own_socket = own_socket
        self._own = own
        self._interval = interval_seconds
        self._lock = threading.Lock()
        self._looking = threading.Lock()  # one look at a time: a change is told once
        self._baseline: tuple[int, int] | None = None  # checkpoint (mtime_ns, inode) at register
        self._read: tuple[tuple[int, int], tuple[str, ...]] | None = None  # last version read
        self._registered = False
        self._replaced = 0
        self._last: Rival | None = None
        self._last_problem = ""
        self._stop = stop or threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_settings(
        cls,
        kube: ObjectEventApi,
        settings: DevicePluginSettings,
        board: DeviceBoard,
        gpus: Callable[[], Iterable[PhysicalGpu]],
        *,
        stop: threading.Event | None = None,
    ) -> RivalWatch:
        """The watch of the daemon's `--device-plugin-path`, `--resource-name`, `--socket-name`:
        ours are the devices on `board` and the GPUs `gpus` gives. Looks until `stop` is set."""
        return cls(
            kube,
            settings.node_name,
            plugin_dir=settings.device_plugin_path,
            resource_name=settings.resource_name,
            own_socket=settings.socket_name,
            own=lambda: OwnDevices.of(board.devices, gpus()),
            stop=stop,
        )

    @property
    def current(self) -> Rival | None:
        """What the latest look found (None: no other plugin)."""
        with self._lock:
            return self._last

    def registered(self, reasons: Sequence[str]) -> None:
        """We registered with kubelet: a checkpoint written from now on lists the last
        sender's devices; `reasons` naming our socket replaced count as the rival's doing."""
        baseline = self._checkpoint_version()
        with self._lock:
            self._registered = True
            self._baseline = baseline
            self._replaced += sum(1 for reason in reasons if reason == SOCKET_REPLACED)
            started = self._thread is not None
        if not started:
            self.start()

    def check(self) -> Rival | None:
        """One look: log and record an Event when what is seen changed. Never raises."""
        with self._looking:
            return self._look()

    def _look(self) -> Rival | None:
        try:
            sockets = self._sockets()
        except OSError as error:
            self._problem(f"cannot list {self._plugin_dir}: {error}")
            return self.current
        registered = self._fresh_registered()
        own = self._own()
        with self._lock:
            replaced, self._replaced = self._replaced, 0
        rival = find_rival(
            sockets,
            registered,
            resource_name=self._resource_name,
            own_socket=self._own_socket,
            own_ids=own.ids,
            own_gpu_uuids=own.gpu_uuids,
            socket_replaced=replaced,
        )
        with self._lock:
            changed, self._last = rival != self._last, rival
        if changed:
            self._tell(rival)
        return rival

    def start(self) -> None:
        """Look now and every `interval_seconds` on a thread, until `stop()`."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="rival-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            try:
                self.check()
            except Exception:  # the watch only warns: it must never take the daemon down
                logger.exception("looking for another device plugin failed")
            if self._stop.wait(self._interval):
                return

    def _tell(self, rival: Rival | None) -> None:
        if rival is None:
            logger.info(
                "no other device plugin serves %s on this node any more", self._resource_name
            )
            return
        message = rival.message(self._resource_name, self._plugin_dir, self._own_socket)
        logger.warning("%s", message)
        # kubelet's own node events name the node as its UID (kubelet.go, `nodeRef`).
        ref = ObjectRef("Node", "", self._node_name, uid=self._node_name)
        self._kube.create_event(ref, EVENT_REASON, message, "Warning", EVENT_COMPONENT)

    def _problem(self, problem: str) -> None:
        if problem != self._last_problem:
            logger.warning("%s; looking at the sockets only", problem)
        self._last_problem = problem

    def _sockets(self) -> list[str]:
        found = []
        with os.scandir(self._plugin_dir) as entries:
            for entry in entries:
                try:
                    if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                        found.append(entry.name)
                except FileNotFoundError:
                    continue  # removed while listed
        return [name for name in found if name != KUBELET_SOCKET_NAME]

    def _checkpoint_path(self) -> str:
        return os.path.join(self._plugin_dir, CHECKPOINT_NAME)

    def _checkpoint_version(self) -> tuple[int, int] | None:
        try:
            status = os.stat(self._checkpoint_path())
        except OSError:
            return None
        return status.st_mtime_ns, status.st_ino

    def _fresh_registered(self) -> tuple[str, ...] | None:
        """The checkpoint's IDs for our resource when kubelet wrote it after our latest
        registration; None otherwise, or when it cannot be read (logged once per problem)."""
        with self._lock:
            registered, baseline = self._registered, self._baseline
        version = self._checkpoint_version()
        if not registered or version is None or version == baseline:
            return None
        if self._read is not None and self._read[0] == version:
            return self._read[1]  # unchanged since the last look: not read again
        path = self._checkpoint_path()
        try:
            with open(path, "rb") as file:
                ids = registered_devices(file.read(), self._resource_name)
        except (OSError, CheckpointError) as error:
            self._problem(f"cannot read kubelet's checkpoint {path}: {error}")
            return None
        self._last_problem = ""
        self._read = (version, ids)
        return ids
