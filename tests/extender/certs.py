"""Certificates for the TLS tests, made with `cryptography`: certificate authorities, serving
certificates for 127.0.0.1 and client certificates (P-256 keys: quick to make).

Apart from `hami certs` (`hami_plugin/certs/`) on purpose: these tests check the listeners
against certificates made independently of the code that makes them in a cluster.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = timedelta(days=1)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass(frozen=True)
class Issued:
    """A certificate and its key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def der(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.DER)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, cert_file: Path, key_file: Path) -> None:
        """Write both PEM files (the key first: a reader that sees the new certificate finds
        its key)."""
        key_file.write_bytes(self.key_pem)
        cert_file.write_bytes(self.certificate_pem)


@dataclass(frozen=True)
class Authority:
    """A self-signed CA that issues serving and client certificates."""

    issued: Issued

    @classmethod
    def create(cls, common_name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(Issued(certificate, key))

    @property
    def certificate_pem(self) -> bytes:
        return self.issued.certificate_pem

    def write(self, path: Path) -> Path:
        path.write_bytes(self.certificate_pem)
        return path

    def serving(self, common_name: str = "hami-scheduler") -> Issued:
        """A serving certificate for 127.0.0.1 and localhost."""
        names: list[x509.GeneralName] = [
            x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
            x509.DNSName("localhost"),
        ]
        return self._issue(
            common_name, ExtendedKeyUsageOID.SERVER_AUTH, x509.SubjectAlternativeName(names)
        )

    def client(self, common_name: str = "kube-scheduler") -> Issued:
        """A client certificate, as kube-scheduler presents to the extender."""
        return self._issue(common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None)

    def _issue(
        self,
        common_name: str,
        usage: x509.ObjectIdentifier,
        names: x509.SubjectAlternativeName | None,
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        ca = self.issued.certificate
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.issued.key.public_key()),
                critical=False,
            )
        )
        if names is not None:
            builder = builder.add_extension(names, critical=False)
        return Issued(builder.sign(self.issued.key, hashes.SHA256()), key)


def client_context(
    trusted: Path,
    presented: Issued | None = None,
    directory: Path | None = None,
    *,
    version: ssl.TLSVersion | None = None,
) -> ssl.SSLContext:
    """A client context that verifies the server against the CA file `trusted` and presents
    `presented` (written under `directory`: `ssl` loads a certificate chain only from files);
    `version` pins the TLS version."""
    context = ssl.create_default_context(cafile=str(trusted))
    if version is not None:
        context.minimum_version = context.maximum_version = version
    if presented is not None:
        assert directory is not None, "a client certificate needs a directory to be written to"
        serial = presented.certificate.serial_number
        cert_file, key_file = directory / f"client-{serial}.crt", directory / f"client-{serial}.key"
        presented.write(cert_file, key_file)
        context.load_cert_chain(str(cert_file), str(key_file))
    return context
