"""Generate the Python gRPC stubs of the kubelet APIs we speak from proto/.

Usage: python proto/generate.py [OUTPUT_DIR]   (default: hami_plugin/deviceplugin/api)

Two APIs: the device-plugin API v1beta1 (proto/deviceplugin/v1beta1/api.proto) into OUTPUT_DIR,
and kubelet's PodResources API v1 (proto/podresources/v1/api.proto) into
OUTPUT_DIR/podresources. Runs the pinned grpcio-tools' protoc and rewrites the one absolute
import protoc emits in each `api_pb2_grpc.py` into a package-relative one, so the stubs live
inside hami_plugin. The PodResources file is compiled as `podresources/v1/api.proto` (its
name in protobuf's descriptor pool): both files are called api.proto, and one pool cannot hold
two files of one name. tests/test_proto.py regenerates into a temp dir and fails if the
committed stubs differ.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_DIR = PROTO_ROOT / "deviceplugin" / "v1beta1"
PODRESOURCES_PROTO = Path("podresources") / "v1" / "api.proto"
"""Relative to PROTO_ROOT, which is its include root."""
DEFAULT_OUTPUT = ROOT / "hami_plugin" / "deviceplugin" / "api"
PODRESOURCES_PACKAGE = "podresources"
"""The sub-package of OUTPUT_DIR that holds the PodResources stubs."""
STUBS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
HEADER = (
    "# Generated from proto/deviceplugin/v1beta1/api.proto by proto/generate.py. Do not edit.\n"
)
PODRESOURCES_HEADER = (
    "# Generated from proto/podresources/v1/api.proto by proto/generate.py. Do not edit.\n"
)


def _protoc(include: Path, proto: Path, output_dir: Path) -> None:
    grpc_include = str(Path(protoc.__file__).parent / "_proto")
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{include}",
            f"-I{grpc_include}",
            f"--python_out={output_dir}",
            f"--pyi_out={output_dir}",
            f"--grpc_python_out={output_dir}",
            str(include / proto),
        ]
    )
    if status != 0:
        raise SystemExit(f"protoc failed with status {status} on {proto}")


def _finish(output_dir: Path, imports: tuple[str, str], header: str, docstring: str) -> None:
    """Replace the grpc module's absolute import (`imports[0]`) by the package-relative one
    (`imports[1]`), head every stub, write __init__.py."""
    absolute, relative = imports
    grpc_module = output_dir / "api_pb2_grpc.py"
    text = grpc_module.read_text()
    if absolute not in text:
        raise SystemExit(f"protoc's output lacks {absolute!r}: update proto/generate.py")
    grpc_module.write_text(text.replace(absolute, relative))
    for name in STUBS:
        path = output_dir / name
        path.write_text(header + path.read_text())
    (output_dir / "__init__.py").write_text(f'"""{docstring}"""\n')


def generate(output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    _protoc(PROTO_DIR, Path("api.proto"), output_dir)
    _finish(
        output_dir,
        ("import api_pb2 as api__pb2", "from . import api_pb2 as api__pb2"),
        HEADER,
        "Kubelet device-plugin API v1beta1 stubs, generated from proto/ (see proto/generate.py).",
    )
    podresources_dir = output_dir / PODRESOURCES_PACKAGE
    podresources_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        # protoc writes under the proto's path relative to its include root
        _protoc(PROTO_ROOT, PODRESOURCES_PROTO, Path(scratch))
        for name in STUBS:
            shutil.move(Path(scratch) / PODRESOURCES_PROTO.parent / name, podresources_dir / name)
    _finish(
        podresources_dir,
        (
            "from podresources.v1 import api_pb2 as podresources_dot_v1_dot_api__pb2",
            "from . import api_pb2 as podresources_dot_v1_dot_api__pb2",
        ),
        PODRESOURCES_HEADER,
        "Kubelet PodResources API v1 stubs, generated from proto/ (see proto/generate.py).",
    )


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT)
