"""The drain core: what a draining node does on each tick, and when it is drained."""

from __future__ import annotations

from sidecar.drain.progress import (
    HAND_OFF_AFTER,
    KICK_EVERY,
    Announce,
    CloseAdmission,
    Drain,
    Facts,
    HandOff,
    KickAll,
    OpenAdmission,
)


def test_start_closes_admission_and_tells_the_peers_once():
    d = Drain()
    assert d.start(10.0, 1000.0) == [CloseAdmission(), Announce(True)]
    assert d.start(11.0, 1001.0) == []  # idempotent
    assert d.draining and d.progress(11.0).state == "draining"
    assert d.on_resync() == [CloseAdmission()]  # a restarted Mosquitto admits again


def test_clients_are_kicked_again_until_none_is_left():
    d = Drain()
    d.start(0.0, 0.0)
    assert d.on_tick(Facts(clients=5, peers_up=2), 0.1) == [KickAll()]
    assert d.on_tick(Facts(clients=1, peers_up=2), 0.5) == []
    assert d.on_tick(Facts(clients=1, peers_up=2), 0.1 + KICK_EVERY) == [KickAll()]
    assert d.progress(1.2).phase == "disconnecting"
    assert d.kicks == 2


def test_sessions_left_are_handed_off_after_the_clients_had_time_to_come_back():
    d = Drain()
    d.start(0.0, 0.0)
    d.on_tick(Facts(clients=3, sessions_owned=3, peers_up=2), 0.0)
    left = Facts(sessions_owned=1, session_copies=1, session_messages=40, peers_up=2)
    assert d.on_tick(left, HAND_OFF_AFTER - 0.1) == []
    assert d.progress(HAND_OFF_AFTER).phase == "moving sessions"
    assert d.progress(HAND_OFF_AFTER).session_messages == 40
    assert d.on_tick(left, HAND_OFF_AFTER) == [HandOff()]
    assert d.on_tick(left, HAND_OFF_AFTER + 0.5) == []
    assert d.on_tick(left, HAND_OFF_AFTER + 1.0) == [HandOff()]
    # nowhere to go: no hand-off, and the progress says why
    assert d.on_tick(Facts(sessions_owned=1), HAND_OFF_AFTER + 5) == []
    assert "no other node is up" in d.progress(HAND_OFF_AFTER + 5).note


def test_a_node_without_clients_hands_off_at_once():
    d = Drain()
    d.start(0.0, 0.0)
    assert d.on_tick(Facts(sessions_owned=2, peers_up=1), 0.1) == [HandOff()]


def test_drained_once_nothing_is_left_and_the_forwarding_is_quiet():
    d = Drain()
    d.start(0.0, 100.0)
    d.on_tick(Facts(unsettled=0, queued=4, peers_up=1), 1.0)
    assert d.progress(1.0).phase == "settling"
    assert d.progress(1.0).messages_queued == 4
    d.on_tick(Facts(quiet=False, peers_up=1), 2.0)
    assert d.state == "draining"
    d.on_tick(Facts(queued_down=7, peers_up=1), 2.5)
    p = d.progress(9.0)
    assert (p.state, p.phase, p.seconds, p.started_at) == ("drained", "drained", 2.5, 100.0)
    assert p.messages_queued_down == 7 and "spill" in p.note
    # something came back (Mosquitto restarted, a client slipped in): draining again
    assert d.on_tick(Facts(clients=1, peers_up=1), 10.0) == [KickAll()]
    assert d.state == "draining"


def test_undrain_admits_again_and_reports_serving():
    d = Drain()
    assert d.stop() == []
    d.start(0.0, 0.0)
    assert d.stop() == [OpenAdmission(), Announce(False)]
    assert d.on_tick(Facts(clients=3), 1.0) == []
    assert (d.progress(1.0).state, d.progress(1.0).phase) == ("serving", "")
    assert d.on_resync() == []
