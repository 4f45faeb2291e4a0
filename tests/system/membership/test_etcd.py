"""EtcdMembership against real etcd processes on free loopback ports (stopped by PID)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import aetcd
import pytest

from sidecar.devcluster.etcd import find_etcd
from sidecar.membership.etcd import DuplicateNodeId, EtcdMembership, grpc_target
from sidecar.membership.view import NodeRecord
from tests.harness.procs import ManagedProcess, ProcessGroup, free_port

ETCD = find_etcd()
pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(ETCD is None, reason="etcd not installed (apt etcd-server)")]
TTL = 2
CLUSTER = "t1"


class Etcd:
    """A loopback etcd cluster of n members; `start(i)`/`kill(i)` one member."""

    def __init__(self, procs: ProcessGroup, root: Path, n: int = 1) -> None:
        self.procs, self.root = procs, root
        self.client_ports = [free_port() for _ in range(n)]
        self.peer_ports = [free_port() for _ in range(n)]
        self.members: list[ManagedProcess | None] = [None] * n
        self.initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(self.peer_ports))
        self.starts = 0

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    def start(self, i: int) -> None:
        client, peer = f"http://127.0.0.1:{self.client_ports[i]}", \
            f"http://127.0.0.1:{self.peer_ports[i]}"
        self.starts += 1
        self.members[i] = self.procs.start(f"etcd-m{i}-{self.starts}", [
            str(ETCD), "--name", f"m{i}", "--data-dir", str(self.root / f"m{i}"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial, "--initial-cluster-state", "new",
            "--initial-cluster-token", f"tok-{self.peer_ports[0]}",
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"])

    def start_all(self) -> None:
        for i in range(len(self.members)):
            self.start(i)
        for i in range(len(self.members)):
            self.wait_healthy(i)

    def wait_healthy(self, i: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.client_ports[i]}/health"
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"etcd member m{i} not healthy after {timeout}s")

    def kill(self, i: int) -> None:
        proc = self.members[i]
        assert proc is not None
        proc.stop(sig=signal.SIGKILL)
        self.members[i] = None


@pytest.fixture
def etcd1(procs: ProcessGroup, tmp_path: Path) -> Etcd:
    e = Etcd(procs, tmp_path / "etcd")
    e.start_all()
    return e


def record(node: str, inc: int | None = None) -> NodeRecord:
    return NodeRecord(node, f"127.0.0.1:{7000 + ord(node[-1])}", "127.0.0.1:1883", "test",
                      inc if inc is not None else time.time_ns(), time.time())


def member(e: Etcd, node: str, inc: int | None = None, **kw) -> EtcdMembership:
    return EtcdMembership(e.endpoints, CLUSTER, record(node, inc), lease_ttl=TTL, **kw)


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float,
                     what: str) -> float:
    """Poll until `check` holds; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        res = check()
        if not isinstance(res, bool):
            res = await res
        if res:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def within(aw: Awaitable[object], seconds: float, what: str) -> object:
    """`aw`, or a failure naming the step that hung (rather than the test's whole timeout)."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except TimeoutError:
        raise AssertionError(f"{what} did not finish within {seconds}s") from None


async def key_exists(e: Etcd, node: str, i: int = 0) -> bool:
    async with aetcd.Client("127.0.0.1", e.client_ports[i], timeout=2) as c:
        return await c.get(f"/{CLUSTER}/nodes/{node}".encode()) is not None


async def key_lease(e: Etcd, node: str, i: int = 0) -> int:
    """The lease id `node`'s key is held under (0: no key)."""
    async with aetcd.Client("127.0.0.1", e.client_ports[i], timeout=2) as c:
        kv = await c.get(f"/{CLUSTER}/nodes/{node}".encode())
        return 0 if kv is None else kv.lease


def test_grpc_target_for_several_endpoints() -> None:
    assert grpc_target(["127.0.0.1:1"]) == ("127.0.0.1", 1)
    assert grpc_target(["http://127.0.0.1:1", "127.0.0.2:2", "127.0.0.3:3"]) == \
        ("ipv4:127.0.0.1:1,127.0.0.2:2,127.0.0.3", 3)


def test_join_and_graceful_leave(etcd1: Etcd) -> None:
    """Two members see each other via the watch; a graceful stop removes the key at once."""
    async def main() -> None:
        seen: list[dict[str, str]] = []
        a = member(etcd1, "a", on_change=seen.append)
        b = member(etcd1, "b")
        try:
            await a.start()
            await b.start()
            assert b.peers() == {"a": a.record.grpc}  # from the initial get
            await eventually(lambda: a.peers() == {"b": b.record.grpc}, 2, "a sees b")
            assert seen[-1] == {"b": b.record.grpc}
            t0 = time.monotonic()
            await b.stop()
            assert not await key_exists(etcd1, "b")
            await eventually(lambda: a.peers() == {}, 1, "a sees b leave")
            assert time.monotonic() - t0 < 1.0  # well before the 2 s TTL
        finally:
            await a.stop()
            await b.stop()
        assert not await key_exists(etcd1, "a")
    asyncio.run(main())


