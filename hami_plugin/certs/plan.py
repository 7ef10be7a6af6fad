"""What `hami certs` writes, decided from what it read: pure, the time passed in.

The Secrets (names are settings; the keys are the contract the manifests mount):

| Secret (default name)        | type                | keys                         |
|------------------------------|---------------------|------------------------------|
| `hami-scheduler-ca`          | `Opaque`            | `ca.crt`, `ca.key`           |
| `hami-scheduler-tls`         | `kubernetes.io/tls` | `tls.crt`, `tls.key`, `ca.crt` |
| `hami-kube-scheduler-client` | `kubernetes.io/tls` | `tls.crt`, `tls.key`, `ca.crt` |
| `hami-booking-signing-key`   | `Opaque`            | `keys` (private, scheduler)  |
| `hami-booking-public-keys`   | `Opaque`            | `keys` (public, nodes)       |

The rules, in order:

1. The CA is made again when its Secret is missing or unreadable, or when it expires within
   `renew_before`; then every leaf is issued again.
2. A leaf is issued again when its Secret is missing or unreadable, or its certificate is not
   signed by the current CA, says other names or another usage than the settings ask, or
   expires within `renew_before`.
3. The `ca.crt` of both leaf Secrets, and the webhook's `caBundle`, is the trust bundle
   (`issue.trust_bundle`): the CA, and a CA it replaced because that one was expiring, until
   it expires. A leaf that stays gets only its `ca.crt` rewritten when that differs.
4. The booking key pair (Ed25519) is made when its private Secret is missing or unreadable,
   and otherwise changes only when asked, in two runs so that no daemon ever meets a signature
   it cannot verify: `rotate_booking_key` adds a new key second (accepted everywhere once the
   mounted Secrets are updated, signing nothing yet), `promote_booking_key` later makes the
   second key the signing one; three keys at most. It is never rotated on a schedule.
5. The public Secret is the public key of each private key, in order; it is written (before
   the private one, so that a node knows a key before the scheduler can sign with it) whenever
   it differs. The HMAC Secret of the scheme before (`hami-booking-key`) is never written.

Everything valid: no change at all, so running the job again writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509

from hami_plugin.certs import booking_key
from hami_plugin.certs.issue import (
    CertificateError,
    KeyPair,
    Renewal,
    ca_renewal,
    issue_leaf,
    leaf_renewal,
    make_ca,
    read_ca,
    read_certificates,
    read_leaf,
    serial_hex,
    trust_bundle,
)
from hami_plugin.certs.settings import CertsSettings, LeafSpec

__all__ = [
    "BOOKING_KEYS",
    "CA_CERT",
    "CA_KEY",
    "OPAQUE",
    "TLS_CERT",
    "TLS_KEY",
    "TLS_SECRET",
    "Observed",
    "Plan",
    "SecretChange",
    "plan",
]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
BOOKING_KEYS = "keys"
OPAQUE = "Opaque"
TLS_SECRET = "kubernetes.io/tls"


@dataclass(frozen=True, slots=True)
class Observed:
    """What the job read: each Secret's data (None: there is no such Secret) and the webhook
    configuration's (webhook name, caBundle) pairs (None: there is no such configuration)."""

    ca: Mapping[str, bytes] | None = None
    serving: Mapping[str, bytes] | None = None
    client: Mapping[str, bytes] | None = None
    booking_key: Mapping[str, bytes] | None = None
    webhooks: tuple[tuple[str, bytes], ...] | None = None
    booking_public: Mapping[str, bytes] | None = None


