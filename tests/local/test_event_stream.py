"""EventStream: ordering, duplicates, gaps, epochs, snapshots, resume and ack pacing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.local.event_stream import (
    Apply,
    EventStream,
    LoadSnapshot,
    RequestResume,
    RequestSnapshot,
    SendAck,
)
from sidecar.local.events import Heartbeat, Snapshot

E1, E2, E3 = "e1" * 8, "e2" * 8, "e3" * 8


def ev(seq: int, epoch: str = E1) -> Heartbeat:
    return Heartbeat(epoch, seq, 0, 0, 0, 0, 0)


def snap(seq: int, epoch: str = E1) -> Snapshot:
    return Snapshot(epoch, seq, ())


def synced(seq: int = 0, epoch: str = E1, **kw: float) -> EventStream:
    stream = EventStream(**kw)  # type: ignore[arg-type]
    assert stream.start() == [RequestSnapshot()]
    assert stream.on_snapshot(snap(seq, epoch)) == [LoadSnapshot(snap(seq, epoch)), SendAck(seq)]
    assert stream.in_sync and stream.epoch == epoch and stream.last_seq == seq
    return stream


def applied(actions: list) -> list[int]:
    return [a.event.seq for a in actions if isinstance(a, Apply)]


def test_start_requests_a_snapshot() -> None:
    stream = EventStream()
    assert stream.start() == [RequestSnapshot()]
    assert not stream.in_sync
    assert stream.stats()["resyncs"] == 1


def test_in_order_events_are_applied() -> None:
    stream = synced(5)
    assert stream.on_event(ev(6), 0.0) == [Apply(ev(6))]
    assert stream.on_event(ev(7), 0.0) == [Apply(ev(7))]
    assert stream.applied == 2 and stream.last_seq == 7


def test_duplicates_are_dropped_and_counted() -> None:
    stream = synced(5)
    stream.on_event(ev(6), 0.0)
    assert stream.on_event(ev(6), 0.0) == []
    assert stream.on_event(ev(3), 0.0) == []
    assert stream.duplicates == 2 and stream.applied == 1


def test_gap_requests_one_snapshot_and_buffers() -> None:
    stream = synced(5)
    assert stream.on_event(ev(8), 0.0) == [RequestSnapshot()]
    assert not stream.in_sync
    assert stream.on_event(ev(9), 0.0) == []  # not requested twice
    assert stream.on_event(ev(9), 0.0) == []  # duplicate in the buffer
    assert stream.gaps == 1 and stream.duplicates == 1 and stream.resyncs == 2
    actions = stream.on_snapshot(snap(7))
    assert actions == [LoadSnapshot(snap(7)), Apply(ev(8)), Apply(ev(9)), SendAck(9)]
    assert stream.in_sync and stream.last_seq == 9


def test_snapshot_drops_buffered_events_up_to_the_cut() -> None:
    stream = synced(5)
    stream.on_event(ev(8), 0.0)
    stream.on_event(ev(9), 0.0)
    stream.on_event(ev(10), 0.0)
    assert stream.on_snapshot(snap(9)) == [LoadSnapshot(snap(9)), Apply(ev(10)), SendAck(10)]
    assert stream.on_event(ev(11), 0.0) == [Apply(ev(11))]


def test_snapshot_cut_past_every_buffered_event() -> None:
    stream = synced(5)
    stream.on_event(ev(8), 0.0)
    assert stream.on_snapshot(snap(20)) == [LoadSnapshot(snap(20)), SendAck(20)]
    assert stream.on_event(ev(9), 0.0) == []  # republished, already in the snapshot
    assert stream.on_event(ev(21), 0.0) == [Apply(ev(21))]


def test_gap_inside_the_buffer_requests_another_snapshot() -> None:
    stream = synced(5)
    stream.on_event(ev(8), 0.0)
    stream.on_event(ev(9), 0.0)
    stream.on_event(ev(12), 0.0)
    actions = stream.on_snapshot(snap(7))
    assert actions == [
        LoadSnapshot(snap(7)),
        Apply(ev(8)),
        Apply(ev(9)),
        SendAck(9),
        RequestSnapshot(),
    ]
    assert not stream.in_sync and stream.gaps == 2
    assert stream.on_event(ev(13), 0.0) == []
    assert stream.on_snapshot(snap(11)) == [
        LoadSnapshot(snap(11)),
        Apply(ev(12)),
        Apply(ev(13)),
        SendAck(13),
    ]


def test_events_before_the_first_snapshot_are_buffered() -> None:
    stream = EventStream()
    stream.start()
    assert stream.on_event(ev(3), 0.0) == []
    assert stream.on_event(ev(4), 0.0) == []
    assert stream.on_snapshot(snap(3)) == [LoadSnapshot(snap(3)), Apply(ev(4)), SendAck(4)]


def test_new_epoch_while_in_sync_resyncs() -> None:
    stream = synced(50)
    assert stream.on_event(ev(1, E2), 0.0) == [RequestSnapshot()]
    assert not stream.in_sync and stream.gaps == 0
    stream.on_event(ev(2, E2), 0.0)
    assert stream.on_event(ev(51, E1), 0.0) == []  # old epoch: stale
    assert stream.stale == 1
    actions = stream.on_snapshot(snap(1, E2))
    assert actions == [LoadSnapshot(snap(1, E2)), Apply(ev(2, E2)), SendAck(2)]
    assert stream.epoch == E2


def test_stale_snapshot_of_an_older_epoch_is_requested_again() -> None:
    stream = synced(5)
    stream.on_event(ev(9), 0.0)  # gap: snapshot requested from the E1 plugin
    stream.on_event(ev(1, E2), 0.0)  # the broker restarted meanwhile
    assert stream.on_snapshot(snap(9)) == [RequestSnapshot()]
    assert stream.stale == 1 and not stream.in_sync
    assert stream.on_snapshot(snap(1, E2))[0] == LoadSnapshot(snap(1, E2))
    assert stream.in_sync and stream.epoch == E2


def test_snapshot_of_a_new_epoch_retires_buffered_old_events() -> None:
    stream = synced(5)
    stream.on_event(ev(9), 0.0)
    assert stream.on_snapshot(snap(3, E2)) == [LoadSnapshot(snap(3, E2)), SendAck(3)]
    assert stream.on_event(ev(10), 0.0) == []  # late event of the retired epoch
    assert stream.stale == 1
    assert stream.on_event(ev(4, E2), 0.0) == [Apply(ev(4, E2))]


def test_epoch_change_never_acks_old_seqs() -> None:
    stream = synced(5, ack_every=100, ack_interval=0.05)
    stream.on_event(ev(6), 0.0)
    stream.on_event(ev(1, E2), 0.0)
    assert stream.on_tick(10.0) == []


def test_outdated_snapshot_while_in_sync_is_ignored() -> None:
    stream = synced(5)
    stream.on_event(ev(6), 0.0)
    assert stream.on_snapshot(snap(6)) == []
    assert stream.on_snapshot(snap(4)) == []
    assert stream.stale == 2 and stream.last_seq == 6
    assert stream.on_snapshot(snap(8)) == [LoadSnapshot(snap(8)), SendAck(8)]


def test_ack_every_n_events() -> None:
    stream = synced(0, ack_every=3)
    out = []
    for seq in range(1, 8):
        out += stream.on_event(ev(seq), 0.0)
    assert [a for a in out if isinstance(a, SendAck)] == [SendAck(3), SendAck(6)]


def test_ack_after_interval_on_tick() -> None:
    stream = synced(0, ack_every=100, ack_interval=0.05)
    assert stream.on_tick(1.0) == []  # nothing pending
    stream.on_event(ev(1), 1.00)
    stream.on_event(ev(2), 1.03)
    assert stream.on_tick(1.04) == []
    assert stream.on_tick(1.05) == [SendAck(2)]
    assert stream.on_tick(2.0) == []
    stream.on_event(ev(3), 2.0)
    assert stream.on_tick(2.06) == [SendAck(3)]


def test_ack_every_resets_the_timer() -> None:
    stream = synced(0, ack_every=2, ack_interval=0.05)
    stream.on_event(ev(1), 0.0)
    assert stream.on_event(ev(2), 0.01) == [Apply(ev(2)), SendAck(2)]
    assert stream.on_tick(1.0) == []


def test_link_reconnected_in_sync_resumes() -> None:
    stream = synced(5)
    stream.on_event(ev(6), 0.0)
    assert stream.on_link_reconnected() == [RequestResume(7), SendAck(6)]
    assert stream.on_event(ev(6), 0.0) == []  # redelivered
    assert stream.on_event(ev(7), 0.0) == [Apply(ev(7))]
    assert stream.on_resumed(E1) == []


def test_link_reconnected_fresh_resume_without_ack() -> None:
    stream = synced(0)
    assert stream.on_link_reconnected() == [RequestResume(1)]


def test_link_reconnected_out_of_sync_requests_again() -> None:
    stream = EventStream()
    stream.start()
    assert stream.on_link_reconnected() == [RequestSnapshot()]  # the first one may be lost


def test_resume_failed_requests_snapshot_once() -> None:
    stream = synced(5)
    stream.on_link_reconnected()
    assert stream.on_resume_failed() == [RequestSnapshot()]
    assert not stream.in_sync
    assert stream.on_resume_failed() == []
    assert stream.on_event(ev(9), 0.0) == []
    assert stream.on_snapshot(snap(8)) == [LoadSnapshot(snap(8)), Apply(ev(9)), SendAck(9)]


def test_resumed_into_another_epoch_resyncs() -> None:
    stream = synced(5)
    stream.on_link_reconnected()
    assert stream.on_resumed(E2) == [RequestSnapshot()]


def test_snapshot_failed_asks_again() -> None:
    stream = EventStream()
    stream.start()
    assert stream.on_snapshot_failed() == [RequestSnapshot()]


def test_stats() -> None:
    stream = synced(5)
    stream.on_event(ev(6), 0.0)
    stats = stream.stats()
    assert stats["applied"] == 1 and stats["epoch"] == E1 and stats["seq"] == 6
    assert set(stats) >= {"applied", "duplicates", "gaps", "resyncs", "stale", "in_sync"}


# ---- property: whatever the delivery, the applied stream is exactly the plugin's -------------


@st.composite
def deliveries(draw: st.DrawFn) -> list[tuple[str, int]]:
    """The plugin's events 1..n of one or two epochs, with duplicates, replays and losses."""
    out: list[tuple[str, int]] = []
    for epoch in (E1, E2)[: draw(st.integers(1, 2))]:
        n = draw(st.integers(1, 30))
        nxt = 1
        while nxt <= n:
            kind = draw(st.sampled_from(["next"] * 5 + ["again", "lose"]))
            if kind == "again" and nxt > 1:
                out.append((epoch, draw(st.integers(1, nxt - 1))))
            elif kind == "lose":
                nxt += draw(st.integers(1, 3))
            else:
                out.append((epoch, nxt))
                nxt += 1
    return out


