"""PeerTransport over real gRPC on loopback: handshake, order, refusals, replacement, membership,
dead peers (SIGKILL, SIGSTOP of a separate process), stop(), limits, and a throughput figure.

Run as `python -m tests.system.peering.test_transport child ...` it is the peer process used by the
cross-process tests (a PeerTransport that acks every message batch it receives).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from sidecar._proto import peer_pb2
from sidecar.peering.dialer import Backoff
from sidecar.peering.handshake import (
    CAPABILITIES,
    INTEREST_CHUNKS,
    PROTOCOL_MINOR,
    Accept,
    Handshake,
    Hello,
    RefuseCode,
)
from sidecar.peering.transport import FrameTooLarge, PeerTransport, PeerTransportError
from sidecar.peering.wire import METHOD
from tests.harness.procs import free_port

ROOT = Path(__file__).resolve().parents[3]
FAST = {"heartbeat_interval": 0.1, "dead_after": 0.8, "hello_timeout": 0.5,
        "backoff": Backoff(initial=0.05, max=0.3, jitter=0.05, refused_min=0.3, refused_max=0.5)}
Frame = peer_pb2.Frame

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """A PeerHandler that records everything."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self.frames: list[tuple[str, peer_pb2.Frame, bool]] = []
        self.refusals: list[tuple[str, peer_pb2.Refuse]] = []
        self.on_any: Callable[[], None] = lambda: None

    def on_outbound_up(self, peer: str, accept: Accept) -> None:
        self.events.append(("outbound_up", peer, accept))

    def on_outbound_down(self, peer: str, reason: str) -> None:
        self.events.append(("outbound_down", peer, reason))

    def on_inbound_up(self, peer: str, accept: Accept) -> None:
        self.events.append(("inbound_up", peer, accept))

    def on_inbound_down(self, peer: str, reason: str) -> None:
        self.events.append(("inbound_down", peer, reason))

    def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None:
        self.frames.append((peer, frame, inbound))
        self.on_any()

    def on_outbound_drained(self, peer: str) -> None:
        pass

    def on_refused(self, peer: str, refuse: peer_pb2.Refuse) -> None:
        self.refusals.append((peer, refuse))

    def kinds(self, peer: str | None = None) -> list[str]:
        return [kind for kind, p, _ in self.events if peer is None or p == peer]

    def last(self, kind: str) -> Any:
        return [detail for k, _, detail in self.events if k == kind][-1]


GRPC_SETTLE = 2.0  # seconds; a call whose status never arrives stays pending


def run(coro: Coroutine[Any, Any, Any], timeout: float = 40) -> Any:
    """Run one async test body; afterwards no task may be left on its loop."""

    async def body() -> Any:
        try:
            async with asyncio.timeout(timeout):
                return await coro
        finally:
            leftover = asyncio.all_tasks() - {asyncio.current_task()}
            if leftover:  # gRPC's own status task of a cancelled call may need a poll or two
                _, leftover = await asyncio.wait(leftover, timeout=GRPC_SETTLE)
            assert not leftover, f"tasks left behind: {leftover}"

    return asyncio.run(body())


