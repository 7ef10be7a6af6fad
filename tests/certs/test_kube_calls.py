"""The Kubernetes calls of `hami certs` (`hami_plugin.kube.api.CertsApi`): `KubeClient` against
the API server double, which checks Secrets and webhook configurations as the API server does,
and `FakeKube` keeping the same rules."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import urllib3

from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import Conflict, KubeError, NotFound
from hami_plugin.kube.fake import FakeKube
from hami_plugin.kube.records import SecretRecord, WebhookConfigurationRecord
from hami_plugin.testing.apiserver import FakeApiServer
from tests.certs.helpers import WEBHOOK, add_webhook_configuration, ca_bundles
from tests.kube.support import FAST, SleepRecorder
from tests.testing.apiserver.wire import call

BINARY = bytes(range(256))


@pytest.fixture
def kube(apiserver: FakeApiServer) -> Iterator[KubeClient]:
    with KubeClient(
        apiserver.api_client(), FAST, sleep=SleepRecorder(), rng=random.Random(7)
    ) as client:
        yield client


@pytest.fixture
def http() -> Iterator[urllib3.PoolManager]:
    pool = urllib3.PoolManager(retries=False, timeout=5.0)
    yield pool
    pool.clear()


def tls_secret(name: str = "s", **data: bytes) -> SecretRecord:
    values = {"tls.crt": b"crt", "tls.key": b"key", **data}
    return SecretRecord("ns", name, "kubernetes.io/tls", values, {"app": "x"})


@pytest.mark.parametrize("kind", ["client", "fake"])
def test_a_secret_is_created_read_back_and_not_created_twice(kube: KubeClient, kind: str) -> None:
    api: KubeClient | FakeKube = kube if kind == "client" else FakeKube()

    created = api.create_secret(tls_secret(blob=BINARY))
    read = api.get_secret("ns", "s")

    assert read.data == {"tls.crt": b"crt", "tls.key": b"key", "blob": BINARY}
    assert (read.type, dict(read.labels)) == ("kubernetes.io/tls", {"app": "x"})
    assert read.resource_version == created.resource_version != ""
    with pytest.raises(Conflict):
        api.create_secret(tls_secret())
    with pytest.raises(NotFound):
        api.get_secret("ns", "ghost")


@pytest.mark.parametrize("kind", ["client", "fake"])
def test_a_data_patch_sets_and_deletes_keys_and_keeps_the_rest(kube: KubeClient, kind: str) -> None:
    api: KubeClient | FakeKube = kube if kind == "client" else FakeKube()
    created = api.create_secret(tls_secret(extra=b"kept", gone=b"x"))

    patched = api.patch_secret_data(
        "ns", "s", {"tls.crt": b"new", "gone": None}, resource_version=created.resource_version
    )

    assert patched.data == {"tls.crt": b"new", "tls.key": b"key", "extra": b"kept"}
    assert patched.type == "kubernetes.io/tls" and dict(patched.labels) == {"app": "x"}
    with pytest.raises(Conflict):
        api.patch_secret_data("ns", "s", {"x": b"y"}, resource_version=created.resource_version)
    with pytest.raises(NotFound):
        api.patch_secret_data("ns", "ghost", {"x": b"y"})


def test_the_double_checks_secrets_as_the_api_server(
    apiserver: FakeApiServer, kube: KubeClient, http: urllib3.PoolManager
) -> None:
    with pytest.raises(KubeError, match=r"HTTP 422: .*data\[tls.key\]: Required value"):
        kube.create_secret(SecretRecord("ns", "half", "kubernetes.io/tls", {"tls.crt": b"x"}, {}))
    kube.create_secret(tls_secret())

    changed_type = call(
        http, apiserver, "PUT", "/api/v1/namespaces/ns/secrets/s",
        {"metadata": {"name": "s"}, "type": "Opaque", "data": {}},
    )  # fmt: skip
    bad_base64 = call(
        http, apiserver, "POST", "/api/v1/namespaces/ns/secrets",
        {"metadata": {"name": "b"}, "data": {"k": "not base64!"}},
    )  # fmt: skip
    folded = call(
        http, apiserver, "POST", "/api/v1/namespaces/ns/secrets",
        {"metadata": {"name": "f"}, "stringData": {"k": "text"}},
    )  # fmt: skip

    assert changed_type[0] == 422 and "field is immutable" in changed_type[1]["message"]
    assert bad_base64[0] == 400
    assert folded[0] == 201 and "stringData" not in folded[1]
    assert kube.get_secret("ns", "f").data == {"k": b"text"}
    assert kube.get_secret("ns", "f").type == "Opaque"


def test_a_webhook_ca_bundle_is_set_on_every_webhook(
    apiserver: FakeApiServer, kube: KubeClient
) -> None:
    add_webhook_configuration(apiserver, ("a.hami.io", "b.hami.io"))
    read = kube.get_mutating_webhook_configuration(WEBHOOK)
    assert read.ca_bundles == (("a.hami.io", b""), ("b.hami.io", b""))

    patched = kube.patch_mutating_webhook_ca_bundles(WEBHOOK, ["a.hami.io", "b.hami.io"], b"PEM")

    assert patched.ca_bundles == (("a.hami.io", b"PEM"), ("b.hami.io", b"PEM"))
    assert ca_bundles(apiserver) == [b"PEM", b"PEM"]
    configuration = apiserver.get_object("mutatingwebhookconfigurations", "", WEBHOOK)
    assert configuration is not None
    assert configuration["webhooks"][0]["clientConfig"]["service"]["name"] == "hami-scheduler"
    with pytest.raises(NotFound):
        kube.get_mutating_webhook_configuration("ghost")


def test_a_webhook_list_that_changed_since_it_was_read_is_not_patched(
    apiserver: FakeApiServer, kube: KubeClient
) -> None:
    add_webhook_configuration(apiserver, ("a.hami.io", "b.hami.io"))
    fake = FakeKube()
    fake.webhook_configurations[WEBHOOK] = WebhookConfigurationRecord(
        WEBHOOK, (("a.hami.io", b""), ("b.hami.io", b"")), "1"
    )

    for api in (kube, fake):
        with pytest.raises(KubeError, match="HTTP 422"):
            api.patch_mutating_webhook_ca_bundles(WEBHOOK, ["b.hami.io", "a.hami.io"], b"PEM")

    assert ca_bundles(apiserver) == [b"", b""]
    assert fake.webhook_configurations[WEBHOOK].ca_bundles == (
        ("a.hami.io", b""),
        ("b.hami.io", b""),
    )
