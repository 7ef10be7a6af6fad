"""The certificate job: read the Secrets and the webhook configuration, let `plan` decide,
write what it says, through the Kubernetes adapter (`hami_plugin.kube.api.CertsApi`).

A Secret that exists is changed with a merge patch of its `data` under a `resourceVersion`
precondition: the keys the plan names are set, the rest of the Secret (its type, which the API
server never lets change, other keys, labels, annotations, owners) stays as it is. A new one is
created with the plan's type and the labels below. The webhook's caBundle is set with a JSON
patch that checks each webhook's name at its index first.

Two jobs running at once (a Helm hook and the Job of the plain manifests) race on the same
objects; the loser's write fails with Conflict (a changed resourceVersion, or AlreadyExists), and
the whole job starts over from a fresh read, up to `ATTEMPTS` times: the second look finds the
winner's valid Secrets and writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from hami_plugin.certs.plan import Observed, Plan, SecretChange, plan
from hami_plugin.certs.settings import CertsSettings
from hami_plugin.clock import Clock
from hami_plugin.kube.api import CertsApi
from hami_plugin.kube.errors import Conflict, NotFound
from hami_plugin.kube.records import SecretRecord
from hami_plugin.protocol.govalues import format_go_duration

__all__ = ["ATTEMPTS", "LABELS", "CertsJob", "JobResult", "WebhookConfigurationMissing"]

logger = logging.getLogger(__name__)

ATTEMPTS = 3
LABELS: Mapping[str, str] = {
    "app.kubernetes.io/part-of": "hami-plugin",
    "app.kubernetes.io/managed-by": "hami-certs",
}
"""The labels of a Secret the job creates."""


class WebhookConfigurationMissing(Exception):  # noqa: N818 - says what is wrong
    """The webhook configuration is not there and the settings require it."""


@dataclass(frozen=True, slots=True)
class JobResult:
    """What one run wrote: the Secrets, in order, and whether the caBundle was patched."""

    secrets_written: tuple[str, ...]
    webhook_patched: bool


class CertsJob:
    """One run of `hami certs` against `api`, at `clock.now()`."""

    def __init__(self, api: CertsApi, settings: CertsSettings, clock: Clock) -> None:
        self._api = api
        self._settings = settings
        self._clock = clock

    def run(self) -> JobResult:
        """Create or renew what needs it. Raises KubeError when an API call fails (Conflict
        only after `ATTEMPTS` fresh starts), WebhookConfigurationMissing (after the Secrets
        are written) when the settings require a webhook configuration that is not there."""
        attempt = 1
        while True:
            try:
                return self._run_once()
            except Conflict as error:
                if attempt >= ATTEMPTS:
                    raise
                attempt += 1
                logger.info("%s; another writer was faster: reading again", error)

    def _run_once(self) -> JobResult:
        settings = self._settings
        booking = (settings.booking_key_secret, settings.booking_public_key_secret)
        certificates = (settings.ca_secret, settings.tls_secret, settings.client_secret)
        names = booking if settings.booking_keys_only else (*certificates, *booking)
        secrets = {name: self._read_secret(name) for name in names}
        webhook = None if settings.booking_keys_only else self._read_webhooks()

        def data(name: str) -> Mapping[str, bytes] | None:
            record = secrets.get(name)
            return None if record is None else record.data

        observed = Observed(
            ca=data(settings.ca_secret),
            serving=data(settings.tls_secret),
            client=data(settings.client_secret),
            booking_key=data(settings.booking_key_secret),
            booking_public=data(settings.booking_public_key_secret),
            webhooks=webhook,
        )
        decided = plan(settings, observed, self._clock.now())
        for change in decided.changes:
            self._write(change, secrets[change.name])
        if decided.patch_webhooks:
            self._patch_webhooks(decided, webhook or ())
        required = (
            settings.webhook_configuration
            and settings.require_webhook_configuration
            and not settings.booking_keys_only
        )
        if webhook is None and required:
            raise WebhookConfigurationMissing(
                f"MutatingWebhookConfiguration {settings.webhook_configuration} not found "
                "(--require-webhook-configuration): its caBundle is set on the next run"
            )
        if decided.writes_nothing:
            logger.info(
                "every certificate, key and caBundle in %s is valid for more than %s: "
                "nothing written",
                settings.namespace,
                format_go_duration(settings.renew_before),
            )
        return JobResult(tuple(change.name for change in decided.changes), decided.patch_webhooks)

    def _read_secret(self, name: str) -> SecretRecord | None:
        try:
            return self._api.get_secret(self._settings.namespace, name)
        except NotFound:
            return None

    def _read_webhooks(self) -> tuple[tuple[str, bytes], ...] | None:
        name = self._settings.webhook_configuration
        if not name:
            return None
        try:
            return self._api.get_mutating_webhook_configuration(name).ca_bundles
        except NotFound:
            logger.info(
                "MutatingWebhookConfiguration %s not found: no caBundle to set (it is set on "
                "the next run once it exists)",
                name,
            )
            return None

    def _write(self, change: SecretChange, current: SecretRecord | None) -> None:
        namespace = self._settings.namespace
        if current is None:
            self._api.create_secret(
                SecretRecord(namespace, change.name, change.type, dict(change.data), dict(LABELS))
            )
            logger.info("secret %s/%s created: %s", namespace, change.name, change.why)
            return
        self._api.patch_secret_data(
            namespace, change.name, change.data, resource_version=current.resource_version
        )
        logger.info("secret %s/%s updated: %s", namespace, change.name, change.why)

    def _patch_webhooks(self, decided: Plan, webhooks: tuple[tuple[str, bytes], ...]) -> None:
        name = self._settings.webhook_configuration
        self._api.patch_mutating_webhook_ca_bundles(
            name, [webhook for webhook, _ in webhooks], decided.ca_bundle
        )
        logger.info(
            "MutatingWebhookConfiguration %s: caBundle of %d webhook(s) set to the trust bundle",
            name,
            len(webhooks),
        )
