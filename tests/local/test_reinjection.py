"""The re-injection window (sidecar.local.reinjection): Receive Maximum, refusals, order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.local.reinjection import (
    PERSISTENT_AFTER,
    Confirm,
    Refused,
    Reinjection,
    ReinjectWindow,
    Send,
    backoff,
    reason_name,
)
from sidecar.message import MessageProperties

OK, QUOTA, DENIED = 0x00, 0x97, 0x87


def item(ticket: int, topic: str = "t", qos: int = 1) -> Reinjection:
    return Reinjection(ticket, topic, str(ticket).encode(), qos, False, MessageProperties())


def sent(actions) -> list[int]:
    return [a.item.ticket for a in actions if isinstance(a, Send)]


def confirmed(actions) -> list[int]:
    return [t for a in actions if isinstance(a, Confirm) for t in a.tickets]


def test_qos0_goes_at_once_and_is_never_tracked():
    w = ReinjectWindow(receive_maximum=1)
    assert sent(w.offer(item(1, qos=1))) == [1]
    assert sent(w.offer(item(2, qos=0))) == [2]  # a full window does not hold QoS 0
    assert w.status()["in_flight"] == 1


def test_window_holds_what_exceeds_receive_maximum_and_releases_in_order():
    w = ReinjectWindow()
    w.on_connack(2)
    out = []
    for t in range(1, 6):
        out += sent(w.offer(item(t, qos=2)))
    assert out == [1, 2]
    assert w.status()["waiting"] == 3
    acts = w.on_ack(1, OK, 0.0)
    assert confirmed(acts) == [1] and sent(acts) == [3]
    assert sent(w.on_ack(2, OK, 0.0)) == [4]


def test_connack_without_receive_maximum_means_unlimited():
    w = ReinjectWindow()
    w.on_connack(None)
    assert sum(len(sent(w.offer(item(t)))) for t in range(1, 1001)) == 1000


def test_a_larger_receive_maximum_at_reconnect_releases_waiting_messages():
    w = ReinjectWindow()
    w.on_connack(1)
    w.offer(item(1))
    w.offer(item(2))
    assert sent(w.on_connack(5)) == [2]


def test_a_refusal_is_not_confirmed_and_is_retried_after_backoff():
    w = ReinjectWindow()
    w.offer(item(1, qos=2))
    acts = w.on_ack(1, QUOTA, now=10.0)
    assert confirmed(acts) == []
    assert [a.item.ticket for a in acts if isinstance(a, Refused)] == [1]
    assert w.next_due() == 10.0 + backoff(1)
    assert sent(w.on_timer(10.0)) == []  # not yet
    assert sent(w.on_timer(10.0 + backoff(1))) == [1]
    assert w.next_due() is None  # while it is out, no second copy
    assert confirmed(w.on_ack(1, OK, 11.0)) == [1]
    assert w.held_count == 0 and w.status()["held_topics"] == 0
    assert w.refused_by_reason == {QUOTA: 1}


def test_later_messages_on_a_refused_topic_wait_behind_it_other_topics_flow():
    w = ReinjectWindow()
    w.offer(item(1, "a"))
    w.on_ack(1, DENIED, 0.0)
    assert sent(w.offer(item(2, "a"))) == []
    assert sent(w.offer(item(3, "b"))) == [3]
    assert sent(w.offer(item(4, "a"))) == []
    assert sent(w.on_timer(1.0)) == [1]
    acts = w.on_ack(1, OK, 1.0)
    assert confirmed(acts) == [1] and sent(acts) == [2, 4]


def test_messages_in_flight_behind_a_refused_one_are_retried_in_ticket_order():
    w = ReinjectWindow()
    for t in (1, 2, 3, 4):
        w.offer(item(t, "a"))
    w.on_ack(2, DENIED, 0.0)  # acks may come back in any order
    w.on_ack(1, DENIED, 0.0)
    assert confirmed(w.on_ack(3, OK, 0.0)) == [3]  # already out: it cannot be recalled
    w.on_ack(4, DENIED, 0.0)
    retried = []
    now = 100.0
    while w.held_count:  # each refused one goes again alone, oldest first
        out = sent(w.on_timer(now))
        assert len(out) == 1
        retried += out
        w.on_ack(out[0], OK, now)
    assert retried == [1, 2, 4]


def test_no_retry_is_due_while_the_window_is_full():
    """(else a caller's timer would fire again and again until an ack makes room)"""
    w = ReinjectWindow()
    w.on_connack(1)
    w.offer(item(1, "a"))
    w.on_ack(1, DENIED, 0.0)
    w.offer(item(2, "b"))  # takes the only place
    assert w.next_due() is None
    assert sent(w.on_timer(100.0)) == []
    w.on_ack(2, OK, 1.0)
    assert w.next_due() == backoff(1)
    assert sent(w.on_timer(100.0)) == [1]


def test_backoff_grows_and_is_capped():
    assert backoff(1) < backoff(2) < backoff(3)
    assert backoff(100) == backoff(200) == 5.0


def test_a_refusal_becomes_persistent_once():
    w = ReinjectWindow()
    w.offer(item(1))
    now = 0.0
    persistent = []
    for _ in range(PERSISTENT_AFTER + 2):
        acts = w.on_ack(1, DENIED, now)
        persistent += [a.persistent for a in acts if isinstance(a, Refused)]
        now += 10
        assert sent(w.on_timer(now)) == [1]
    assert persistent.count(True) == 1
    assert persistent.index(True) == PERSISTENT_AFTER - 1


def test_reason_names_for_metrics():
    assert reason_name(0x97) == "quota_exceeded"
    assert reason_name(0x87) == "not_authorized"
    assert reason_name(0xA2) == "0xa2"


@settings(max_examples=200, deadline=None)
@given(rm=st.integers(1, 5),
       script=st.lists(st.tuples(st.sampled_from(["offer", "ack", "timer"]),
                                 st.sampled_from(["a", "b"]), st.integers(0, 2),
                                 st.booleans()), max_size=80))
def test_window_properties(rm, script):
    """Whatever happens: never more than Receive Maximum in flight, a ticket is confirmed only
    after an accepted attempt and at most once, and nothing is lost once refusals stop."""
    w = ReinjectWindow()
    w.on_connack(rm)
    out: list[int] = []  # in flight, oldest first
    tickets = 0
    offered: set[int] = set()
    confirms: list[int] = []
    accepted: set[int] = set()
    now = 0.0

    def run(actions):
        for a in actions:
            if isinstance(a, Send) and a.item.qos:
                out.append(a.item.ticket)
            elif isinstance(a, Confirm):
                confirms.extend(a.tickets)
        assert len(out) <= rm
        assert len(w.in_flight) <= rm

    for op, topic, qos, ok in script:
        now += 0.5
        if op == "offer":
            tickets += 1
            offered |= {tickets} if qos else set()
            run(w.offer(item(tickets, topic, qos)))
        elif op == "ack" and out:
            t = out.pop(0)
            if ok:
                accepted.add(t)
            run(w.on_ack(t, OK if ok else QUOTA, now))
        else:
            run(w.on_timer(now))
    # refusals end: everything offered at QoS > 0 is confirmed exactly once
    for _ in range(10_000):
        if not (out or w.held_count or w.waiting):
            break
        now += 10
        run(w.on_timer(now))
        while out:
            t = out.pop(0)
            accepted.add(t)
            run(w.on_ack(t, OK, now))
    assert len(confirms) == len(set(confirms))
    assert set(confirms) <= accepted
    assert set(confirms) == offered
    assert not w.in_flight and not w.waiting and not w.held_count
