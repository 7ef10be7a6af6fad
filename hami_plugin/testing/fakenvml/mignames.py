"""NVML's MIG profile constants and NVIDIA's MIG profile names, for the fake NVML.

The fake keeps its own copy rather than importing the adapter's (`deviceplugin.mig.naming`):
the adapter is what the fake tests, so the two are written apart. The name is go-nvlib
v0.12.0's `MigProfileInfo.String()` (pkg/nvlib/device/mig_profile.go): `<G>g.<GB>gb` or
`<C>c.<G>g.<GB>gb` plus the profile's attribute suffix, GB from `getMigMemorySizeGB` (the share
of the GPU's memory rounded up to an eighth, times the GPU's whole GB rounded up, rounded half
away from zero).
"""

from __future__ import annotations

import math

# NVML_GPU_INSTANCE_PROFILE_* (nvml.h, the values pynvml has).
GI_1_SLICE = 0x0
GI_2_SLICE = 0x1
GI_3_SLICE = 0x2
GI_4_SLICE = 0x3
GI_7_SLICE = 0x4
GI_8_SLICE = 0x5
GI_6_SLICE = 0x6
GI_1_SLICE_REV1 = 0x7
GI_2_SLICE_REV1 = 0x8
GI_1_SLICE_REV2 = 0x9
GI_PROFILE_COUNT = 0x12

# NVML_COMPUTE_INSTANCE_PROFILE_*.
CI_1_SLICE = 0x0
CI_2_SLICE = 0x1
CI_3_SLICE = 0x2
CI_4_SLICE = 0x3
CI_7_SLICE = 0x4
CI_8_SLICE = 0x5
CI_6_SLICE = 0x6
CI_1_SLICE_REV1 = 0x7
CI_7_SLICE_NVL = 0x8
CI_PROFILE_COUNT = 0x9
CI_ENGINE_PROFILE_SHARED = 0x0

CI_PROFILE_SLICES: dict[int, int] = {
    CI_1_SLICE: 1,
    CI_2_SLICE: 2,
    CI_3_SLICE: 3,
    CI_4_SLICE: 4,
    CI_6_SLICE: 6,
    CI_7_SLICE: 7,
    CI_8_SLICE: 8,
}
"""The compute instance profiles the fake offers -> their slices (REV1 / NVL: not offered)."""

FULL_CI_PROFILE: dict[int, int] = {slices: ci for ci, slices in CI_PROFILE_SLICES.items()}
"""Slices -> the compute instance profile of that many slices."""

_MIB = 1024 * 1024
_GIB = 1024 * 1024 * 1024


def memory_size_gb(total_device_memory_bytes: int, memory_size_mib: int) -> int:
    """go-nvlib's `getMigMemorySizeGB`."""
    if total_device_memory_bytes <= 0:
        return 0
    fraction = math.ceil(memory_size_mib * _MIB / total_device_memory_bytes * 8) / 8
    total_gb = (total_device_memory_bytes + _GIB - 1) // _GIB
    return math.floor(fraction * total_gb + 0.5)


def mig_profile_name(
    gi_slices: int, ci_slices: int, suffix: str, memory_size_mib: int, total_bytes: int
) -> str:
    """`1g.10gb`, `1c.2g.20gb`, `1g.5gb+me` as go-nvlib writes them."""
    gb = memory_size_gb(total_bytes, memory_size_mib)
    if ci_slices == gi_slices:
        return f"{gi_slices}g.{gb}gb{suffix}"
    return f"{ci_slices}c.{gi_slices}g.{gb}gb{suffix}"
