"""Forwarder: one envelope per peer per message, local ack only when every peer settled."""

from __future__ import annotations

from sidecar.hlc import HybridClock, Timestamp
from sidecar.routing.forwarder import (
    LOCAL,
    AckLocal,
    DeliverLocalShared,
    Forwarder,
    LocalCopy,
    QueueEnvelope,
    SendEnvelope,
)
from sidecar.routing.interest import InterestSnapshot, RemoteInterest
from sidecar.routing.table import InterestKey


def _setup(**peers: list[str]) -> tuple[Forwarder, dict[str, int]]:
    interest = RemoteInterest()
    for peer, filters in peers.items():
        keys = frozenset(InterestKey.parse(f) for f in filters)
        interest.apply_snapshot(peer, InterestSnapshot(1, keys))
    return Forwarder("n1", 7, interest, HybridClock()), interest.local_subscriptions()


def test_qos1_waits_for_every_target_peer():
    fwd, sids = _setup(n2=["a/#"], n3=["a/+"], n4=["b/#"])
    copy = LocalCopy(mid=11, topic="a/x", payload=b"p", qos=1, retain=False,
                     subscription_ids=(sids["a/#"],))
    actions = fwd.on_copy(copy, wall_ms=1000)
    queued = [a for a in actions if isinstance(a, QueueEnvelope)]
    assert sorted(a.peer for a in queued) == ["n2", "n3"]
    env = queued[0].envelope
    assert (env.origin_node, env.origin_incarnation, env.origin_seq) == ("n1", 7, 1)
    assert not any(isinstance(a, AckLocal) for a in actions)
    assert fwd.on_settled("n2", [1]) == []
    assert fwd.on_settled("n3", [1]) == [AckLocal(11, 1)]
    assert fwd.pending == 0


def test_overlapping_filters_forward_once():
    fwd, sids = _setup(n2=["a/#", "a/+"])
    first = fwd.on_copy(LocalCopy(1, "a/x", b"", 0, False, subscription_ids=(sids["a/#"],)), 1)
    second = fwd.on_copy(LocalCopy(2, "a/x", b"", 0, False, subscription_ids=(sids["a/+"],)), 1)
    sends = [a for a in first + second if isinstance(a, SendEnvelope)]
    assert len(sends) == 1 and sends[0].peer == "n2"
    assert AckLocal(1, 0) in first and AckLocal(2, 0) in second


def test_copy_nobody_wants_is_acked_at_once():
    fwd, sids = _setup(n2=["a/#"])
    actions = fwd.on_copy(LocalCopy(5, "zzz", b"", 2, False, subscription_ids=(999,)), 1)
    assert actions == [AckLocal(5, 2)]
    assert fwd.skipped == 1


def test_shared_copy_goes_to_one_peer_and_one_no_peer_takes_to_a_local_member():
    fwd, sids = _setup(n2=["$share/g/job/#"], n3=["$share/g/job/#"])
    sid = sids["$share/g/job/#"]
    picked = []
    for mid in range(4):
        actions = fwd.on_copy(LocalCopy(mid, "job/1", b"", 1, False, subscription_ids=(sid,)), 1)
        queued = [a for a in actions if isinstance(a, QueueEnvelope)]
        assert len(queued) == 1 and queued[0].envelope.shared_group == "g"
        picked.append(queued[0].peer)
    assert set(picked) == {"n2", "n3"}
    # the group went away while Mosquitto picked the forwarding client for copies on their
    # way: Mosquitto would have given them to another member; a local one takes them, and
    # the copy is acknowledged once it has (a plain stale copy is just acknowledged)
    fwd.interest.remove_peer("n2")
    fwd.interest.remove_peer("n3")
    actions = fwd.on_copy(LocalCopy(9, "job/1", b"x", 1, False, subscription_ids=(sid,)), 1)
    assert [(type(a), a.envelope.shared_group, a.envelope.shared_filter) for a in actions] == [
        (DeliverLocalShared, "g", "job/#")]
    seq = actions[0].envelope.origin_seq
    assert fwd.on_settled(LOCAL, [seq]) == [AckLocal(9, 1)]
    zero = fwd.on_copy(LocalCopy(10, "job/1", b"", 0, False, subscription_ids=(sid,)), 1)
    assert [type(a) for a in zero] == [DeliverLocalShared, AckLocal]
    assert fwd.local_shared == 2


