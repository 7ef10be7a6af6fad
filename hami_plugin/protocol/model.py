"""Domain types shared by the scheduler and the device plugin.

Plain frozen dataclasses, no I/O. The annotation codec (`hami_plugin.protocol.codec`) turns them
into HAMi's wire strings and back; field names here are the ones a GPU engineer would use, the
HAMi wire names are noted where they differ.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

# --- annotation and resource names (HAMi v2.10 wire names) ---------------------------------

NVIDIA_DEVICE_TYPE = "NVIDIA"
"""The request/device-list type HAMi writes for NVIDIA GPUs (not the card model)."""

ANNOTATION_DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ANNOTATION_DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
ANNOTATION_VGPU_NODE = "hami.io/vgpu-node"
ANNOTATION_VGPU_TIME = "hami.io/vgpu-time"
ANNOTATION_BIND_TIME = "hami.io/bind-time"
ANNOTATION_BIND_PHASE = "hami.io/bind-phase"
ANNOTATION_VGPU_MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
ANNOTATION_NODE_REGISTER = "hami.io/node-nvidia-register"
ANNOTATION_NODE_HANDSHAKE = "hami.io/node-handshake"
ANNOTATION_NODE_LOCK = "hami.io/mutex.lock"
ANNOTATION_DEVICE_CORDON = "hami.io/device-cordon"
ANNOTATION_USE_GPUTYPE = "nvidia.com/use-gputype"
ANNOTATION_NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
ANNOTATION_USE_GPUUUID = "nvidia.com/use-gpuuuid"
ANNOTATION_NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
ANNOTATION_NUMA_BIND = "nvidia.com/numa-bind"
ANNOTATION_VGPU_MODE = "nvidia.com/vgpu-mode"
ANNOTATION_GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
ANNOTATION_NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
ANNOTATION_DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"

LABEL_VGPU_NODE = "hami.io/vgpu-node"

RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_GPU_MEMORY = "nvidia.com/gpumem"
RESOURCE_GPU_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
RESOURCE_GPU_CORES = "nvidia.com/gpucores"
RESOURCE_GPU_PRIORITY = "nvidia.com/priority"

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class OperatingMode(enum.StrEnum):
    """How a node shares its GPUs: a registered device's `mode`, and a node entry's
    `operatingmode` (HAMi v2.10 pkg/device/nvidia/device.go:61-63; its `mps` is not
    implemented here)."""

    HAMI_CORE = "hami-core"
    """HAMi-core's software limits on a shared GPU (HAMi's default)."""
    MIG = "mig"
    """A GPU split into MIG instances on demand (HAMi's `MigMode`)."""


class BindPhase(enum.StrEnum):
    """Value of `hami.io/bind-phase`."""

    ALLOCATING = "allocating"
    SUCCESS = "success"
    FAILED = "failed"


# --- pod device lists (hami.io/vgpu-devices-*) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One GPU (or share of one) given to one container.

    Wire form `<uuid>,<type>,<used_mem_mib>,<used_cores>`; `type` is `NVIDIA` for NVIDIA GPUs.
    """

    uuid: str
    type: str
    used_mem_mib: int
    used_cores: int


ContainerDevices = tuple[ContainerDevice, ...]
"""The devices of one container, in allocation order."""

PodDevices = tuple[ContainerDevices, ...]
"""One entry per container (init containers first, then app containers); empty entries kept."""


# --- node register annotation (hami.io/node-nvidia-register) --------------------------------


@dataclass(frozen=True, slots=True)
class MigPlacement:
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG profile as HAMi v2.10 writes it (`migProfiles`); carried through, not scheduled."""

    name: str
    memory_mib: int
    cores: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU as registered on the node (HAMi's DeviceInfo).

    Wire keys: id, index, count, devmem, devcore, type, numa, mode, migProfiles, health.
    """

    uuid: str
    index: int
    split_count: int
    memory_mib: int
    cores_percent: int
    type: str
    numa_node: int
    mode: str
    healthy: bool
    mig_profiles: tuple[MigProfile, ...] = ()


# --- handshake --------------------------------------------------------------------------------


class HandshakeState(enum.StrEnum):
    REQUESTING = "Requesting"
    REPORTED = "Reported"
    DELETED = "Deleted"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class Handshake:
    """Value of `hami.io/node-handshake`; `time` is None when absent or unparsable."""

    state: HandshakeState
    time: datetime | None
    raw: str


# --- user annotations on the pod --------------------------------------------------------------


class NodePolicy(enum.StrEnum):
    """Node-level placement: binpack fills the fullest node, spread the emptiest."""

    BINPACK = "binpack"
    SPREAD = "spread"


class GpuPolicyName(enum.StrEnum):
    """Names allowed in a GPU scheduler policy (alone or in a comma chain)."""

    BINPACK = "binpack"
    SPREAD = "spread"
    NUMA = "numa"
    MUTEX = "mutex"
    TOPOLOGY_AWARE = "topology-aware"


@dataclass(frozen=True, slots=True)
class GpuPolicy:
    """A parsed GPU scheduler policy such as `spread`, `mutex` or `numa,binpack`.

    `names` keeps the written order (blank items dropped); `chain` is True when the text was
    written as a comma chain or is exactly `numa` (HAMi then compares key by key,
    docs/hami-reference.md 3.5.4). `exact` is False when a single name was written with blanks
    around it: HAMi compares the whole text, so such a policy (and a blank one, `names == ()`)
    orders GPUs as spread, while its name still counts as a filter (`" mutex"`). How the names order
    GPUs is the scheduler's business (`hami_plugin.scheduler`).
    """

    names: tuple[GpuPolicyName, ...]
    chain: bool
    exact: bool = True

    @property
    def text(self) -> str:
        return ",".join(self.names)

    def has(self, name: GpuPolicyName) -> bool:
        return name in self.names


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """`hami.io/device-scoring-weights`: multipliers of the three device-score terms."""

    slot: int = 1
    core: int = 1
    memory: int = 1


@dataclass(frozen=True, slots=True)
class PodGpuOptions:
    """Everything a user can say about GPU placement through pod annotations, parsed once.

    The four lists are None when the annotation is absent or blank (no constraint); otherwise
    their items, trimmed, blank ones dropped, so `","` gives `()`: a `use-*` list that admits
    no GPU, as in HAMi. `vgpu_mode` is the text as written (`""` admits only GPUs without a
    mode, HAMi's substring test). `gpu_policy`/`node_policy`/`scoring_weights` are None when
    the pod does not set them (the scheduler's defaults apply).
    """

    use_gpu_types: tuple[str, ...] | None = None
    nouse_gpu_types: tuple[str, ...] | None = None
    use_gpu_uuids: tuple[str, ...] | None = None
    nouse_gpu_uuids: tuple[str, ...] | None = None
    numa_bind: bool = False
    vgpu_mode: str | None = None
    gpu_policy: GpuPolicy | None = None
    node_policy: NodePolicy | None = None
    scoring_weights: ScoringWeights | None = None
