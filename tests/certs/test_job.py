"""`hami certs` over the wire: the real `hami` parser and Kubernetes client against the API
server double, which records every request, so "nothing written" is checked, not assumed."""

from __future__ import annotations

import base64
import itertools
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from hami_plugin.certs import booking_key
from hami_plugin.certs.issue import issue_leaf, make_ca, read_ca
from hami_plugin.certs.job import ATTEMPTS, CertsJob
from hami_plugin.certs.plan import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY
from hami_plugin.certs.settings import CertsSettings
from hami_plugin.cli import main
from hami_plugin.clock import SystemClock
from hami_plugin.kube.errors import Conflict
from hami_plugin.kube.fake import FakeKube
from hami_plugin.protocol.signature import BookingFields, parse_booking_keys, public_key_line
from hami_plugin.testing.apiserver import FakeApiServer
from tests.certs.helpers import (
    BOOKING,
    CA,
    CLIENT,
    LEGACY,
    NAMESPACE,
    PUBLIC,
    SERVICE_NAMES,
    SERVING,
    add_webhook_configuration,
    ca_bundles,
    certificate,
    certificates,
    put_secret,
    secret_data,
    stored_secret,
    version,
    writes,
)
from tests.processes import hami_command

DAY = timedelta(days=1)


def certs(kubeconfig: Path, *flags: str) -> int:
    return main(["certs", "--kubeconfig", str(kubeconfig), *flags])


