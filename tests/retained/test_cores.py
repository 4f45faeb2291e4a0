"""The retained cores without I/O: LWW index, replicator, anti-entropy, wire, SQLite."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.hlc import HybridClock
from sidecar.message import MessageProperties
from sidecar.retained import wire
from sidecar.retained.antientropy import (
    AntiEntropy,
    ReplyEntries,
    ReplyVersions,
    SendDigest,
    SendRequest,
)
from sidecar.retained.entry import RetainedEntry
from sidecar.retained.index import RetainedIndex
from sidecar.retained.replicator import (
    Broadcast,
    LocalWrite,
    Persist,
    ReadBack,
    ReadValue,
    Reinject,
    Replicator,
    RetryRead,
)
from sidecar.retained.sqlite import SqliteRetainedStore

T0 = 1_700_000_000_000

entries = st.builds(
    RetainedEntry,
    topic=st.sampled_from(["a", "a/b", "c/d/e", "x"]),
    hlc=st.integers(1, 50),
    origin=st.sampled_from(["n1", "n2", "n3"]),
    payload=st.binary(max_size=3),
    deleted=st.booleans(),
)


def _unique_versions(items: list[RetainedEntry]) -> list[RetainedEntry]:
    """One value per (topic, version), as the system guarantees (an origin never reuses an
    hlc for two different writes)."""
    seen: dict[tuple, RetainedEntry] = {}
    for e in items:
        seen.setdefault((e.topic, e.hlc, e.origin), e)
    return list(seen.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(entries, max_size=40), st.randoms())
def test_merge_converges_whatever_the_order(items, rnd) -> None:
    items = _unique_versions(items)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    a, b = RetainedIndex(items), RetainedIndex()
    for e in shuffled + shuffled[: len(shuffled) // 2]:  # duplicates are harmless
        b.merge(e)
    assert a.digest() == b.digest() and a.summary() == b.summary()
    assert {e.topic: e for e in a} == {e.topic: e for e in b}
    for topic in {e.topic for e in items}:  # the newest version wins
        newest = max((e for e in items if e.topic == topic), key=lambda e: e.version)
        assert a.get(topic) == newest


def test_an_older_copy_never_overwrites_a_newer_one() -> None:
    index = RetainedIndex()
    assert index.merge(RetainedEntry("t", 10, "n1", b"new"))
    assert not index.merge(RetainedEntry("t", 9, "n3", b"old"))
    assert not index.merge(RetainedEntry("t", 10, "n0", b"tie, lower origin"))
    assert index.merge(RetainedEntry("t", 10, "n2", deleted=True))  # tombstone, newer
    assert not index.merge(RetainedEntry("t", 10, "n1", b"new"))
    assert index.get("t").deleted


def _replicator(node: str = "n1") -> Replicator:
    return Replicator(node, HybridClock(), RetainedIndex())


def test_local_write_is_read_back_then_stamped_and_broadcast_with_its_expiry() -> None:
    rep = _replicator()
    actions = rep.on_local([LocalWrite("t", b"v", 1)], T0)
    assert actions == [ReadBack(("t",))]
    actions = rep.on_read(["t"], {"t": ReadValue(b"v", expiry=30)}, T0)
    persist, broadcast = actions
    assert isinstance(persist, Persist) and isinstance(broadcast, Broadcast)
    (entry,) = broadcast.entries
    assert (entry.payload, entry.origin, entry.expires_at_ms) == (b"v", "n1", T0 + 30_000)
    assert rep.busy_topics() == 0


def test_a_write_overwritten_by_a_later_reinjection_is_dropped() -> None:
    rep = _replicator()
    remote = RetainedEntry("t", (T0 << 16), "n2", b"remote")
    persist, reinject = rep.on_remote([remote], T0)
    assert persist == Persist((remote,)) and isinstance(reinject, Reinject)
    # a client wrote "local" before Mosquitto stored the re-injection: wait for the PUBACK
    assert rep.on_local([LocalWrite("t", b"local", 0)], T0) == []
    assert rep.on_reinjected([reinject.token]) == [ReadBack(("t",))]
    # Mosquitto holds the re-injected value: it came after the client's write
    assert rep.on_read(["t"], {"t": ReadValue(b"remote")}, T0 + 5) == []
    assert rep.index.get("t") == remote and rep.counters["local_overwritten"] == 1


def test_remote_entries_wait_while_a_local_write_is_read_back() -> None:
    rep = _replicator()
    rep.on_local([LocalWrite("t", b"local", 0)], T0)
    older = RetainedEntry("t", (T0 << 16), "n2", b"older")
    assert rep.on_remote([older], T0 + 1) == []  # held back
    actions = rep.on_read(["t"], {"t": ReadValue(b"local")}, T0 + 2)
    assert [type(a) for a in actions] == [Persist, Broadcast]  # the held entry lost
    assert rep.index.get("t").payload == b"local"
    assert rep.counters["remote_stale"] == 1


def test_a_later_local_write_still_unseen_does_not_drop_earlier_ones() -> None:
    rep = _replicator()
    rep.on_local([LocalWrite("t", b"1", 0)], T0)
    actions = rep.on_read(["t"], {"t": ReadValue(b"2")}, T0)  # "2" is already stored
    assert [e.payload for e in actions[1].entries] == [b"1"]
    rep.on_local([LocalWrite("t", b"2", 0)], T0)
    actions = rep.on_read(["t"], {"t": ReadValue(b"2")}, T0 + 1)
    assert rep.index.get("t").payload == b"2"


def test_anti_entropy_entries_reinject_only_what_changes_mosquitto() -> None:
    rep = _replicator()
    tomb = RetainedEntry("gone", (T0 << 16), "n2", deleted=True)
    assert rep.on_remote([tomb], T0, live=False) == [Persist((tomb,))]
    live = RetainedEntry("here", (T0 << 16), "n2", b"x")
    assert isinstance(rep.on_remote([live], T0, live=False)[-1], Reinject)
    # a live delete is delivered (like a delete on one broker)
    tomb2 = RetainedEntry("gone2", (T0 << 16), "n2", deleted=True)
    assert isinstance(rep.on_remote([tomb2], T0, live=True)[-1], Reinject)


def test_broker_reset_reinjects_every_live_entry() -> None:
    index = RetainedIndex([RetainedEntry("a", 5, "n2", b"x"),
                           RetainedEntry("b", 6, "n2", deleted=True),
                           RetainedEntry("c", 7, "n2", b"old", expires_at_ms=T0 - 1)])
    rep = Replicator("n1", HybridClock(), index)
    actions = rep.on_broker_reset(T0)
    assert [a.entry.topic for a in actions if isinstance(a, Reinject)] == ["a"]


def _exchange(a_index: RetainedIndex, b_index: RetainedIndex) -> tuple[int, int]:
    """Run one exchange where A pulls from B; returns (entries sent, frames)."""
    a, b = AntiEntropy(a_index), AntiEntropy(b_index)
    a.on_peer_up("B")
    queue = a.poll(T0)
    sent = frames = 0
    while queue:
        action = queue.pop(0)
        frames += 1
        if isinstance(action, SendDigest):
            queue += b.on_digest("A", action.exchange, action.digests, action.counts)
        elif isinstance(action, ReplyEntries):
            sent += len(action.entries)
            for e in action.entries:
                a_index.merge(e)
            if action.last:
                a.on_entries_done("B", action.exchange, T0)
        elif isinstance(action, ReplyVersions):
            queue += a.on_versions("B", action.exchange, action.buckets, action.versions, T0)
        elif isinstance(action, SendRequest):
            queue += b.on_request("A", action.exchange, action.topics)
    assert a.active() is None
    return sent, frames


@settings(max_examples=60, deadline=None)
@given(st.lists(entries, max_size=30), st.lists(entries, max_size=30))
def test_two_exchanges_make_two_indexes_equal(left, right) -> None:
    a, b = RetainedIndex(_unique_versions(left)), RetainedIndex(_unique_versions(right))
    _exchange(a, b)  # a pulls from b
    _exchange(b, a)  # b pulls from a
    assert a.summary() == b.summary()
    assert {e.topic: e.version for e in a} == {e.topic: e.version for e in b}


def test_exchange_sends_only_the_differences() -> None:
    common = [RetainedEntry(f"t/{i}", 100 + i, "n1", b"v") for i in range(2000)]
    a = RetainedIndex(common)
    b = RetainedIndex(common + [RetainedEntry("t/5", 999, "n2", b"newer"),
                                RetainedEntry("new", 5, "n2", b"n")])
    sent, _ = _exchange(a, b)
    assert sent == 2 and a.summary() == b.summary()
    empty = RetainedIndex()
    sent, frames = _exchange(empty, b)
    assert sent == len(b) and frames == 3  # digest, whole buckets, versions (none)
    assert _exchange(a, b)[0] == 0


def test_wire_round_trip_keeps_value_version_and_remaining_expiry() -> None:
    props = MessageProperties(user=(("k", "v"),), content_type="text/plain",
                              correlation_data=b"\x01")
    entry = RetainedEntry("t", 77, "n1", b"p", 2, props, expires_at_ms=T0 + 10_500)
    (frame,) = wire.entries_frames([entry], T0, exchange=3, last=True)
    from sidecar._proto import peer_pb2
    msg = peer_pb2.Frame.FromString(frame).retained_entries
    assert (msg.exchange, msg.last) == (3, True)
    back = wire.entry_from_proto(msg.entries[0], T0 + 100)
    assert back == RetainedEntry("t", 77, "n1", b"p", 2, props, expires_at_ms=T0 + 11_100)
    expired = wire.entry_from_proto(wire.entry_to_proto(entry, T0 + 20_000), T0)
    assert expired.deleted and expired.version == entry.version


def test_sqlite_store_keeps_the_newest_version(tmp_path: Path) -> None:
    store = SqliteRetainedStore(tmp_path / "r.sqlite")
    new = RetainedEntry("t", 9, "n1", b"new", 1, MessageProperties(user=(("a", "b"),)),
                        expires_at_ms=T0)
    store.save([new, RetainedEntry("gone", 3, "n2", deleted=True)])
    store.save([RetainedEntry("t", 8, "n3", b"older")])
    store.close()
    loaded = {e.topic: e for e in SqliteRetainedStore(tmp_path / "r.sqlite").load()}
    assert loaded["t"] == new and loaded["gone"].deleted


def test_interest_path_skips_retained_copies_except_shared_deliveries() -> None:
    from sidecar.routing.forwarder import AckLocal, Forwarder, LocalCopy, QueueEnvelope
    from sidecar.routing.interest import InterestSnapshot, RemoteInterest
    from sidecar.routing.table import InterestKey

    interest = RemoteInterest()
    interest.apply_snapshot("n2", InterestSnapshot(1, frozenset(
        {InterestKey.parse("r/#"), InterestKey.parse("$share/g/r/#")})))
    sids = interest.local_subscriptions()
    fwd = Forwarder("n1", 1, interest, HybridClock())
    plain = fwd.on_copy(LocalCopy(1, "r/x", b"v", 1, True, subscription_ids=(sids["r/#"],)), 1)
    assert plain == [AckLocal(1, 1)], "the retained path delivers it to plain subscribers"
    shared = fwd.on_copy(LocalCopy(2, "r/x", b"v", 1, True,
                                   subscription_ids=(sids["$share/g/r/#"],)), 1)
    (queued,) = [a for a in shared if isinstance(a, QueueEnvelope)]
    assert queued.envelope.shared_group == "g", "the group's one delivery still goes"


def test_a_qos2_write_not_stored_yet_is_read_again_before_it_counts_as_overwritten() -> None:
    rep = _replicator()
    persist, reinject = rep.on_remote([RetainedEntry("t", T0 << 16, "n2", b"old")], T0)
    rep.on_reinjected([reinject.token])
    assert rep.on_local([LocalWrite("t", b"new", 2)], T0) == [ReadBack(("t",))]
    # Mosquitto still holds the old value: the client's PUBREL has not arrived yet
    assert rep.on_read(["t"], {"t": ReadValue(b"old")}, T0 + 1) == [RetryRead(("t",), 0.1)]
    assert rep.on_retry(["t"]) == [ReadBack(("t",))]
    actions = rep.on_read(["t"], {"t": ReadValue(b"new")}, T0 + 2)
    assert [type(a) for a in actions] == [Persist, Broadcast]
    assert rep.index.get("t").payload == b"new" and rep.busy_topics() == 0


def test_the_write_mosquitto_holds_is_accepted_last() -> None:
    """A client pipelines a QoS 2 then a QoS 1 write: Mosquitto stores the QoS 2 one at its
    PUBREL, last. Whichever the read finds, the index ends with what Mosquitto holds."""
    for seen_first in (b"q1", b"q2"):
        rep = _replicator()
        rep.on_local([LocalWrite("t", b"q2", 2), LocalWrite("t", b"q1", 1)], T0)
        actions = rep.on_read(["t"], {"t": ReadValue(seen_first)}, T0)
        if seen_first == b"q1":  # PUBREL still to come: q1 now, q2 when a read finds it
            assert isinstance(actions[-1], RetryRead)
            rep.on_retry(["t"])
            rep.on_read(["t"], {"t": ReadValue(b"q2")}, T0 + 100)
        assert rep.index.get("t").payload == b"q2" and rep.busy_topics() == 0


def test_reinjections_of_one_topic_go_one_at_a_time() -> None:
    rep = _replicator()
    e1 = RetainedEntry("t", (T0 << 16) + 1, "n2", b"1", qos=2)
    e2 = RetainedEntry("t", (T0 << 16) + 2, "n3", b"2", qos=1)
    first = rep.on_remote([e1], T0)[-1]
    assert rep.on_remote([e2], T0) == [Persist((e2,))]  # waits: QoS 2 is stored at PUBREL
    (second,) = rep.on_reinjected([first.token])
    assert isinstance(second, Reinject) and second.entry == e2
    rep.on_reinjected([second.token])
    assert rep.busy_topics() == 0


def _wall(ms: int) -> int:
    """An HLC whose wall time is `ms`."""
    return ms << 16


dated = st.builds(
    RetainedEntry,
    topic=st.sampled_from(["a", "a/b", "c/d/e", "x", "y/z"]),
    hlc=st.integers(1, 40).map(_wall),
    origin=st.sampled_from(["n1", "n2"]),
    payload=st.just(b"v"),
    deleted=st.booleans(),
    expires_at_ms=st.one_of(st.none(), st.integers(1, 60)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(dated, max_size=30), st.integers(0, 50), st.randoms())
def test_purge_keeps_digests_equal_to_an_index_of_the_survivors(items, horizon, rnd) -> None:
    """Purging is the same on every node: two nodes with the same entries, purged at the same
    horizon in any order of merges, agree; and their digest is that of the survivors."""
    items = _unique_versions(items)
    a = RetainedIndex(items)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    b = RetainedIndex(shuffled)
    gone = a.purge(horizon, busy=lambda topic: False)
    b.purge(horizon, busy=lambda topic: False)
    assert a.digest() == b.digest()
    survivors = list(a)
    assert RetainedIndex(survivors).digest() == a.digest()
    for entry in gone:  # only values dead since before the horizon go
        if entry.deleted:  # a tombstone is dead from its write
            assert entry.hlc >> 16 < horizon
        else:
            assert entry.expires_at_ms is not None and entry.expires_at_ms < horizon
    for entry in survivors:
        if entry.deleted:
            assert entry.hlc >> 16 >= horizon
        else:
            assert entry.expires_at_ms is None or entry.expires_at_ms >= horizon


def test_a_purged_tombstone_is_not_taken_back_and_busy_topics_wait() -> None:
    index = RetainedIndex()
    index.merge(RetainedEntry("gone", _wall(10), "n1", deleted=True))
    index.merge(RetainedEntry("busy", _wall(10), "n1", deleted=True))
    index.merge(RetainedEntry("kept", _wall(10), "n1", b"live value"))
    gone = index.purge(20, busy=lambda topic: topic == "busy")
    assert [e.topic for e in gone] == ["gone"]
    assert sorted(e.topic for e in index) == ["busy", "kept"]
    # a peer that has not purged yet sends it back (anti-entropy): refused
    assert not index.merge(RetainedEntry("gone", _wall(10), "n1", deleted=True))
    # a newer write of the topic is a new value
    assert index.merge(RetainedEntry("gone", _wall(30), "n2", b"back"))
    assert index.purge(20, busy=lambda topic: False)[0].topic == "busy"


def test_the_store_forgets_purged_rows(tmp_path: Path) -> None:
    store = SqliteRetainedStore(tmp_path / "r.sqlite")
    old = RetainedEntry("t", _wall(10), "n1", deleted=True)
    store.save([old, RetainedEntry("u", _wall(10), "n1", b"v")])
    store.forget([old, RetainedEntry("u", _wall(9), "n1", deleted=True)])  # u: another version
    assert [e.topic for e in store.load()] == ["u"]
    store.close()


def test_entries_no_node_makes_are_dropped_and_counted() -> None:
    """A peer's entry Mosquitto would refuse (or drop the sidecar's connection for), with an
    HLC SQLite cannot hold, or without an origin, changes nothing (found by fuzzing)."""
    rep = _replicator()
    bad = [RetainedEntry("a/+", T0 << 16, "n2", b"x"), RetainedEntry("", T0 << 16, "n2", b"x"),
           RetainedEntry("a\x01", T0 << 16, "n2", b"x"),
           RetainedEntry("$mqfed/read-sentinel", T0 << 16, "n2"),
           RetainedEntry("t", T0 << 16, "n2", b"x", qos=3),
           RetainedEntry("t", 1 << 63, "n2", b"x"), RetainedEntry("t", 0, "n2", b"x"),
           RetainedEntry("t", T0 << 16, "", b"x"),
           RetainedEntry("t", T0 << 16, "n2", b"x", properties=MessageProperties(
               correlation_data=b"c" * 70_000)),
           RetainedEntry("t", T0 << 16, "n2", b"x", properties=MessageProperties(
               response_topic="r/#")),
           RetainedEntry("t", T0 << 16, "n2", b"x", properties=MessageProperties(
               user=(("k", "\uffff"),)))]
    assert rep.on_remote(bad, T0) == []
    assert rep.counters["remote_invalid"] == len(bad) and len(rep.index) == 0
    good = RetainedEntry("t", T0 << 16, "n2", b"x")
    assert rep.on_remote([good], T0)[0] == Persist((good,))


def test_a_version_this_node_refused_is_not_asked_for_again() -> None:
    """A peer holding an entry this node refuses (invalid) keeps a differing digest; the
    exchanges go on, but that version is not pulled again, a newer one of the topic is."""
    bad = RetainedEntry("bad/+", 50, "n2", b"x")  # a wildcard: no node makes one
    a = AntiEntropy(RetainedIndex())
    a.on_peer_up("B")
    (digest,) = a.poll(T0)
    assert a.on_versions("B", digest.exchange, [1], [("bad/+", bad.version)], T0) \
        == [SendRequest("B", digest.exchange, ("bad/+",))]
    a.on_refused("bad/+", bad.version)
    a.on_entries_done("B", digest.exchange, T0)
    (digest,) = a.poll(T0 + a.interval_ms + 1)
    assert a.on_versions("B", digest.exchange, [1], [("bad/+", bad.version)], T0) == []
    assert a.counters["refused_skipped"] == 1
    newer = RetainedEntry("bad/+", 60, "n2", b"y").version
    (digest,) = a.poll(T0 + 2 * a.interval_ms + 2)
    assert a.on_versions("B", digest.exchange, [1], [("bad/+", newer)], T0) \
        == [SendRequest("B", digest.exchange, ("bad/+",))]
