"""The fake NVML's GPU topology: the PCIe common ancestor of every GPU pair and each GPU's NVLinks.

The fake GPU file's optional `topology` key (documented in docs/device-plugin.md, "Fake GPUs"):

```yaml
topology:
  preset: hgx-8-nvswitch   # or pcie-4-nvlink-bridges; then no other key
  # or, written out:
  pcie_default: system     # level of the pairs not listed (default: system)
  pcie:                    # NVML_TOPOLOGY_* of a pair: internal, single, multiple, hostbridge,
    - {gpus: [0, 1], level: node}   # node, system
  nvlink:                  # direct GPU <-> GPU NVLinks (bridges): `links` lanes on each side
    - {gpus: [0, 1], links: 12}
  nvswitch: {gpus: [0, 1, 2, 3], links: 18}   # each GPU's lanes to the NVSwitch fabric
```

GPUs are named by NVML index. A GPU has at most 18 lanes (H100/B200's count). What the fake
answers follows NVML: `nvmlDeviceGetTopologyCommonAncestor` the pair's level;
`nvmlDeviceGetNvLinkState` NotSupported on a GPU without NVLink, InvalidArgument for a link
number >= NVML_NVLINK_MAX_LINKS (36, pynvml's), FEATURE_DISABLED for an unused lane;
`nvmlDeviceGetNvLinkRemotePciInfo` the peer GPU's (or the NVSwitch's) PCI address;
`nvmlDeviceGetNvLinkRemoteDeviceType` GPU or SWITCH.

The presets model two real boxes:
- `hgx-8-nvswitch`: an 8-GPU HGX H100 board. Every GPU has 18 lanes spread over four NVSwitches
  (`nvidia-smi topo -m` shows NV18 for every pair); GPUs 0-3 hang off CPU 0 (pairs `node`),
  4-7 off CPU 1 (pairs across the halves `system`).
- `pcie-4-nvlink-bridges`: a 4-GPU PCIe server (A100 PCIe) with NVLink bridges 0-1 and 2-3
  (12 lanes each, NV12); GPUs 0-1 on CPU 0, 2-3 on CPU 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_NVLINK_MAX_LINKS = 36
"""pynvml 13's value (link numbers 0..35); a fake GPU has at most MAX_LANES enabled lanes."""
MAX_LANES = 18
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF

LEVELS = {
    "internal": NVML_TOPOLOGY_INTERNAL,
    "single": NVML_TOPOLOGY_SINGLE,
    "multiple": NVML_TOPOLOGY_MULTIPLE,
    "hostbridge": NVML_TOPOLOGY_HOSTBRIDGE,
    "node": NVML_TOPOLOGY_NODE,
    "system": NVML_TOPOLOGY_SYSTEM,
}
"""The file's level names for NVML's `nvmlGpuTopologyLevel_t` values."""

NVSWITCH_BUS_IDS = tuple(f"00000000:{bus:02X}:00.0" for bus in (0xC0, 0xC1, 0xC2, 0xC3))
"""PCI addresses of the fake NVSwitches; a GPU's switch lanes go round-robin over them."""

PRESETS = ("hgx-8-nvswitch", "pcie-4-nvlink-bridges")


class FakeTopologyError(ValueError):
    """The `topology` section is invalid; the message says where."""


@dataclass(frozen=True, slots=True)
class NvLinkLane:
    """One enabled NVLink lane of a GPU: what is at its far end."""

    remote_gpu: int | None
    """NVML index of the peer GPU; None when the far end is an NVSwitch."""
    remote_switch_bus_id: str | None = None


@dataclass(frozen=True, slots=True)
class FakeTopology:
    """Pair levels and NVLink lanes by GPU index."""

    pair_levels: Mapping[frozenset[int], int]
    default_level: int
    lanes: Mapping[int, tuple[NvLinkLane, ...]]

    def level(self, first: int, second: int) -> int:
        """NVML's common-ancestor level of two GPUs (INTERNAL for a GPU with itself)."""
        if first == second:
            return NVML_TOPOLOGY_INTERNAL
        return self.pair_levels.get(frozenset((first, second)), self.default_level)

    def lanes_of(self, index: int) -> tuple[NvLinkLane, ...]:
        return self.lanes.get(index, ())


def _preset(name: str) -> dict[str, object]:
    if name == "hgx-8-nvswitch":
        return {
            "pcie_default": "system",
            "pcie": [
                {"gpus": [a, b], "level": "node"}
                for half in (range(0, 4), range(4, 8))
                for a in half
                for b in half
                if a < b
            ],
            "nvswitch": {"gpus": list(range(8)), "links": 18},
        }
    return {
        "pcie_default": "system",
        "pcie": [{"gpus": [0, 1], "level": "node"}, {"gpus": [2, 3], "level": "node"}],
        "nvlink": [{"gpus": [0, 1], "links": 12}, {"gpus": [2, 3], "links": 12}],
    }


