"""hami_plugin.certs.issue: the CA and its leaves say what kube-scheduler, the API server and
OpenSSL check; reading back refuses what cannot be used; renewal reasons; the trust bundle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from hami_plugin.certs.issue import (
    CLOCK_SKEW,
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
    trust_bundle,
)
from hami_plugin.certs.settings import CertsSettings, LeafSpec, Usage

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
YEAR = timedelta(days=365)
TEN_YEARS = timedelta(days=3650)
MONTH = timedelta(days=30)
SERVING = CertsSettings().serving_spec
CLIENT = CertsSettings().client_spec


@pytest.fixture(scope="module")
def ca() -> KeyPair:
    return make_ca("test-ca", NOW, TEN_YEARS)


def test_the_ca_may_sign_and_nothing_else(ca: KeyPair) -> None:
    certificate = ca.certificate
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    usage = certificate.extensions.get_extension_for_class(x509.KeyUsage)

    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature
    assert isinstance(ca.key, ec.EllipticCurvePrivateKey) and ca.key.curve.name == "secp256r1"
    assert certificate.not_valid_before_utc == NOW - CLOCK_SKEW
    assert certificate.not_valid_after_utc == NOW + TEN_YEARS
    assert certificate.issuer == certificate.subject


def test_the_serving_certificate_names_the_service_and_serves(ca: KeyPair) -> None:
    leaf = issue_leaf(ca, SERVING, NOW, YEAR).certificate

    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(names.get_values_for_type(x509.DNSName)) == {
        "hami-scheduler",
        "hami-scheduler.hami-system",
        "hami-scheduler.hami-system.svc",
        "hami-scheduler.hami-system.svc.cluster.local",
    }
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf.verify_directly_issued_by(ca.certificate)
    assert leaf.not_valid_after_utc == NOW + YEAR


def test_the_client_certificate_is_kube_schedulers_and_only_a_client(ca: KeyPair) -> None:
    leaf = issue_leaf(ca, CLIENT, NOW, YEAR).certificate

    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert leaf.subject.rfc4514_string() == "CN=hami-kube-scheduler"
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_a_leaf_never_outlives_its_ca() -> None:
    short_ca = make_ca("short", NOW, timedelta(days=40))

    leaf = issue_leaf(short_ca, SERVING, NOW, YEAR).certificate

    assert leaf.not_valid_after_utc == short_ca.certificate.not_valid_after_utc


def test_a_pair_reads_back_as_written(ca: KeyPair) -> None:
    leaf = issue_leaf(ca, SERVING, NOW, YEAR)

    assert read_ca(ca.cert_pem, ca.key_pem).certificate == ca.certificate
    assert read_leaf(leaf.cert_pem, leaf.key_pem).certificate == leaf.certificate


def test_a_ca_of_your_own_with_an_rsa_key_signs_leaves() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    template = make_ca("template", NOW, TEN_YEARS)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(template.certificate.subject)
        .issuer_name(template.certificate.subject)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(NOW + TEN_YEARS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, template.certificate.signature_hash_algorithm)  # type: ignore[arg-type]
    )
    own = KeyPair(certificate, key, b"", b"")

    leaf = issue_leaf(own, SERVING, NOW, YEAR)

    assert leaf_renewal(leaf, own, SERVING, NOW, MONTH) is None


@pytest.mark.parametrize(
    ("cert_pem", "key_pem", "message"),
    [
        (b"not a certificate", None, "not a PEM certificate"),
        (None, b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "private key"),
        (None, "other", "does not belong to the certificate"),
    ],
    ids=["garbage certificate", "garbage key", "another key"],
)
def test_an_unusable_pair_is_refused_with_the_reason(
    ca: KeyPair, cert_pem: bytes | None, key_pem: bytes | str | None, message: str
) -> None:
    leaf = issue_leaf(ca, SERVING, NOW, YEAR)
    if key_pem == "other":
        key_pem = issue_leaf(ca, SERVING, NOW, YEAR).key_pem
    assert not isinstance(key_pem, str)

    with pytest.raises(CertificateError, match=message):
        read_leaf(cert_pem or leaf.cert_pem, key_pem or leaf.key_pem)


def test_a_leaf_is_not_a_ca(ca: KeyPair) -> None:
    leaf = issue_leaf(ca, SERVING, NOW, YEAR)

    with pytest.raises(CertificateError, match="not a CA"):
        read_ca(leaf.cert_pem, leaf.key_pem)
    with pytest.raises(CertificateError, match="not a PEM certificate"):
        read_certificates(b"")


@pytest.mark.parametrize(
    ("later", "expected"),
    [
        (timedelta(0), None),
        (YEAR - MONTH - timedelta(seconds=1), None),
        (YEAR - MONTH, Renewal.EXPIRING),
        (YEAR + timedelta(days=1), Renewal.EXPIRING),
        (-timedelta(hours=1), Renewal.NOT_YET_VALID),
    ],
    ids=["fresh", "just outside the window", "window reached", "expired", "clock went back"],
)
def test_a_leaf_is_renewed_within_the_window(
    ca: KeyPair, later: timedelta, expected: Renewal | None
) -> None:
    leaf = issue_leaf(ca, SERVING, NOW, YEAR)

    assert leaf_renewal(leaf, ca, SERVING, NOW + later, MONTH) is expected


def test_a_leaf_that_says_something_else_is_renewed(ca: KeyPair) -> None:
    serving = issue_leaf(ca, SERVING, NOW, YEAR)
    renamed = CertsSettings(service="gpu-scheduler").serving_spec
    other_domain = CertsSettings(cluster_domain="corp.example").serving_spec
    as_server = LeafSpec(CLIENT.common_name, (), Usage.SERVER)

    assert leaf_renewal(serving, ca, renamed, NOW, MONTH) is Renewal.SPEC_CHANGED
    assert leaf_renewal(serving, ca, other_domain, NOW, MONTH) is Renewal.SPEC_CHANGED
    client = issue_leaf(ca, CLIENT, NOW, YEAR)
    assert leaf_renewal(client, ca, as_server, NOW, MONTH) is Renewal.SPEC_CHANGED
    assert leaf_renewal(client, ca, CLIENT, NOW, MONTH) is None


def test_a_leaf_of_another_ca_is_renewed(ca: KeyPair) -> None:
    other = make_ca("test-ca", NOW, TEN_YEARS)  # same name, another key
    leaf = issue_leaf(other, SERVING, NOW, YEAR)

    assert leaf_renewal(leaf, ca, SERVING, NOW, MONTH) is Renewal.OTHER_CA


def test_the_ca_is_renewed_within_the_window(ca: KeyPair) -> None:
    assert ca_renewal(ca, NOW, MONTH) is None
    assert ca_renewal(ca, NOW + TEN_YEARS - MONTH, MONTH) is Renewal.EXPIRING


def test_the_bundle_keeps_an_expiring_ca_it_replaced_until_it_expires(ca: KeyPair) -> None:
    old = make_ca("old", NOW - TEN_YEARS + timedelta(days=10), TEN_YEARS)  # 10 days left
    forced_out = make_ca("forced", NOW - YEAR, TEN_YEARS)  # years left: a forced rotation

    bundle = read_certificates(
        trust_bundle(ca, [old.certificate, forced_out.certificate, ca.certificate], NOW, MONTH)
    )
    later = read_certificates(trust_bundle(ca, [old.certificate], NOW + timedelta(days=11), MONTH))

    assert bundle == [ca.certificate, old.certificate]
    assert later == [ca.certificate]


def test_the_bundle_holds_no_leaf_and_at_most_two_old_cas(ca: KeyPair) -> None:
    expiring = [
        make_ca(f"old-{n}", NOW - TEN_YEARS + timedelta(days=n), TEN_YEARS) for n in (1, 2, 3)
    ]
    leaf = issue_leaf(ca, SERVING, NOW, YEAR)

    bundle = read_certificates(
        trust_bundle(ca, [leaf.certificate, *(c.certificate for c in expiring)], NOW, MONTH)
    )

    assert bundle == [ca.certificate, expiring[0].certificate, expiring[1].certificate]
