"""Generate the gRPC/protobuf Python code for ``proto/*.proto`` into ``sidecar/_proto/``.

``python -m sidecar.protogen [--out DIR]`` runs ``grpc_tools.protoc`` in-process (grpcio-tools,
a dev dependency pinned with grpcio and protobuf) and rewrites the generated ``import peer_pb2``
lines into package-relative imports, so the output works as a package (``sidecar._proto``).
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import resources
from pathlib import Path

__all__ = ["OUT_DIR", "PROTO_DIR", "ProtogenError", "fix_imports", "generate", "main"]

PROTO_DIR = Path(__file__).resolve().parent.parent / "proto"
OUT_DIR = Path(__file__).resolve().parent / "_proto"

# what protoc writes for a module generated from another of our .proto files (e.g. in peer_pb2_grpc)
_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


class ProtogenError(RuntimeError):
    """protoc failed; the message carries its exit status."""


def fix_imports(source: str, local_modules: set[str]) -> str:
    """Make ``import <m>_pb2 as x`` package-relative for the modules generated alongside."""

    def repl(match: re.Match[str]) -> str:
        module, alias = match.groups()
        if module not in local_modules:
            return match.group(0)
        return f"from . import {module} as {alias}"

    return _IMPORT.sub(repl, source)


def generate(out_dir: Path = OUT_DIR, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Generate ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` for every proto file in proto_dir.

    Returns the generated files. Raises `ProtogenError` if protoc fails.
    """
    from grpc_tools import protoc  # dev dependency: imported only when generating

    protos = sorted(proto_dir.glob("*.proto"))
    if not protos:
        raise ProtogenError(f"no .proto files in {proto_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in protos),
    ]
    status = protoc.main(args)
    if status != 0:
        raise ProtogenError(f"protoc exited with status {status} for {', '.join(map(str, protos))}")
    local = {f"{p.stem}_pb2" for p in protos}
    generated: list[Path] = []
    for proto in protos:
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            path = out_dir / f"{proto.stem}{suffix}"
            text = path.read_text(encoding="utf-8")
            fixed = fix_imports(text, local)
            if fixed != text:
                path.write_text(fixed, encoding="utf-8")
            generated.append(path)
    return generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sidecar.protogen", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output dir ({OUT_DIR})")
    parser.add_argument("--proto", type=Path, default=PROTO_DIR, help=f"proto dir ({PROTO_DIR})")
    args = parser.parse_args(argv)
    try:
        files = generate(args.out, args.proto)
    except ProtogenError as exc:
        print(f"protogen: {exc}", file=sys.stderr)
        return 1
    print(f"protogen: wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
