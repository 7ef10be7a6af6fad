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
from hami_plugin.extender.settings import add_arguments, resolve_config
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


def run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the exit status."""
    configure_logging()  # escaped, cut and rate-limited lines (logsafe)
    from hami_plugin.extender.daemon import SchedulerDaemon

    try:
        config = resolve_config(args)
        logging.getLogger().setLevel(config.log_level.upper())  # --log-level, --debug, -v
        daemon = SchedulerDaemon(config)
    except ConfigError as error:
        logger.error("%s", error)
        return EXIT_USAGE

    daemon.stop_signal.install()
    return daemon.run()
