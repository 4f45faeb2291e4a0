"""Liveness: dead = lease gone AND streams down for the grace; graceful leaves; false deaths."""

from __future__ import annotations

from sidecar.wills.liveness import Confirmed, Liveness, Returned

GRACE = 3000


def live(**members: int) -> Liveness:
    lv = Liveness("n1", GRACE)
    lv.on_view({"n1": 1, **members}, 0)
    return lv


def test_dead_only_once_the_lease_is_gone_and_the_streams_were_down_for_the_grace():
    lv = live(n2=7)
    lv.on_stream("n2", False, 1000)  # streams down, lease still there
    assert lv.tick(10_000) == [] and not lv.is_dead("n2")
    lv.on_view({"n1": 1}, 10_000)  # the lease expired
    events = lv.tick(10_000)
    assert [type(e) for e in events] == [Confirmed]
    death = events[0].death
    assert (death.node, death.incarnation, death.since_ms) == ("n2", 7, 1000)
    assert lv.is_dead("n2") and lv.live() == ["n1"]
    assert lv.tick(20_000) == []  # once


def test_streams_must_have_been_down_for_the_whole_grace():
    lv = live(n2=7)
    lv.on_view({"n1": 1}, 0)  # lease gone first (the node was cut off from etcd)
    lv.on_stream("n2", False, 5000)
    assert lv.tick(7999) == []
    lv.on_stream("n2", True, 7999)  # the stream came back: not dead
    lv.on_stream("n2", False, 8500)
    assert lv.tick(11_000) == []
    assert [type(e) for e in lv.tick(11_500)] == [Confirmed]


def test_a_graceful_leave_is_never_a_death():
    lv = live(n2=7)
    lv.on_left("n2")
    lv.on_view({"n1": 1}, 0)
    lv.on_stream("n2", False, 0)
    assert lv.tick(60_000) == [] and not lv.is_dead("n2")


def test_a_dead_node_back_with_the_same_incarnation_is_a_false_death():
    lv = live(n2=7, n3=4)
    lv.on_view({"n1": 1}, 0)
    lv.on_stream("n2", False, 0)
    lv.on_stream("n3", False, 0)
    assert len(lv.tick(GRACE)) == 2
    events = lv.on_view({"n1": 1, "n2": 7, "n3": 5}, 9000)
    by_node = {e.death.node: e for e in events}
    assert all(isinstance(e, Returned) for e in events)
    assert by_node["n2"].false and not by_node["n3"].false  # n3 restarted: really died
    assert lv.counters == {"confirmed": 2, "false": 1}
    assert not lv.is_dead("n2") and lv.live() == ["n1", "n2", "n3"]


def test_owners_never_seen_in_the_view_are_watched_too():
    lv = live()
    assert lv.watched(["n9"]) == {"n9"}
    lv.on_stream("n9", False, 0)
    events = lv.tick(GRACE, owners=["n9"])
    assert [e.death.incarnation for e in events] == [None]
