"""MIG profile names as NVIDIA's go-nvlib writes them (`1g.10gb`, `1c.2g.20gb`, `1g.5gb+me`),
from the NVML GPU/compute instance profile constants and the memory NVML reports. Pure.

HAMi v2.10 names its static MIG devices with go-nvlib's `MigProfile.String()`
(pkg/device-plugin/nvidiadevice/nvinternal/rm/device_map.go:154-159 calls `mig.GetProfile()`),
which go-nvlib v0.12.0 builds in pkg/nvlib/device/mig_profile.go `NewMigProfile` (slices from
the profile constants, the `+me` / `+me.all` / `+gfx` / `-me` attributes) and rounds the
memory with `getMigMemorySizeGB`: the instance's share of the GPU's memory rounded *up* to an
eighth, times the GPU's memory in whole GB rounded up, rounded to the nearest GB.
HAMi's dynamic MIG maps a profile name to NVML constants by its slice key only
(plugin/migmgr.go:23-41 `profileNameToGIProfileID` / `profileNameToCIProfileID`, :109-114
`profileSliceKey`): that table is here too.
"""

from __future__ import annotations

import math

__all__ = [
    "CI_PROFILE_SLICES",
    "GI_PROFILE_ATTRIBUTES",
    "GI_PROFILE_SLICES",
    "HAMI_CI_PROFILE_BY_SLICE_KEY",
    "HAMI_GI_PROFILE_BY_SLICE_KEY",
    "mig_memory_size_gb",
    "profile_name",
    "profile_slice_key",
]

# NVML_GPU_INSTANCE_PROFILE_* values (nvml.h; pynvml has the same numbers).
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
GI_1_SLICE_GFX = 0xA
GI_2_SLICE_GFX = 0xB
GI_4_SLICE_GFX = 0xC
GI_1_SLICE_NO_ME = 0xD
GI_2_SLICE_NO_ME = 0xE
GI_1_SLICE_ALL_ME = 0xF
GI_2_SLICE_ALL_ME = 0x10
GI_PROFILE_COUNT = 0x12
"""NVML_GPU_INSTANCE_PROFILE_COUNT of nvidia-ml-py 13 (0x11, 3_SLICE_GFX, has no slice rule in
go-nvlib v0.12.0 and is left out of `GI_PROFILE_SLICES`)."""

# NVML_COMPUTE_INSTANCE_PROFILE_* values.
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

GI_PROFILE_SLICES: dict[int, int] = {
    GI_1_SLICE: 1,
    GI_1_SLICE_REV1: 1,
    GI_1_SLICE_REV2: 1,
    GI_1_SLICE_GFX: 1,
    GI_1_SLICE_NO_ME: 1,
    GI_1_SLICE_ALL_ME: 1,
    GI_2_SLICE: 2,
    GI_2_SLICE_REV1: 2,
    GI_2_SLICE_GFX: 2,
    GI_2_SLICE_NO_ME: 2,
    GI_2_SLICE_ALL_ME: 2,
    GI_3_SLICE: 3,
    GI_4_SLICE: 4,
    GI_4_SLICE_GFX: 4,
    GI_6_SLICE: 6,
    GI_7_SLICE: 7,
    GI_8_SLICE: 8,
}
"""GPU instance profile constant -> compute slices (go-nvlib mig_profile.go `NewMigProfile`)."""

CI_PROFILE_SLICES: dict[int, int] = {
    CI_1_SLICE: 1,
    CI_1_SLICE_REV1: 1,
    CI_2_SLICE: 2,
    CI_3_SLICE: 3,
    CI_4_SLICE: 4,
    CI_6_SLICE: 6,
    CI_7_SLICE: 7,
    CI_7_SLICE_NVL: 7,
    CI_8_SLICE: 8,
}
"""Compute instance profile constant -> slices (go-nvlib mig_profile.go `NewMigProfile`)."""

GI_PROFILE_ATTRIBUTES: dict[int, str] = {
    GI_1_SLICE_REV1: "+me",
    GI_2_SLICE_REV1: "+me",
    GI_1_SLICE_ALL_ME: "+me.all",
    GI_2_SLICE_ALL_ME: "+me.all",
    GI_1_SLICE_GFX: "+gfx",
    GI_2_SLICE_GFX: "+gfx",
    GI_4_SLICE_GFX: "+gfx",
    GI_1_SLICE_NO_ME: "-me",
    GI_2_SLICE_NO_ME: "-me",
}
"""The name suffix of a profile constant (go-nvlib `MigProfileInfo.String`)."""

HAMI_GI_PROFILE_BY_SLICE_KEY: dict[str, int] = {
    "1g": GI_1_SLICE,
    "2g": GI_2_SLICE,
    "3g": GI_3_SLICE,
    "4g": GI_4_SLICE,
    "6g": GI_6_SLICE,
    "7g": GI_7_SLICE,
    "8g": GI_8_SLICE,
}
"""HAMi's `profileNameToGIProfileID` (plugin/migmgr.go:23-31)."""

HAMI_CI_PROFILE_BY_SLICE_KEY: dict[str, int] = {
    "1g": CI_1_SLICE,
    "2g": CI_2_SLICE,
    "3g": CI_3_SLICE,
    "4g": CI_4_SLICE,
    "6g": CI_6_SLICE,
    "7g": CI_7_SLICE,
    "8g": CI_8_SLICE,
}
"""HAMi's `profileNameToCIProfileID` (plugin/migmgr.go:33-41)."""

_MIB = 1024 * 1024
_GIB = 1024 * 1024 * 1024


def profile_slice_key(profile: str) -> str:
    """`1g.10gb` -> `1g`: HAMi's `profileSliceKey` (plugin/migmgr.go:109-114)."""
    index = profile.find(".")
    return profile[:index] if index > 0 else profile


def mig_memory_size_gb(total_device_memory_bytes: int, mig_memory_size_mib: int) -> int:
    """go-nvlib's `getMigMemorySizeGB` (mig_profile.go): the GB figure of a profile name."""
    if total_device_memory_bytes <= 0:
        return 0
    fraction = (float(mig_memory_size_mib) * _MIB) / float(total_device_memory_bytes)
    fraction = math.ceil(fraction * 8) / 8
    total_gb = float((total_device_memory_bytes + _GIB - 1) // _GIB)
    # Go's math.Round rounds half away from zero; Python's round() rounds half to even.
    return math.floor(fraction * total_gb + 0.5)


def profile_name(
    gi_profile: int, ci_profile: int, memory_size_mib: int, total_device_memory_bytes: int
) -> str | None:
    """go-nvlib's `MigProfileInfo.String()`: `<G>g.<GB>gb` when the compute instance spans the
    GPU instance, else `<C>c.<G>g.<GB>gb`, plus the profile's attribute suffix. None for a
    profile constant go-nvlib does not know."""
    g = GI_PROFILE_SLICES.get(gi_profile)
    c = CI_PROFILE_SLICES.get(ci_profile)
    if g is None or c is None:
        return None
    gb = mig_memory_size_gb(total_device_memory_bytes, memory_size_mib)
    suffix = GI_PROFILE_ATTRIBUTES.get(gi_profile, "")
    if c == g:
        return f"{g}g.{gb}gb{suffix}"
    return f"{c}c.{g}g.{gb}gb{suffix}"