async def until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `check` on the loop; return the seconds it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def stays(check: Callable[[], bool], seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert check(), f"no longer true: {what}"
        await asyncio.sleep(0.02)


class Nodes:
    """Transports of one test; all are stopped at the end."""

    def __init__(self) -> None:
        self.all: list[PeerTransport] = []

    async def start(self, node: str, *, cluster: str = "c", incarnation: int = 1,
                    major: int = 1, minor: int = PROTOCOL_MINOR,
                    capabilities: frozenset[str] = CAPABILITIES,
                    **options: Any) -> tuple[PeerTransport, Recorder]:
        port = free_port()
        me = Hello(cluster, node, incarnation, f"127.0.0.1:{port}", protocol_major=major,
                   protocol_minor=minor, capabilities=capabilities)
        recorder = Recorder()
        transport = PeerTransport(Handshake(me, frozenset({major})), f"127.0.0.1:{port}",
                                  recorder, **{**FAST, **options})
        await transport.start()
        self.all.append(transport)
        return transport, recorder


@contextlib.asynccontextmanager
async def nodes() -> AsyncIterator[Nodes]:
    group = Nodes()
    try:
        yield group
    finally:
        for transport in group.all:
            await transport.stop()


def addr(t: PeerTransport) -> str:
    return f"127.0.0.1:{t.port}"


def connect(*ts: PeerTransport) -> None:
    for t in ts:
        t.set_peers({o.node_id: addr(o) for o in ts})


def all_connected(*ts: PeerTransport) -> Callable[[], bool]:
    return lambda: all(
        t.connected(o.node_id) and t.connected(o.node_id, inbound=True)
        for t in ts for o in ts if o is not t
    )


# ---- in one process ----------------------------------------------------------------------------


def test_handshake_both_ways_and_idle_streams_stay_up():
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", incarnation=7)
            b, rb = await n.start("b", incarnation=9)
            connect(a, b)
            await until(all_connected(a, b), 5, "a <-> b")
            assert sorted(ra.kinds()) == ["inbound_up", "outbound_up"]
            assert sorted(rb.kinds()) == ["inbound_up", "outbound_up"]
            welcome: Accept = ra.last("outbound_up")
            assert (welcome.peer.node_id, welcome.peer.incarnation) == ("b", 9)
            assert rb.last("inbound_up").peer.incarnation == 7
            # idle for several dead_after periods: heartbeats keep both streams up
            await stays(all_connected(a, b), 3 * FAST["dead_after"], "idle streams up")
            state = a.states()["b"]
            assert state["outbound"]["state"] == "up" and state["inbound"]["state"] == "up"
            assert state["reconnects"] == 0 and state["incarnation"] == 9
            assert state["outbound"]["frames_in"] >= 10, "no heartbeats received"
            assert ra.frames == [] and rb.frames == [], "heartbeats must not reach on_frame"

    run(body())


def test_frames_in_order_on_outbound_and_reply_paths():
    count = 10_000

    # Both nodes share one event loop here, which 10,000 frames each way keep busy for a
    # while on a loaded machine: liveness is not what this test is about, so it is lenient.
    lenient = {"heartbeat_interval": 0.5, "dead_after": 15.0}

    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", **lenient)
            b, rb = await n.start("b", **lenient)
            connect(a, b)
            await until(all_connected(a, b), 5, "a <-> b")
            for i in range(count):
                assert a.send("b", Frame(interest_request=peer_pb2.InterestRequest(have_version=i)))
                assert b.reply("a", Frame(ack_batch=peer_pb2.AckBatch(
                    acks=[peer_pb2.Ack(origin_seq=i)])))
            assert a.queued("b") > 0 and b.queued("a", inbound=True) > 0
            await until(lambda: len(ra.frames) == count and len(rb.frames) == count, 20,
                        "all frames")
            assert [f.interest_request.have_version for _, f, _ in rb.frames] == list(range(count))
            assert all(p == "a" and inbound for p, _, inbound in rb.frames)
            assert [f.ack_batch.acks[0].origin_seq for _, f, _ in ra.frames] == list(range(count))
            assert all(p == "b" and not inbound for p, _, inbound in ra.frames)
            await until(lambda: a.queued("b") == 0, 5, "a's queue to b drained")
            assert a.states()["b"]["outbound"]["frames_out"] >= count
            assert a.states()["b"]["reconnects"] == 0 and b.states()["a"]["reconnects"] == 0

    run(body())


def test_frames_a_peer_of_an_older_version_cannot_read_are_withheld():
    """Mixed versions (issue 20): a 1.1 peer reads retained and session frames (it had them
    before their flags) but not wills nor node states; the newer node never sends those."""
    async def body():
        async with nodes() as n:
            new, _ = await n.start("new")
            old, rold = await n.start("old", minor=1, capabilities=frozenset({INTEREST_CHUNKS}))
            connect(new, old)
            await until(all_connected(new, old), 5, "new <-> old")
            will = Frame(will_records=peer_pb2.WillRecords())
            assert not new.send("old", will)
            assert not new.reply("old", Frame(node_state=peer_pb2.NodeState(draining=True)))
            assert new.send("old", Frame(session_records=peer_pb2.SessionRecords()))
            assert new.send("old", Frame(retained_digest=peer_pb2.RetainedDigest()))
            assert old.send("new", Frame(interest_applied=peer_pb2.InterestApplied(version=3)))
            await until(lambda: len(rold.frames) == 2, 5, "the readable frames")
            assert [f.WhichOneof("body") for _, f, _ in rold.frames] == [
                "session_records", "retained_digest"]
            state = new.states()["old"]
            assert state["protocol"] == "1.1" and state["withheld"] == {"wills": 1, "drain": 1}
            assert new.capabilities("old") == {"interest-chunks", "retained", "sessions"}

    run(body())


def test_wrong_cluster_refused_with_both_cluster_names():
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", cluster="blue")
            x, rx = await n.start("x", cluster="green")
            x.set_peers({"a": addr(a)})
            await until(lambda: rx.refusals, 5, "x refused by a")
            peer, refuse = rx.refusals[0]
            assert peer == "a" and refuse.code == RefuseCode.WRONG_CLUSTER
            assert "'blue'" in refuse.message and "'green'" in refuse.message
            assert list(refuse.supported_majors) == [1]
            assert x.states()["a"]["outbound"]["state"] == "refused"
            assert x.states()["a"]["last_error"] == refuse.message
            assert ra.events == [] and rx.events == []
            # the refusal is a Refuse frame, then status FAILED_PRECONDITION with the same text
            frames, code, details = await raw_stream(addr(a), Frame(hello=peer_pb2.Hello(
                cluster_id="green", node_id="y", protocol_major=1, incarnation=1)))
            assert [f.WhichOneof("body") for f in frames] == ["refuse"]
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert details == frames[0].refuse.message and "'green'" in details
            # retries are slow: no second attempt within refused_min
            await asyncio.sleep(0.1)
            assert len(rx.refusals) == 1

    run(body())


def test_peer_token_required_presented_and_refused_loudly(caplog):
    """With a peer token, a stream without it (or with another) is refused before its Hello
    is looked at, with a Refuse the dialler logs as an error; the right token meshes."""
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", token="s3cret")
            b, rb = await n.start("b", token="s3cret")
            x, rx = await n.start("x")  # no token
            w, rw = await n.start("w", token="other")
            connect(a, b)
            await until(all_connected(a, b), 10, "a and b with the same token")
            x.set_peers({"a": addr(a)})
            w.set_peers({"a": addr(a)})
            await until(lambda: rx.refusals and rw.refusals, 5, "x and w refused by a")
            for refusals, why in ((rx.refusals, "no peer token"),
                                  (rw.refusals, "does not match this node's token")):
                peer, refuse = refusals[0]
                assert peer == "a" and refuse.code == RefuseCode.UNAUTHENTICATED
                assert why in refuse.message and "grpc.token" in refuse.message
            assert x.states()["a"]["outbound"]["state"] == "refused"
            assert not a.connected("x", inbound=True) and not a.connected("w", inbound=True)
            # not even a claimed incarnation reaches the handshake state
            frames, code, _ = await raw_stream(addr(a), Frame(hello=peer_pb2.Hello(
                cluster_id="c", node_id="b", protocol_major=1, incarnation=10**12)))
            assert [f.WhichOneof("body") for f in frames] == ["refuse"]
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert a.connected("b", inbound=True) and b.connected("a")
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert any("refused this node" in m and "no peer token" in m for m in errors), errors

    run(body())


def test_another_node_at_the_dialled_address_is_refused():
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a")
            b, _ = await n.start("b")
            a.set_peers({"z": addr(b)})
            await until(lambda: ra.refusals, 5, "a's dial of z refused")
            assert "dialled node 'z'" in ra.refusals[0][1].message
            assert "node 'b' answered" in ra.refusals[0][1].message
            assert not a.connected("z") and "outbound_up" not in ra.kinds()

    run(body())


def test_silent_or_wrong_first_frame_is_closed():
    async def body():
        async with nodes() as n:
            a, _ = await n.start("a")
            start = time.monotonic()
            frames, code, details = await raw_stream(addr(a), None)
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "no Hello" in details
            assert time.monotonic() - start < 3
            frames, code, details = await raw_stream(addr(a), Frame(
                heartbeat=peer_pb2.Heartbeat()))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "must be Hello" in details

    run(body())


def test_unsupported_major_refused():
    async def body():
        async with nodes() as n:
            a, _ = await n.start("a")
            x, rx = await n.start("x", major=2)
            x.set_peers({"a": addr(a)})
            await until(lambda: rx.refusals, 5, "x refused")
            refuse = rx.refusals[0][1]
            assert refuse.code == RefuseCode.UNSUPPORTED_VERSION
            assert "protocol 2." in refuse.message and "1.x" in refuse.message

    run(body())


def test_newer_incarnation_replaces_older_which_is_then_refused_as_stale():
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a")
            b_old, r_old = await n.start("b", incarnation=5)
            b_old.set_peers({"a": addr(a)})
            await until(lambda: a.connected("b", inbound=True), 5, "old b -> a")
            b_new, r_new = await n.start("b", incarnation=6)
            b_new.set_peers({"a": addr(a)})
            await until(lambda: r_old.refusals, 5, "old b refused after being replaced")
            assert r_old.refusals[0][1].code == RefuseCode.STALE_INCARNATION
            assert "incarnation 5" in r_old.refusals[0][1].message
            assert ra.kinds() == ["inbound_up", "inbound_down", "inbound_up"]
            assert [e[2].peer.incarnation for e in ra.events if e[0] == "inbound_up"] == [5, 6]
            assert "replaced" in ra.events[1][2]
            assert r_old.kinds() == ["outbound_up", "outbound_down"]
            assert "replaced" in r_old.last("outbound_down")
            assert a.connected("b", inbound=True) and b_new.connected("a")
            assert a.states()["b"]["incarnation"] == 6
            # the stream that is up is the new one
            assert b_new.send("a", Frame(interest_request=peer_pb2.InterestRequest(reason="new")))
            await until(lambda: ra.frames, 5, "frame from the new b")
            assert not b_old.connected("a")

    run(body())


def test_set_peers_removal_closes_the_stream_and_stops_dialling():
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a")
            b, rb = await n.start("b")
            connect(a, b)
            await until(all_connected(a, b), 5, "a <-> b")
            b.set_peers({})
            assert not b.connected("a") and not b.send("a", Frame())
            assert rb.kinds()[-2:] == ["outbound_down", "inbound_down"]
            assert rb.last("outbound_down") == "removed from the membership view"
            await until(lambda: "inbound_down" in ra.kinds(), 5, "a sees b's stream end")
            # a still dials b and is accepted again; b never dials a again
            await until(lambda: a.connected("b"), 5, "a -> b again")
            await stays(lambda: not a.connected("b", inbound=True), 1.0, "b does not dial a")
            assert b.states()["a"]["member"] is False
            b.set_peers({"a": addr(a)})
            await until(all_connected(a, b), 5, "a <-> b again")
            # a moved address: the old stream closes, the new address is dialled
            b.set_peers({"a": f"127.0.0.1:{free_port()}"})
            assert "address changed" in rb.last("outbound_down")
            await until(lambda: b.states()["a"]["failures"] > 0, 5, "dialling the new address")
            assert "cannot reach" in b.states()["a"]["last_error"]
            b.set_peers({"a": addr(a)})
            await until(all_connected(a, b), 5, "a <-> b at the right address")

    run(body())


def test_stop_leaves_no_tasks_or_threads():
    threads_before = set(threading.enumerate())

    async def body():
        async with nodes() as n:
            a, ra = await n.start("a")
            b, rb = await n.start("b")
            c, rc = await n.start("c")
            connect(a, b, c)
            c.set_peers({"a": addr(a), "b": addr(b), "gone": f"127.0.0.1:{free_port()}"})
            await until(all_connected(a, b, c), 5, "a, b, c meshed")
            for t in (a, b, c):
                await t.stop()
            assert asyncio.all_tasks() == {asyncio.current_task()}
            for r in (ra, rb, rc):  # every up got its down
                kinds = r.kinds()
                assert kinds.count("outbound_up") == kinds.count("outbound_down") == 2
                assert kinds.count("inbound_up") == kinds.count("inbound_down") == 2
            assert not any(t.connected(o.node_id) for t in (a, b, c) for o in (a, b, c))

    run(body())
    gc.collect()  # grpc.aio's poller thread ends once its channels and servers are collected
    deadline = time.monotonic() + 3
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - threads_before == set()


def test_port_already_taken_is_a_clear_error():
    async def body():
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            t = PeerTransport(Handshake(Hello("c", "a", 1)), f"127.0.0.1:{port}", Recorder())
            with pytest.raises(PeerTransportError, match=f"127.0.0.1:{port}.*in use"):
                await t.start()
        async with nodes() as n:  # a second sidecar on a running one's port (no SO_REUSEPORT)
            a, _ = await n.start("a")
            t = PeerTransport(Handshake(Hello("c", "b", 1)), addr(a), Recorder())
            with pytest.raises(PeerTransportError, match="in use"):
                await t.start()

    run(body())


def test_oversized_frames_fail_loudly_and_unknown_bodies_are_ignored():
    async def body():
        async with nodes() as n:
            # a long dead_after: under load the heartbeat timeout must not beat gRPC's own error
            a, ra = await n.start("a", max_message_bytes=64 << 10, dead_after=10.0)
            b, rb = await n.start("b", max_message_bytes=16 << 10, dead_after=10.0)
            connect(a, b)
            await until(all_connected(a, b), 5, "a <-> b")
            # a newer minor's body (field 100): counted and skipped; the stream stays up
            unknown = bytes([0xA2, 0x06, 3]) + b"new"
            assert a.send("b", unknown)
            assert a.send("b", Frame(interest_request=peer_pb2.InterestRequest(reason="known")))
            await until(lambda: rb.frames, 5, "the known frame")
            assert [f.interest_request.reason for _, f, _ in rb.frames] == ["known"]
            assert b.states()["a"]["inbound"]["unknown_in"] == 1
            # over our own limit: refused at send() with a clear error
            big = Frame(message_batch=peer_pb2.MessageBatch(envelopes=[
                peer_pb2.Envelope(topic="t", payload=b"x" * (70 << 10))]))
            with pytest.raises(FrameTooLarge, match="exceeds max_message_bytes=65536"):
                a.send("b", big)
            # over the receiver's limit: the stream fails with gRPC's reason, then reconnects
            medium = Frame(message_batch=peer_pb2.MessageBatch(envelopes=[
                peer_pb2.Envelope(topic="t", payload=b"x" * (32 << 10))]))
            assert a.send("b", medium)
            await until(lambda: "outbound_down" in ra.kinds(), 5, "stream failed")
            reason = ra.last("outbound_down")
            assert "RESOURCE_EXHAUSTED" in reason and "larger than max" in reason, reason
            await until(lambda: a.connected("b"), 5, "a -> b reconnected")
            assert a.states()["b"]["reconnects"] == 1

    run(body())


@pytest.mark.benchmark
def test_throughput_in_one_process():
    async def body():
        async with nodes() as n:
            a, _ = await n.start("a", dead_after=5.0)
            b, rb = await n.start("b", dead_after=5.0)
            connect(a, b)
            await until(all_connected(a, b), 5, "a <-> b")
            frames = 5000
            batches = [batch_frame(seq) for seq in range(100)]
            serialized = [f.SerializeToString() for f in batches]
            for what, items in (("Frame objects, serialized by send()", batches),
                                ("pre-serialized frames", serialized)):
                rb.frames.clear()
                done = asyncio.Event()
                rb.on_any = lambda done=done: len(rb.frames) >= frames and done.set()
                start = time.perf_counter()
                for i in range(frames):
                    a.send("b", items[i % 100])
                await asyncio.wait_for(done.wait(), 30)
                report(f"one process, one event loop for both ends, {what}",
                       frames, time.perf_counter() - start)

    run(body())


def batch_frame(seq: int) -> peer_pb2.Frame:
    """100 envelopes with 100-byte payloads, as the node batches them."""
    return Frame(message_batch=peer_pb2.MessageBatch(envelopes=[
        peer_pb2.Envelope(origin_node="a", origin_seq=seq * 100 + i, origin_incarnation=1,
                          hlc=seq, topic="bench/topic", payload=b"p" * 100, qos=1)
        for i in range(100)]))


def report(what: str, frames: int, seconds: float) -> None:
    print(f"\nthroughput, {what}: {frames / seconds:,.0f} frames/s ="
          f" {frames * 100 / seconds:,.0f} envelopes/s (100 x 100-byte payloads per frame;"
          f" {frames} frames in {seconds:.2f}s)")


async def raw_stream(address: str, first: peer_pb2.Frame | None
                     ) -> tuple[list[peer_pb2.Frame], grpc.StatusCode, str]:
    """Open a bare Peer.Stream, optionally send one frame, read until the server ends it."""
    async with grpc.aio.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as ch:
        call = ch.stream_stream(METHOD, request_serializer=None,
                                response_deserializer=Frame.FromString)()
        if first is not None:
            await call.write(first.SerializeToString())
        frames = []
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for frame in call:
                frames.append(frame)
        return frames, await call.code(), await call.details()


# ---- across processes --------------------------------------------------------------------------

SLOW = {"heartbeat_interval": 0.25, "dead_after": 1.5, "hello_timeout": 1.0}


def start_child(procs, a: PeerTransport, port: int, incarnation: int, name: str):
    argv = [sys.executable, "-m", "tests.system.peering.test_transport", "child",
            "--port", str(port), "--incarnation", str(incarnation), "--peer", f"a={addr(a)}"]
    return procs.start(name, argv, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})


