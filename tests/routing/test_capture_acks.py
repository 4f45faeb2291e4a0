"""CaptureAcks: which captured records are settled and acknowledged to the plugin."""

from sidecar.routing.capture_acks import CAPTURE_MID_BASE, MAX_LISTED, CaptureAcks


def test_records_are_acknowledged_only_once_settled_cumulatively_and_listed():
    acks = CaptureAcks()
    assert acks.on_hello(7) == (0, None)
    m1, m2, m3 = (acks.on_record(s) for s in (1, 2, 3))
    assert min(m1, m2, m3) >= CAPTURE_MID_BASE and len({m1, m2, m3}) == 3
    assert acks.take_ack() is None  # nothing settled yet
    assert acks.on_settled(m2)
    assert acks.take_ack() == (0, [2])  # 1 still waits for a peer: 2 listed
    assert acks.take_ack() is None
    assert acks.on_settled(m1)
    assert acks.take_ack() == (2, [])
    assert acks.on_settled(m3)
    assert acks.take_ack() == (3, [])
    assert not acks.on_settled(m3)  # once
    assert acks.pending == 0


def test_a_reconnect_resumes_after_the_settled_records_and_forwards_nothing_twice():
    acks = CaptureAcks()
    acks.on_hello(7)
    mids = {s: acks.on_record(s) for s in (1, 2, 3, 4)}
    acks.on_settled(mids[1])
    acks.on_settled(mids[3])
    acks.take_ack()
    # the socket broke (the ack may be lost); same epoch: resume after what is settled
    assert acks.on_hello(7) == (1, None)
    assert acks.on_record(2) is None  # pending: acked when it settles
    assert acks.on_record(3) is None  # settled: its ack is due again
    assert acks.take_ack() == (1, [3])
    assert acks.on_record(4) is None
    m5 = acks.on_record(5)
    assert m5 is not None
    acks.on_settled(mids[2])
    assert acks.take_ack() == (3, [])
    assert acks.duplicates == 3


def test_a_new_epoch_voids_the_last_one_s_pending_records():
    acks = CaptureAcks()
    acks.on_hello(7)
    m1 = acks.on_record(1)
    acks.on_record(2)
    acks.on_settled(m1)
    resume, forgotten = acks.on_hello(8)  # Mosquitto restarted
    assert resume == 0 and forgotten is not None and m1 in forgotten
    assert acks.take_ack() is None
    m = acks.on_record(1)  # the new epoch's seq 1 is a new record
    assert m is not None and not acks.on_settled(m1)
    assert acks.on_settled(m) and acks.take_ack() == (1, [])


def test_a_first_hello_after_a_sidecar_restart_asks_for_everything():
    assert CaptureAcks().on_hello(99) == (0, None)


def test_an_ack_lists_at_most_max_listed_seqs():
    acks = CaptureAcks()
    acks.on_hello(1)
    acks.on_record(1)  # stays pending
    mids = [acks.on_record(s) for s in range(2, MAX_LISTED + 12)]
    for mid in mids:
        acks.on_settled(mid)
    first = acks.take_ack()
    second = acks.take_ack()
    assert first is not None and second is not None
    assert first[0] == 0 and len(first[1]) == MAX_LISTED and len(second[1]) == 10
    assert acks.take_ack() is None


def test_records_a_sidecar_before_this_one_acknowledged_are_skipped_and_count_as_settled():
    """A restarted sidecar resumes from 0; the plugin sends only what it still holds (from
    425 on, 426-430 listed by the dead sidecar): the cumulative seq moves past the gaps."""
    acks = CaptureAcks()
    assert acks.on_hello(7) == (0, None)
    m425 = acks.on_record(425)
    m431 = acks.on_record(431)
    acks.on_settled(m425)
    assert acks.take_ack() == (430, [])
    acks.on_settled(m431)
    assert acks.take_ack() == (431, [])
    assert acks.status()["settled_above"] == 0
