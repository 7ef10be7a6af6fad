"""Run the API server double in a process of its own (benchmarks, manual experiments).

    python -m hami_plugin.testing.apiserver [--load objects.json] [--kubeconfig PATH]

Serves `FakeApiServer` on 127.0.0.1 (a free port), stores the objects of `--load` first (a
JSON list of Node/Pod/Lease objects, or a YAML file of documents), writes a kubeconfig for it
when asked, then prints one line, `serving on http://127.0.0.1:<port>`, on stdout, so that the
parent process knows where it is and that the objects are in. SIGTERM or SIGINT stops it (exit
0). A double of the API server in the same process would share the GIL with whatever measures
it: a separate process keeps the benchmark's figures honest.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from hami_plugin.testing.apiserver import FakeApiServer

logger = logging.getLogger(__name__)


def _objects(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        loaded = json.loads(text)
        documents = loaded if isinstance(loaded, list) else [loaded]
    else:
        documents = [doc for doc in yaml.safe_load_all(text) if doc]
    for document in documents:
        if not isinstance(document, dict):
            raise ValueError(f"{path}: every object must be a mapping")
    return documents


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status (2 for an unusable --load file)."""
    parser = argparse.ArgumentParser(
        prog="python -m hami_plugin.testing.apiserver",
        description="Serve the Kubernetes API server double until SIGTERM.",
    )
    parser.add_argument("--load", type=Path, help="objects to store first (.json list or YAML)")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the server here")
    parser.add_argument(
        "--history-size", type=int, default=100_000, help="writes kept for watches to resume"
    )
    parser.add_argument("--log-level", default="warning", help="log level (warning)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    server = FakeApiServer(history_size=args.history_size)
    if args.load is not None:
        try:
            for obj in _objects(args.load):
                server.add_object(obj)
        except (OSError, ValueError, yaml.YAMLError) as error:
            logger.error("cannot load %s: %s", args.load, error)
            return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    try:
        if args.kubeconfig is not None:
            server.write_kubeconfig(args.kubeconfig)
        sys.stdout.write(f"serving on {server.url}\n")
        sys.stdout.flush()
        stop.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
