"""`hami scheduler`: the sub-command. Its flags are `settings.OPTIONS`; `run` resolves them once
and runs `daemon.SchedulerDaemon` until SIGTERM or SIGINT. Light to import (`hami --help`): the
daemon, with kubernetes, is imported when the command runs.

Exit status: 0 stopped by a signal, 1 the daemon cannot start (an address in use, no Kubernetes
configuration: one line says which), 2 a setting is wrong (one line names it).
"""

from __future__ import annotations

import argparse
import logging

from hami_plugin.config import EXIT_USAGE, ConfigError
from hami_plugin.extender.settings import SchedulerConfig, add_arguments, resolve_config
from hami_plugin.logsafe import configure_logging

__all__ = ["EXIT_USAGE", "register", "run"]

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `hami scheduler`."""
    parser = subparsers.add_parser(
        "scheduler",
        help="run the kube-scheduler extender: filter, bind, admission webhook",
        description="Serve kube-scheduler's extender calls (POST /filter, /bind), the "
        "admission webhook (POST /webhook) and probes (GET /healthz, /readyz) for "
        "HAMi-compatible GPU sharing.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def _check_tls_files(config: SchedulerConfig) -> None:
    """The certificate files given can be read, as the daemon reads them at start: a missing
    one is a wrong setting (exit 2, the flag named), not a daemon that cannot start. Raises
    ConfigError."""
    for flag, path in (
        ("--cert-file", config.cert_file),
        ("--key-file", config.key_file),
        ("--client-ca-file", config.client_ca_file),
    ):
        if not path:
            continue
        try:
            open(path, "rb").close()
        except OSError as error:
            raise ConfigError(f"{flag} {path}: {error.strerror}") from None


def run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the exit status."""
    configure_logging()  # escaped, cut and rate-limited lines (logsafe)
    from hami_plugin.extender.daemon import SchedulerDaemon

    try:
        config = resolve_config(args)
        _check_tls_files(config)
        logging.getLogger().setLevel(config.log_level.upper())  # --log-level, --debug, -v
        daemon = SchedulerDaemon(config)
    except ConfigError as error:
        logger.error("%s", error)
        return EXIT_USAGE

    daemon.stop_signal.install()
    return daemon.run()