@settings(max_examples=150, deadline=None)
@given(deliveries(), st.integers(0, 1000))
def test_applied_stream_is_contiguous_from_each_snapshot(
    delivery: list[tuple[str, int]], salt: int
) -> None:
    stream = EventStream(ack_every=4)
    pending = len(stream.start()) == 1
    head: dict[str, int] = {}  # newest seq per epoch the plugin has published so far
    live = delivery[0][0] if delivery else E1
    state: tuple[str, int] | None = None  # (epoch, seq) reflected in the consumer's state

    def run(actions: list) -> None:
        nonlocal state, pending
        for action in actions:
            if isinstance(action, LoadSnapshot):
                state = (action.snapshot.epoch, action.snapshot.seq)
            elif isinstance(action, Apply):
                assert state is not None
                assert (action.event.epoch, action.event.seq) == (state[0], state[1] + 1)
                state = (state[0], state[1] + 1)
            elif isinstance(action, SendAck):
                assert state is not None and action.seq == state[1]
            elif isinstance(action, RequestSnapshot):
                assert not pending
                pending = True

    def answer() -> None:
        nonlocal pending
        pending = False
        cut = head.get(live, 0) + salt % 2  # the plugin may be ahead of what arrived
        head[live] = cut
        run(stream.on_snapshot(snap(cut, live)))

    for i, (epoch, seq) in enumerate(delivery):
        live = epoch
        head[epoch] = max(head.get(epoch, 0), seq)
        run(stream.on_event(ev(seq, epoch), float(i)))
        if pending and (i + salt) % 3 == 0:
            answer()
        run(stream.on_tick(float(i) + 0.5))
    if pending:
        answer()
    assert stream.in_sync and not pending
    assert state == (live, head.get(live, 0)) == (stream.epoch, stream.last_seq)