def preset_gpu_count(name: str) -> int:
    """How many GPUs a preset describes (the file must list exactly that many)."""
    return 8 if name == "hgx-8-nvswitch" else 4


def _level(value: object, where: str) -> int:
    if not isinstance(value, str) or value not in LEVELS:
        raise FakeTopologyError(f"{where}: level must be one of {', '.join(LEVELS)}, got {value!r}")
    return LEVELS[value]


def _links(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 18:
        raise FakeTopologyError(f"{where}: 'links' must be an integer 1..18, got {value!r}")
    return value


def _gpus(value: object, where: str, count: int, *, pair: bool) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        raise FakeTopologyError(f"{where}: 'gpus' must be a list of GPU indexes, got {value!r}")
    if pair and (len(value) != 2 or value[0] == value[1]):
        raise FakeTopologyError(f"{where}: 'gpus' must name two different GPUs, got {value!r}")
    for index in value:
        if not 0 <= index < count:
            raise FakeTopologyError(f"{where}: GPU index {index} is not in 0..{count - 1}")
    return value


def _entries(section: Mapping[str, object], key: str, where: str) -> list[Mapping[str, object]]:
    entries = section.get(key) or []
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise FakeTopologyError(f"{where}: '{key}' must be a list of mappings")
    return entries


def parse_topology(section: object, gpu_count: int, where: str) -> FakeTopology:
    """Validate the `topology` section of a fake GPU file with `gpu_count` GPUs."""
    where = f"{where}: topology"
    if not isinstance(section, Mapping):
        raise FakeTopologyError(f"{where}: expected a mapping")
    known = ("preset", "pcie_default", "pcie", "nvlink", "nvswitch")
    unknown = sorted(str(key) for key in section if key not in known)
    if unknown:
        raise FakeTopologyError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(known)})")
    if "preset" in section:
        name = section["preset"]
        if not isinstance(name, str) or name not in PRESETS:
            raise FakeTopologyError(f"{where}: preset must be one of {', '.join(PRESETS)}")
        if len(section) > 1:
            raise FakeTopologyError(f"{where}: a preset takes no other key")
        if gpu_count != preset_gpu_count(name):
            raise FakeTopologyError(
                f"{where}: preset {name} describes {preset_gpu_count(name)} GPUs, "
                f"the file has {gpu_count}"
            )
        section = _preset(name)
    default_level = _level(section.get("pcie_default", "system"), f"{where}.pcie_default")
    pair_levels: dict[frozenset[int], int] = {}
    for position, entry in enumerate(_entries(section, "pcie", where)):
        at = f"{where}.pcie[{position}]"
        pair = _gpus(entry.get("gpus"), at, gpu_count, pair=True)
        pair_levels[frozenset(pair)] = _level(entry.get("level"), at)
    lanes: dict[int, list[NvLinkLane]] = {}
    for position, entry in enumerate(_entries(section, "nvlink", where)):
        at = f"{where}.nvlink[{position}]"
        first, second = _gpus(entry.get("gpus"), at, gpu_count, pair=True)
        count = _links(entry.get("links"), at)
        lanes.setdefault(first, []).extend([NvLinkLane(remote_gpu=second)] * count)
        lanes.setdefault(second, []).extend([NvLinkLane(remote_gpu=first)] * count)
    switch = section.get("nvswitch")
    if switch is not None:
        at = f"{where}.nvswitch"
        if not isinstance(switch, Mapping):
            raise FakeTopologyError(f"{at}: expected a mapping with 'gpus' and 'links'")
        count = _links(switch.get("links"), at)
        for index in _gpus(switch.get("gpus"), at, gpu_count, pair=False):
            lanes.setdefault(index, []).extend(
                NvLinkLane(None, NVSWITCH_BUS_IDS[lane % len(NVSWITCH_BUS_IDS)])
                for lane in range(count)
            )
    for index, gpu_lanes in lanes.items():
        if len(gpu_lanes) > MAX_LANES:
            raise FakeTopologyError(
                f"{where}: GPU {index} has {len(gpu_lanes)} NVLink lanes, at most {MAX_LANES}"
            )
    return FakeTopology(
        pair_levels=pair_levels,
        default_level=default_level,
        lanes={index: tuple(gpu_lanes) for index, gpu_lanes in lanes.items()},
    )
