"""What the `hami certs` tests share: the Secrets and the webhook configuration as the API
server double stores them, decoded, and certificates read back."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from cryptography import x509

from hami_plugin.testing.apiserver import FakeApiServer

NAMESPACE = "hami-system"
CA = "hami-scheduler-ca"
SERVING = "hami-scheduler-tls"
CLIENT = "hami-kube-scheduler-client"
BOOKING = "hami-booking-signing-key"
PUBLIC = "hami-booking-public-keys"
LEGACY = "hami-booking-key"
"""The HMAC Secret of the scheme before: `hami certs` never writes it."""
WEBHOOK = "hami-webhook"
SERVICE_NAMES = frozenset(
    {
        "hami-scheduler",
        "hami-scheduler.hami-system",
        "hami-scheduler.hami-system.svc",
        "hami-scheduler.hami-system.svc.cluster.local",
    }
)


def stored_secret(apiserver: FakeApiServer, name: str) -> dict[str, Any]:
    """The Secret as stored (raises AssertionError when there is none)."""
    secret = apiserver.get_object("secrets", NAMESPACE, name)
    assert secret is not None, f"no secret {name}"
    return secret


def secret_data(apiserver: FakeApiServer, name: str) -> dict[str, bytes]:
    """The Secret's data, decoded."""
    data = stored_secret(apiserver, name).get("data") or {}
    return {key: base64.b64decode(value) for key, value in data.items()}


def version(apiserver: FakeApiServer, name: str) -> str:
    return str(stored_secret(apiserver, name)["metadata"]["resourceVersion"])


def put_secret(
    apiserver: FakeApiServer, name: str, data: Mapping[str, bytes], secret_type: str = "Opaque"
) -> None:
    """Create the Secret, or replace its data (as another client would)."""
    encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
    if apiserver.get_object("secrets", NAMESPACE, name) is None:
        apiserver.add_object(
            {
                "kind": "Secret",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "type": secret_type,
                "data": encoded,
            }
        )
        return

    def change(secret: dict[str, Any]) -> None:
        secret["data"] = encoded

    apiserver.update_object("secrets", NAMESPACE, name, change)


def add_webhook_configuration(
    apiserver: FakeApiServer, names: tuple[str, ...] = ("vgpu.hami.io",)
) -> None:
    apiserver.add_object(
        {
            "kind": "MutatingWebhookConfiguration",
            "apiVersion": "admissionregistration.k8s.io/v1",
            "metadata": {"name": WEBHOOK},
            "webhooks": [
                {
                    "name": name,
                    "clientConfig": {"service": {"name": "hami-scheduler", "namespace": NAMESPACE}},
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                }
                for name in names
            ],
        }
    )


def ca_bundles(apiserver: FakeApiServer) -> list[bytes]:
    """Each webhook's caBundle, decoded (b"" when unset)."""
    configuration = apiserver.get_object("mutatingwebhookconfigurations", "", WEBHOOK)
    assert configuration is not None
    return [
        base64.b64decode(webhook.get("clientConfig", {}).get("caBundle", ""))
        for webhook in configuration["webhooks"]
    ]


def certificate(pem: bytes) -> x509.Certificate:
    """The first certificate of a PEM bundle."""
    return x509.load_pem_x509_certificates(pem)[0]


def certificates(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def writes(apiserver: FakeApiServer) -> list[tuple[str, str]]:
    """The requests that were not reads."""
    return [(r.method, r.path) for r in apiserver.requests if r.method != "GET"]