def test_shared_copy_prefers_peers_whose_stream_is_up():
    fwd, sids = _setup(n2=["$share/g/job/#"], n3=["$share/g/job/#"])
    sid = sids["$share/g/job/#"]
    for mid in range(4):
        actions = fwd.on_copy(LocalCopy(mid, "job/1", b"", 1, False, subscription_ids=(sid,)), 1,
                              down={"n2"})
        assert [a.peer for a in actions if isinstance(a, QueueEnvelope)] == ["n3"]
    # every holder down: still queued for one of them (it is durable in that peer's queue)
    actions = fwd.on_copy(LocalCopy(9, "job/1", b"", 1, False, subscription_ids=(sid,)), 1,
                          down={"n2", "n3"})
    assert len([a for a in actions if isinstance(a, QueueEnvelope)]) == 1
    assert not any(isinstance(a, DeliverLocalShared) for a in actions)


def test_peer_removed_releases_waiting_acks_and_seqs_increase():
    fwd, sids = _setup(n2=["t"], n3=["t"])
    for mid in (1, 2):
        fwd.on_copy(LocalCopy(mid, "t", b"", 1, False, subscription_ids=(sids["t"],)), mid)
    assert fwd.waiting_for("n3") == [1, 2]
    fwd.on_settled("n2", [1, 2])
    assert fwd.on_peer_removed("n3") == [AckLocal(1, 1), AckLocal(2, 1)]


def test_rejected_shared_delivery_moves_to_another_holder_then_local():

    fwd, sids = _setup(n2=["$share/g/job/#", "job/#"], n3=["$share/g/job/#"])
    shared = sids["$share/g/job/#"]
    actions = fwd.on_copy(LocalCopy(7, "job/1", b"x", 1, False, subscription_ids=(shared,)), 1)
    (first,) = [a for a in actions if isinstance(a, QueueEnvelope)]
    other = {"n2": "n3", "n3": "n2"}[first.peer]
    plain = fwd.on_copy(LocalCopy(8, "job/1", b"y", 1, False, subscription_ids=(sids["job/#"],)),
                        1)
    assert [a.peer for a in plain if isinstance(a, QueueEnvelope)] == ["n2"]
    (moved,) = fwd.on_rejected(first.peer, 1)
    assert isinstance(moved, QueueEnvelope) and moved.peer == other
    assert moved.envelope.origin_seq == 3, "a new seq: each peer's queue takes increasing seqs"
    assert moved.envelope.payload == b"x" and moved.envelope.shared_group == "g"
    assert fwd.on_settled(first.peer, [1]) == [], "the first peer no longer counts"
    assert fwd.on_settled("n2", [2]) == [AckLocal(8, 1)]  # the plain copy is independent
    local = fwd.on_rejected(other, 3)
    assert local == [DeliverLocalShared(moved.envelope)]
    assert fwd.on_settled(LOCAL, [3]) == [AckLocal(7, 1)]
    assert fwd.pending == 0


def test_same_peer_owing_two_seqs_of_one_copy():
    """A copy sent plain to n3 (seq 1) and re-routed as a shared delivery to n3 (seq 2): the
    local ack waits for both."""
    fwd, sids = _setup(n2=["$share/g/t"], n3=["$share/g/t", "t"])
    acts = fwd.on_copy(LocalCopy(5, "t", b"", 1, False,
                                 subscription_ids=(sids["t"], sids["$share/g/t"])), 1)
    queued = sorted((a.peer, a.envelope.shared_group) for a in acts
                    if isinstance(a, QueueEnvelope))
    assert queued == [("n2", "g"), ("n3", None)]  # the group's first pick (seed 0) is n2
    (moved,) = fwd.on_rejected("n2", 1)
    assert moved.peer == "n3" and moved.envelope.origin_seq == 2
    assert fwd.on_settled("n3", [1]) == []
    assert fwd.on_settled("n3", [2]) == [AckLocal(5, 1)]


def test_rejected_plain_delivery_just_settles():
    fwd, sids = _setup(n2=["t"])
    fwd.on_copy(LocalCopy(3, "t", b"", 1, False, subscription_ids=(sids["t"],)), 1)
    assert fwd.on_rejected("n2", 1) == [AckLocal(3, 1)]