def test_peer_killed_then_restarted_reconnects(procs):
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", **SLOW)
            port = free_port()
            a.set_peers({"b": f"127.0.0.1:{port}"})
            child = start_child(procs, a, port, 1, "b1")
            await until(all_connected_to(a, "b"), 20, "a <-> b (child process)")
            os.kill(child.pid, signal.SIGKILL)
            took = await until(lambda: {"outbound_down", "inbound_down"} <= set(ra.kinds()), 5,
                               "down callbacks after SIGKILL")
            assert took < SLOW["dead_after"], f"down detected after {took:.2f}s"
            assert not a.connected("b")
            assert a.states()["b"]["outbound"]["state"] in ("connecting", "backoff")
            start_child(procs, a, port, 2, "b2")
            await until(all_connected_to(a, "b"), 20, "a <-> restarted b")
            kinds = ra.kinds()
            assert kinds.count("outbound_up") == kinds.count("inbound_up") == 2, kinds
            assert kinds.count("outbound_down") == kinds.count("inbound_down") == 1, kinds
            assert ra.last("outbound_up").peer.incarnation == 2
            assert a.states()["b"]["reconnects"] == 1

    run(body())


def test_stopped_peer_detected_by_heartbeat_timeout_then_recovers(procs):
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", **SLOW)
            port = free_port()
            a.set_peers({"b": f"127.0.0.1:{port}"})
            child = start_child(procs, a, port, 1, "b")
            try:
                await until(all_connected_to(a, "b"), 20, "a <-> b (child process)")
                os.kill(child.pid, signal.SIGSTOP)
                took = await until(lambda: {"outbound_down", "inbound_down"} <= set(ra.kinds()),
                                   SLOW["dead_after"] + 3, "down callbacks after SIGSTOP")
                assert SLOW["dead_after"] * 0.9 <= took <= SLOW["dead_after"] + 1.5, took
                assert "nothing received" in ra.last("outbound_down")
                await asyncio.sleep(1.0)  # a keeps dialling the frozen peer: no answer
                assert not a.connected("b")
                os.kill(child.pid, signal.SIGCONT)
                await until(all_connected_to(a, "b"), 15, "a <-> b after SIGCONT")
                assert ra.kinds().count("outbound_up") == 2
            finally:
                os.kill(child.pid, signal.SIGCONT)

    run(body())


