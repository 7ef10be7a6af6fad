"""The MIG profile tables of the GPU models the fake NVML models: what
`nvmlDeviceGetGpuInstanceProfileInfo` and `nvmlDeviceGetGpuInstancePossiblePlacements` answer
on a real A100-SXM4-40GB, A100-SXM4-80GB and H100-SXM5-80GB.

Source: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html: the
profiles, their fractions of memory and SMs, instance counts and the placement diagrams) and
what `nvidia-smi mig -lgip` / `-lgipp` print on those GPUs (profile ids 19/20/15/14/9/5/0,
memory in MiB, SM counts, placements `{0,1,2,3,4,5,6}:1`, `{0,2,4,6}:2`, `{0,2,4}:2`,
`{0,4}:4`, `{0}:4`, `{0}:8`). A GPU has 8 memory slices; a placement `start`/`size` covers the
memory slices `start .. start+size-1`, and two GPU instances may not share one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami_plugin.testing.fakenvml import mignames as naming

__all__ = [
    "MAX_MIG_DEVICES",
    "FakeMigProfile",
    "full_ci_profile",
    "model_profiles",
    "model_total_memory_mib",
    "profile_display_name",
    "resolve_profile",
]

MAX_MIG_DEVICES = 7
"""`nvmlDeviceGetMaxMigDeviceCount` of the modelled GPUs with MIG enabled."""


@dataclass(frozen=True, slots=True)
class FakeMigProfile:
    """One GPU instance profile of one model (the fields of c_nvmlGpuInstanceProfileInfo_v2_t)."""

    constant: int
    """The NVML_GPU_INSTANCE_PROFILE_* value it is asked for by."""
    id: int
    """The profile id NVML reports (`info.id`, what nvidia-smi lists and create calls take)."""
    slice_count: int
    memory_mib: int
    multiprocessor_count: int
    instance_count: int
    starts: tuple[int, ...]
    size: int
    """Placement size in memory slices."""
    copy_engines: int
    decoders: int
    jpegs: int = 0
    ofas: int = 0
    suffix: str = ""
    """The name's attribute suffix (`+me` for the media-extension profile)."""


def _table(
    memory: tuple[int, int, int, int, int, int, int],
    sms: tuple[int, int, int, int, int, int, int],
    decoders: tuple[int, int, int, int, int, int, int],
) -> tuple[FakeMigProfile, ...]:
    """The seven profiles the A100 and H100 share, in `nvidia-smi mig -lgip` order."""
    g = naming
    rows = (
        # constant, id, slices, instances, starts, size, copy engines, jpeg/ofa
        (g.GI_1_SLICE, 19, 1, 7, (0, 1, 2, 3, 4, 5, 6), 1, 1, 0),
        (g.GI_1_SLICE_REV1, 20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, 1, 1),
        (g.GI_1_SLICE_REV2, 15, 1, 4, (0, 2, 4, 6), 2, 1, 0),
        (g.GI_2_SLICE, 14, 2, 3, (0, 2, 4), 2, 2, 0),
        (g.GI_3_SLICE, 9, 3, 2, (0, 4), 4, 3, 0),
        (g.GI_4_SLICE, 5, 4, 1, (0,), 4, 4, 0),
        (g.GI_7_SLICE, 0, 7, 1, (0,), 8, 7, 1),
    )
    return tuple(
        FakeMigProfile(
            constant=constant,
            id=profile_id,
            slice_count=slices,
            memory_mib=memory[position],
            multiprocessor_count=sms[position],
            instance_count=instances,
            starts=starts,
            size=size,
            copy_engines=engines,
            decoders=decoders[position],
            jpegs=jpeg_ofa,
            ofas=jpeg_ofa,
            suffix="+me" if constant == g.GI_1_SLICE_REV1 else "",
        )
        for position, (
            constant,
            profile_id,
            slices,
            instances,
            starts,
            size,
            engines,
            jpeg_ofa,
        ) in (enumerate(rows))
    )


_A100_SMS = (14, 14, 14, 28, 42, 56, 98)
_A100_DECODERS = (0, 1, 1, 1, 2, 2, 5)
_MODELS: dict[str, tuple[int, tuple[FakeMigProfile, ...]]] = {
    # name: (total memory MiB as nvmlDeviceGetMemoryInfo reports it, profiles)
    "A100-SXM4-40GB": (
        40960,
        _table((4864, 4864, 9856, 9856, 19968, 19968, 40192), _A100_SMS, _A100_DECODERS),
    ),
    "A100-SXM4-80GB": (
        81920,
        _table((9728, 9728, 19968, 19968, 40192, 40192, 80640), _A100_SMS, _A100_DECODERS),
    ),
    "H100-SXM5-80GB": (
        81559,
        _table(
            (9984, 9984, 20096, 20096, 40448, 40448, 81152),
            (16, 16, 26, 32, 60, 64, 132),
            (1, 1, 1, 2, 3, 4, 7),
        ),
    ),
}


def _model_key(name: str) -> str:
    return name.removeprefix("NVIDIA ").strip()


def model_profiles(name: str) -> tuple[FakeMigProfile, ...]:
    """The MIG profiles of a GPU model (`NVIDIA A100-SXM4-80GB` or without `NVIDIA `); empty
    for a model without MIG in the fake."""
    entry = _MODELS.get(_model_key(name))
    return entry[1] if entry is not None else ()


def model_total_memory_mib(name: str) -> int | None:
    """The memory a modelled MIG GPU reports, None for other models."""
    entry = _MODELS.get(_model_key(name))
    return entry[0] if entry is not None else None


def full_ci_profile(slice_count: int) -> int:
    """The NVML_COMPUTE_INSTANCE_PROFILE_* constant of a compute instance spanning its GI."""
    return naming.FULL_CI_PROFILE[slice_count]


def profile_display_name(profile: FakeMigProfile, gpu_memory_mib: int) -> str:
    """go-nvlib's name of the profile on a GPU with this much memory (`1g.10gb`)."""
    return naming.mig_profile_name(
        profile.slice_count,
        profile.slice_count,
        profile.suffix,
        profile.memory_mib,
        gpu_memory_mib * 1024 * 1024,
    )


def resolve_profile(model: str, gpu_memory_mib: int, name: str) -> FakeMigProfile | None:
    """The profile of `model` that go-nvlib names `name` on this GPU, None if there is none."""
    for profile in model_profiles(model):
        if profile_display_name(profile, gpu_memory_mib) == name:
            return profile
    return None
