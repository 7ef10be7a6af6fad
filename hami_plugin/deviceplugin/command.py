"""`hami device-plugin`: the sub-command. Its flags are `settings.OPTIONS`; `run` resolves them
once and runs `daemon.DevicePluginDaemon` until SIGTERM or SIGINT, with the NVML module the
entry point chose (`hami_plugin.deviceplugin_cli`: pynvml or the fake). Light to import (`hami
--help`): the daemon, with grpc, kubernetes and NVML, is imported when the command runs.

Exit status: 0 stopped by a signal, 1 the node cannot be served (NVML, the GPU list, the CDI
spec, the Kubernetes configuration: one line says which), 2 a setting is wrong (one line names
it).
"""

from __future__ import annotations

import argparse
import functools
import logging
from typing import TYPE_CHECKING

from hami_plugin.config import EXIT_USAGE, ConfigError
from hami_plugin.deviceplugin.settings import add_arguments, resolve_log_level, resolve_settings
from hami_plugin.logsafe import configure_logging

if TYPE_CHECKING:
    from hami_plugin.deviceplugin.nvml import NvmlLoader

__all__ = ["EXIT_USAGE", "register", "run"]

logger = logging.getLogger(__name__)


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], load_nvml: NvmlLoader
) -> None:
    """Add `hami device-plugin`, its daemon getting NVML from `load_nvml`."""
    parser = subparsers.add_parser(
        "device-plugin",
        help="run the node daemon: kubelet device plugin for vGPUs",
        description="Advertise each GPU as vGPU slots to kubelet, answer Allocate with "
        "HAMi-core's environment, and publish the node's GPUs for the scheduler.",
    )
    add_arguments(parser)
    parser.set_defaults(func=functools.partial(run, load_nvml=load_nvml))


def run(args: argparse.Namespace, load_nvml: NvmlLoader) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the exit status."""
    configure_logging(resolve_log_level())  # escaped, cut and rate-limited lines (logsafe)
    try:
        settings = resolve_settings(args)
    except ConfigError as error:
        logger.error("%s", error)
        return EXIT_USAGE
    if settings.debug_logging:
        logging.getLogger().setLevel(logging.DEBUG)  # HAMi's -v 4 and above
    from hami_plugin.deviceplugin.daemon import DevicePluginDaemon

    daemon = DevicePluginDaemon(settings, load_nvml=load_nvml)

    daemon.stop_signal.install()
    return daemon.run()
