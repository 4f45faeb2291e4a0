"""Catch-up core: the forwarder's ring of recent copies, planning, holding and replay order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar._proto import peer_pb2
from sidecar.hlc import HybridClock
from sidecar.local.events import Connect, ProtocolError, Subscribe
from sidecar.local.protocol import SIDECAR_USERNAME
from sidecar.message import MessageProperties
from sidecar.peering import envelopes as peer_frames
from sidecar.routing.catchup import (
    MAX_FILTERS,
    AskPlugin,
    CatchUp,
    Missed,
    RecentCopies,
    Release,
    Replay,
    missed_from_reply,
    split_missed,
)
from sidecar.routing.forwarder import AckLocal, Forwarder, LocalCopy, QueueEnvelope, SendEnvelope
from sidecar.routing.interest import InterestSnapshot, LocalInterest, RemoteInterest
from sidecar.routing.table import InterestAdded, InterestKey, InterestRemoved, SubscriptionTable

P = MessageProperties()
A = InterestKey(None, "a/#")
B = InterestKey(None, "b/1")
G = InterestKey("g", "s/#")


def _missed(t: int, topic: str, plain: bool = True, shared: tuple[int, ...] = ()) -> Missed:
    return Missed(t, topic, topic.encode(), 1, P, plain, shared)


def test_recent_copies_are_bounded_by_age_bytes_and_count():
    ring = RecentCopies(window_ms=100, max_bytes=1000, max_entries=3)
    for t in range(4):
        ring.add(1000 + t, "t", b"x", 1, P, frozenset({"n3"}))
    assert len(ring) == 3 and ring.evicted_ms == 1000
    ring.add(1200, "t", b"x", 1, P, frozenset())  # the others are older than the window
    assert len(ring) == 1 and ring.bytes == 2
    ring.add(1201, "t", b"y" * 1000, 1, P, frozenset())
    assert len(ring) == 0 and ring.bytes == 0


def test_recent_copies_missed_by_a_peer_from_its_time():
    ring = RecentCopies(window_ms=10_000, max_bytes=1 << 20)
    ring.add(100, "a/1", b"1", 1, P, frozenset({"n3"}))
    ring.add(200, "a/2", b"2", 0, P, frozenset({"n3"}))
    ring.add(300, "a/3", b"3", 1, P, frozenset({"n2", "n3"}))  # n2 had it
    ring.add(400, "b/1", b"4", 1, P, frozenset({"n3"}))
    got = ring.missed("n2", [("a/#", 150), ("b/1", 450)])
    assert [(c.topic, c.qos) for c in got] == [("a/2", 0)]
    assert [c.topic for c in ring.missed("n2", [("a/#", 0), ("b/#", 0)])] == ["a/1", "a/2", "b/1"]
    assert ring.missed("n2", []) == []


def test_plugin_reply_is_decoded_and_checked():
    fields = {"complete": False, "messages": [
        {"t": 5, "topic": "a/1", "payload": "eA==", "qos": 2, "plain": True, "shared": [1],
         "properties": {"user": [["k", "v"]], "response_topic": "r"}}]}
    missed, complete = missed_from_reply(fields)
    assert complete is False
    assert missed == [Missed(5, "a/1", b"x", 2, MessageProperties(user=(("k", "v"),),
                                                                  response_topic="r"),
                             True, (1,))]
    for bad in ({}, {"messages": [{"t": 1}]}, {"messages": [{**fields["messages"][0],
                                                              "payload": "!!"}]},
                {"messages": [{**fields["messages"][0], "shared": [-1]}]}):
        with pytest.raises(ProtocolError):
            missed_from_reply(bad)


def test_plan_asks_for_fresh_keys_from_their_time_minus_the_margin():
    cu = CatchUp(window_ms=1000, margin_ms=50, max_bytes=1 << 20)
    asks = cu.on_interest("n2", {A: 10_000, B: 10_010, G: 10_000}, subscribed={"$share/g/s/#"},
                          local_member=lambda key: False, wall_ms=10_020, now=0.0)
    assert len(asks) == 1 and asks[0].peer == "n2"
    assert asks[0].filters == (("a/#", 9950), ("b/1", 9960), ("$share/g/s/#", 9950))
    assert cu.waiting == {"n2": {asks[0].request}}


def test_shared_keys_only_for_a_group_new_here_without_local_members():
    cu = CatchUp(1000, 50, 1 << 20)
    assert cu.on_interest("n2", {G: 10_000}, set(), lambda k: False, 10_010, 0.0) == []
    assert cu.on_interest("n2", {G: 10_000}, {"$share/g/s/#"}, lambda k: True, 10_010, 0.0) == []
    assert cu.waiting == {}


def test_old_times_are_skipped_and_a_clock_ahead_is_counted():
    cu = CatchUp(1000, 50, 1 << 20)
    assert cu.on_interest("n2", {A: 8000, B: 0}, set(), lambda k: False, 10_000, 0.0) == []
    assert cu.counters["too_old"] == 1
    assert len(cu.on_interest("n2", {A: 10_500}, set(), lambda k: False, 10_000, 0.0)) == 1
    assert cu.counters["ahead"] == 1


def test_large_interest_goes_in_several_requests():
    cu = CatchUp(1000, 0, 1 << 20)
    fresh = {InterestKey(None, f"t/{i}"): 10_000 for i in range(MAX_FILTERS + 5)}
    asks = cu.on_interest("n2", fresh, set(), lambda k: False, 10_000, 0.0)
    assert [len(a.filters) for a in asks] == [MAX_FILTERS, 5]
    assert len(cu.waiting["n2"]) == 2


def test_replays_come_in_time_order_then_what_was_held():
    cu = CatchUp(1000, 50, 1 << 20)
    cu.recent.add(9900, "a/old", b"o", 1, P, frozenset({"n3"}))  # before the margin
    cu.recent.add(10_001, "a/r", b"r", 1, P, frozenset({"n3"}))   # went to n3 only
    cu.recent.add(10_002, "a/s", b"s", 1, P, frozenset({"n2", "n3"}))
    (ask,) = cu.on_interest("n2", {A: 10_000}, {"a/#"}, lambda k: False, 10_005, 0.0)
    assert not cu.hold("n3", "a/x", None, "to n3")
    assert not cu.hold("n2", "zz", None, "other topic")
    assert cu.hold("n2", "a/x", None, "held 1")
    assert cu.hold("n2", "a/y", None, "held 2")
    assert cu.held == 2
    out = cu.on_reply(ask.request, [_missed(10_000, "a/p"), _missed(10_003, "a/q")])
    assert [(type(a).__name__, getattr(a, "topic", None)) for a in out] == [
        ("Replay", "a/p"), ("Replay", "a/r"), ("Replay", "a/q"), ("Release", None)]
    assert out[-1] == Release("n2", ("held 1", "held 2"))
    assert all(a.peer == "n2" for a in out)
    assert cu.waiting == {} and cu.held == 0
    assert cu.counters["replayed_plugin"] == 2 and cu.counters["replayed_recent"] == 1
    assert cu.on_reply(ask.request, []) == []  # answered once


def test_shared_replays_name_their_group():
    cu = CatchUp(1000, 0, 1 << 20)
    (ask,) = cu.on_interest("n2", {A: 10_000, G: 10_000}, {"$share/g/s/#"}, lambda k: False,
                            10_000, 0.0)
    assert cu.hold("n2", "s/1", G, "shared held")
    assert not cu.hold("n2", "s/1", InterestKey("h", "s/#"), "another group")
    out = cu.on_reply(ask.request, [_missed(10_001, "s/1", plain=False, shared=(1, 0, 7))],
                      complete=False)
    assert out == [Replay("n2", "s/1", b"s/1", 1, P, G), Release("n2", ("shared held",))]
    assert cu.counters["incomplete"] == 1


def test_an_action_waits_for_every_request_it_followed():
    cu = CatchUp(1000, 0, 1 << 20)
    (first,) = cu.on_interest("n2", {A: 10_000}, set(), lambda k: False, 10_000, 0.0)
    assert cu.hold("n2", "a/b/1", None, "h1")
    (second,) = cu.on_interest("n2", {InterestKey(None, "a/b/#"): 10_000}, set(),
                               lambda k: False, 10_000, 0.0)
    assert cu.hold("n2", "a/b/2", None, "h2")  # follows both
    assert cu.hold("n2", "a/c", None, "h3")    # the first only
    assert cu.on_reply(first.request, []) == [Release("n2", ("h1", "h3"))]
    assert cu.on_reply(second.request, []) == [Release("n2", ("h2",))]


def test_unanswered_requests_release_at_their_deadline_and_peers_are_forgotten():
    cu = CatchUp(1000, 0, 1 << 20, timeout=3.0)
    cu.on_interest("n2", {A: 10_000}, set(), lambda k: False, 10_000, now=100.0)
    cu.hold("n2", "a/1", None, "held")
    assert cu.on_timer(102.9) == []
    assert cu.on_timer(103.0) == [Release("n2", ("held",))]
    assert cu.counters["failed"] == 1
    cu.on_interest("n3", {A: 10_000}, set(), lambda k: False, 10_000, now=0.0)
    cu.hold("n3", "a/1", None, "held")
    cu.forget("n3")
    assert cu.waiting == {} and cu.held == 0 and cu.on_timer(1e9) == []


def _forwarder(recent: RecentCopies | None = None) -> tuple[Forwarder, dict[str, int]]:
    interest = RemoteInterest()
    interest.apply_snapshot("n3", InterestSnapshot(1, frozenset({A})))
    interest.apply_snapshot("n4", InterestSnapshot(1, frozenset({G})))
    return Forwarder("n1", 7, interest, HybridClock(), recent), interest.local_subscriptions()


def test_forwarder_keeps_forwarded_copies_for_catch_up():
    ring = RecentCopies(10_000, 1 << 20)
    fwd, sids = _forwarder(ring)
    fwd.on_copy(LocalCopy(1, "a/1", b"x", 1, False, subscription_ids=(sids["a/#"],)), 1000)
    fwd.on_copy(LocalCopy(2, "a/2", b"x", 1, True, subscription_ids=(sids["a/#"],)), 1001)
    fwd.on_copy(LocalCopy(3, "s/1", b"x", 1, False, subscription_ids=(sids["$share/g/s/#"],)),
                1002)
    assert [(c.topic, c.peers) for c in ring.missed("n2", [("#", 0)])] == [
        ("a/1", frozenset({"n3"}))]  # not retained, not a shared delivery


def test_forwarder_replays_under_new_ids_without_local_acks():
    fwd, _ = _forwarder()
    q1 = fwd.replay("n2", "a/1", b"x", 1, P, 1000)
    q0 = fwd.replay("n2", "a/1", b"x", 0, P, 1000)
    shared = fwd.replay("n2", "s/1", b"x", 2, P, 1000, G)
    assert isinstance(q1, QueueEnvelope) and isinstance(q0, SendEnvelope)
    assert [a.envelope.origin_seq for a in (q1, q0, shared)] == [1, 2, 3]
    assert (shared.envelope.shared_group, shared.envelope.shared_filter) == ("g", "s/#")
    assert fwd.on_settled("n2", [1]) == [] and fwd.pending == 0
    # n2 has no member left: the shared replay moves to another holder of the group
    assert fwd.on_rejected("n2", 3) == [QueueEnvelope("n4", replace(shared.envelope,
                                                                     origin_seq=4))]


def test_renumbered_action_keeps_its_local_ack_waiting():
    fwd, sids = _forwarder()
    fwd.interest.apply_snapshot("n2", InterestSnapshot(1, frozenset({A})))
    actions = fwd.on_copy(LocalCopy(9, "a/1", b"x", 1, False,
                                    subscription_ids=(sids["a/#"],)), 1000)
    held = next(a for a in actions if isinstance(a, QueueEnvelope) and a.peer == "n2")
    fwd.replay("n2", "a/0", b"x", 1, P, 1000)  # seq 2
    moved = fwd.renumber(held)
    assert moved.peer == "n2" and moved.envelope.origin_seq == 3
    assert moved.envelope.topic == "a/1"
    assert fwd.on_settled("n3", [1]) == []
    assert fwd.on_settled("n2", [1]) == []  # the old seq no longer counts for n2
    assert fwd.on_settled("n2", [3]) == [AckLocal(9, 1)]
    assert fwd.pending == 0


def test_local_interest_sends_subscribe_times_of_added_keys():
    li = LocalInterest(keep_ms=1000)
    (d1,) = li.apply_chunked([InterestAdded(A, 5000), InterestAdded(B), InterestAdded(G, 5001)])
    assert d1.since == {A: 5000, G: 5001}  # B: unknown (a snapshot, a shadow)
    (d2,) = li.apply_chunked([InterestRemoved(A), InterestAdded(InterestKey(None, "c"), 6500)])
    assert d2.since == {InterestKey(None, "c"): 6500}
    (chunk,) = li.snapshot_chunks()
    assert chunk.since == {InterestKey(None, "c"): 6500}  # G's time is past keep_ms
    assert li.snapshot().since == chunk.since
    frame = peer_pb2.Frame.FromString(peer_frames.interest_delta_frame(d2))
    assert peer_frames.delta_from(frame.interest_delta).since == d2.since
    frame = peer_pb2.Frame.FromString(peer_frames.interest_snapshot_frame(chunk))
    assert peer_frames.snapshot_from(frame.interest_snapshot).since == chunk.since


def test_table_reports_when_a_key_was_first_subscribed():
    table = SubscriptionTable()
    for event in (Connect("e", 1, 0, "c1", "u", "mqtt5", True, 0, 60, False, None),
                  Connect("e", 2, 0, "shadow", SIDECAR_USERNAME, "mqtt5", True, 0, 60, False,
                          None)):
        table.apply(event)
    (added,) = table.apply(Subscribe("e", 3, 4242, "c1", "a/#", 1))
    assert added == InterestAdded(A) and added.at_ms == 4242
    assert table.apply(Subscribe("e", 4, 4243, "shadow", "a/#", 1)) == []
    (added,) = table.apply(Subscribe("e", 5, 4244, "shadow", "b/1", 1))
    assert added.at_ms is None  # the sidecar acting as a client: not a new subscription
    assert table.holds(A) and not table.holds(G)


def test_one_command_for_several_asks_is_answered_per_ask():
    """Asks waiting together go as one `catchup` command; its answer is split back: shared
    indexes rebased, `plain` for the asks whose plain filters match at or after their time."""
    a = AskPlugin(1, "p1", (("a/+", 100), ("$share/g/x", 100)))
    b = AskPlugin(2, "p2", (("a/b", 200), ("$share/h/y", 50), ("#", 300)))
    props = MessageProperties()
    early = Missed(150, "a/b", b"1", 1, props, True)  # a/+ since 100 wants it, a/b since 200 not
    late = Missed(250, "a/b", b"2", 1, props, True)  # both
    group = Missed(60, "y", b"3", 0, props, False, (3,))  # b's "$share/h/y"
    both = Missed(400, "x", b"4", 0, props, True, (1,))  # a's group, b's "#"
    taken = Missed(500, "a/c", b"5", 0, props, False)  # (a forwarding subscription took it)
    for_a, for_b = split_missed([a, b], [early, late, group, both, taken])
    assert for_a == [early, late, replace(both, plain=False, shared=(1,))]
    assert for_b == [late, replace(group, shared=(1,)), replace(both, shared=())]
    assert split_missed([a], [early, taken]) == [[early, taken]]  # one ask: as answered
