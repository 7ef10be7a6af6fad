"""A small in-memory `MigNvml` for the dynamic MIG tests: A100-SXM4-80GB profiles (NVML's
placements in memory slices), instance creation that refuses overlaps as NVML does, per-MIG-device
processes (`running`), and a log of every create and destroy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hami_plugin.deviceplugin.mig.devices import MigDevice, MigModeState, MigProfileInfo
from hami_plugin.deviceplugin.nvml import NvmlError
from hami_plugin.protocol.model import MigPlacement


def _profile(
    name: str, constant: int, slices: int, mem: int, sms: int, count: int, starts: Sequence[int],
    size: int,
) -> MigProfileInfo:  # fmt: skip
    return MigProfileInfo(
        name=name,
        gi_profile_id=constant,
        slice_count=slices,
        memory_mib=mem,
        multiprocessor_count=sms,
        instance_count=count,
        placements=tuple(MigPlacement(start, size) for start in starts),
    )


A100_80GB = (
    _profile("1g.10gb", 0, 1, 9856, 14, 7, range(7), 1),
    _profile("2g.20gb", 1, 2, 19968, 28, 3, (0, 2, 4), 2),
    _profile("3g.40gb", 2, 3, 40192, 42, 2, (0, 4), 4),
    _profile("4g.40gb", 3, 4, 40192, 56, 1, (0,), 4),
    _profile("7g.80gb", 4, 7, 80768, 98, 1, (0,), 8),
    _profile("1g.20gb", 9, 1, 19968, 14, 4, (0, 2, 4, 6), 2),  # REV2: not a standard group id
)


def overlaps(a: MigPlacement, b: MigPlacement) -> bool:
    return a.start < b.start + b.size and b.start < a.start + a.size


@dataclass
class StubGpu:
    uuid: str
    mig_current: bool = True
    mig_pending: bool = True
    devices: list[MigDevice] = field(default_factory=list)
    busy: bool = False
    next_gi: int = 1


class StubMigNvml:
    """`MigNvml` over `gpus` (index order). `fail_create` makes the next creates fail with
    NVML's error text; `created`/`destroyed` log (gpu index, placement) of each call."""

    def __init__(self, count: int = 1) -> None:
        self.gpus = [
            StubGpu(f"GPU-{index:08d}-0000-0000-0000-000000000000") for index in range(count)
        ]
        self.created: list[tuple[int, MigPlacement]] = []
        self.destroyed: list[tuple[int, MigPlacement]] = []
        self.fail_create: list[str] = []
        self.set_mode_calls = 0
        self.running: set[str] = set()
        """MIG UUIDs a process runs on (destroying one fails with NVML's "In use")."""

    def mig_mode(self, gpu_index: int) -> MigModeState:
        gpu = self.gpus[gpu_index]
        return MigModeState(current=gpu.mig_current, pending=gpu.mig_pending)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        self.set_mode_calls += 1
        gpu = self.gpus[gpu_index]
        gpu.mig_current = gpu.mig_pending = enabled

    def profiles(self, gpu_index: int) -> Sequence[MigProfileInfo]:
        return A100_80GB

    def mig_devices(self, gpu_index: int) -> Sequence[MigDevice]:
        return tuple(self.gpus[gpu_index].devices)

    def create_instance(self, gpu_index: int, profile: str, placement: MigPlacement) -> MigDevice:
        gpu = self.gpus[gpu_index]
        if self.fail_create:
            raise NvmlError(self.fail_create.pop(0))
        if any(overlaps(d.placement, placement) for d in gpu.devices):
            shown = f"{{Start:{placement.start} Size:{placement.size}}}"
            raise NvmlError(
                f"create GI profile={profile} placement={shown}: Insufficient Resources"
            )
        info = next(p for p in A100_80GB if p.name.split(".")[0] == profile.split(".")[0])
        gi = gpu.next_gi
        gpu.next_gi += 1
        device = MigDevice(
            uuid=f"MIG-{gpu_index:02d}{gi:06d}-0000-0000-0000-000000000000",
            parent_uuid=gpu.uuid,
            parent_index=gpu_index,
            mig_index=len(gpu.devices),
            gpu_instance_id=gi,
            compute_instance_id=0,
            profile=info.name,
            placement=placement,
            memory_mib=info.memory_mib,
        )
        gpu.devices.append(device)
        self.created.append((gpu_index, placement))
        return device

    def destroy_instance(
        self, gpu_index: int, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        gpu = self.gpus[gpu_index]
        for device in list(gpu.devices):
            if device.gpu_instance_id == gpu_instance_id:
                if device.uuid in self.running:
                    raise NvmlError(f"destroy CI {compute_instance_id} on gpu {gpu_index}: In use")
                gpu.devices.remove(device)
                self.destroyed.append((gpu_index, device.placement))

    def destroy_all(self, gpu_index: int) -> None:
        gpu = self.gpus[gpu_index]
        for device in list(gpu.devices):
            self.destroy_instance(gpu_index, device.gpu_instance_id, device.compute_instance_id)

    def has_processes(self, gpu_index: int) -> bool:
        gpu = self.gpus[gpu_index]
        return gpu.busy or any(d.uuid in self.running for d in gpu.devices)

    def mig_device_has_processes(self, gpu_index: int, mig_index: int) -> bool:
        gpu = self.gpus[gpu_index]
        device = next((d for d in gpu.devices if d.mig_index == mig_index), None)
        if device is None:
            raise NvmlError(f"get MIG device {mig_index} of gpu {gpu_index}: Not Found")
        return device.uuid in self.running