def test_lost_local_session_never_acks_stale_packet_ids():
    fwd, sids = _setup(n2=["t"])
    fwd.on_copy(LocalCopy(41, "t", b"", 1, False, subscription_ids=(sids["t"],)), 1)
    assert fwd.forget_local_acks() == 1
    assert fwd.on_settled("n2", [1]) == []
    assert fwd.pending == 0


def test_shared_delivery_settled_as_durable_is_still_rerouted_when_rejected():
    fwd, sids = _setup(n2=["$share/g/job"], n3=["$share/g/job"])
    acts = fwd.on_copy(LocalCopy(9, "job", b"z", 1, False,
                                 subscription_ids=(sids["$share/g/job"],)), 1)
    (first,) = [a for a in acts if isinstance(a, QueueEnvelope)]
    # the peer is away: the message sits durably in its queue, the local ack goes out
    assert fwd.on_settled(first.peer, [1], acked=False) == [AckLocal(9, 1)]
    # it comes back with no member left: the delivery moves on instead of being lost
    (moved,) = fwd.on_rejected(first.peer, 1)
    assert isinstance(moved, QueueEnvelope) and moved.peer != first.peer
    assert moved.envelope.payload == b"z"
    assert fwd.on_settled(moved.peer, [moved.envelope.origin_seq]) == []


def test_a_shard_s_lost_session_forgets_only_its_copies_acks():
    """Copies of forwarding shard 1 carry ids 65536 + packet id (sidecar.local.shards): a
    new session of shard 1 voids its acks, shard 0's still go out."""
    fwd, sids = _setup(n2=["t", "u"])
    fwd.on_copy(LocalCopy(41, "t", b"", 1, False, subscription_ids=(sids["t"],)), 1)
    fwd.on_copy(LocalCopy(65536 + 41, "u", b"", 1, False, subscription_ids=(sids["u"],)), 1)
    assert fwd.forget_local_acks(range(65536, 2 * 65536)) == 1
    assert fwd.on_settled("n2", [1, 2]) == [AckLocal(41, 1)]
    assert fwd.pending == 0


def test_a_cut_goes_to_each_peer_under_one_seq_at_its_clients_connect_time():
    fwd, _ = _setup(n2=["a/#"])
    seq, actions = fwd.cut("dev", ["n2", "n3"], 5_000, connect_ms=4_990)
    assert [a.peer for a in actions] == ["n2", "n3"]
    assert {(a.envelope.origin_seq, a.envelope.first_seq, a.envelope.cut_client)
            for a in actions} == {(seq, seq, "dev")}
    assert {a.envelope.hlc for a in actions} == {Timestamp(4_990).pack()}
    seq2, actions = fwd.cut("dev", [], 5_000)  # the old copy's own (it goes with its queue)
    assert (seq2, actions) == (seq + 1, [])
    _, (action,) = fwd.cut("dev", ["n2"], 6_000)  # without a connect time (an older plugin)
    assert action.envelope.hlc >> 16 == 6_000


def test_a_captured_message_goes_once_to_every_peer_with_matching_plain_interest():
    """A record the plugin captured (one per message, no subscription identifiers) goes to
    every peer whose plain filters match, never to a shared group's holder (shared picks
    keep the copies' path), with its publisher named for No Local over there."""
    fwd, _ = _setup(n2=["a/#", "a/+"], n3=["a/x"], n4=["$share/g/a/#"], n5=["b/#"])
    copy = LocalCopy(3, "a/x", b"p", 1, False, publisher="dev-1", captured=True)
    actions = fwd.on_copy(copy, 1)
    queued = [a for a in actions if isinstance(a, QueueEnvelope)]
    assert sorted(a.peer for a in queued) == ["n2", "n3"]
    assert {a.envelope.publisher for a in queued} == {"dev-1"}
    assert fwd.on_settled("n2", [1]) == [] and fwd.on_settled("n3", [1]) == [AckLocal(3, 1)]
    assert fwd.on_copy(LocalCopy(4, "c/x", b"", 0, False, captured=True), 1) == [
        AckLocal(4, 0)]
