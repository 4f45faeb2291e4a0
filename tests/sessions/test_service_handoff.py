"""The session service's order of frames when a draining node hands a session off (a rolling
restart once lost a message here): the hand-off's record reaches its target before any
barrier, the target is asked for its barrier alone before the other peers, and the target
answers only once what that record started there (its copy's hold going off) is done. So
whatever the other peers route after their barrier finds the target's copy queueing.

In-process: the peer transport and the plugin are fakes that record what they are given."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from sidecar._proto import peer_pb2
from sidecar.local.events import Connect, Disconnect
from sidecar.sessions import wire
from sidecar.sessions.record import SessionRecord
from sidecar.sessions.service import SessionService


class Peers:
    """The peer transport: every frame sent, in order, decoded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, peer_pb2.Frame]] = []

    def send(self, peer: str, data: bytes) -> bool:
        self.sent.append((peer, peer_pb2.Frame.FromString(data)))
        return True

    reply = send

    def capabilities(self, peer: str) -> tuple[str, ...]:
        return ()

    def kinds(self) -> list[tuple[str, str]]:
        return [(p, f.WhichOneof("body")) for p, f in self.sent]


class Plugin:
    """The plugin's commands: answered at once, but `hold` only after `hold_delay` s."""

    def __init__(self, hold_delay: float = 0.0) -> None:
        self.hold_delay = hold_delay
        self.done: list[tuple[str, float]] = []

    async def request(self, cmd: str, **fields: Any) -> dict[str, Any]:
        if cmd == "hold":
            await asyncio.sleep(self.hold_delay)
        self.done.append((cmd, time.monotonic()))
        return {"messages": []} if cmd == "unreleased" else {}


def service(tmp_path: Path, node: str, peers: list[str], plugin: Plugin, transport: Peers,
            barriers: list[float]) -> SessionService:
    async def barrier(peer: str, timeout: float) -> bool:
        barriers.append(time.monotonic())
        return True
    svc = SessionService(node, 1, tmp_path / node, tmp_path / "none.sock", "secret",
                         plugin.request, transport, lambda: list(peers), barrier, replicas=2)
    for peer in peers:
        svc.on_peer_up(peer)
    return svc


def event(cls: type, **fields: Any) -> Any:
    return cls(epoch="e", seq=1, t_ms=int(time.time() * 1000), **fields)


async def _handing_off(tmp_path: Path) -> None:
    (tmp_path / "n1").mkdir()
    transport, plugin, barriers = Peers(), Plugin(), []
    svc = service(tmp_path, "n1", ["n2", "n3"], plugin, transport, barriers)
    try:
        svc.on_event(event(Connect, client="dev", username=None, protocol="mqtt5",
                           clean_start=False, session_expiry=600, keepalive=30,
                           session_present=False, address=None))
        svc.on_event(event(Disconnect, client="dev", taken_over=False, session_kept=True,
                           session_expiry=600))
        await asyncio.sleep(0.05)
        transport.sent.clear()
        svc.set_unavailable(frozenset({"n1"}))
        svc.hand_off_all()
        target = svc.registry.records["dev"].owner
        other = ({"n2", "n3"} - {target}).pop()
        await asyncio.sleep(0.05)
        kinds = transport.kinds()
        assert (target, "session_sync") in kinds, kinds
        assert kinds.index((target, "session_records")) < kinds.index((target, "session_sync"))
        assert (other, "session_sync") not in kinds, "the other peer was asked before the target"
        exchange = next(f.session_sync.exchange for p, f in transport.sent
                        if p == target and f.WhichOneof("body") == "session_sync")
        svc.on_frame(target, peer_pb2.Frame.FromString(
            wire.synced_frame("dev", exchange, True)), inbound=False)
        await asyncio.sleep(0.05)
        assert (other, "session_sync") in transport.kinds()
    finally:
        await svc.stop()


def test_a_hand_off_sends_its_record_then_asks_its_target_alone_first(tmp_path):
    asyncio.run(_handing_off(tmp_path))


async def _handed_here(tmp_path: Path) -> None:
    (tmp_path / "n2").mkdir()
    transport, plugin, barriers = Peers(), Plugin(hold_delay=0.3), []
    svc = service(tmp_path, "n2", ["n1", "n3"], plugin, transport, barriers)
    try:
        svc.registry.presence["dev"] = "session"  # a copy made here for the client, held
        svc.registry.holding.add("dev")
        now = int(time.time() * 1000)
        hlc = svc.clock.now(now).pack()
        handed = SessionRecord("dev", "n2", hlc + 1, hlc + 2, expiry=600, fresh=False,
                               online=False, since_ms=now, client_connect_hlc=hlc)
        for data in wire.records_frames([handed]):
            svc.on_frame("n1", peer_pb2.Frame.FromString(data), inbound=True)
        svc.on_frame("n1", peer_pb2.Frame.FromString(wire.sync_frame("dev", 7)),
                     inbound=True)
        await asyncio.sleep(0.6)
        holds = [t for cmd, t in plugin.done if cmd == "hold"]
        assert holds and barriers, (plugin.done, barriers)
        assert barriers[0] >= holds[0], "the barrier passed before the copy here queued"
        synced = [f.session_synced for p, f in transport.sent
                  if p == "n1" and f.WhichOneof("body") == "session_synced"]
        assert [(s.exchange, s.ok) for s in synced] == [(7, True)]
    finally:
        await svc.stop()


def test_a_hand_off_target_answers_the_barrier_once_its_copy_queues(tmp_path):
    asyncio.run(_handed_here(tmp_path))
