"""Benchmark of Go JSON decoding, valid and malformed bodies alike (run by `make bench`).

For bodies of one size (7 MiB, the webhook's cap) in a few shapes, prints one JSON line per
shape: the CPU milliseconds `decode_go_json` takes for the valid body and for malformed ones (a
value that cannot begin near the end, junk after the last item, the body cut short), the best
of `--repeat` runs. With `--reference` also what the reference scan of the whole body
(`gojson_scanner.go_syntax_error`, how the message was built before issue 14) adds to a
malformed body: seconds per shape.

    python tests/benchmarks/bench_json.py [--size-mib 7] [--repeat 3] [--reference]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable

from hami_plugin.protocol.gojson import GoJsonError, decode_go_json
from hami_plugin.protocol.gojson_scanner import go_syntax_error


def _shapes(size: int) -> dict[str, tuple[bytes, bytes]]:
    """name -> (the body's opening, the bytes that close it validly); the opening is `size`
    bytes of repeated items, each followed by a comma."""
    names = b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":['
    return {
        "node-names": (names + b'"node-0000001",' * (size // 15), b'"n"]}'),
        "numbers": (b'{"Nodes":{"items":[' + b"1," * (size // 2), b"1]}}"),
        "empty-lists": (b"[" + b"[]," * (size // 3), b"[]]"),
        "objects": (b"[" + b'{"k":"v","n":1.5},' * (size // 18), b"{}]"),
    }


def _cpu_ms(decode: Callable[[bytes], object], body: bytes, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        with contextlib.suppress(GoJsonError):
            decode(body)
        best = min(best, time.process_time() - started)
    return round(best * 1000, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=7.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args(argv)
    size = int(args.size_mib * 1024 * 1024)
    for shape, (opening, closing) in _shapes(size).items():
        bodies = {
            "valid": opening + closing,
            "error_near_end": opening + b"x" + closing,
            "junk_after_last_item": opening[:-1] + b" x" + closing,
            "cut": opening + closing[:1],
        }
        row: dict[str, object] = {"shape": shape, "mib": round(len(opening) / 2**20, 2)}
        for case, body in bodies.items():
            row[f"{case}_cpu_ms"] = _cpu_ms(decode_go_json, body, args.repeat)
        if args.reference:
            started = time.process_time()
            go_syntax_error(bodies["error_near_end"])
            row["reference_scan_cpu_s"] = round(time.process_time() - started, 2)
        print(json.dumps(row))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
