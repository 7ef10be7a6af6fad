"""`hami certs`: create or renew the CA, the serving and client certificates and the booking
key in their Secrets, and the webhook's caBundle; then exit. Run it as the install Job (and a
Helm hook) before the daemons start, and again at any time: a run with nothing to renew writes
nothing.

Exit status: 0 done (or nothing to do), 1 an API call failed (one line says which, and why)
or, with `--require-webhook-configuration`, the webhook configuration is not there yet, 2 a
flag is wrong.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from dataclasses import fields
from datetime import timedelta
from typing import Any

from hami_plugin.certs.settings import CertsSettings
from hami_plugin.config import (
    EXIT_USAGE,
    LOG_LEVELS,
    ConfigError,
    parse_bool,
    parse_duration,
    parse_optional_str,
    parse_str,
)
from hami_plugin.config.options import Option, OptionTable
from hami_plugin.protocol.govalues import format_go_duration

__all__ = ["EXIT_API", "EXIT_USAGE", "OPTIONS", "add_arguments", "register", "run", "settings_from"]

logger = logging.getLogger(__name__)

EXIT_API = 1
_DEFAULTS = CertsSettings()


def _go(duration: timedelta) -> str:
    # 8760h rather than Go's 8760h0m0s: what a manifest would write
    text = format_go_duration(duration)
    return text.removesuffix("0m0s") if text.endswith("h0m0s") else text


def _text(name: str, help_text: str) -> Option:
    """A text flag `--<name>` defaulting to `CertsSettings`'s value, named in its help."""
    default = getattr(_DEFAULTS, name)
    return Option(
        name, ("--" + name.replace("_", "-"),), parse_str, default=default,
        help=f"{help_text} (default {default})",
    )  # fmt: skip


def _duration(name: str, help_text: str) -> Option:
    """A Go duration flag defaulting to `CertsSettings`'s value, named in its help."""
    default = _go(getattr(_DEFAULTS, name))
    return Option(
        name, ("--" + name.replace("_", "-"),), parse_duration, default=default,
        help=f"{help_text}, a Go duration (default {default})",
    )  # fmt: skip


OPTIONS = OptionTable(
    (
        Option("kubeconfig", ("--kubeconfig",), parse_optional_str, env="KUBECONFIG",
               help="kubeconfig file (default: $KUBECONFIG, else the in-cluster configuration)"),
        _text("namespace", "namespace of the Secrets and the Service"),
        _text("service", "the scheduler's Service: the serving certificate is for <svc>, "
              "<svc>.<ns>, <svc>.<ns>.svc, <svc>.<ns>.svc.<domain>"),
        _text("cluster_domain", "the cluster's DNS domain"),
        _duration("validity", "lifetime of a new serving or client certificate"),
        _duration("ca_validity", "lifetime of a new CA"),
        _duration("renew_before", "renew a certificate expiring within this"),
        _text("ca_secret", "Secret of the CA: ca.crt, ca.key"),
        _text("tls_secret", "Secret of the serving certificate: tls.crt, tls.key, ca.crt"),
        _text("client_secret", "Secret of kube-scheduler's client certificate: tls.crt, "
              "tls.key, ca.crt"),
        _text("client_common_name", "CN of kube-scheduler's client certificate"),
        _text("booking_key_secret", "Secret of the scheduler's private booking keys: keys "
              "(mounted by the scheduler only)"),
        _text("booking_public_key_secret", "Secret of the public booking keys: keys (mounted "
              "by the device plugins; written from the private keys)"),
        _text("webhook_configuration", 'MutatingWebhookConfiguration whose caBundle is set; "" '
              "for none"),
        Option("require_webhook_configuration", ("--require-webhook-configuration",),
               parse_bool, default="false",
               help="fail (exit 1, after writing the Secrets) when the webhook configuration "
               "does not exist yet, so that a Job applied with it is retried until it does"),
        Option("rotate_booking_key", ("--rotate-booking-key",), parse_bool, default="false",
               help="rotation step 1: add a new booking key pair second, after the signing key "
               "(three keys at most, the oldest goes); the scheduler signs with the first key, "
               "the daemons accept any"),
        Option("booking_keys_only", ("--booking-keys-only",), parse_bool, default="false",
               help="the booking key pair only: no certificate, no caBundle (cert-manager "
               "makes those)"),
        Option("promote_booking_key", ("--promote-booking-key",), parse_bool, default="false",
               help="rotation step 2, once every pod mounts the new key: the second key signs"),
        Option("log_level", ("--log-level",), parse_str, default="info",
               choices=LOG_LEVELS, help="(default info)"),
    )
)  # fmt: skip
"""Every flag of `hami certs`, in `--help` order (defaults: `CertsSettings`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hami certs` (defaults: `CertsSettings`)."""
    OPTIONS.add_to(parser)


def _settings(values: Mapping[str, Any]) -> CertsSettings:
    """The job's settings of the resolved `values`. Raises ConfigError naming the flag."""
    try:
        return CertsSettings(**{f.name: values[f.name] for f in fields(CertsSettings)})
    except ValueError as error:
        raise ConfigError(str(error)) from None


def settings_from(args: argparse.Namespace) -> CertsSettings:
    """The settings of parsed flags. Raises ConfigError naming the flag."""
    return _settings(OPTIONS.resolve_args(args))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `hami certs`."""
    parser = subparsers.add_parser(
        "certs",
        help="create or renew the CA, certificates and booking key in Secrets, then exit",
        description="Create or renew, idempotently, the CA, the scheduler's serving "
        "certificate, kube-scheduler's client certificate and the booking key in their "
        "Secrets, and set the webhook's caBundle. Nothing is written when all is valid.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the job once; returns the exit status."""
    from hami_plugin.certs.job import CertsJob, WebhookConfigurationMissing
    from hami_plugin.clock import SystemClock
    from hami_plugin.kube.client import KubeClient
    from hami_plugin.kube.errors import KubeError

    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    try:
        values = OPTIONS.resolve_args(args)
        settings = _settings(values)
    except ConfigError as error:
        logging.basicConfig(format=log_format)
        logger.error("hami certs: %s", error)
        return EXIT_USAGE
    logging.basicConfig(level=values["log_level"].upper(), format=log_format)
    clock = SystemClock()
    try:
        with KubeClient.from_config(values.get("kubeconfig"), clock=clock) as kube:
            CertsJob(kube, settings, clock).run()
    except (KubeError, WebhookConfigurationMissing) as error:
        logger.error("hami certs: %s", error)
        return EXIT_API
    return 0
