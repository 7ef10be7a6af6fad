"""The device config's MIG profile allowlist, validated as HAMi v2.10 validates it
(mig_profiles_test.go)."""

from __future__ import annotations

import pytest

from hami_plugin.protocol.mig_allowlist import AllowedMigProfiles, validate_mig_profile_allowlist


def test_allowlist_validation() -> None:
    # TestValidateMigProfileAllowlist
    validate_mig_profile_allowlist([AllowedMigProfiles(("A100",), ("1g.5gb", "2g.10gb"))])
    with pytest.raises(ValueError, match="must define models and profiles"):
        validate_mig_profile_allowlist([AllowedMigProfiles(("A100",), ())])
    for bad in ["1g", "g.5gb", "1x.5gb", ".5gb"]:
        with pytest.raises(ValueError) as caught:
            validate_mig_profile_allowlist([AllowedMigProfiles(("A100",), (bad,))])
        assert str(caught.value) == f'invalid MIG profile "{bad}"'
