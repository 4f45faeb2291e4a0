"""The receiving side's core (sidecar.routing.receiver), without sockets."""

from __future__ import annotations

from sidecar.hlc import MessageId
from sidecar.routing.forwarder import Envelope
from sidecar.routing.receiver import (
    ACK_BATCH,
    ACK_LINGER,
    ACK_OK,
    ACK_REJECTED,
    DeliverShared,
    Receiver,
    Reinject,
    SendAcks,
)


def env(seq: int, qos: int = 1, group: str | None = None, inc: int = 7) -> Envelope:
    return Envelope("n2", inc, seq, 0, "t", b"x", qos, shared_group=group,
                    shared_filter="t" if group else "")


def acks(actions) -> dict[str, list]:
    out: dict[str, list] = {}
    for a in actions:
        if isinstance(a, SendAcks):
            for peer, batch in a.acks.items():
                out.setdefault(peer, []).extend(batch)
    return out


def test_a_duplicate_goes_no_further_and_is_acknowledged_again():
    r = Receiver()
    first, out = r.accept("n2", MessageId("n2", 7, 1), 1, 0.0)
    assert first and out == []
    again, out = r.accept("n2", MessageId("n2", 7, 1), 1, 0.0)
    assert not again
    assert r.counters["duplicates"] == 1 and r.counters["received"] == 2
    assert r.ack_due == ACK_LINGER  # the ack lingers for company
    assert acks(r.on_timer(ACK_LINGER)) == {"n2": [(7, 1, ACK_OK)]}
    _, out = r.accept("n2", MessageId("n2", 7, 1), 0, 1.0)  # QoS 0: nothing to ack
    assert out == [] and r.ack_due is None


def test_a_reinjection_is_acknowledged_only_once_mosquitto_confirmed_it():
    r = Receiver()
    action = r.route("n2", env(1), [])
    assert isinstance(action, Reinject)
    r.on_reinjecting(ticket=41, peer="n2", env=action.envelope)
    assert r.on_confirmed([99], 0.0) == []  # someone else's ticket (a retained write)
    assert r.ack_due is None
    r.on_confirmed([41], 0.0)
    assert acks(r.on_timer(1.0)) == {"n2": [(7, 1, ACK_OK)]}
    assert r.on_confirmed([41], 2.0) == []  # once


def test_a_retargeted_reinjection_is_confirmed_under_its_new_ticket():
    r = Receiver()
    action = r.route("n2", env(1), [])
    r.on_reinjecting(ticket=-1, peer="n2", env=action.envelope)   # a batch's ticket
    r.retarget(-1, 5)                                              # sent again on its own
    assert r.on_confirmed([-1], 0.0) == []
    r.on_confirmed([5], 0.0)
    assert acks(r.on_timer(1.0)) == {"n2": [(7, 1, ACK_OK)]}


def test_qos0_reinjections_are_not_tracked():
    r = Receiver()
    r.on_reinjecting(5, "n2", env(1, qos=0))
    assert r.on_confirmed([5], 0.0) == [] and r.ack_due is None


def test_acks_leave_at_once_when_a_batch_is_full():
    r = Receiver()
    out = []
    for seq in range(ACK_BATCH):
        r.on_reinjecting(seq, "n2", env(seq))
        out += r.on_confirmed([seq], 0.0)
    assert len(acks(out)["n2"]) == ACK_BATCH
    assert r.ack_due is None


def test_not_before_the_linger_and_dropped_with_the_peers_stream():
    r = Receiver()
    r.on_reinjecting(1, "n2", env(1))
    r.on_reinjecting(2, "n3", env(2))
    r.on_confirmed([1, 2], 10.0)
    assert r.on_timer(10.0 + ACK_LINGER / 2) == []
    r.on_inbound_down("n2")  # n2 re-sends what it did not get an ack for
    assert acks(r.on_timer(10.0 + ACK_LINGER)) == {"n3": [(7, 2, ACK_OK)]}


def test_shared_picks_rotate_over_members_and_a_failure_is_rejected_to_the_origin():
    r = Receiver()
    picks = [r.route("n2", env(s, group="g"), ["a", "b", "c"]) for s in range(4)]
    assert all(isinstance(p, DeliverShared) for p in picks)
    assert [p.client for p in picks] == ["a", "b", "c", "a"]
    none = r.route("n2", env(9, group="g"), [])
    assert none.client is None
    r.on_shared_result("n2", env(1, group="g"), True, 0.0)
    r.on_shared_result("n2", env(2, group="g"), False, 0.0)
    assert acks(r.on_timer(1.0)) == {"n2": [(7, 1, ACK_OK), (7, 2, ACK_REJECTED)]}
    r.on_shared_result("n2", env(3, group="g", qos=0), False, 0.0)
    assert r.counters["shared_delivered"] == 1 and r.counters["shared_repicked"] == 1
    assert r.counters["shared_dropped"] == 1  # QoS 0: not acknowledged, so nobody picks again


def test_a_message_that_cannot_be_published_is_refused_and_not_resent():
    """Found by fuzzing peer frames: a wildcard topic made the re-injection raise."""
    r = Receiver()
    assert r.refuse("n2", env(1), 0.0) == [] and r.counters["invalid"] == 1
    assert acks(r.on_timer(1.0)) == {"n2": [(7, 1, ACK_REJECTED)]}
    assert r.refuse("n2", env(2, qos=0), 2.0) == [] and r.ack_due is None
