"""The `hami` command: one entry point, one sub-command per job.

Each sub-command lives in the module that owns the job; that module exposes
`register(subparsers)` which adds its parser and sets `func` (a callable taking the parsed
namespace and returning the exit status). Heavy imports stay inside those functions so that
`hami --help` and `hami decode` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
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


EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141
"""What a shell reports for a process that SIGPIPE ended (128 + 13): `hami ... | head -1`
ends as `yes | head -1` does, without a traceback."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hami-plugin")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (hami-plugin is not installed)"


class _VersionAction(argparse.Action):
    """`--version`: the installed version, looked up only when asked (reading the package
    metadata costs tens of milliseconds, which every daemon start would pay otherwise)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {_version()}")  # stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The `hami` parser with every sub-command of `_COMMAND_MODULES` registered."""
    parser = argparse.ArgumentParser(
        prog="hami",
        description="HAMi-compatible GPU sharing for Kubernetes: device plugin, scheduler, tools.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="show the version and exit"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit finds no closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: name a command (hami --help lists them)", file=sys.stderr)
        return EXIT_USAGE
    return func(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `hami` with `argv` (default: the process arguments); returns the exit status:
    the sub-command's, 2 with the usage when none is named, 141 when stdout is a pipe its
    reader closed (`| head`), as for a process SIGPIPE ends."""
    try:
        try:
            return _dispatch(argv)
        finally:  # what is still buffered meets the closed pipe here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
