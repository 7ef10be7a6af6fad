"""The node's operating mode and the MIG profile allowlist, as the device config sets them
(pure parsers for `deviceplugin.settings`).

HAMi v2.10 reads `operatingmode` from the node's `nodeconfig` entry (plugin/server.go:128-155,
default `hami-core`) and `migProfileAllowlist` from the device config's `nvidia:` section,
validated at load (pkg/device/nvidia/device.go:109, 171-173, `ValidateMigProfileAllowlist`;
the parser lives with the validation in `protocol.mig_allowlist`, which the scheduler uses too).
`mig` turns on dynamic MIG (`deviceplugin.mig.dynamic`); HAMi's `mps` is not implemented.
"""

from __future__ import annotations

from hami_plugin.protocol.mig_allowlist import parse_mig_profile_allowlist

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
