"""Calling one node's admin endpoint (adapter): used by `mqfed ctl` and by nodes fanning out.

With a token the client never sends it: each call carries a proof of it (`sidecar.grpc_auth`)
and the answer counts only if the node proved the token back. A node asking another one names
the node id and address it means to reach (`callee`), so a proof sent to a forged address
(a record written to etcd) is worthless anywhere else; `mqfed ctl` names neither.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from sidecar._proto import admin_pb2
from sidecar.admin.wire import CHALLENGE, METHODS, path
from sidecar.grpc_auth import AuthFailure, Prover

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
                 credentials: grpc.ChannelCredentials | None = None, *,
                 caller: str = "", callee: str = "") -> None:
        """`credentials`: call over TLS (the node has `admin.tls`); `caller`/`callee`: node
        ids of a node-to-node call (the proof then binds `callee` and `address`)."""
        self.address = address
        self.callee = callee
        self._prover = Prover(token, "admin", caller) if token else None
        self._channel = (grpc.aio.insecure_channel(address) if credentials is None
                         else grpc.aio.secure_channel(address, credentials))

    async def call(self, name: str, request: Any, timeout: float) -> Any:
        method = METHODS[name]
        rpc = self._channel.unary_unary(path(name),
                                        request_serializer=method.request.SerializeToString,
                                        response_deserializer=method.reply.FromString)
        try:
            claim, metadata = None, ()
            if self._prover is not None:
                claim = await self._prover.claim(
                    self._channel, CHALLENGE, self.callee, self.address if self.callee else "",
                    timeout, admin_pb2.ChallengeReply)
                metadata = self._prover.metadata(claim)
            call = rpc(request, timeout=timeout, metadata=metadata, wait_for_ready=False)
            reply = await call
            if claim is not None and not self._prover.answered(  # type: ignore[union-attr]
                    claim, await call.initial_metadata()):
                raise AdminCallError(
                    f"{self.address} did not prove that it holds the admin token, so its answer"
                    " is ignored: it is not a node of this cluster (a forged or stale"
                    " membership record?) or its admin token differs", "UNAUTHENTICATED", False)
            return reply
        except AuthFailure as exc:
            raise AdminCallError(str(exc), exc.code, False) from None
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code in _UNREACHABLE:
                raise AdminCallError(f"unreachable ({code.name}: {exc.details()})",
                                     code.name, True) from None
            raise AdminCallError(exc.details() or code.name, code.name, False) from None

    async def close(self) -> None:
        await self._channel.close(None)
