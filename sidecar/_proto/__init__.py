"""Generated gRPC/protobuf code for ``proto/*.proto`` (written by ``python -m sidecar.protogen``).

Only this file is in git; the generated modules are built by ``make install``.
"""

from __future__ import annotations

from importlib import import_module

_GENERATED = ("peer_pb2", "peer_pb2_grpc")

try:
    peer_pb2, peer_pb2_grpc = (import_module(f"{__name__}.{m}") for m in _GENERATED)
except ModuleNotFoundError as exc:
    if exc.name not in {f"{__name__}.{m}" for m in _GENERATED}:
        raise
    raise ImportError(
        f"{__name__}: generated module {exc.name!r} is missing: run `make install` to generate"
        " the gRPC code (or `.venv/bin/python -m sidecar.protogen`)"
    ) from None

__all__ = ["peer_pb2", "peer_pb2_grpc"]
