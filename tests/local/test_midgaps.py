"""The forwarding client's recovery of copies Mosquitto dropped: each copy taken exactly once,
in publish order; only ids Mosquitto never kept are counted as lost."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.local.midgaps import GIVE_UP, MID_SPACE, RECOVERY_INTERVAL, CopyTracker, Verdict


def test_ids_in_order_are_taken_and_wrap_around_is_not_a_gap():
    tracker = CopyTracker()
    for mid in [MID_SPACE - 1, MID_SPACE, 1, 2]:
        assert tracker.on_copy(mid, 1, False, 0.0) is Verdict.TAKE
    assert not tracker.holding and tracker.dropped_seen == 0


def test_a_gap_holds_what_follows_until_the_reconnect_resends_it_in_order():
    tracker = CopyTracker()
    assert tracker.on_copy(1, 1, False, 0.0) is Verdict.TAKE
    tracker.on_ack(1)
    assert tracker.on_copy(2, 1, False, 0.0) is Verdict.TAKE  # held, not yet acked
    assert tracker.on_copy(5, 1, False, 0.0) is Verdict.HOLD  # 3 and 4 were dropped
    assert tracker.on_copy(6, 1, False, 0.0) is Verdict.HOLD
    assert tracker.dropped_seen == 2
    assert tracker.should_recover(1.0) and not tracker.should_recover(1.0)
    tracker.on_connect()
    assert tracker.on_copy(2, 1, True, 1.1) is Verdict.SKIP  # we hold it
    assert [tracker.on_copy(m, 1, True, 1.1) for m in (3, 4, 5, 6)] == [Verdict.TAKE] * 4
    assert tracker.on_copy(7, 1, False, 1.1) is Verdict.TAKE
    assert not tracker.holding


def test_a_resent_copy_already_acknowledged_is_acknowledged_again_not_taken():
    tracker = CopyTracker()
    tracker.on_copy(1, 1, False, 0.0)
    tracker.on_ack(1)  # the PUBACK was lost in the reconnect
    tracker.on_connect()
    assert tracker.on_copy(1, 1, True, 0.0) is Verdict.REACK


def test_acknowledged_ids_missing_from_a_replay_are_not_losses():
    tracker = CopyTracker()
    for mid in range(1, 6):
        tracker.on_copy(mid, 1, False, 0.0)
    tracker.on_ack(2)
    tracker.on_ack(3)
    tracker.on_connect()
    assert [tracker.on_copy(m, 1, True, 0.0) for m in (1, 4, 5)] == [Verdict.SKIP] * 3
    assert not tracker.holding


def test_a_tail_drop_is_found_by_the_probe_after_a_quiet_period():
    tracker = CopyTracker()
    tracker.on_copy(1, 1, False, 10.0)
    assert not tracker.should_probe(10.2)
    assert tracker.should_probe(10.6) and not tracker.should_probe(10.7)
    tracker.on_probe(4)  # 2 and 3 never came
    assert tracker.holding and tracker.dropped_seen == 2
    assert not tracker.should_probe(10.9)
    assert tracker.should_probe(11.2)  # still missing: probe again until resent or given up


def test_an_unanswered_probe_is_sent_again():
    tracker = CopyTracker()
    tracker.on_copy(1, 1, False, 0.0)
    assert tracker.should_probe(1.0)
    assert not tracker.should_probe(2.0)
    assert tracker.should_probe(3.1)


def test_an_id_never_resent_is_counted_lost_after_the_retries_and_stops_holding():
    tracker = CopyTracker()
    tracker.on_copy(1, 1, False, 0.0)
    tracker.on_ack(1)
    now = 0.0
    for _ in range(GIVE_UP + 2):
        assert tracker.on_copy(3, 1, False, now) is Verdict.HOLD  # 2 is gone for good
        now += 2 * RECOVERY_INTERVAL
        assert tracker.should_recover(now)
        tracker.on_connect()
        tracker.on_copy(1, 1, True, now)  # the replay starts at what is still in flight
        tracker.on_copy(3, 1, True, now)
        if not tracker.holding:
            break
    assert tracker.lost == 1 and not tracker.holding
    assert tracker.on_copy(4, 1, False, now) is Verdict.TAKE


def test_qos0_copies_are_always_taken():
    tracker = CopyTracker()
    tracker.on_copy(1, 1, False, 0.0)
    tracker.on_copy(9, 1, False, 0.0)
    assert tracker.on_copy(0, 0, False, 0.0) is Verdict.TAKE


class Mosquitto:
    """Mosquitto's outgoing side for one persistent client, with packets dropped at will (one
    packet fewer than `GIVE_UP` times: a resend starts the write queue, so it goes through)."""

    def __init__(self) -> None:
        self.in_flight: list[int] = []  # ids routed to the client and not acknowledged
        self.drops: dict[int, int] = {}

    def send(self, mid: int, dropped: bool, dup: bool, out: list) -> None:
        if not dup:
            self.in_flight.append(mid)
        if dropped and self.drops.get(mid, 0) < GIVE_UP:
            self.drops[mid] = self.drops.get(mid, 0) + 1
        else:
            out.append((mid, dup))

    def reconnect(self, drops, out: list) -> None:
        for mid in list(self.in_flight):
            self.send(mid, next(drops, False), True, out)


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 300), drops=st.lists(st.booleans(), max_size=900),
       lost_acks=st.lists(st.booleans(), max_size=900), start=st.sampled_from([1, 65400]))
def test_with_any_dropped_packets_every_copy_is_taken_once_in_order(count, drops, lost_acks,
                                                                     start):
    """Packets dropped anywhere (first sends, probes, resends) and PUBACKs lost in reconnects:
    probing and reconnecting as told, every copy is taken exactly once, in order."""
    broker, tracker = Mosquitto(), CopyTracker()
    tracker.on_connect(session_present=False)
    drop_iter, ack_iter = iter(drops), iter(lost_acks)
    taken: list[int] = []
    probes: set[int] = set()
    now = 0.0

    def receive(wire: list) -> None:
        for mid, dup in wire:
            if mid in probes:
                tracker.on_probe(mid)
                verdict = Verdict.REACK
            else:
                verdict = tracker.on_copy(mid, 1, dup, now)
            if verdict is Verdict.TAKE:
                taken.append(mid)
            if verdict in (Verdict.TAKE, Verdict.REACK):
                tracker.on_ack(mid)
                if not next(ack_iter, False) and mid in broker.in_flight:  # PUBACK arrives
                    broker.in_flight.remove(mid)
        wire.clear()

    ids = [(start - 1 + k) % MID_SPACE + 1 for k in range(count + 200)]
    wire: list = []
    for k, mid in enumerate(ids[:count]):
        broker.send(mid, k > 0 and next(drop_iter, False), False, wire)  # (the first: a base)
        receive(wire)
    next_id = iter(ids[count:])
    for _ in range(200):
        now += 1.0
        if tracker.should_recover(now):
            tracker.on_connect()
            broker.reconnect(drop_iter, wire)
            receive(wire)
        elif not tracker.holding and not broker.in_flight and len(taken) == count:
            break
        else:  # a probe: the next id
            probe = next(next_id)
            probes.add(probe)
            broker.send(probe, next(drop_iter, False), False, wire)
            receive(wire)
    assert taken == ids[:count]
    assert tracker.lost == 0
