"""How a container's GPU list reaches the container runtime: the device list strategies (pure).

HAMi v2.10 takes NVIDIA's `--device-list-strategy` (`DEVICE_LIST_STRATEGY`, a comma list, default
`envvar`; cmd/device-plugin/nvidia/main.go:115-120) and answers each container in
`getAllocateResponse` (pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go:914-953):

- `envvar`: `NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>` (server.go:1056-1059);
- `volume-mounts`: `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` and one mount of
  `/dev/null` at `/var/run/nvidia-container-devices/<uuid>` per GPU (server.go:72-76, 1071-1081);
- `cdi-annotations`: one annotation `cdi.k8s.io/nvidia-device-plugin_<response id>` whose value
  is the comma list of qualified CDI names `k8s.device-plugin.nvidia.com/gpu=<uuid>`, the prefix
  replaced by `--cdi-annotation-prefix` (server.go:955-1009; the key and value are the CDI
  library's `UpdateAnnotations`);
- `cdi-cri`: the same names in the response's `cdi_devices` (server.go:979-986; kubelet 1.28+).

When every chosen strategy is a CDI one, HAMi returns before the env/mount strategies and before
`NVIDIA_GDRCOPY`/`NVIDIA_GDS`/`NVIDIA_MOFED` (server.go:928-951): with CDI those come as the CDI
devices `k8s.device-plugin.nvidia.com/<mode>=all`, which HAMi lists only when the toolkit wrote a
spec for the mode (cdi/cdi.go:154-177, 280-292). This plugin writes no mode specs (`cdi.py`), so
in CDI-only mode the three flags add nothing. HAMi-core's environment and mounts come on top in
every mode (`allocate.container_envs`, `container_mounts`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
VOLUME_MOUNTS_CONTAINER_ROOT = "/var/run/nvidia-container-devices"
DEFAULT_CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_VENDOR = "k8s.device-plugin.nvidia.com"
"""HAMi's CDI vendor (cmd/device-plugin/nvidia/plugin-manager.go:57)."""
CDI_GPU_CLASS = "gpu"
CDI_ANNOTATION_PLUGIN_NAME = "nvidia-device-plugin"
_CDI_ANNOTATION_NAME_MAX = 63
"""The CDI library's limit on `<plugin>_<id>` in an annotation key."""


