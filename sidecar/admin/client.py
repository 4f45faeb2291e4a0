"""Calling one node's admin endpoint (adapter): used by `mqfed ctl` and by nodes fanning out."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from sidecar.admin.auth import bearer_metadata
from sidecar.admin.wire import METHODS, path

__all__ = ["AdminCallError", "AdminClient"]


class AdminCallError(RuntimeError):
    """A call failed: `code` is the gRPC status code name, `unreachable` whether the node could
    not be reached at all (as opposed to answering with an error)."""

    def __init__(self, message: str, code: str, unreachable: bool) -> None:
        super().__init__(message)
        self.code = code
        self.unreachable = unreachable


_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class AdminClient:
    """One channel to one admin address; `await call("Status", query)`."""

    def __init__(self, address: str, token: str | None,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        """`credentials`: call over TLS (the node has `admin.tls`)."""
        self.address = address
        self._metadata = bearer_metadata(token)
        self._channel = (grpc.aio.insecure_channel(address) if credentials is None
                         else grpc.aio.secure_channel(address, credentials))

    async def call(self, name: str, request: Any, timeout: float) -> Any:
        method = METHODS[name]
        rpc = self._channel.unary_unary(path(name),
                                        request_serializer=method.request.SerializeToString,
                                        response_deserializer=method.reply.FromString)
        try:
            return await rpc(request, timeout=timeout, metadata=self._metadata,
                             wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code in _UNREACHABLE:
                raise AdminCallError(f"unreachable ({code.name}: {exc.details()})",
                                     code.name, True) from None
            raise AdminCallError(exc.details() or code.name, code.name, False) from None

    async def close(self) -> None:
        await self._channel.close(None)
