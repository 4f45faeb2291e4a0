"""Challenge-response authentication of peer streams over real gRPC on loopback: the token
never travels, an impostor learns nothing usable, a relay of a real node's challenge fails,
an older peer that presents the token itself is refused with a clear reason."""

from __future__ import annotations

import contextlib
import logging

import grpc
import grpc.aio
import pytest

from sidecar._proto import peer_pb2
from sidecar.grpc_auth import ANSWER, PREFIX
from sidecar.peering import wire
from sidecar.peering.handshake import RefuseCode
from tests.system.peering.test_transport import Frame, addr, all_connected, nodes, run, until

pytestmark = pytest.mark.timeout(60)


class Relay:
    """An impostor that fetches real server nonces from `target` and replays whatever proof
    the dialler sends it there (the man in the middle a forged etcd record makes possible)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.replayed: list[tuple[grpc.StatusCode, str]] = []
        self.metadata: list[dict[str, str]] = []
        self.frames = 0
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            wire.SERVICE_NAME, {
                "Challenge": grpc.unary_unary_rpc_method_handler(self.challenge),
                "Stream": grpc.stream_stream_rpc_method_handler(self.stream)}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def challenge(self, request: bytes, context) -> bytes:
        async with grpc.aio.insecure_channel(self.target) as channel:
            return await channel.unary_unary(wire.CHALLENGE)(b"", timeout=5)

    async def stream(self, requests, context):
        metadata = {k: v for k, v in context.invocation_metadata() if k.startswith(PREFIX)}
        self.metadata.append(metadata)
        async with grpc.aio.insecure_channel(self.target) as channel:
            call = channel.stream_stream(wire.METHOD)(metadata=tuple(metadata.items()))
            answer = dict(await call.initial_metadata()).get(ANSWER)
            self.replayed.append((await call.code() if answer is None else grpc.StatusCode.OK,
                                  await call.details() if answer is None else answer))
            call.cancel()
        # the real node's proof if it accepted (it does not), else nothing valid
        await context.send_initial_metadata(((ANSWER, answer or "00" * 32),))
        async for _ in requests:
            self.frames += 1


def test_an_impostor_at_a_forged_address_gets_nothing_and_its_relay_fails(caplog):
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", token="s3cret")
            b, rb = await n.start("b", token="s3cret")
            relay = Relay(addr(b))
            await relay.server.start()
            try:
                # a's view says b lives at the impostor's address
                a.set_peers({"b": f"127.0.0.1:{relay.port}"})
                await until(lambda: ra.refusals, 10, "a refuses the impostor")
                peer, refuse = ra.refusals[0]
                assert peer == "b" and refuse.code == RefuseCode.UNAUTHENTICATED
                assert "did not prove that it holds the peer token" in refuse.message
                # b refused the relayed proof: it names an address that is not b's
                code, details = relay.replayed[0]
                assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
                assert "not this node's address" in details
                assert relay.frames == 0 and not b.connected("a", inbound=True)
                assert not any("s3cret" in v for md in relay.metadata for v in md.values())
                assert relay.metadata[0][PREFIX + "address"] == f"127.0.0.1:{relay.port}"
                # the real address works
                a.set_peers({"b": addr(b)})
                b.set_peers({"a": addr(a)})
                await until(all_connected(a, b), 10, "a <-> b at their real addresses")
            finally:
                await relay.server.stop(None)
        assert any("refused peer 'b'" in r.getMessage() for r in caplog.records
                   if r.levelno == logging.ERROR)

    run(body())


def test_an_older_peer_presenting_the_token_itself_is_refused_clearly():
    async def body():
        async with nodes() as n:
            a, _ = await n.start("a", token="s3cret")
            async with grpc.aio.insecure_channel(addr(a)) as channel:
                call = channel.stream_stream(wire.METHOD, response_deserializer=Frame.FromString)(
                    metadata=(("authorization", "Bearer s3cret"),))
                await call.write(Frame(hello=peer_pb2.Hello(
                    cluster_id="c", node_id="old", protocol_major=1, protocol_minor=1,
                    incarnation=1)).SerializeToString())
                frames = []
                with contextlib.suppress(grpc.aio.AioRpcError):  # after the Refuse
                    async for frame in call:
                        frames.append(frame)
                assert [f.WhichOneof("body") for f in frames] == ["refuse"]
                assert frames[0].refuse.code == peer_pb2.Refuse.UNAUTHENTICATED
                assert "older mqfed" in frames[0].refuse.message
                assert "upgrade" in frames[0].refuse.message
                assert await call.code() == grpc.StatusCode.UNAUTHENTICATED
            assert not a.connected("old", inbound=True)

    run(body())


def test_a_node_with_a_token_does_not_dial_one_without_and_says_why():
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", token="s3cret")
            x, _ = await n.start("x")  # no token: it cannot prove one
            a.set_peers({"x": addr(x)})
            await until(lambda: ra.refusals, 10, "a refused by x")
            refuse = ra.refusals[0][1]
            assert refuse.code == RefuseCode.UNAUTHENTICATED
            assert "has no peer token" in refuse.message and "grpc.token" in refuse.message
            assert a.states()["x"]["outbound"]["state"] == "refused"
            assert not x.connected("a", inbound=True)

    run(body())


def test_a_flood_of_unauthenticated_streams_is_capped():
    async def body():
        async with nodes() as n:
            a, _ = await n.start("a", token="s3cret")
            b, _ = await n.start("b", token="s3cret")
            a.gate.limit = 0  # as if a flood held every slot
            b.set_peers({"a": addr(a)})
            await until(lambda: b.states()["a"]["failures"] >= 1, 10, "b's dial refused")
            assert "RESOURCE_EXHAUSTED" in b.states()["a"]["last_error"]
            assert a.gate.refused >= 1
            a.gate.limit = 32
            a.set_peers({"b": addr(b)})
            await until(all_connected(a, b), 10, "a <-> b once the flood is over")
            assert a.auth is not None and a.auth.counters["accepted"] >= 1

    run(body())


