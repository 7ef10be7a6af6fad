"""The device config's `migProfileAllowlist`: the MIG profiles each GPU model may be split
into (HAMi v2.10 devices.go:101-104, validated by `ValidateMigProfileAllowlist`,
mig_profiles.go:24-41). The device plugin splits GPUs by it; the scheduler validates it at
start. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "AllowedMigProfiles",
    "parse_mig_profile_allowlist",
    "validate_mig_profile_allowlist",
]


@dataclass(frozen=True, slots=True)
class AllowedMigProfiles:
    """One `migProfileAllowlist` entry of the device config (HAMi devices.go:101-104): the
    profiles a GPU model may be split into."""

    models: tuple[str, ...]
    profiles: tuple[str, ...]


def validate_mig_profile_allowlist(entries: Sequence[AllowedMigProfiles]) -> None:
    """HAMi's `ValidateMigProfileAllowlist` (mig_profiles.go:24-41): every entry names models
    and profiles, and every profile is `<n>g.<rest>`. Raises ValueError with HAMi's message."""
    for entry in entries:
        if not entry.models or not entry.profiles:
            raise ValueError("MIG profile allowlist must define models and profiles")
        for profile in entry.profiles:
            head, dot, _ = profile.partition(".")
            if not dot or len(head) < 2 or not head.endswith("g"):
                quoted = profile.replace("\\", "\\\\").replace('"', '\\"')
                raise ValueError(f'invalid MIG profile "{quoted}"')


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