class DeviceListStrategy(enum.StrEnum):
    """NVIDIA's device list strategies, as HAMi takes them."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"

    @property
    def is_cdi(self) -> bool:
        """True for the strategies that name CDI devices (NVIDIA: the `cdi-` prefix)."""
        return self.value.startswith("cdi-")


def parse_device_list_strategies(raw: object) -> frozenset[DeviceListStrategy]:
    """A comma list (or a YAML list) of strategies, as NVIDIA's `NewDeviceListStrategies`.

    Raises ValueError `invalid strategy: <s>` for an unknown one (NVIDIA's words) and for an
    empty list: HAMi would answer an empty list with no device list at all, so the container
    would get no GPU; we refuse it at start instead.
    """
    if isinstance(raw, list | tuple):
        words = [str(item).strip() for item in raw]
    elif isinstance(raw, str):
        words = [word.strip() for word in raw.split(",")]
    else:
        raise ValueError(f"expected a comma list of strategies, got {raw!r}")
    strategies: set[DeviceListStrategy] = set()
    for word in words:
        if not word:
            continue
        try:
            strategies.add(DeviceListStrategy(word))
        except ValueError:
            raise ValueError(f"invalid strategy: {word}") from None
    if not strategies:
        raise ValueError(
            "no device list strategy given: at least one of "
            + ", ".join(s.value for s in DeviceListStrategy)
        )
    return frozenset(strategies)


def cdi_qualified_name(uuid: str, *, cdi_class: str = CDI_GPU_CLASS) -> str:
    """The CDI name of one GPU in HAMi's spec: `k8s.device-plugin.nvidia.com/gpu=<uuid>`."""
    return f"{CDI_VENDOR}/{cdi_class}={uuid}"


@dataclass(frozen=True, slots=True)
class DeviceListConfig:
    """The device list settings Allocate depends on (resolved once in `settings`)."""

    strategies: frozenset[DeviceListStrategy] = frozenset({DeviceListStrategy.ENVVAR})
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
    gdrcopy_enabled: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False

    @property
    def any_cdi(self) -> bool:
        """Some strategy names CDI devices: the daemon must write the CDI spec."""
        return any(strategy.is_cdi for strategy in self.strategies)

    @property
    def all_cdi(self) -> bool:
        """Every strategy is a CDI one (NVIDIA's `AllCDIEnabled`)."""
        return all(strategy.is_cdi for strategy in self.strategies)


@dataclass(frozen=True, slots=True)
class DeviceListAnswer:
    """What the strategies add to one ContainerAllocateResponse, before HAMi-core's part.

    `mount_paths` are container paths, each backed by `/dev/null` (read-write, as HAMi's).
    """

    envs: Mapping[str, str] = field(default_factory=dict)
    mount_paths: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def cdi_annotations(
    response_id: str, devices: Sequence[str], prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX
) -> dict[str, str]:
    """The CDI annotation of one response: `<prefix>nvidia-device-plugin_<id>` = the names.

    Raises ValueError when the key's name part is longer than the CDI library allows (63).
    """
    name = f"{CDI_ANNOTATION_PLUGIN_NAME}_{response_id.replace('/', '_')}"
    if len(name) > _CDI_ANNOTATION_NAME_MAX:
        raise ValueError(f"CDI annotation name {name!r} is longer than 63 characters")
    return {f"{prefix}{name}": ",".join(devices)}


def device_list_answer(
    gpu_uuids: Iterable[str], config: DeviceListConfig, response_id: str
) -> DeviceListAnswer:
    """The strategies' part of one container's answer for its GPUs (repeats counted once).

    `response_id` names the CDI annotation (HAMi: a fresh UUIDv4 per container response); it is
    used only with `cdi-annotations`. Raises ValueError as `cdi_annotations`.
    """
    uuids = list(dict.fromkeys(gpu_uuids))
    strategies = config.strategies
    annotations: dict[str, str] = {}
    cdi_devices: tuple[str, ...] = ()
    if config.any_cdi and uuids:
        names = tuple(cdi_qualified_name(uuid) for uuid in uuids)
        if DeviceListStrategy.CDI_ANNOTATIONS in strategies:
            annotations = cdi_annotations(response_id, names, config.cdi_annotation_prefix)
        if DeviceListStrategy.CDI_CRI in strategies:
            cdi_devices = names
    if config.all_cdi:
        return DeviceListAnswer(annotations=annotations, cdi_devices=cdi_devices)
    envs: dict[str, str] = {}
    mount_paths: tuple[str, ...] = ()
    if DeviceListStrategy.ENVVAR in strategies:
        envs[ENV_VISIBLE_DEVICES] = ",".join(uuids)
    if DeviceListStrategy.VOLUME_MOUNTS in strategies:
        envs[ENV_VISIBLE_DEVICES] = VOLUME_MOUNTS_CONTAINER_ROOT
        mount_paths = tuple(f"{VOLUME_MOUNTS_CONTAINER_ROOT}/{uuid}" for uuid in uuids)
    if config.gdrcopy_enabled:
        envs["NVIDIA_GDRCOPY"] = "enabled"
    if config.gds_enabled:
        envs["NVIDIA_GDS"] = "enabled"
    if config.mofed_enabled:
        envs["NVIDIA_MOFED"] = "enabled"
    return DeviceListAnswer(
        envs=envs, mount_paths=mount_paths, annotations=annotations, cdi_devices=cdi_devices
    )
