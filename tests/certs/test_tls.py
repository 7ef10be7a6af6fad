"""The certificates `hami certs` writes, used as the cluster uses them: the scheduler's listener
serves the serving certificate, a client verifying against `ca.crt` and a Service DNS name
accepts it, kube-scheduler's client certificate passes the listener's client-CA check, and a
renewed certificate is served without a restart."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from hami_plugin.certs.issue import issue_leaf, make_ca, read_ca
from hami_plugin.certs.plan import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY
from hami_plugin.certs.settings import CertsSettings
from hami_plugin.cli import main
from hami_plugin.clock import ManualClock
from hami_plugin.extender.tls import TLS_RECHECK_SECONDS, TlsFiles
from hami_plugin.httpserve.routes import PlainReply, text_reply
from hami_plugin.httpserve.server import BoundedServer
from hami_plugin.testing.apiserver import FakeApiServer
from tests.certs.helpers import CA, CLIENT, SERVICE_NAMES, SERVING, put_secret, secret_data


class _Probe:
    """Routes that answer GET /healthz, enough to see a request through."""

    def body_limit(self, path: str) -> int:
        return 0

    def handle(self, method: str, path: str, body: bytes, content_type: str) -> PlainReply:
        return text_reply(200, "ok") if path == "/healthz" else text_reply(404, "not found")


def write_files(apiserver: FakeApiServer, name: str, directory: Path) -> None:
    """The Secret's keys as files, each replaced at once (as kubelet swaps a Secret volume)."""
    directory.mkdir(exist_ok=True)
    for key, value in secret_data(apiserver, name).items():
        staged = directory / f".{key}.new"
        staged.write_bytes(value)
        os.replace(staged, directory / key)


@pytest.fixture
def installed(apiserver: FakeApiServer, kubeconfig_path: Path, tmp_path: Path) -> Path:
    """`hami certs` run once; the serving and client Secrets written out under tmp_path."""
    assert main(["certs", "--kubeconfig", str(kubeconfig_path)]) == 0
    write_files(apiserver, SERVING, tmp_path / "serving")
    write_files(apiserver, CLIENT, tmp_path / "client")
    return tmp_path


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def listener(installed: Path, clock: ManualClock) -> Iterator[BoundedServer]:
    """The scheduler's listener with the serving certificate, requiring a client certificate
    from the CA (`--client-ca-file` = the serving Secret's ca.crt)."""
    serving = installed / "serving"
    tls = TlsFiles(
        str(serving / TLS_CERT),
        str(serving / TLS_KEY),
        client_ca_file=str(serving / CA_CERT),
        clock=clock,
    )
    server = BoundedServer("127.0.0.1", 0, _Probe(), tls=tls)
    server.start()
    yield server
    server.stop(timeout=5.0)


def kube_scheduler_context(directory: Path, *, certificate: bool = True) -> ssl.SSLContext:
    """What kube-scheduler's extender client does: verify against caFile, present its
    certificate."""
    context = ssl.create_default_context(cafile=str(directory / CA_CERT))
    if certificate:
        context.load_cert_chain(str(directory / TLS_CERT), str(directory / TLS_KEY))
    return context