def test_throughput_across_processes(procs):
    async def body():
        async with nodes() as n:
            a, ra = await n.start("a", heartbeat_interval=0.5, dead_after=5.0)
            port = free_port()
            a.set_peers({"b": f"127.0.0.1:{port}"})
            start_child(procs, a, port, 1, "b")
            await until(all_connected_to(a, "b"), 20, "a <-> b (child process)")
            frames = 10_000
            payload = [batch_frame(seq).SerializeToString() for seq in range(100)]
            done = asyncio.Event()
            ra.on_any = lambda: len(ra.frames) >= frames and done.set()
            start = time.perf_counter()
            for i in range(frames):
                a.send("b", payload[i % 100])
            await asyncio.wait_for(done.wait(), 30)
            seconds = time.perf_counter() - start
            acked = [f.ack_batch.acks[0].origin_seq for _, f, _ in ra.frames]
            assert acked == [(i % 100) * 100 + 99 for i in range(frames)]
            report("two processes, acked by the receiver (pre-serialized frames)", frames, seconds)

    run(body())


def all_connected_to(a: PeerTransport, peer: str) -> Callable[[], bool]:
    return lambda: a.connected(peer) and a.connected(peer, inbound=True)


# ---- the child process ---------------------------------------------------------------------------


async def child_main(args: argparse.Namespace) -> None:
    """Node "b": dials the given peers and acks each message batch on the reply path."""
    peers = dict(item.split("=", 1) for item in args.peer)
    me = Hello("c", "b", args.incarnation, f"127.0.0.1:{args.port}")

    class Acker(Recorder):
        def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None:
            if frame.WhichOneof("body") == "message_batch":
                seq = frame.message_batch.envelopes[-1].origin_seq
                transport.reply(peer, Frame(ack_batch=peer_pb2.AckBatch(
                    acks=[peer_pb2.Ack(origin_seq=seq, status=peer_pb2.Ack.OK)])))

    transport = PeerTransport(Handshake(me), f"127.0.0.1:{args.port}", Acker(), **SLOW)
    await transport.start()
    transport.set_peers(peers)
    print("child ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--peer", action="append", default=[])
    asyncio.run(child_main(parser.parse_args(sys.argv[2:])))