def usages(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def serials(apiserver: FakeApiServer) -> dict[str, int]:
    return {
        name: certificate(secret_data(apiserver, name)[key]).serial_number
        for name, key in ((CA, CA_CERT), (SERVING, TLS_CERT), (CLIENT, TLS_CERT))
    }


def test_a_first_run_creates_the_four_secrets_and_sets_the_ca_bundle(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    add_webhook_configuration(apiserver, ("vgpu.hami.io", "second.hami.io"))

    assert certs(kubeconfig_path) == 0

    assert stored_secret(apiserver, CA)["type"] == "Opaque"
    assert stored_secret(apiserver, SERVING)["type"] == "kubernetes.io/tls"
    assert stored_secret(apiserver, CLIENT)["type"] == "kubernetes.io/tls"
    assert stored_secret(apiserver, BOOKING)["type"] == "Opaque"
    ca = read_ca(secret_data(apiserver, CA)[CA_CERT], secret_data(apiserver, CA)[CA_KEY])
    serving = secret_data(apiserver, SERVING)
    client = secret_data(apiserver, CLIENT)
    served = certificate(serving[TLS_CERT])
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == SERVICE_NAMES
    served.verify_directly_issued_by(ca.certificate)
    assert usages(served) == [ExtendedKeyUsageOID.SERVER_AUTH]
    kube_scheduler = certificate(client[TLS_CERT])
    kube_scheduler.verify_directly_issued_by(ca.certificate)
    assert usages(kube_scheduler) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert kube_scheduler.subject.rfc4514_string() == "CN=hami-kube-scheduler"
    assert serving[CA_CERT] == client[CA_CERT] == ca.cert_pem
    assert ca_bundles(apiserver) == [ca.cert_pem, ca.cert_pem]
    now = datetime.now(UTC)
    assert ca.certificate.not_valid_after_utc - now > timedelta(days=3649)
    assert timedelta(days=364) < served.not_valid_after_utc - now <= timedelta(days=365)
    assert_usable_pair(apiserver, 1)
    assert apiserver.get_object("secrets", NAMESPACE, LEGACY) is None


def assert_usable_pair(apiserver: FakeApiServer, count: int) -> None:
    """The private Secret signs, the public one holds the public key of each private key in
    order (a booking the scheduler signs verifies on a node) and nothing that signs."""
    lines = secret_data(apiserver, BOOKING)["keys"].decode().splitlines()
    assert len(lines) == count and all(line.startswith("ed25519-private:") for line in lines)
    scheduler = parse_booking_keys(lines)
    node = parse_booking_keys(secret_data(apiserver, PUBLIC)["keys"].decode().splitlines())
    assert stored_secret(apiserver, PUBLIC)["type"] == "Opaque"
    assert not node.can_sign
    assert [public_key_line(key) for key in node.public] == [
        public_key_line(key) for key in scheduler.public
    ]
    fields = BookingFields("uid-1", "node-1", "GPU-0,NVIDIA,1000,10:;", "1767268800")
    assert node.verify(scheduler.sign(fields), fields)


def test_without_the_flag_the_kubeconfig_is_kubeconfigs(
    apiserver: FakeApiServer, kubeconfig_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `$KUBECONFIG` is read with the flags (`hami_plugin.config`), not by the client.
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_path))

    assert main(["certs"]) == 0

    assert {s["metadata"]["name"] for s in apiserver.objects("secrets", NAMESPACE)} == {
        CA,
        SERVING,
        CLIENT,
        BOOKING,
        PUBLIC,
    }


def test_a_second_run_writes_nothing(apiserver: FakeApiServer, kubeconfig_path: Path) -> None:
    add_webhook_configuration(apiserver)
    assert certs(kubeconfig_path) == 0
    apiserver.clear_requests()

    assert certs(kubeconfig_path) == 0

    assert writes(apiserver) == []
    assert len(apiserver.requests) == 6  # five Secrets and the webhook configuration read


def test_a_serving_certificate_expiring_in_ten_days_is_renewed_alone(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    add_webhook_configuration(apiserver)
    assert certs(kubeconfig_path) == 0
    data = secret_data(apiserver, CA)
    ca = read_ca(data[CA_CERT], data[CA_KEY])
    expiring = issue_leaf(
        ca, CertsSettings().serving_spec, datetime.now(UTC) - 355 * DAY, timedelta(days=365)
    )
    put_secret(
        apiserver,
        SERVING,
        {**secret_data(apiserver, SERVING), TLS_CERT: expiring.cert_pem, TLS_KEY: expiring.key_pem},
    )
    before = {name: version(apiserver, name) for name in (CA, CLIENT, BOOKING)}
    apiserver.clear_requests()

    assert certs(kubeconfig_path) == 0

    assert writes(apiserver) == [("PATCH", f"/api/v1/namespaces/{NAMESPACE}/secrets/{SERVING}")]
    renewed = certificate(secret_data(apiserver, SERVING)[TLS_CERT])
    assert renewed.serial_number != expiring.certificate.serial_number
    assert renewed.not_valid_after_utc - datetime.now(UTC) > timedelta(days=364)
    renewed.verify_directly_issued_by(ca.certificate)
    assert {name: version(apiserver, name) for name in (CA, CLIENT, BOOKING)} == before


def test_an_expiring_ca_renews_everything_and_the_ca_bundle(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    add_webhook_configuration(apiserver)
    now = datetime.now(UTC)
    old = make_ca("hami-plugin-ca.hami-system", now - timedelta(days=3640), timedelta(days=3650))
    settings = CertsSettings()
    put_secret(apiserver, CA, {CA_CERT: old.cert_pem, CA_KEY: old.key_pem})
    for name, spec in ((SERVING, settings.serving_spec), (CLIENT, settings.client_spec)):
        leaf = issue_leaf(old, spec, now - DAY, timedelta(days=365))
        put_secret(
            apiserver,
            name,
            {TLS_CERT: leaf.cert_pem, TLS_KEY: leaf.key_pem, CA_CERT: old.cert_pem},
            "kubernetes.io/tls",
        )
    put_secret(apiserver, BOOKING, {"keys": booking_key.key_file([booking_key.new_key()])})
    booking_version = version(apiserver, BOOKING)

    assert certs(kubeconfig_path) == 0

    data = secret_data(apiserver, CA)
    new = read_ca(data[CA_CERT], data[CA_KEY])
    assert new.certificate != old.certificate
    assert new.certificate.not_valid_after_utc - now > timedelta(days=3649)
    bundle = secret_data(apiserver, SERVING)[CA_CERT]
    assert certificates(bundle) == [new.certificate, old.certificate]  # old: 10 days left
    for name in (SERVING, CLIENT):
        certificate(secret_data(apiserver, name)[TLS_CERT]).verify_directly_issued_by(
            new.certificate
        )
        assert secret_data(apiserver, name)[CA_CERT] == bundle
    assert ca_bundles(apiserver) == [bundle]
    assert version(apiserver, BOOKING) == booking_version
    apiserver.clear_requests()
    assert certs(kubeconfig_path) == 0
    assert writes(apiserver) == []


@pytest.mark.parametrize(
    ("name", "key"),
    [(SERVING, TLS_CERT), (CLIENT, TLS_KEY), (CA, CA_CERT), (BOOKING, "keys"), (PUBLIC, "keys")],
)
def test_a_corrupt_secret_is_made_again(
    apiserver: FakeApiServer, kubeconfig_path: Path, name: str, key: str
) -> None:
    assert certs(kubeconfig_path) == 0
    before = serials(apiserver)
    put_secret(apiserver, name, {**secret_data(apiserver, name), key: b"garbage"})

    assert certs(kubeconfig_path) == 0

    after = serials(apiserver)
    if name == CA:  # a new CA, every leaf issued by it
        assert all(after[n] != before[n] for n in (CA, SERVING, CLIENT))
    elif name in (BOOKING, PUBLIC):
        assert after == before
        assert_usable_pair(apiserver, 1)
    else:
        assert [n for n in after if after[n] != before[n]] == [name]
    apiserver.clear_requests()
    assert certs(kubeconfig_path) == 0
    assert writes(apiserver) == []


def test_rotate_then_promote_booking_key_keeps_three(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    assert certs(kubeconfig_path) == 0
    history = [secret_data(apiserver, BOOKING)["keys"].decode().split()]
    certificates_before = serials(apiserver)

    for _ in range(3):
        assert certs(kubeconfig_path, "--rotate-booking-key") == 0
        history.append(secret_data(apiserver, BOOKING)["keys"].decode().split())
        assert_usable_pair(apiserver, len(history[-1]))  # the nodes know the new key
        assert certs(kubeconfig_path, "--promote-booking-key") == 0
        history.append(secret_data(apiserver, BOOKING)["keys"].decode().split())
        assert_usable_pair(apiserver, len(history[-1]))

    assert [len(keys) for keys in history] == [1, 2, 2, 3, 3, 3, 3]
    for index, (before, after) in enumerate(itertools.pairwise(history)):
        if index % 2 == 0:  # rotate: the signing key stays, a new one comes second
            assert after[0] == before[0] and after[1] not in before
        else:  # promote: the new key signs, the previous signing key is still accepted
            assert after[:2] == [before[1], before[0]] and after[2:] == before[2:]
    assert serials(apiserver) == certificates_before
    # both steps in one run are a usage error
    assert certs(kubeconfig_path, "--rotate-booking-key", "--promote-booking-key") == 2


def test_an_existing_opaque_secret_keeps_its_type_and_other_keys(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    # what kube-webhook-certgen left: an Opaque Secret with its own key names
    put_secret(apiserver, SERVING, {"cert": b"x", "key": b"y", "ca": b"z"})

    assert certs(kubeconfig_path) == 0

    secret = stored_secret(apiserver, SERVING)
    assert secret["type"] == "Opaque"  # the API server never lets a type change
    assert set(secret["data"]) == {"cert", "key", "ca", TLS_CERT, TLS_KEY, CA_CERT}
    assert secret["metadata"].get("labels") is None


def test_no_webhook_configuration_is_no_error(
    apiserver: FakeApiServer, kubeconfig_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")

    assert certs(kubeconfig_path) == 0

    assert "MutatingWebhookConfiguration hami-webhook not found" in caplog.text
    assert secret_data(apiserver, SERVING)[CA_CERT].startswith(b"-----BEGIN CERTIFICATE-----")
    add_webhook_configuration(apiserver)
    apiserver.clear_requests()
    assert certs(kubeconfig_path) == 0
    assert writes(apiserver) == [
        (
            "PATCH",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/hami-webhook",
        )
    ]


def test_a_required_webhook_configuration_missing_fails_after_the_secrets(
    apiserver: FakeApiServer, kubeconfig_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert certs(kubeconfig_path, "--require-webhook-configuration") == 1

    assert "MutatingWebhookConfiguration hami-webhook not found" in caplog.text
    assert {s["metadata"]["name"] for s in apiserver.objects("secrets", NAMESPACE)} == {
        CA,
        SERVING,
        CLIENT,
        BOOKING,
        PUBLIC,
    }
    add_webhook_configuration(apiserver)
    assert certs(kubeconfig_path, "--require-webhook-configuration") == 0
    assert ca_bundles(apiserver) == [secret_data(apiserver, SERVING)[CA_CERT]]


def test_flags_name_the_namespace_service_and_secrets(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    assert (
        certs(
            kubeconfig_path,
            "--namespace=gpu",
            "--service=sched",
            "--cluster-domain=corp.example",
            "--tls-secret=serving",
            "--validity=48h",
            "--renew-before=1h",
            "--webhook-configuration=",
        )
        == 0
    )

    secret = apiserver.get_object("secrets", "gpu", "serving")
    assert secret is not None
    served = certificate(base64.b64decode(secret["data"][TLS_CERT]))
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {
        "sched",
        "sched.gpu",
        "sched.gpu.svc",
        "sched.gpu.svc.corp.example",
    }
    assert served.not_valid_after_utc - served.not_valid_before_utc == timedelta(
        hours=48, minutes=5
    )
    assert {s["metadata"]["name"] for s in apiserver.objects("secrets", "gpu")} == {
        CA,
        "serving",
        CLIENT,
        BOOKING,
        PUBLIC,
    }


def test_a_lost_race_starts_over_from_a_fresh_read() -> None:
    kube = FakeKube()
    kube.fail("create_secret", Conflict("create secret hami-system/x: HTTP 409", 409))

    result = CertsJob(kube, CertsSettings(), SystemClock()).run()

    assert result.secrets_written == (CA, SERVING, CLIENT, PUBLIC, BOOKING)
    assert kube.calls.count("create_secret") == 6  # the lost one, then all five
    assert set(kube.secrets) == {(NAMESPACE, n) for n in (CA, SERVING, CLIENT, PUBLIC, BOOKING)}


def test_a_race_lost_every_time_is_an_api_failure() -> None:
    kube = FakeKube()
    kube.fail("create_secret", Conflict("create secret hami-system/x: HTTP 409", 409), times=None)

    with pytest.raises(Conflict):
        CertsJob(kube, CertsSettings(), SystemClock()).run()

    assert kube.calls.count("create_secret") == ATTEMPTS
    assert kube.secrets == {}


def test_the_job_exits_1_with_one_line_when_the_api_refuses_and_2_on_a_bad_flag(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    apiserver.inject_fault("GET", ".*/secrets/.*", status=403, times=None)

    refused = subprocess.run(
        [*hami_command("certs", "--kubeconfig", str(kubeconfig_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    bad_flag = subprocess.run(
        [*hami_command("certs", "--kubeconfig", str(kubeconfig_path), "--renew-before=30d")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert refused.returncode == 1
    [error] = [line for line in refused.stderr.splitlines() if "ERROR" in line]
    assert "hami certs: get secret hami-system/hami-scheduler-ca: HTTP 403" in error
    assert bad_flag.returncode == 2
    assert "--renew-before" in bad_flag.stderr
    assert writes(apiserver) == []


def test_the_job_as_a_process_creates_the_secrets(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    done = subprocess.run(
        [*hami_command("certs", "--kubeconfig", str(kubeconfig_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert {s["metadata"]["name"] for s in apiserver.objects("secrets", NAMESPACE)} == {
        CA,
        SERVING,
        CLIENT,
        BOOKING,
        PUBLIC,
    }
    assert "secret hami-system/hami-scheduler-tls created" in done.stderr


def test_booking_keys_only_makes_the_pair_and_no_certificate(
    apiserver: FakeApiServer, kubeconfig_path: Path
) -> None:
    """With cert-manager making the certificates, the chart's hook makes the key pair."""
    add_webhook_configuration(apiserver)
    assert certs(kubeconfig_path, "--booking-keys-only") == 0
    assert {s["metadata"]["name"] for s in apiserver.objects("secrets", NAMESPACE)} == {
        BOOKING,
        PUBLIC,
    }
    assert_usable_pair(apiserver, 1)
    assert ca_bundles(apiserver) == [b""]
    apiserver.clear_requests()
    assert certs(kubeconfig_path, "--booking-keys-only") == 0
    assert writes(apiserver) == []
