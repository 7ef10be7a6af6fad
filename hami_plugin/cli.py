"""The `hami` command: one entry point, one sub-command per job.

Each sub-command lives in the module that owns the job; that module exposes
`register(subparsers)` which adds its parser and sets `func` (a callable taking the parsed
namespace and returning the exit status). Heavy imports stay inside those functions so that
`hami --help` and `hami decode` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

_COMMAND_MODULES = (
    "hami_plugin.codec_cli",
    "hami_plugin.scheduler.dryrun",
    "hami_plugin.deviceplugin_cli",
    "hami_plugin.extender.command",
    "hami_plugin.certs.command",
    "hami_plugin.demo",
)


def build_parser() -> argparse.ArgumentParser:
    """The `hami` parser with every sub-command of `_COMMAND_MODULES` registered."""
    parser = argparse.ArgumentParser(
        prog="hami",
        description="HAMi-compatible GPU sharing for Kubernetes: device plugin, scheduler, tools.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `hami` with `argv` (default: the process arguments); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