@dataclass(frozen=True, slots=True)
class SecretChange:
    """One Secret to write: the keys to set (a new Secret gets `type` and exactly these), and
    why, for the log."""

    name: str
    type: str
    data: Mapping[str, bytes]
    why: str

    def __repr__(self) -> str:  # never print key material
        return f"SecretChange({self.name}, keys: {', '.join(sorted(self.data))}, {self.why!r})"


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything to write, in order (the CA first: a job that stops half-way leaves leaves
    that the next run sees are not the CA's and issues again)."""

    changes: tuple[SecretChange, ...]
    ca_bundle: bytes
    """The trust bundle (PEM): every leaf Secret's `ca.crt` and the webhooks' caBundle."""
    patch_webhooks: bool
    """Whether a webhook's caBundle differs from `ca_bundle`."""

    @property
    def writes_nothing(self) -> bool:
        return not self.changes and not self.patch_webhooks


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _renewal_text(reason: Renewal, detail: str) -> str:
    return f"{reason.value} ({detail})" if detail else reason.value


def _decide_ca(
    data: Mapping[str, bytes] | None, settings: CertsSettings, now: datetime
) -> tuple[KeyPair | None, Renewal | None, str]:
    """The CA read (None: unreadable or missing), why it must be made again, and a detail."""
    if data is None:
        return None, Renewal.MISSING, ""
    if CA_CERT not in data or CA_KEY not in data:
        return None, Renewal.UNREADABLE, f"needs {CA_CERT} and {CA_KEY}"
    try:
        ca = read_ca(data[CA_CERT], data[CA_KEY])
    except CertificateError as error:
        return None, Renewal.UNREADABLE, str(error)
    reason = ca_renewal(ca, now, settings.renew_before)
    detail = f"notAfter {_stamp(ca.certificate.not_valid_after_utc)}" if reason else ""
    return ca, reason, detail


def _bundle_certificates(*sources: Mapping[str, bytes] | None) -> list[x509.Certificate]:
    found: list[x509.Certificate] = []
    for data in sources:
        if data is None or CA_CERT not in data:
            continue
        try:
            found.extend(read_certificates(data[CA_CERT]))
        except CertificateError:
            continue
    return found


def _decide_leaf(
    data: Mapping[str, bytes] | None, ca: KeyPair, spec: LeafSpec, now: datetime, renew: timedelta
) -> tuple[Renewal | None, str]:
    if data is None:
        return Renewal.MISSING, ""
    if TLS_CERT not in data or TLS_KEY not in data:
        return Renewal.UNREADABLE, f"needs {TLS_CERT} and {TLS_KEY}"
    try:
        leaf = read_leaf(data[TLS_CERT], data[TLS_KEY])
    except CertificateError as error:
        return Renewal.UNREADABLE, str(error)
    reason = leaf_renewal(leaf, ca, spec, now, renew)
    if reason in (Renewal.EXPIRING, Renewal.NOT_YET_VALID):
        certificate = leaf.certificate
        window = (
            f"{_stamp(certificate.not_valid_before_utc)}..{_stamp(certificate.not_valid_after_utc)}"
        )
        return reason, f"valid {window}"
    return reason, ""


def _leaf_change(
    name: str,
    data: Mapping[str, bytes] | None,
    spec: LeafSpec,
    ca: KeyPair,
    ca_renewed: bool,
    bundle: bytes,
    settings: CertsSettings,
    now: datetime,
) -> SecretChange | None:
    reason: Renewal | None
    if ca_renewed and data is not None:
        reason, detail = Renewal.CA_RENEWED, ""
    else:
        reason, detail = _decide_leaf(data, ca, spec, now, settings.renew_before)
    if reason is None:
        assert data is not None
        if data.get(CA_CERT) == bundle:
            return None
        return SecretChange(name, TLS_SECRET, {CA_CERT: bundle}, "ca.crt set to the trust bundle")
    pair = issue_leaf(ca, spec, now, settings.validity)
    why = (
        f"certificate {_renewal_text(reason, detail)}: issued serial {serial_hex(pair)}, "
        f"valid until {_stamp(pair.certificate.not_valid_after_utc)}"
    )
    return SecretChange(
        name,
        TLS_SECRET,
        {TLS_CERT: pair.cert_pem, TLS_KEY: pair.key_pem, CA_CERT: bundle},
        why,
    )


def _booking_changes(observed: Observed, settings: CertsSettings) -> list[SecretChange]:
    """The public Secret's change (when it differs from the private keys'), then the private
    one's."""
    private = _booking_change(observed.booking_key, settings)
    if private is not None:
        lines = booking_key.read_key_lines(private.data[BOOKING_KEYS])
    else:
        assert observed.booking_key is not None  # unchanged: readable
        lines = booking_key.read_key_lines(observed.booking_key[BOOKING_KEYS])
    public = booking_key.public_file(lines)
    current = (observed.booking_public or {}).get(BOOKING_KEYS)
    changes = []
    if current != public:
        why = (
            "public booking keys "
            + ("missing" if current is None else "differ")
            + (": the public key of each private key, in order")
        )
        name = settings.booking_public_key_secret
        changes.append(SecretChange(name, OPAQUE, {BOOKING_KEYS: public}, why))
    return [*changes, *([private] if private is not None else [])]


def _booking_change(
    data: Mapping[str, bytes] | None, settings: CertsSettings
) -> SecretChange | None:
    name = settings.booking_key_secret
    if data is None:
        why = "booking key missing: one new key"
        lines = [booking_key.new_key()]
    else:
        try:
            current = booking_key.read_key_lines(data.get(BOOKING_KEYS, b""))
        except ValueError as error:
            why = f"booking keys unreadable ({error}): one new key"
            lines = [booking_key.new_key()]
        else:
            if settings.rotate_booking_key:
                lines = booking_key.staged(current, booking_key.new_key())
                why = (
                    "booking key rotation, step 1: a new key second (accepted, not signing "
                    "yet); run again with --promote-booking-key once every pod mounts it"
                )
            elif settings.promote_booking_key and len(current) > 1:
                lines = booking_key.promoted(current)
                why = "booking key rotation, step 2: the second key signs from now on"
            else:
                return None
    return SecretChange(name, OPAQUE, {BOOKING_KEYS: booking_key.key_file(lines)}, why)


def plan(settings: CertsSettings, observed: Observed, now: datetime) -> Plan:
    """What to write so that every Secret and the webhook's caBundle are valid at `now` for
    longer than `settings.renew_before` (the rules of this module's docstring); with
    `booking_keys_only`, the booking key pair alone."""
    if settings.booking_keys_only:
        return Plan(tuple(_booking_changes(observed, settings)), b"", patch_webhooks=False)
    changes: list[SecretChange] = []
    ca, reason, detail = _decide_ca(observed.ca, settings, now)
    previous: list[x509.Certificate] = []
    ca_renewed = reason is not None
    if ca is None or reason is not None:
        if ca is not None:
            previous.append(ca.certificate)
        ca = make_ca(settings.ca_common_name, now, settings.ca_validity)
        changes.append(
            SecretChange(
                settings.ca_secret,
                OPAQUE,
                {CA_CERT: ca.cert_pem, CA_KEY: ca.key_pem},
                f"CA {_renewal_text(reason or Renewal.MISSING, detail)}: made serial "
                f"{serial_hex(ca)}, valid until {_stamp(ca.certificate.not_valid_after_utc)}",
            )
        )
    previous.extend(_bundle_certificates(observed.serving, observed.client))
    bundle = trust_bundle(ca, previous, now, settings.renew_before)
    leaves = (
        (settings.tls_secret, observed.serving, settings.serving_spec),
        (settings.client_secret, observed.client, settings.client_spec),
    )
    for name, data, spec in leaves:
        change = _leaf_change(name, data, spec, ca, ca_renewed, bundle, settings, now)
        if change is not None:
            changes.append(change)
    changes.extend(_booking_changes(observed, settings))
    webhooks = observed.webhooks or ()
    return Plan(
        changes=tuple(changes),
        ca_bundle=bundle,
        patch_webhooks=any(current != bundle for _, current in webhooks),
    )
