"""Generates the `bagel.v1` modules the package ships (`*_pb2.py`, their
`.pyi` stubs and `*_pb2_grpc.py`) from bagel's .proto files with
grpcio-tools, the same code a raw-gRPC client would generate for itself:

    python client/python/grpc_gen.py            # rewrites client/python/python/bagel/v1
    python client/python/grpc_gen.py OUT_DIR    # writes OUT_DIR/bagel/v1 instead

The package ships them so that `from bagel.v1 import lease_pb2` works
with the wheel installed: a `bagel/v1` generated elsewhere on `sys.path`
would be shadowed by the installed `bagel` package. The test suite
regenerates them and fails when the committed ones are stale.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parents[1] / "proto" / "proto"
PACKAGE = HERE / "python"
# What protoc writes for each .proto file, beside the package's own
# hand-written `bagel/v1/__init__.py`.
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Writes the generated modules under `out_root/bagel/v1`; returns them."""
    from grpc_tools import protoc

    well_known = Path(importlib.import_module("grpc_tools").__file__).parent / "_proto"
    files = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "bagel" / "v1").glob("*.proto"))
    out_root.mkdir(parents=True, exist_ok=True)
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            *files,
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {files}")
    return generated(out_root)


def generated(root: Path) -> list[Path]:
    """The generated modules under `root/bagel/v1`, by name."""
    return sorted(p for p in (root / "bagel" / "v1").iterdir() if p.name.endswith(SUFFIXES))


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE
    if out == PACKAGE:
        for old in generated(PACKAGE):
            old.unlink()
    for path in generate(out):
        print(path)


if __name__ == "__main__":
    main()
