"""Compile ``protos/**/*.proto`` into ``services/pb/`` (run by ``make install``; not committed).

grpcio-tools writes absolute imports that follow the proto file paths (``from mqstore.v1 import
common_pb2``); they are rewritten to ``services.pb.…`` so the generated code lives inside the
``services`` package. A manifest of the sources' SHA-256 lets :mod:`services.proto` refuse to run
on generated code that no longer matches the ``.proto`` files.

Usage: ``python -m services._protogen`` (``--check`` only reports whether the code is current).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO / "protos"
OUT = REPO / "services" / "pb"
MANIFEST = OUT / "manifest.json"
_IMPORT = re.compile(r"^(from|import) ((?:mqstore|apache|google\.rpc)\b[\w.]*)", re.MULTILINE)


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def source_digest() -> dict[str, str]:
    """SHA-256 of every .proto file, by path relative to protos/."""
    return {str(p.relative_to(PROTO_ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in proto_files()}


def is_current() -> bool:
    try:
        recorded = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return False
    return recorded == source_digest()


def generate() -> None:
    from grpc_tools import protoc  # build-time dependency (grpcio-tools)

    files = proto_files()
    if not files:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}")
    include = Path(protoc.__file__).resolve().parent / "_proto"  # google/protobuf/*.proto
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(f.relative_to(PROTO_ROOT)) for f in files],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        if OUT.exists():
            shutil.rmtree(OUT)
        shutil.copytree(tmp, OUT)
    for path in OUT.rglob("*.py*"):
        text = path.read_text()
        path.write_text(_IMPORT.sub(lambda m: f"{m[1]} services.pb.{m[2]}", text))
    for folder in [OUT, *[d for d in OUT.rglob("*") if d.is_dir()]]:
        (folder / "__init__.py").touch()
    MANIFEST.write_text(json.dumps(source_digest(), indent=1, sort_keys=True))


def main() -> None:
    if "--check" in sys.argv[1:]:
        ok = is_current()
        print("generated code is current" if ok else "generated code is missing or stale")
        raise SystemExit(0 if ok else 1)
    generate()
    print(f"generated {len(proto_files())} proto files into {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
