"""The certificates of `hami certs`: a CA, the leaves it signs, reading them back, and whether
one must be issued again. Pure: no I/O, time comes in as `now`; only this package imports
`cryptography`.

What is issued (docs/design.md 8 says who trusts what):

* the CA: ECDSA P-256, `basicConstraints CA:TRUE, pathlen:0` (critical), keyUsage
  `keyCertSign, cRLSign` (critical), a subject key identifier;
* a leaf: ECDSA P-256 signed with SHA-256 by the CA, `basicConstraints CA:FALSE`, keyUsage
  `digitalSignature`, one extended key usage (`serverAuth` for the Service's certificate,
  `clientAuth` for kube-scheduler's), the Service's DNS names as subjectAltName (Go's TLS and
  OpenSSL check the name there, never in the CN), the CA's key identifier. A leaf never
  outlives its CA: its notAfter is cut to the CA's.

Every certificate starts five minutes before `now`, so that a peer whose clock is a little
behind accepts it at once. A CA read back may also be an RSA one (a CA of your own, put into
the Secret): leaves are signed with whatever key it has.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hami_plugin.certs.settings import LeafSpec, Usage

__all__ = [
    "CLOCK_SKEW",
    "MAX_PREVIOUS_CAS",
    "CertificateError",
    "KeyPair",
    "Renewal",
    "ca_renewal",
    "issue_leaf",
    "leaf_renewal",
    "make_ca",
    "read_ca",
    "read_certificates",
    "read_leaf",
    "serial_hex",
    "trust_bundle",
]

CLOCK_SKEW = timedelta(minutes=5)
"""How long before `now` a new certificate starts."""

MAX_PREVIOUS_CAS = 2
"""How many replaced CAs a trust bundle keeps (while they are valid)."""

SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

_USAGE_OIDS = {
    Usage.SERVER: ExtendedKeyUsageOID.SERVER_AUTH,
    Usage.CLIENT: ExtendedKeyUsageOID.CLIENT_AUTH,
}


class CertificateError(ValueError):
    """A certificate or key that cannot be used; the message says why."""


class Renewal(enum.StrEnum):
    """Why a certificate is issued (again)."""

    MISSING = "missing"
    UNREADABLE = "unreadable"
    EXPIRING = "expiring"
    NOT_YET_VALID = "not yet valid"
    OTHER_CA = "not signed by the current CA"
    SPEC_CHANGED = "names or usage changed"
    CA_RENEWED = "the CA was renewed"


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, parsed and as PEM (the PEM is what was read or
    written, byte for byte)."""

    certificate: x509.Certificate
    key: SigningKey
    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:  # never print key material
        return f"KeyPair({self.certificate.subject.rfc4514_string()}, {serial_hex(self)})"


def serial_hex(pair: KeyPair | x509.Certificate) -> str:
    """The certificate's serial number in hex, as `openssl x509 -serial` shows it."""
    certificate = pair.certificate if isinstance(pair, KeyPair) else pair
    return format(certificate.serial_number, "X")


# --- issuing ----------------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: SigningKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pair(certificate: x509.Certificate, key: SigningKey) -> KeyPair:
    return KeyPair(
        certificate, key, certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key)
    )


def _start(now: datetime) -> datetime:
    return now.replace(microsecond=0) - CLOCK_SKEW


def make_ca(common_name: str, now: datetime, validity: timedelta) -> KeyPair:
    """A new self-signed CA valid from `now` (less the clock skew) for `validity`."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _start(now)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + CLOCK_SKEW + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _pair(certificate, key)


def issue_leaf(ca: KeyPair, spec: LeafSpec, now: datetime, validity: timedelta) -> KeyPair:
    """A new key and certificate for `spec`, signed by `ca`, valid from `now` (less the clock
    skew) for `validity` or until the CA expires, whichever comes first."""
    key = _new_key()
    start = _start(now)
    end = min(start + CLOCK_SKEW + validity, ca.certificate.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, spec.common_name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([_USAGE_OIDS[spec.usage]]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if spec.dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in spec.dns_names]),
            critical=False,
        )
    return _pair(builder.sign(ca.key, hashes.SHA256()), key)


# --- reading ----------------------------------------------------------------------------------


def read_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle, in order. Raises CertificateError when there is none
    or one does not parse."""
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        # cryptography's message is a URL to its FAQ: say what was wrong instead
        raise CertificateError("not a PEM certificate") from None


