"""Dial one peer: open its stream, send our Hello, wait for Welcome or Refuse, check the Welcome.

One attempt per call and one gRPC channel (one connection) per attempt; the reconnect loop and
its backoff belong to the caller (`PeerTransport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc
import grpc.aio
from tenacity import RetryCallState, wait_exponential_jitter

from sidecar._proto import peer_pb2
from sidecar.grpc_auth import AuthFailure, Prover
from sidecar.peering import wire
from sidecar.peering.frame_stream import describe
from sidecar.peering.handshake import Accept, Handshake, Refuse

UNPROVEN_WAIT = 1.0
"""Seconds to wait for the status of a stream whose peer gave no proof (it may be ending)."""


@dataclass(frozen=True)
class Backoff:
    """Delays between dial attempts: exponential with jitter after failures (reset once a stream
    stayed up for `stable_after` seconds), uniform in [refused_min, refused_max] after a refusal."""

    initial: float = 0.1
    max: float = 2.0
    jitter: float = 0.1
    refused_min: float = 5.0
    refused_max: float = 10.0
    stable_after: float = 1.0

    def delay(self, failures: int) -> float:
        """The wait before the next attempt after `failures` failures in a row (>= 1)."""
        state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = max(1, failures)
        wait = wait_exponential_jitter(multiplier=self.initial, max=self.max, jitter=self.jitter)
        return wait(state)

    def refused_delay(self) -> float:
        return random.uniform(self.refused_min, self.refused_max)


class DialError(Exception):
    """The attempt failed (unreachable, timed out, broken stream); retry with backoff."""


class PeerRefused(Exception):
    """The handshake failed: the peer refused us, or we refused its Welcome."""

    def __init__(self, refuse: peer_pb2.Refuse, by_peer: bool) -> None:
        super().__init__(refuse.message)
        self.refuse = refuse
        self.by_peer = by_peer


class Dialled(NamedTuple):
    """An established outbound stream: close `channel` when done with `call`."""

    channel: grpc.aio.Channel
    call: Any  # grpc.aio.StreamStreamCall
    accept: Accept


async def dial(
    peer: str, address: str, handshake: Handshake, *, options: list, timeout: float,
    prover: Prover | None = None, credentials: grpc.ChannelCredentials | None = None,
) -> Dialled:
    """Open the stream to `peer` at `address` and handshake; raise DialError or PeerRefused.

    With a `prover` (the cluster has a peer token) the peer proves it holds the token before
    this node sends anything but a proof of its own (`sidecar.grpc_auth`); the token itself is
    never sent. Over TLS with `credentials`."""
    channel = (grpc.aio.insecure_channel(address, options=options) if credentials is None
               else grpc.aio.secure_channel(address, credentials, options=options))
    call = None
    try:
        method = channel.stream_stream(
            wire.METHOD, request_serializer=None, response_deserializer=wire.decode
        )
        try:
            proven = True
            async with asyncio.timeout(timeout):
                claim = None
                if prover is not None:
                    claim = await prover.claim(channel, wire.CHALLENGE, peer, address, timeout,
                                               peer_pb2.ChallengeReply)
                call = method(metadata=() if claim is None else prover.metadata(claim),
                              wait_for_ready=False)
                if claim is not None and prover is not None:
                    proven = prover.answered(claim, await call.initial_metadata())
                if proven:
                    await call.write(wire.hello_frame(handshake.me))
                    item = await call.read()
            if not proven:
                await _unproven(call, peer, address)
        except TimeoutError:
            raise DialError(
                f"no answer to Hello from {address} within {timeout:g}s: the peer is hung,"
                " or that address is not a mqfed peer port"
            ) from None
        except AuthFailure as exc:
            raise PeerRefused(peer_pb2.Refuse(code=peer_pb2.Refuse.UNAUTHENTICATED,
                                              message=str(exc)), by_peer=exc.by_peer) from None
        except grpc.aio.AioRpcError as exc:
            if "handshake failed" in (exc.details() or "").lower():  # TLS: not transient
                raise PeerRefused(peer_pb2.Refuse(
                    code=peer_pb2.Refuse.UNAUTHENTICATED,
                    message=f"TLS handshake with {address} failed ({exc.details()}): both nodes"
                            " need certificates signed by the same grpc.tls_ca, each naming"
                            " the host peers dial it at"), by_peer=False) from None
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:  # it refused us unread
                raise PeerRefused(peer_pb2.Refuse(code=peer_pb2.Refuse.UNAUTHENTICATED,
                                                  message=exc.details() or exc.code().name),
                                  by_peer=True) from None
            raise DialError(f"cannot reach {address}: {describe(exc)}") from None
        assert call is not None
        if item is grpc.aio.EOF:
            raise DialError(
                f"{address} ended the stream without answering Hello"
                f" ({(await call.code()).name}: {await call.details()})"
            )
        frame: peer_pb2.Frame | None = item[1]
        if frame is None:
            raise DialError(f"{address} answered Hello with bytes that are not a Frame: is it"
                            " a mqfed peer port?")
        kind = frame.WhichOneof("body")
        if kind == "refuse":
            raise PeerRefused(frame.refuse, by_peer=True)
        if kind != "welcome":
            raise DialError(
                f"{address} answered Hello with a {kind or 'unknown'} frame instead of Welcome:"
                " is it a mqfed peer port of a compatible version?"
            )
        theirs = wire.hello_from(frame.welcome)
        if theirs.node_id != peer:
            raise PeerRefused(peer_pb2.Refuse(message=(
                f"dialled node {peer!r} at {address}, but node {theirs.node_id!r} answered:"
                f" the membership view has a wrong or stale address for {peer!r}"
            )), by_peer=False)
        result = handshake.check(theirs)
        if isinstance(result, Refuse):
            raise PeerRefused(wire.refuse_message(result), by_peer=False)
        return Dialled(channel, call, result)
    except BaseException:
        if call is not None:  # else its status may never arrive once the channel is closed
            call.cancel()
        await channel.close(None)
        raise


async def _unproven(call: Any, peer: str, address: str) -> None:
    """The peer gave no valid proof: if it ended the call, it refused ours; else it is not a
    holder of the peer token and gets nothing (raises AuthFailure either way)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(UNPROVEN_WAIT):
            code = await call.code()
            if code != grpc.StatusCode.OK:
                raise AuthFailure(await call.details() or code.name, by_peer=True)
    raise AuthFailure(
        f"{address} did not prove that it holds the peer token, so it was sent nothing: it is"
        f" not node {peer!r} (a forged or stale membership record?) or its grpc.token differs",
        by_peer=False)
