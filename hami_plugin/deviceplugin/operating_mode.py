"""The node's operating mode and the MIG profile allowlist, as the device config sets them
(pure parsers for `deviceplugin.settings`).

HAMi v2.10 reads `operatingmode` from the node's `nodeconfig` entry (plugin/server.go:128-155,
default `hami-core`) and `migProfileAllowlist` from the device config's `nvidia:` section,
validated at load (pkg/device/nvidia/device.go:109, 171-173, `ValidateMigProfileAllowlist`).
`mig` turns on dynamic MIG (`deviceplugin.mig.dynamic`); HAMi's `mps` is not implemented.
"""

from __future__ import annotations

from hami_plugin.scheduler.mig import AllowedMigProfiles, validate_mig_profile_allowlist

__all__ = [
    "MODE_HAMI_CORE",
    "MODE_MIG",
    "OPERATING_MODES",
    "parse_mig_profile_allowlist",
    "parse_operating_mode",
]

MODE_MIG = "mig"
MODE_HAMI_CORE = "hami-core"
OPERATING_MODES = (MODE_HAMI_CORE, MODE_MIG)
"""The `operatingmode` values supported (HAMi device.go:61-63 also has `mps`)."""


def parse_operating_mode(raw: object) -> str:
    """A node entry's `operatingmode`: `hami-core` or `mig`. Raises ValueError otherwise."""
    mode = str(raw)
    if mode not in OPERATING_MODES:
        raise ValueError(f"operating mode {mode!r} is not supported (supported: hami-core, mig)")
    return mode


def _names(raw: object, what: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(raw)


def parse_mig_profile_allowlist(raw: object) -> tuple[AllowedMigProfiles, ...]:
    """`migProfileAllowlist`: a list of `{models: [...], profiles: [...]}` (keys matched
    case-insensitively), then HAMi's `ValidateMigProfileAllowlist` with its messages. Raises
    ValueError."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("migProfileAllowlist must be a list of {models, profiles} entries")
    entries = []
    for position, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValueError(f"migProfileAllowlist[{position}] must be a mapping")
        folded = {str(key).lower(): value for key, value in item.items()}
        where = f"migProfileAllowlist[{position}]"
        entries.append(
            AllowedMigProfiles(
                models=_names(folded.get("models"), f"{where}.models"),
                profiles=_names(folded.get("profiles"), f"{where}.profiles"),
            )
        )
    validate_mig_profile_allowlist(entries)
    return tuple(entries)
