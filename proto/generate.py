"""Generate the Python gRPC stubs of the kubelet device-plugin API from proto/.

Usage: python proto/generate.py [OUTPUT_DIR]   (default: hami_plugin/deviceplugin/api)

Runs the pinned grpcio-tools' protoc and rewrites the one absolute import protoc emits
(`import api_pb2`) into a package-relative one, so the stubs live inside hami_plugin.
tests/deviceplugin/test_proto.py regenerates into a temp dir and fails if the committed
stubs differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto" / "deviceplugin" / "v1beta1"
DEFAULT_OUTPUT = ROOT / "hami_plugin" / "deviceplugin" / "api"
HEADER = (
    "# Generated from proto/deviceplugin/v1beta1/api.proto by proto/generate.py. Do not edit.\n"
)


def generate(output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={output_dir}",
            f"--pyi_out={output_dir}",
            f"--grpc_python_out={output_dir}",
            str(PROTO_DIR / "api.proto"),
        ]
    )
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    grpc_module = output_dir / "api_pb2_grpc.py"
    text = grpc_module.read_text()
    text = text.replace("import api_pb2 as api__pb2", "from . import api_pb2 as api__pb2")
    grpc_module.write_text(text)
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        path = output_dir / name
        path.write_text(HEADER + path.read_text())
    (output_dir / "__init__.py").write_text(
        '"""Kubelet device-plugin API v1beta1 stubs, generated from proto/'
        ' (see proto/generate.py)."""\n'
    )


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT)
