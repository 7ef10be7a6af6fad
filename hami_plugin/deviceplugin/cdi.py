"""The CDI spec of this node's GPUs: built from the inventory (pure), written atomically.

With a CDI device list strategy (`device_list`), Allocate names each GPU as
`k8s.device-plugin.nvidia.com/gpu=<uuid>` and the container runtime looks the name up in a CDI
spec under `/var/run/cdi`. HAMi v2.10 has NVIDIA's toolkit (`nvcdi`) generate that spec at start
(cmd/device-plugin/nvidia/plugin-manager.go:49-80; pkg/device-plugin/nvidiadevice/nvinternal/cdi/
cdi.go:183-230): vendor `k8s.device-plugin.nvidia.com`, class `gpu`, one device per GPU named
by the device ID strategy (UUIDs by default) plus `all`, saved as
`<cdiRoot>/k8s.device-plugin.nvidia.com-gpu.json` (the CDI library's `GenerateNameForSpec`).

What ours holds (docs/differences.md): each GPU's `/dev/nvidia<minor>` node, the `all` device,
and the common nodes `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` with
`NVIDIA_VISIBLE_DEVICES=void` (so nvidia-container-runtime does not inject the GPUs a second
time). The toolkit's spec also mounts the driver libraries and adds its ldcache hooks; this one
does not look through the host's driver files, so the runtime must still provide the driver
(nvidia-container-runtime in `cdi` mode, or a toolkit-generated spec for the driver files).
MIG devices served by a static MIG strategy (`mig.static`) are in the spec twice, as NVIDIA's
toolkit names them: by MIG UUID (the name Allocate uses) and by `<gpu index>:<mig index>`; each
holds its parent's `/dev/nvidia<minor>` and, where `/proc/driver/nvidia-caps/mig-minors` lists
them, the GPU and compute instance capability nodes `/dev/nvidia-caps/nvidia-cap<n>` (HAMi:
rm/nvml_devices.go:120-164). MIG-mode GPUs themselves are not devices of the spec. No
`gdrcopy`/`gds`/`mofed` mode specs are written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hami_plugin.deviceplugin.device_list import CDI_GPU_CLASS, CDI_VENDOR, ENV_VISIBLE_DEVICES
from hami_plugin.deviceplugin.inventory import PhysicalGpu

if TYPE_CHECKING:
    from hami_plugin.deviceplugin.mig.devices import MigDevice

logger = logging.getLogger(__name__)

CDI_VERSION = "0.5.0"
DEFAULT_CDI_SPEC_DIR = "/var/run/cdi"
COMMON_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
ALL_DEVICE_NAME = "all"
MIG_MINORS_PATH = "/proc/driver/nvidia-caps/mig-minors"
"""The driver's table of MIG capability minors: `gpu<minor>/gi<id>/access <n>` and
`gpu<minor>/gi<id>/ci<id>/access <n>` lines (HAMi's mig.GetMigCapabilityDevicePaths)."""


def cdi_kind() -> str:
    """The spec's kind: `k8s.device-plugin.nvidia.com/gpu`."""
    return f"{CDI_VENDOR}/{CDI_GPU_CLASS}"


def cdi_spec_file_name() -> str:
    """The spec's file name, as the CDI library names it: `<vendor>-<class>.json`."""
    return f"{CDI_VENDOR}-{CDI_GPU_CLASS}.json"


def gpu_device_node(gpu: PhysicalGpu) -> str:
    """The GPU's device node: `/dev/nvidia<minor>`; the NVML index when NVML gave no minor
    number (the driver numbers the nodes in the same order on a plain node)."""
    minor = gpu.minor_number if gpu.minor_number is not None else gpu.index
    return f"/dev/nvidia{minor}"


def parse_mig_minors(text: str) -> dict[str, int]:
    """`mig-minors` lines -> capability path (`gpu0/gi1/ci0/access`) -> minor; others skipped."""
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def read_mig_minors(path: str = MIG_MINORS_PATH) -> dict[str, int]:
    """The driver's MIG capability minors; empty when the file cannot be read (no MIG driver)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_mig_minors(handle.read())
    except OSError:
        return {}


def mig_device_nodes(
    device: MigDevice, parent: PhysicalGpu, mig_minors: Mapping[str, int]
) -> list[str]:
    """The device nodes of one MIG device: its parent's, then the GPU instance's and compute
    instance's capability nodes where the driver lists them (rm/nvml_devices.go:147-161)."""
    minor = parent.minor_number if parent.minor_number is not None else parent.index
    gi = f"gpu{minor}/gi{device.gpu_instance_id}"
    nodes = [gpu_device_node(parent)]
    for key in (f"{gi}/access", f"{gi}/ci{device.compute_instance_id}/access"):
        if key in mig_minors:
            nodes.append(f"/dev/nvidia-caps/nvidia-cap{mig_minors[key]}")
    return nodes


def build_cdi_spec(
    gpus: Sequence[PhysicalGpu],
    mig_devices: Sequence[MigDevice] = (),
    mig_minors: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The CDI spec (a JSON object) for `gpus`: one device per GPU named by its UUID, each of
    `mig_devices` by its MIG UUID and by `<gpu index>:<mig index>`, plus `all`. GPUs come in
    NVML index order, MIG devices as given; MIG-mode GPUs are left out (see the module doc)."""
    ordered = sorted((gpu for gpu in gpus if not gpu.mig_enabled), key=lambda gpu: gpu.index)
    devices: list[dict[str, Any]] = [
        {"name": gpu.uuid, "containerEdits": {"deviceNodes": [{"path": gpu_device_node(gpu)}]}}
        for gpu in ordered
    ]
    every_node = [gpu_device_node(gpu) for gpu in ordered]
    parents = {gpu.uuid: gpu for gpu in gpus}
    for device in mig_devices:
        parent = parents.get(device.parent_uuid)
        if parent is None:
            continue
        nodes = mig_device_nodes(device, parent, mig_minors or {})
        if len(nodes) < 3:
            # HAMi refuses such a device at start (rm/nvml_devices.go:147-155); here it is said.
            logger.warning(
                "MIG device %s: missing MIG GPU instance capability path (gi%d/ci%d of "
                "/dev/nvidia%s not in %s): its CDI device holds only %s",
                device.uuid,
                device.gpu_instance_id,
                device.compute_instance_id,
                nodes[0].removeprefix("/dev/nvidia"),
                MIG_MINORS_PATH,
                ", ".join(nodes),
            )
        edits = {"deviceNodes": [{"path": path} for path in nodes]}
        for name in (device.uuid, f"{device.parent_index}:{device.mig_index}"):
            devices.append({"name": name, "containerEdits": edits})
        every_node.extend(node for node in nodes if node not in every_node)
    if every_node:
        devices.append(
            {
                "name": ALL_DEVICE_NAME,
                "containerEdits": {"deviceNodes": [{"path": path} for path in every_node]},
            }
        )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(),
        "devices": devices,
        "containerEdits": {
            "env": [f"{ENV_VISIBLE_DEVICES}=void"],
            "deviceNodes": [{"path": path} for path in COMMON_DEVICE_NODES],
        },
    }


def write_cdi_spec(spec: dict[str, Any], spec_dir: str) -> str:
    """Write `spec` to `<spec_dir>/<cdi_spec_file_name()>` atomically (a temporary file in the
    same directory, then a rename: a runtime never reads half a spec); creates `spec_dir`.

    Returns the path written. Raises OSError when the directory or file cannot be written.
    """
    os.makedirs(spec_dir, exist_ok=True)
    path = os.path.join(spec_dir, cdi_spec_file_name())
    descriptor, temporary = tempfile.mkstemp(prefix=".hami-cdi-", suffix=".tmp", dir=spec_dir)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(spec, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    logger.info("wrote the CDI spec to %s", path)
    return path
