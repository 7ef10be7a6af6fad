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
from datetime import timedelta

from hami_plugin.certs.settings import CertsSettings
from hami_plugin.config import ConfigError, add_bool_flag, flag_dest, parse_bool, parse_duration
from hami_plugin.protocol.govalues import format_go_duration

__all__ = ["EXIT_API", "EXIT_USAGE", "add_arguments", "register", "run", "settings_from"]

logger = logging.getLogger(__name__)

EXIT_API = 1
EXIT_USAGE = 2
_DEFAULTS = CertsSettings()


def _go(duration: timedelta) -> str:
    # 8760h rather than Go's 8760h0m0s: what a manifest would write
    text = format_go_duration(duration)
    return text.removesuffix("0m0s") if text.endswith("h0m0s") else text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hami certs` (defaults: `CertsSettings`)."""
    d = _DEFAULTS
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, else the in-cluster configuration)",
    )
    parser.add_argument(
        "--namespace",
        default=d.namespace,
        help=f"namespace of the Secrets and the Service (default {d.namespace})",
    )
    parser.add_argument(
        "--service",
        default=d.service,
        help=f"the scheduler's Service: the serving certificate is for "
        f"<svc>, <svc>.<ns>, <svc>.<ns>.svc, <svc>.<ns>.svc.<domain> "
        f"(default {d.service})",
    )
    parser.add_argument(
        "--cluster-domain",
        default=d.cluster_domain,
        help=f"the cluster's DNS domain (default {d.cluster_domain})",
    )
    parser.add_argument(
        "--validity",
        default=_go(d.validity),
        help=f"lifetime of a new serving or client certificate, a Go duration "
        f"(default {_go(d.validity)})",
    )
    parser.add_argument(
        "--ca-validity",
        default=_go(d.ca_validity),
        help=f"lifetime of a new CA, a Go duration (default {_go(d.ca_validity)})",
    )
    parser.add_argument(
        "--renew-before",
        default=_go(d.renew_before),
        help=f"renew a certificate expiring within this, a Go duration "
        f"(default {_go(d.renew_before)})",
    )
    parser.add_argument(
        "--ca-secret",
        default=d.ca_secret,
        help=f"Secret of the CA: ca.crt, ca.key (default {d.ca_secret})",
    )
    parser.add_argument(
        "--tls-secret",
        default=d.tls_secret,
        help=f"Secret of the serving certificate: tls.crt, tls.key, ca.crt "
        f"(default {d.tls_secret})",
    )
    parser.add_argument(
        "--client-secret",
        default=d.client_secret,
        help=f"Secret of kube-scheduler's client certificate: tls.crt, tls.key, "
        f"ca.crt (default {d.client_secret})",
    )
    parser.add_argument(
        "--client-common-name",
        default=d.client_common_name,
        help=f"CN of kube-scheduler's client certificate (default {d.client_common_name})",
    )
    parser.add_argument(
        "--booking-key-secret",
        default=d.booking_key_secret,
        help=f"Secret of the booking keys: keys (default {d.booking_key_secret})",
    )
    parser.add_argument(
        "--webhook-configuration",
        default=d.webhook_configuration,
        help=f'MutatingWebhookConfiguration whose caBundle is set; "" for '
        f"none (default {d.webhook_configuration})",
    )
    add_bool_flag(
        parser,
        "--require-webhook-configuration",
        default="false",
        help="fail (exit 1, after writing the Secrets) when the webhook configuration does not "
        "exist yet, so that a Job applied with it is retried until it does",
    )
    add_bool_flag(
        parser,
        "--rotate-booking-key",
        default="false",
        help="rotation step 1: add a new booking key second, after the signing key (three "
        "keys at most, the oldest goes); the daemons sign with the first key and accept any",
    )
    add_bool_flag(
        parser,
        "--promote-booking-key",
        default="false",
        help="rotation step 2, once every pod mounts the new key: the second key signs",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="(default info)",
    )


def settings_from(args: argparse.Namespace) -> CertsSettings:
    """The settings of parsed flags. Raises ConfigError naming the flag."""

    def duration(flag: str) -> timedelta:
        raw = getattr(args, flag_dest(flag))
        try:
            return parse_duration(raw)
        except ValueError as error:
            raise ConfigError(f"{flag}: {error}") from None

    def boolean(flag: str) -> bool:
        try:
            return parse_bool(getattr(args, flag_dest(flag)))
        except ValueError as error:
            raise ConfigError(f"{flag}: {error}") from None

    try:
        return CertsSettings(
            namespace=args.namespace,
            service=args.service,
            cluster_domain=args.cluster_domain,
            validity=duration("--validity"),
            ca_validity=duration("--ca-validity"),
            renew_before=duration("--renew-before"),
            ca_secret=args.ca_secret,
            tls_secret=args.tls_secret,
            client_secret=args.client_secret,
            booking_key_secret=args.booking_key_secret,
            webhook_configuration=args.webhook_configuration,
            client_common_name=args.client_common_name,
            rotate_booking_key=boolean("--rotate-booking-key"),
            promote_booking_key=boolean("--promote-booking-key"),
            require_webhook_configuration=boolean("--require-webhook-configuration"),
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None


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

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = settings_from(args)
    except ConfigError as error:
        logger.error("hami certs: %s", error)
        return EXIT_USAGE
    clock = SystemClock()
    try:
        with KubeClient.from_config(args.kubeconfig, clock=clock) as kube:
            CertsJob(kube, settings, clock).run()
    except (KubeError, WebhookConfigurationMissing) as error:
        logger.error("hami certs: %s", error)
        return EXIT_API
    return 0