def healthz(server: BoundedServer, context: ssl.SSLContext, name: str) -> tuple[bytes, int]:
    """GET /healthz over TLS as `name`; the answer's status line and the serial served."""
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        served = tls.getpeercert(binary_form=True)
        assert served is not None
        tls.sendall(f"GET /healthz HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := tls.recv(4096):
            answer += chunk
    return answer.split(b"\r\n", 1)[0], x509.load_der_x509_certificate(served).serial_number


@pytest.mark.parametrize("name", sorted(SERVICE_NAMES))
def test_kube_scheduler_reaches_the_listener_by_every_service_name(
    listener: BoundedServer, installed: Path, name: str
) -> None:
    status, _ = healthz(listener, kube_scheduler_context(installed / "client"), name)

    assert status == b"HTTP/1.1 200 OK"


def test_another_name_is_refused_by_the_client(listener: BoundedServer, installed: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        healthz(listener, kube_scheduler_context(installed / "client"), "evil.example")


def handshake(listener: BoundedServer, client: ssl.SSLContext, name: str) -> None:
    """A TLS handshake in memory between `client` and the listener's own server context (what
    its TlsFiles loaded), so that the server's reason for refusing is what is raised."""
    assert listener.tls is not None
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_client = client.wrap_bio(to_client, to_server, server_hostname=name)
    tls_server = listener.tls.context().wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, endpoint in (("client", tls_client), ("server", tls_server)):
            if not done[side]:
                try:
                    endpoint.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(to_server.read())
        to_client.write(server_out.read())
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


def test_the_handshake_of_kube_scheduler_completes(
    listener: BoundedServer, installed: Path
) -> None:
    handshake(listener, kube_scheduler_context(installed / "client"), "hami-scheduler")


def test_a_client_without_the_kube_scheduler_certificate_is_refused(
    listener: BoundedServer, installed: Path
) -> None:
    anonymous = kube_scheduler_context(installed / "client", certificate=False)

    with pytest.raises(ssl.SSLError, match="peer did not return a certificate"):
        handshake(listener, anonymous, "hami-scheduler")


def test_the_serving_certificate_is_no_client_certificate(
    listener: BoundedServer, installed: Path
) -> None:
    # the serving pair presented as a client certificate: its one usage is serverAuth
    posing = kube_scheduler_context(installed / "serving")

    with pytest.raises(ssl.SSLError, match="unsuitable certificate purpose"):
        handshake(listener, posing, "hami-scheduler")


def test_a_renewed_certificate_is_served_without_a_restart(
    apiserver: FakeApiServer,
    kubeconfig_path: Path,
    installed: Path,
    listener: BoundedServer,
    clock: ManualClock,
) -> None:
    client = kube_scheduler_context(installed / "client")
    _, first = healthz(listener, client, "hami-scheduler")
    assert (
        first
        == x509.load_pem_x509_certificate(secret_data(apiserver, SERVING)[TLS_CERT]).serial_number
    )
    # the serving certificate is found expiring in 10 days, renewed, and the volume updated
    ca_data = secret_data(apiserver, CA)
    ca = read_ca(ca_data[CA_CERT], ca_data[CA_KEY])
    expiring = issue_leaf(
        ca,
        CertsSettings().serving_spec,
        datetime.now(UTC) - timedelta(days=355),
        timedelta(days=365),
    )
    put_secret(
        apiserver,
        SERVING,
        {**secret_data(apiserver, SERVING), TLS_CERT: expiring.cert_pem, TLS_KEY: expiring.key_pem},
    )
    assert main(["certs", "--kubeconfig", str(kubeconfig_path)]) == 0
    renewed = x509.load_pem_x509_certificate(secret_data(apiserver, SERVING)[TLS_CERT])
    assert renewed.serial_number not in (first, expiring.certificate.serial_number)
    write_files(apiserver, SERVING, installed / "serving")

    clock.advance(TLS_RECHECK_SECONDS)
    status, served = healthz(listener, client, "hami-scheduler")

    assert status == b"HTTP/1.1 200 OK"
    assert served == renewed.serial_number


def test_a_certificate_from_another_ca_is_refused_both_ways(
    listener: BoundedServer, installed: Path, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    stranger = make_ca("hami-plugin-ca.hami-system", now, timedelta(days=3650))
    forged = issue_leaf(stranger, CertsSettings().client_spec, now, timedelta(days=365))
    (tmp_path / "forged.crt").write_bytes(forged.cert_pem)
    (tmp_path / "forged.key").write_bytes(forged.key_pem)
    context = ssl.create_default_context(cafile=str(installed / "client" / CA_CERT))
    context.load_cert_chain(str(tmp_path / "forged.crt"), str(tmp_path / "forged.key"))
    trusting_stranger = ssl.create_default_context(cadata=stranger.cert_pem.decode())

    with pytest.raises(ssl.SSLError, match="unable to get local issuer certificate"):
        handshake(listener, context, "hami-scheduler")
    with pytest.raises(ssl.SSLCertVerificationError):
        healthz(listener, trusting_stranger, "hami-scheduler")
