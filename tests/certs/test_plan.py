"""hami_plugin.certs.plan: what is written, decided from what was read and the time, without a
cluster: the renewal rules, the trust bundle, the booking key, and the property that a plan's
own result needs no further write."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.certs import booking_key
from hami_plugin.certs.issue import KeyPair, issue_leaf, read_ca, read_certificates
from hami_plugin.certs.plan import (
    BOOKING_KEYS,
    CA_CERT,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    Observed,
    Plan,
    plan,
)
from hami_plugin.certs.settings import CertsSettings
from hami_plugin.protocol.signature import parse_booking_keys
from tests.certs.helpers import BOOKING, CA, CLIENT, PUBLIC, SERVING, certificate

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
DAY = timedelta(days=1)
SETTINGS = CertsSettings(webhook_configuration="hami-webhook")


def applied(observed: Observed, result: Plan) -> Observed:
    """What the job would read back after writing `result`."""
    stored: dict[str, Mapping[str, bytes] | None] = {
        CA: observed.ca,
        SERVING: observed.serving,
        CLIENT: observed.client,
        BOOKING: observed.booking_key,
        PUBLIC: observed.booking_public,
    }
    for change in result.changes:
        stored[change.name] = {**(stored[change.name] or {}), **change.data}
    webhooks = observed.webhooks
    if result.patch_webhooks and webhooks is not None:
        webhooks = tuple((name, result.ca_bundle) for name, _ in webhooks)
    return Observed(
        stored[CA], stored[SERVING], stored[CLIENT], stored[BOOKING], webhooks, stored[PUBLIC]
    )


def installed(now: datetime = NOW, cs: CertsSettings = SETTINGS) -> Observed:
    """Everything as a first run leaves it, the webhook configuration included."""
    first = Observed(webhooks=(("vgpu.hami.io", b""),))
    return applied(first, plan(cs, first, now))


def stored_ca(observed: Observed) -> KeyPair:
    assert observed.ca is not None
    return read_ca(observed.ca[CA_CERT], observed.ca[CA_KEY])


def names(result: Plan) -> list[str]:
    return [change.name for change in result.changes]


def test_a_first_run_makes_everything_and_sets_the_ca_bundle() -> None:
    observed = Observed(webhooks=(("vgpu.hami.io", b""), ("other.hami.io", b"old")))

    result = plan(SETTINGS, observed, NOW)

    assert names(result) == [CA, SERVING, CLIENT, PUBLIC, BOOKING]
    assert result.patch_webhooks
    [ca] = read_certificates(result.ca_bundle)
    for change in result.changes[1:3]:
        assert set(change.data) == {TLS_CERT, TLS_KEY, CA_CERT}
        assert change.data[CA_CERT] == result.ca_bundle
        certificate(change.data[TLS_CERT]).verify_directly_issued_by(ca)
    private = parse_booking_keys(result.changes[4].data[BOOKING_KEYS].decode().splitlines())
    public = parse_booking_keys(result.changes[3].data[BOOKING_KEYS].decode().splitlines())
    assert private.can_sign and not public.can_sign
    assert public.public == private.public


def test_everything_valid_writes_nothing() -> None:
    result = plan(SETTINGS, installed(), NOW + 300 * DAY)

    assert result.writes_nothing


def test_without_a_webhook_configuration_nothing_is_patched() -> None:
    result = plan(SETTINGS, Observed(), NOW)

    assert not result.patch_webhooks
    assert names(result) == [CA, SERVING, CLIENT, PUBLIC, BOOKING]


def test_a_leaf_expiring_within_the_window_is_issued_again_alone() -> None:
    observed = installed()
    ca = stored_ca(observed)
    expiring = issue_leaf(ca, SETTINGS.serving_spec, NOW - 355 * DAY, timedelta(days=365))
    observed = replace(
        observed,
        serving={
            **(observed.serving or {}),
            TLS_CERT: expiring.cert_pem,
            TLS_KEY: expiring.key_pem,
        },
    )

    result = plan(SETTINGS, observed, NOW)

    assert names(result) == [SERVING]
    assert not result.patch_webhooks
    renewed = certificate(result.changes[0].data[TLS_CERT])
    assert renewed.not_valid_after_utc > NOW + 300 * DAY
    assert "expiring" in result.changes[0].why


def test_an_expiring_ca_is_made_again_with_every_leaf_and_stays_trusted_meanwhile() -> None:
    start = NOW - timedelta(days=3650) + 10 * DAY  # the CA has 10 days left
    observed = installed(start)
    old_ca = certificate((observed.ca or {})[CA_CERT])

    result = plan(SETTINGS, observed, NOW)

    assert names(result) == [CA, SERVING, CLIENT]
    assert result.patch_webhooks
    new_ca, kept = read_certificates(result.ca_bundle)
    assert kept == old_ca and new_ca != old_ca
    for change in result.changes[1:]:
        certificate(change.data[TLS_CERT]).verify_directly_issued_by(new_ca)
        assert "the CA was renewed" in change.why
    after = applied(observed, result)
    assert plan(SETTINGS, after, NOW + DAY).writes_nothing
    # once the old CA has expired, it leaves the bundle (and only ca.crt is written)
    dropped = plan(SETTINGS, after, NOW + 11 * DAY)
    assert names(dropped) == [SERVING, CLIENT]
    assert all(set(change.data) == {CA_CERT} for change in dropped.changes)
    assert read_certificates(dropped.ca_bundle) == [new_ca]


def test_a_ca_secret_deleted_forces_a_new_ca_and_the_old_one_is_no_longer_trusted() -> None:
    observed = replace(installed(), ca=None)
    old_ca = certificate((installed().ca or {})[CA_CERT])

    result = plan(SETTINGS, observed, NOW)

    assert names(result) == [CA, SERVING, CLIENT]
    assert old_ca not in read_certificates(result.ca_bundle)
    assert len(read_certificates(result.ca_bundle)) == 1


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        (SERVING, {TLS_CERT: b"garbage"}, "unreadable"),
        (CLIENT, {TLS_KEY: b"garbage"}, "unreadable"),
        (SERVING, {TLS_CERT: None}, "needs tls.crt and tls.key"),
    ],
    ids=["certificate", "key", "key missing"],
)
def test_an_unreadable_leaf_is_issued_again(
    name: str, data: dict[str, bytes | None], reason: str
) -> None:
    observed = installed()
    current = dict((observed.serving if name == SERVING else observed.client) or {})
    for key, value in data.items():
        if value is None:
            current.pop(key)
        else:
            current[key] = value
    if name == SERVING:
        observed = replace(observed, serving=current)
    else:
        observed = replace(observed, client=current)

    result = plan(SETTINGS, observed, NOW)

    assert names(result) == [name]
    assert reason in result.changes[0].why


def test_an_unreadable_ca_makes_everything_again() -> None:
    observed = installed()
    observed = replace(observed, ca={**(observed.ca or {}), CA_KEY: b"garbage"})

    result = plan(SETTINGS, observed, NOW)

    assert names(result) == [CA, SERVING, CLIENT]
    assert "unreadable" in result.changes[0].why


def test_a_renamed_service_gets_a_certificate_for_its_names() -> None:
    renamed = replace(SETTINGS, service="gpu-scheduler")

    result = plan(renamed, installed(), NOW)

    assert names(result) == [SERVING]
    assert "names or usage changed" in result.changes[0].why


def test_a_stale_ca_crt_alone_is_rewritten() -> None:
    observed = installed()
    observed = replace(observed, client={**(observed.client or {}), CA_CERT: b"stale"})

    result = plan(SETTINGS, observed, NOW)

    assert names(result) == [CLIENT]
    assert set(result.changes[0].data) == {CA_CERT}


def test_the_booking_key_rotates_in_two_asked_steps_and_keeps_three_keys() -> None:
    observed = installed()
    first = (observed.booking_key or {})[BOOKING_KEYS].decode().split()
    rotate = replace(SETTINGS, rotate_booking_key=True)
    promote = replace(SETTINGS, promote_booking_key=True)

    def step(settings: CertsSettings, keys: list[str]) -> list[str]:
        stored = replace(
            observed,
            booking_key={BOOKING_KEYS: booking_key.key_file(keys)},
            booking_public={BOOKING_KEYS: booking_key.public_file(keys)},
        )
        result = plan(settings, stored, NOW)
        assert names(result) == [PUBLIC, BOOKING]  # the nodes learn a key first
        lines = result.changes[1].data[BOOKING_KEYS].decode().split()
        assert result.changes[0].data[BOOKING_KEYS] == booking_key.public_file(lines)
        return lines

    keys: list[str] = first
    for _ in range(3):
        staged = step(rotate, keys)
        # step 1: the signing key stays first, the new one is accepted second
        assert staged[0] == keys[0] and staged[1] not in keys
        assert staged[2:] == keys[1:2]
        promoted = step(promote, staged)
        # step 2: the new key signs, the old one is still accepted
        assert promoted[:2] == [staged[1], staged[0]] and promoted[2:] == staged[2:]
        keys = promoted

    assert len(keys) == 3
    assert len(parse_booking_keys(keys).private) == 3
    # a lone key has nothing to promote; both steps at once are refused
    assert plan(promote, observed, NOW).writes_nothing
    with pytest.raises(ValueError, match="two steps"):
        replace(SETTINGS, rotate_booking_key=True, promote_booking_key=True)
    assert plan(SETTINGS, installed(), NOW).writes_nothing


@pytest.mark.parametrize(
    "stored",
    [
        b"",
        b"k" * 44 + b"\n",
        b"# only a comment\n",
        b"\xff\xfe",
        b"ed25519-public:" + b"A" * 43 + b"=",
    ],
    ids=["empty", "hmac key", "no key", "not UTF-8", "public key"],
)
def test_an_unreadable_booking_key_is_replaced_by_one_new_key(stored: bytes) -> None:
    observed = replace(installed(), booking_key={BOOKING_KEYS: stored})

    result = plan(SETTINGS, observed, NOW)

    assert names(result) == [PUBLIC, BOOKING]
    [key] = result.changes[1].data[BOOKING_KEYS].decode().splitlines()
    assert key.startswith("ed25519-private:")
    assert "unreadable" in result.changes[1].why
    assert result.changes[0].data[BOOKING_KEYS] == booking_key.public_file([key])


def test_settings_that_would_renew_on_every_run_are_refused() -> None:
    with pytest.raises(ValueError, match="longer than --renew-before"):
        CertsSettings(validity=timedelta(days=20))
    with pytest.raises(ValueError, match="differ"):
        CertsSettings(client_secret="hami-scheduler-tls")


@given(
    validity_days=st.integers(min_value=2, max_value=800),
    renew_days=st.integers(min_value=0, max_value=60),
    ca_days=st.integers(min_value=61, max_value=4000),
    later_hours=st.integers(min_value=0, max_value=24 * 900),
    service=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
)
def test_a_plan_applied_needs_no_further_write_and_leaves_valid_certificates(
    validity_days: int, renew_days: int, ca_days: int, later_hours: int, service: str
) -> None:
    if validity_days <= renew_days:
        validity_days = renew_days + 1
    cs = CertsSettings(
        service=service,
        validity=timedelta(days=validity_days),
        ca_validity=timedelta(days=ca_days),
        renew_before=timedelta(days=renew_days),
    )
    observed = installed(NOW, cs)
    later = NOW + timedelta(hours=later_hours)

    after = applied(observed, plan(cs, observed, later))
    again = plan(cs, after, later)

    assert again.writes_nothing
    for data in (after.serving, after.client):
        assert data is not None
        leaf = certificate(data[TLS_CERT])
        assert leaf.not_valid_before_utc <= later
        assert leaf.not_valid_after_utc - later > cs.renew_before
        leaf.verify_directly_issued_by(read_certificates(data[CA_CERT])[0])
