"""Outbound queue over a real SQLite spill file: order, limits, rewind, durability, restart."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.peering.outbound import OutboundQueue, QueuedMessage
from sidecar.peering.spill import SqliteSpillStore


def data(seq: int, size: int = 10) -> bytes:
    return f"{seq:0{size}d}".encode()


def seqs(batch: list[QueuedMessage]) -> list[int]:
    return [m.seq for m in batch]


def drain(q: OutboundQueue, n: int = 1_000) -> list[QueuedMessage]:
    out = []
    while batch := q.next_batch(n, 1 << 30):
        out += batch
    return out


@pytest.fixture
def store(tmp_path):
    s = SqliteSpillStore(tmp_path / "peer-n2.sqlite")
    yield s
    s.close()


def test_order_across_memory_and_spill(store):
    q = OutboundQueue(store, incarnation=1, memory_messages=4)
    q.on_connected()
    for seq in range(1, 11):
        assert q.offer(seq, data(seq)) is None
    assert store.count() > 0 and q.memory_count() <= 4
    assert q.count() == 10 and q.bytes() == 100
    first = q.next_batch(3, 1 << 20)
    assert seqs(first) == [1, 2, 3]
    for seq in range(11, 21):  # spills the in-flight ones too
        q.offer(seq, data(seq))
    assert seqs(drain(q, 4)) == list(range(4, 21))
    assert q.in_flight == 20
    assert q.on_acked(range(1, 21)) == 20
    assert q.count() == 0 and q.bytes() == 0 and store.count() == 0


def test_spilled_counts_what_is_in_the_store(store):
    q = OutboundQueue(store, 1)
    q.on_connected()
    q.offer(1, data(1))
    assert (q.spilled(), q.spilled_bytes()) == (0, 0)  # in memory only
    q.on_disconnected()  # moved to the store
    q.offer(2, data(2, size=20))  # straight to the store while down
    assert (q.spilled(), q.spilled_bytes()) == (2, 30)
    q.on_connected()
    assert q.on_acked(seqs(drain(q))) == 2
    assert (q.spilled(), q.spilled_bytes()) == (0, 0)


def test_next_batch_limits(store):
    q = OutboundQueue(store, 1)
    q.on_connected()
    for seq in range(1, 6):
        q.offer(seq, data(seq, 100))
    q.offer(6, data(6, 1_000))
    assert seqs(q.next_batch(10, 250)) == [1, 2]
    assert seqs(q.next_batch(2, 10_000)) == [3, 4]
    assert seqs(q.next_batch(10, 150)) == [5]
    assert seqs(q.next_batch(10, 150)) == [6]  # larger than max_bytes: sent alone
    assert q.next_batch(10, 150) == []


def test_max_in_flight(store):
    q = OutboundQueue(store, 1, max_in_flight=3)
    q.on_connected()
    for seq in range(1, 6):
        q.offer(seq, data(seq))
    assert seqs(q.next_batch(10, 1 << 20)) == [1, 2, 3]
    assert q.next_batch(10, 1 << 20) == []
    q.on_acked([2])
    assert seqs(q.next_batch(10, 1 << 20)) == [4]


def test_total_limits_refuse_and_count(store):
    q = OutboundQueue(store, 1, memory_messages=2, total_messages=5, total_bytes=1_000)
    q.on_connected()
    refused = q.offer_many((s, data(s)) for s in range(1, 8))
    assert [s for s, _ in refused] == [6, 7]
    assert "queue full: 5 messages (limit 5)" in refused[0][1]
    q.on_acked([])  # nothing in flight yet
    q.next_batch(1, 1 << 20)
    q.on_acked([1])
    assert "bytes" in q.offer(8, b"x" * 1_000)
    assert q.offer(9, data(9)) is None
    assert q.dropped == {"total_messages": 2, "total_bytes": 1}
    assert seqs(drain(q)) == [2, 3, 4, 5, 9]


def test_rewind_resends_unacked_in_order(store):
    q = OutboundQueue(store, 1, memory_messages=100)
    q.on_connected()
    q.offer_many((s, data(s)) for s in range(1, 8))
    assert seqs(q.next_batch(5, 1 << 20)) == [1, 2, 3, 4, 5]
    q.on_acked([2, 4])
    q.on_disconnected()
    assert q.in_flight == 0 and q.memory_count() == 0 and store.count() == 5
    assert q.durable(7)
    q.offer(8, data(8))  # while down: straight to the store
    assert q.durable(8) and store.count() == 6
    q.on_acked([1])  # late ack from the dead stream: ignored, 1 will be re-sent
    q.on_connected()
    assert seqs(drain(q, 2)) == [1, 3, 5, 6, 7, 8]
    q.on_acked([3, 6])  # out of order
    assert store.count() == 4
    q.on_disconnected()
    q.on_connected()
    assert seqs(drain(q)) == [1, 5, 7, 8]


def test_durable_tracks_what_reached_the_store(store):
    q = OutboundQueue(store, 1)
    q.offer(1, data(1))  # not connected yet: stored at once
    assert q.durable(1) and q.durable_through == 1
    q.on_connected()
    q.offer_many((s, data(s)) for s in range(2, 6))
    assert not q.durable(2)
    q.next_batch(2, 1 << 20)  # 1 (stored) and 2 (memory) in flight
    assert q.persist(through_seq=3) == 2
    assert q.durable(3) and not q.durable(4) and q.memory_count() == 2
    q.on_acked([1, 2])
    assert store.count() == 1  # 3 is still queued
    assert q.persist() == 2 and q.durable(5)
    assert seqs(drain(q)) == [3, 4, 5]


def test_seqs_must_increase(store):
    q = OutboundQueue(store, 1)
    q.offer(5, b"x")
    with pytest.raises(ValueError, match="seq 5 offered after seq 5"):
        q.offer(5, b"y")


def test_restart_rereads_pending_messages_in_order(tmp_path):
    path = tmp_path / "spill" / "peer-n2.sqlite"
    with SqliteSpillStore(path) as store:
        q = OutboundQueue(store, incarnation=7, memory_messages=3)
        q.on_connected()
        q.offer_many((s, data(s)) for s in range(1, 11))
        q.next_batch(2, 1 << 20)
        q.on_acked([1])
        q.persist()  # e.g. peer slow: everything made durable
        assert store.count() == 9
    with SqliteSpillStore(path) as store:  # the sidecar restarted
        assert store.count() == 9 and store.bytes() == 90
        q = OutboundQueue(store, incarnation=8)
        q.offer(1, data(1, 12))  # new incarnation, seq restarts
        q.on_connected()
        batch = drain(q)
        assert [(m.incarnation, m.seq) for m in batch] == [(7, s) for s in range(2, 11)] + [(8, 1)]
        assert [m.data for m in batch[:2]] == [data(2), data(3)]
        assert q.on_acked(range(2, 11)) == 0  # wrong incarnation
        assert q.on_acked(range(2, 11), incarnation=7) == 9
        assert q.on_acked([1]) == 1
        assert q.count() == 0 and store.count() == 0


def test_store_uses_wal_and_keeps_counters(tmp_path):
    path = tmp_path / "s.sqlite"
    with SqliteSpillStore(path) as store:
        store.append([QueuedMessage(k, 1, k, b"ab" * k) for k in range(1, 1_201)])
        assert store.count() == 1_200 and store.last_key() == 1_200
        store.delete(range(1, 1_101, 2))  # more keys than one DELETE statement holds
        store.delete([5_000])
        assert store.count() == 650
        assert [m.key for m in store.read_batch(0, 3)] == [2, 4, 6]
        assert [m.key for m in store.read_batch(1_100, 3)] == [1_101, 1_102, 1_103]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    total = db.execute("SELECT sum(length(data)) FROM spill").fetchone()[0]
    db.close()
    with SqliteSpillStore(path) as store:
        assert store.bytes() == total and store.count() == 650


# ---- property: whatever happens, everything offered and not refused is delivered in order ----

ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(1, 5)),
        st.tuples(st.just("send"), st.integers(1, 6)),
        st.tuples(st.just("ack"), st.integers(0, 2**16)),
        st.tuples(st.just("disconnect"), st.just(0)),
        st.tuples(st.just("connect"), st.just(0)),
        st.tuples(st.just("persist"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_property_delivery_in_order_exactly_until_acked(operations):
    with tempfile.TemporaryDirectory() as tmp, SqliteSpillStore(Path(tmp) / "q.sqlite") as store:
        q = OutboundQueue(store, 1, memory_messages=3, total_messages=12, max_in_flight=8)
        next_seq = 1
        accepted: list[int] = []
        acked: set[int] = set()
        in_flight: list[int] = []  # as the test's "peer" saw them on the current stream
        for op, arg in operations:
            if op == "offer":
                for _ in range(arg):
                    if q.offer(next_seq, data(next_seq)) is None:
                        accepted.append(next_seq)
                    next_seq += 1
            elif op == "send" and q.connected:
                batch = seqs(q.next_batch(arg, 1 << 20))
                # each stream carries unacked messages in increasing order, without repeats
                assert batch == sorted(batch) and not set(batch) & set(in_flight)
                assert all(s > max(in_flight, default=0) for s in batch)
                assert not set(batch) & acked
                in_flight += batch
            elif op == "ack" and in_flight:
                chosen = {s for i, s in enumerate(in_flight) if arg >> (i % 16) & 1}
                assert q.on_acked(chosen) == len(chosen)
                acked |= chosen
                in_flight = [s for s in in_flight if s not in chosen]
            elif op == "disconnect":
                q.on_disconnected()
                in_flight = []
                # every message not acked yet is durable (acked ones are settled already)
                assert all(q.durable(s) for s in accepted if s not in acked)
            elif op == "connect":
                q.on_connected()
            elif op == "persist":
                q.persist()
            assert q.count() == len(accepted) - len(acked)
            assert q.count() <= 12
        q.on_disconnected()
        q.on_connected()
        rest: list[int] = []
        while batch := seqs(q.next_batch(5, 1 << 20)):
            rest += batch
            q.on_acked(batch)
        assert rest == sorted(set(accepted) - acked)
        assert q.count() == 0 and store.count() == 0