def test_crash_key_expires_after_ttl_and_return_is_a_restart(etcd1: Etcd) -> None:
    """kill -9 equivalent: loops cancelled, nothing deleted → gone after the TTL; the node
    returning with a new incarnation is reported as restarted."""
    async def main() -> None:
        events: list[tuple[str, str]] = []
        a = member(etcd1, "a", on_events=lambda cs: events.extend((c.kind, c.node_id)
                                                                   for c in cs))
        b = member(etcd1, "b", inc=1)
        b2 = member(etcd1, "b", inc=2)
        try:
            await a.start()
            await b.start()
            await eventually(lambda: "b" in a.peers(), 2, "a sees b")
            await b.stop(graceful=False)
            await asyncio.sleep(1.0)
            assert "b" in a.peers() and await key_exists(etcd1, "b")
            took = await eventually(lambda: "b" not in a.peers(), TTL + 2, "b's lease expiry")
            assert not await key_exists(etcd1, "b")
            assert took + 1.0 >= TTL - 0.5
            await b2.start()
            await eventually(lambda: "b" in a.peers(), 2, "a sees b again")
            assert events.count(("joined", "b")) == 2 and ("crashed", "b") in events
        finally:
            for m in (a, b, b2):
                await m.stop()
    asyncio.run(main())


def test_duplicate_node_id_refused(etcd1: Etcd) -> None:
    async def main() -> None:
        a = member(etcd1, "a")
        b = member(etcd1, "b", inc=1)
        dup = member(etcd1, "b", inc=2)
        try:
            await a.start()
            await b.start()
            with pytest.raises(DuplicateNodeId, match="'b' is already registered.*another"):
                await dup.start()
            assert await key_exists(etcd1, "b")
            assert a.peers()["b"] == b.record.grpc  # the live one is untouched
        finally:
            for m in (a, b, dup):
                await m.stop()
    asyncio.run(main())


def test_etcd_outage_keeps_view_and_reregisters(etcd1: Etcd, caplog) -> None:
    """etcd down for longer than the TTL, and back with its data lost (its data dir wiped: a
    replaced etcd; one restarted with its data would keep the leases and prove nothing):
    both keep their last view meanwhile; then each registers again under a new lease and
    the watch works again (a newcomer sees both, both see it)."""
    caplog.set_level(logging.INFO, logger="mqfed.membership")

    async def main() -> None:
        a = member(etcd1, "a")
        b = member(etcd1, "b")
        c = member(etcd1, "c")
        try:
            await a.start()
            await b.start()
            await eventually(lambda: "b" in a.peers(), 2, "a sees b")
            old = {m.record.node_id: m._lease_id for m in (a, b)}
            etcd1.kill(0)
            shutil.rmtree(etcd1.root / "m0")
            await asyncio.sleep(TTL + 2)  # the outage: longer than the lease TTL
            assert a.peers() == {"b": b.record.grpc} and b.peers() == {"a": a.record.grpc}
            etcd1.start(0)
            await asyncio.to_thread(etcd1.wait_healthy, 0)
            for m in (a, b):
                node = m.record.node_id
                await within(eventually(lambda node=node: key_lease(etcd1, node), 5,
                                        f"{node} registered again"), 15, f"{node}'s re-register")
                lease = await within(key_lease(etcd1, node), 5, "reading the key's lease")
                assert lease == m._lease_id and lease != old[node], (
                    f"{node}'s key is under its new lease {m._lease_id}, not {old[node]}")
            await within(c.start(), 15, "the newcomer's start")
            await eventually(lambda: "c" in a.peers() and "c" in b.peers(), 5, "c seen")
            assert c.peers().keys() == {"a", "b"}, "the newcomer sees both re-registered"
            assert a.peers().keys() == {"b", "c"}
        finally:
            for m in (a, b, c):
                await within(m.stop(), 10, f"{m.record.node_id}'s stop")
    asyncio.run(main())
    msgs = [r.getMessage() for r in caplog.records]
    # logged once per state change, not once per retry
    assert 1 <= sum("etcd unreachable" in m for m in msgs) <= 2
    assert sum("etcd reachable again" in m for m in msgs) <= 2


def test_three_member_etcd_survives_one_member_killed(procs: ProcessGroup,
                                                      tmp_path: Path) -> None:
    e = Etcd(procs, tmp_path / "etcd3", n=3)
    e.start_all()

    async def main() -> None:
        a = member(e, "a")
        b = member(e, "b")
        c = member(e, "c")
        try:
            await a.start()
            await b.start()
            await eventually(lambda: "b" in a.peers(), 2, "a sees b")
            e.kill(0)  # the first endpoint, the one the clients connected to
            await asyncio.sleep(TTL + 1)
            assert await key_exists(e, "a", 1) and await key_exists(e, "b", 2)  # leases kept
            await c.start()
            await eventually(lambda: "c" in a.peers() and "c" in b.peers(), 5, "c seen")
            await c.stop()
            await eventually(lambda: "c" not in a.peers(), 2, "c's leave seen")
        finally:
            for m in (a, b, c):
                await m.stop()
    asyncio.run(main())


def test_lease_lost_reregisters(etcd1: Etcd) -> None:
    """Our lease revoked behind our back (as when it expired during a partition): the key
    comes back under a new lease and peers see the node again."""
    async def main() -> None:
        a = member(etcd1, "a")
        b = member(etcd1, "b")
        try:
            await a.start()
            await b.start()
            old = a._lease_id
            async with aetcd.Client("127.0.0.1", etcd1.client_ports[0], timeout=2) as c:
                await c.revoke_lease(old)
            await eventually(lambda: a._lease_id != old, 3, "a re-granted its lease")
            await eventually(lambda: key_exists(etcd1, "a"), 3, "a's key back")
            await eventually(lambda: "a" in b.peers(), 3, "b sees a again")
        finally:
            await a.stop()
            await b.stop()
    asyncio.run(main())
