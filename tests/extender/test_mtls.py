"""Only kube-scheduler reaches /filter and /bind: with `--client-ca-file` the extender listener
requires a client certificate from that CA, the webhook and the probes get a listener of their
own (`--webhook-bind`) that asks for none, and renewed certificates and CAs are served without a
restart. Over real TLS against the daemon, with certificates made here (`tests/extender/certs`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from hami_plugin.cli import build_parser
from hami_plugin.config import ConfigError
from hami_plugin.extender.command import EXIT_USAGE, run
from hami_plugin.extender.settings import resolve_config
from hami_plugin.testing.apiserver import FakeApiServer
from tests.extender.certs import Authority, Issued, client_context
from tests.extender.cluster import Scheduler, running_scheduler
from tests.extender.helpers import cpu_pod, gpu_pod
from tests.processes import wait_until

TLS_VERSIONS = [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3]


@dataclass
class Pki:
    """A CA, the serving pair it signed, the client CA file the extender trusts, the
    kube-scheduler client certificate, and a stranger: a client certificate from another CA."""

    directory: Path
    ca: Authority
    other: Authority
    cert_file: Path
    key_file: Path
    ca_file: Path
    client_ca_file: Path
    kube_scheduler: Issued
    stranger: Issued

    def context(
        self, presented: Issued | None = None, version: ssl.TLSVersion | None = None
    ) -> ssl.SSLContext:
        return client_context(self.ca_file, presented, self.directory, version=version)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca, other = Authority.create("hami-ca"), Authority.create("another-ca")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.serving().write(cert_file, key_file)
    return Pki(
        directory=tmp_path,
        ca=ca,
        other=other,
        cert_file=cert_file,
        key_file=key_file,
        ca_file=ca.write(tmp_path / "ca.crt"),
        client_ca_file=ca.write(tmp_path / "client-ca.crt"),
        kube_scheduler=ca.client(),
        stranger=other.client(),
    )


@contextmanager
def mtls_scheduler(apiserver: FakeApiServer, pki: Pki) -> Iterator[Scheduler]:
    with running_scheduler(
        apiserver,
        cert_file=str(pki.cert_file),
        key_file=str(pki.key_file),
        client_ca_file=str(pki.client_ca_file),
        webhook_host="127.0.0.1",
        webhook_port=0,
    ) as scheduler:
        yield scheduler


def https(
    port: int, context: ssl.SSLContext, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def attempt(port: int, context: ssl.SSLContext) -> str:
    """GET /healthz over a new TLS connection: the status line when served, else where and
    why it was refused."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
        except ssl.SSLError as error:
            return f"handshake refused: {error.reason}"
        with tls:
            try:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = tls.recv(64)
            except ssl.SSLError as error:
                # TLS 1.3: the client's side of the handshake is done before the server has
                # judged its certificate; the verdict arrives as an alert on the first read
                return f"refused after the client's handshake: {error.reason}"
            except ConnectionResetError:
                return "reset"
            return answer.split(b"\r\n", 1)[0].decode()


def served(port: int, context: ssl.SSLContext) -> bool:
    return attempt(port, context) == "HTTP/1.1 200 OK"


def served_certificate(port: int, context: ssl.SSLContext) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        certificate = tls.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


def _refusal(outcome: str, version: ssl.TLSVersion) -> bool:
    if version is ssl.TLSVersion.TLSv1_2:
        return outcome.startswith("handshake refused")
    return outcome.startswith(("handshake refused", "refused after the client's handshake"))


@pytest.mark.parametrize("version", TLS_VERSIONS, ids=["TLS 1.2", "TLS 1.3"])
def test_a_client_without_a_certificate_or_with_a_strangers_cannot_reach_the_extender(
    apiserver: FakeApiServer, pki: Pki, version: ssl.TLSVersion
) -> None:
    with mtls_scheduler(apiserver, pki) as scheduler:
        port = scheduler.daemon.port
        for presented in (None, pki.stranger):
            outcome = attempt(port, pki.context(presented, version))
            assert _refusal(outcome, version), outcome
        # the right certificate over the same TLS version is served
        assert attempt(port, pki.context(pki.kube_scheduler, version)) == "HTTP/1.1 200 OK"


def test_with_kube_schedulers_certificate_filter_and_bind_work(
    apiserver: FakeApiServer, pki: Pki
) -> None:
    with mtls_scheduler(apiserver, pki) as scheduler:
        context = pki.context(pki.kube_scheduler)
        port = scheduler.daemon.port
        body = json.dumps({"Pod": cpu_pod("web"), "NodeNames": ["n1"]}).encode()
        status, answer = https(port, context, "POST", "/filter", body)
        assert (status, json.loads(answer)["NodeNames"]) == (200, ["n1"])
        bind = {"PodName": "nope", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}
        status, answer = https(port, context, "POST", "/bind", json.dumps(bind).encode())
        assert status == 200 and json.loads(answer)["Error"]  # answered (the pod is not there)
        assert scheduler.daemon.url.startswith("https://")


