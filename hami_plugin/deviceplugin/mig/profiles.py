"""What a MIG-mode GPU registers in `hami.io/node-nvidia-register`: its allowlisted profiles
with NVML's memory, slices, instance count and placements (pure).

HAMi v2.10 register.go:190-202 and `discoverMigProfiles` (register.go:209-254): the first
`migProfileAllowlist` entry one of whose models is a substring of the card type
(`containsModel`, util.go:281-289) lists the profiles; each is looked up by its slice group
(`plan.GI_PROFILE_IDS`), a group NVML does not offer is skipped, `core` is the profile's
multiprocessors as a percentage of the largest profile's, rounded up, and the device's `count`
is the largest instance count. A GPU left with no profile is not registered ("skip MIG device
with no discovered profile capacity").
"""

from __future__ import annotations

from collections.abc import Sequence

from hami_plugin.deviceplugin.mig.devices import MigProfileInfo
from hami_plugin.deviceplugin.mig.plan import GI_PROFILE_IDS, gi_profile_for
from hami_plugin.protocol.mig_allowlist import AllowedMigProfiles
from hami_plugin.protocol.model import GpuDevice, MigProfile, OperatingMode

__all__ = [
    "contains_model",
    "mig_device_count",
    "mig_register_device",
    "register_mig_profiles",
]


def contains_model(card_type: str, models: Sequence[str]) -> bool:
    """HAMi's `containsModel` (util.go:281-289): some model is a substring of the card type."""
    return any(model in card_type for model in models)


def register_mig_profiles(
    card_type: str,
    profiles: Sequence[MigProfileInfo],
    allowlist: Sequence[AllowedMigProfiles],
) -> tuple[MigProfile, ...]:
    """HAMi's `discoverMigProfiles` over the profiles NVML reports for the GPU."""
    standard = [info for info in profiles if info.gi_profile_id in GI_PROFILE_IDS.values()]
    full_gpu_sms = max((info.multiprocessor_count for info in standard), default=0)
    out: list[MigProfile] = []
    for allowed in allowlist:
        if not contains_model(card_type, allowed.models):
            continue
        for name in allowed.profiles:
            info = gi_profile_for(profiles, name)
            if info is None:
                continue
            cores = 0
            if full_gpu_sms > 0:
                cores = (info.multiprocessor_count * 100 + full_gpu_sms - 1) // full_gpu_sms
            out.append(
                MigProfile(
                    name=name,
                    memory_mib=info.memory_mib,
                    cores=cores,
                    slice_count=info.slice_count,
                    placements=tuple(info.placements),
                )
            )
        break
    return tuple(out)


def mig_device_count(
    card_type: str,
    profiles: Sequence[MigProfileInfo],
    allowlist: Sequence[AllowedMigProfiles],
) -> int:
    """The register `count` of a MIG-mode GPU: the largest instance count among its registered
    profiles (register.go:196-201); 0 when it registers none."""
    names = {profile.name for profile in register_mig_profiles(card_type, profiles, allowlist)}
    counts = [
        info.instance_count
        for name in names
        if (info := gi_profile_for(profiles, name)) is not None
    ]
    return max(counts, default=0)


def mig_register_device(
    *,
    uuid: str,
    index: int,
    card_type: str,
    memory_mib: int,
    numa_node: int,
    healthy: bool,
    profiles: Sequence[MigProfileInfo],
    allowlist: Sequence[AllowedMigProfiles],
) -> GpuDevice | None:
    """A MIG-mode GPU's register entry (register.go:148-202): mode `mig`, its allowlisted
    profiles, `count` their largest instance count, memory and cores not scaled (devcore 100);
    None when it has no profile ("skip MIG device with no discovered profile capacity")."""
    registered = register_mig_profiles(card_type, profiles, allowlist)
    if not registered:
        return None
    return GpuDevice(
        uuid=uuid,
        index=index,
        split_count=mig_device_count(card_type, profiles, allowlist),
        memory_mib=memory_mib,
        cores_percent=100,
        type=card_type,
        numa_node=numa_node,
        mode=OperatingMode.MIG,
        healthy=healthy,
        mig_profiles=registered,
    )