def _public_der(key: object) -> bytes:
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise CertificateError(f"unsupported public key type {type(key).__name__}")
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _read_pair(cert_pem: bytes, key_pem: bytes) -> KeyPair:
    certificate = read_certificates(cert_pem)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise CertificateError("not a PEM private key (or one with a password)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertificateError(f"unsupported private key type {type(key).__name__}")
    if _public_der(key.public_key()) != _public_der(certificate.public_key()):
        raise CertificateError("the private key does not belong to the certificate")
    return KeyPair(certificate, key, cert_pem, key_pem)


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    if not constraints.value.ca:
        return False
    try:
        usage = certificate.extensions.get_extension_for_class(x509.KeyUsage)
    except x509.ExtensionNotFound:
        return True
    return usage.value.key_cert_sign


def read_ca(cert_pem: bytes, key_pem: bytes) -> KeyPair:
    """The CA of a `ca.crt`/`ca.key` pair. Raises CertificateError when either does not parse,
    the key is not the certificate's, or the certificate is not a CA that may sign."""
    pair = _read_pair(cert_pem, key_pem)
    if not _is_ca(pair.certificate):
        raise CertificateError("not a CA certificate (basicConstraints CA:TRUE, keyCertSign)")
    return pair


def read_leaf(cert_pem: bytes, key_pem: bytes) -> KeyPair:
    """The leaf of a `tls.crt`/`tls.key` pair (the first certificate of `tls.crt`). Raises
    CertificateError when either does not parse or the key is not the certificate's."""
    return _read_pair(cert_pem, key_pem)


# --- judging ----------------------------------------------------------------------------------


def _timing(
    certificate: x509.Certificate, now: datetime, renew_before: timedelta
) -> Renewal | None:
    if certificate.not_valid_before_utc > now:
        return Renewal.NOT_YET_VALID
    if certificate.not_valid_after_utc - now <= renew_before:
        return Renewal.EXPIRING
    return None


def ca_renewal(ca: KeyPair, now: datetime, renew_before: timedelta) -> Renewal | None:
    """Why the CA must be made again (None: it stays)."""
    return _timing(ca.certificate, now, renew_before)


def _usages(certificate: x509.Certificate) -> frozenset[x509.ObjectIdentifier]:
    try:
        extension = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(extension.value)


def _dns_names(certificate: x509.Certificate) -> frozenset[str]:
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(extension.value.get_values_for_type(x509.DNSName))


def _common_name(certificate: x509.Certificate) -> str:
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def _signed_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def leaf_renewal(
    leaf: KeyPair, ca: KeyPair, spec: LeafSpec, now: datetime, renew_before: timedelta
) -> Renewal | None:
    """Why the leaf must be issued again (None: it stays): not signed by `ca`, not what `spec`
    asks for (CN, exactly its DNS names, its usage, not a CA), or not valid from `now` until
    `renew_before` ahead."""
    certificate = leaf.certificate
    if not _signed_by(certificate, ca.certificate):
        return Renewal.OTHER_CA
    if (
        _common_name(certificate) != spec.common_name
        or _dns_names(certificate) != frozenset(spec.dns_names)
        or _USAGE_OIDS[spec.usage] not in _usages(certificate)
        or _is_ca(certificate)
    ):
        return Renewal.SPEC_CHANGED
    return _timing(certificate, now, renew_before)


def trust_bundle(
    ca: KeyPair, previous: Sequence[x509.Certificate], now: datetime, renew_before: timedelta
) -> bytes:
    """The PEM bundle peers verify against: the CA first, then up to `MAX_PREVIOUS_CAS` of
    `previous` (first seen first) that are other CAs, valid at `now` and expiring within
    `renew_before`.

    A CA replaced because it was expiring stays trusted for the little time it has left, so
    that a peer still holding a certificate it signed (a pod whose mounted Secret kubelet has
    not updated yet, a kube-scheduler not yet restarted) keeps working while the new ones roll
    out. A CA replaced for any other reason (its Secret deleted or unreadable: a forced
    rotation) is dropped at once.
    """
    bundle = [ca.certificate]
    for certificate in previous:
        if len(bundle) > MAX_PREVIOUS_CAS:
            break
        if (
            _is_ca(certificate)
            and certificate.not_valid_before_utc <= now
            and now < certificate.not_valid_after_utc <= now + renew_before
            and all(certificate != kept for kept in bundle)
        ):
            bundle.append(certificate)
    return b"".join(item.public_bytes(serialization.Encoding.PEM) for item in bundle)