def test_a_body_over_the_cap_gets_its_answer_over_tls(apiserver: FakeApiServer, pki: Pki) -> None:
    """The answer that closes the connection reaches the client whole, TLS and all, while the
    rest of the body is left unread."""
    with running_scheduler(
        apiserver,
        cert_file=str(pki.cert_file),
        key_file=str(pki.key_file),
        client_ca_file=str(pki.client_ca_file),
        webhook_host="127.0.0.1",
        webhook_port=0,
        max_body_bytes=4096,
    ) as scheduler:
        context = pki.context(pki.kube_scheduler)
        body = json.dumps({"Pod": gpu_pod("big", annotations={"filler": "x" * 200_000})}).encode()
        status, answer = https(scheduler.daemon.port, context, "POST", "/filter", body)
        assert status == 200
        assert json.loads(answer)["Error"] == "request body larger than 4096 bytes"
        assert served(scheduler.daemon.port, context)


def _review(pod: dict[str, object]) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "req-7",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "namespace": "default",
                "object": pod,
            },
        }
    ).encode()


def test_the_webhook_listener_serves_the_webhook_and_probes_without_a_client_certificate(
    apiserver: FakeApiServer, pki: Pki
) -> None:
    with mtls_scheduler(apiserver, pki) as scheduler:
        anonymous = pki.context()
        webhook = scheduler.daemon.webhook_port
        assert webhook != scheduler.daemon.port
        status, answer = https(webhook, anonymous, "POST", "/webhook", _review(gpu_pod("w")))
        assert status == 200
        assert json.loads(answer)["response"]["uid"] == "req-7"
        assert https(webhook, anonymous, "GET", "/readyz") == (200, b"ok\n")
        assert https(webhook, anonymous, "GET", "/healthz") == (200, b"ok\n")
        # the webhook listener serves nothing else
        body = json.dumps({"Pod": cpu_pod("web"), "NodeNames": ["n1"]}).encode()
        assert https(webhook, anonymous, "POST", "/filter", body)[0] == 404
        assert https(webhook, anonymous, "POST", "/bind", b"{}")[0] == 404
        # and the extender listener no longer serves the webhook; its probes stay
        client = pki.context(pki.kube_scheduler)
        assert (
            https(scheduler.daemon.port, client, "POST", "/webhook", _review(gpu_pod("w")))[0]
            == 404
        )
        assert https(scheduler.daemon.port, client, "GET", "/readyz") == (200, b"ok\n")


def test_a_renewed_serving_certificate_is_served_on_new_connections(
    apiserver: FakeApiServer, pki: Pki
) -> None:
    with mtls_scheduler(apiserver, pki) as scheduler:
        daemon = scheduler.daemon
        client, anonymous = pki.context(pki.kube_scheduler), pki.context()
        listeners = ((daemon.port, client), (daemon.webhook_port, anonymous))
        before = [served_certificate(port, context) for port, context in listeners]
        renewed = pki.ca.serving("renewed")
        renewed.write(pki.cert_file, pki.key_file)

        def renewed_everywhere() -> bool:
            return all(served_certificate(*listener) == renewed.der for listener in listeners)

        wait_until(renewed_everywhere, what="the renewed certificate served", interval=0.2)
        assert renewed.der not in before
        assert served(daemon.port, client)


def test_a_renewed_client_ca_is_picked_up(
    apiserver: FakeApiServer, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "hami_plugin.extender.tls")
    with mtls_scheduler(apiserver, pki) as scheduler:
        port = scheduler.daemon.port
        old_client, new_client = pki.context(pki.kube_scheduler), pki.context(pki.stranger)
        assert served(port, old_client)
        assert not served(port, new_client)
        pki.other.write(pki.client_ca_file)  # the client CA rotates to the other CA
        wait_until(lambda: served(port, new_client), what="the new client CA", interval=0.2)
        assert not served(port, old_client)
        # a client CA file that does not load keeps the CA in force
        pki.client_ca_file.write_bytes(b"not a certificate")
        wait_until(
            lambda: served(port, new_client) and "not reloaded" in caplog.text,
            what="the bad CA file seen",
            interval=0.2,
        )
        assert served(port, new_client)
        assert not served(port, old_client)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["scheduler", *argv])


TLS_FLAGS = ("--cert-file", "tls.crt", "--key-file", "tls.key")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--client-ca-file", "ca.crt"), r"--client-ca-file needs --cert-file and --key-file"),
        (
            ("--client-ca-file", "ca.crt", *TLS_FLAGS),
            r"the API server calls the webhook without a client certificate: give --webhook-bind",
        ),
        (("--webhook-bind", ":8443"), r"--webhook-bind: the API server calls webhooks over HTTPS"),
        (
            ("--webhook-bind", "0.0.0.0:443", *TLS_FLAGS),
            r"--webhook-bind 0\.0\.0\.0:443: the same address as --http-bind",
        ),
        (("--webhook-bind", "nope", *TLS_FLAGS), r"address 'nope' has no port"),
    ],
)
def test_listener_flags_that_do_not_go_together_are_usage_errors(
    argv: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_config(parse(*argv), {})


def test_listener_flags_resolve() -> None:
    config = resolve_config(
        parse(*TLS_FLAGS, "--client-ca-file", "ca.crt", "--webhook-bind", ":8443"), {}
    )
    assert config.client_ca_file == "ca.crt"
    assert (config.webhook_host, config.webhook_port) == ("0.0.0.0", 8443)
    assert (config.http_host, config.http_port) == ("0.0.0.0", 443)
    plain = resolve_config(parse(), {})
    assert (plain.client_ca_file, plain.webhook_host) == ("", None)


def test_the_command_exits_2_on_a_client_ca_without_a_webhook_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert run(parse("--client-ca-file", "ca.crt", *TLS_FLAGS)) == EXIT_USAGE
    assert "give --webhook-bind" in caplog.text
