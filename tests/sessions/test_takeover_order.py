"""Two connects of one client id on two nodes: the later *accepted* connect wins, however
late a busy node's sidecar gets to its own connect event (it once stamped a connect when it
processed it; the older connection then looked newer and the other node kicked its own,
newer connection: CI once). Records are delivered by hand here, in the order under test."""

from __future__ import annotations

from sidecar.sessions.registry import Kick, Publish, SessionRegistry

T = 1_800_000_000_000


def _records(actions: list) -> list:
    return [a.record for a in actions if isinstance(a, Publish)]


def _connect(reg: SessionRegistry, at_ms: int, now_ms: int) -> list:
    return reg.on_connect("dev", None, "mqtt5", True, 0, False, now_ms, at_ms)


def test_a_peers_newer_connect_that_came_first_takes_over_the_late_local_event():
    """n1 accepted the client first (T), n2 5 ms later; n2's record reaches n1 before n1's
    sidecar gets to its own connect event (T + 10): n1 kicks its own connection, and n2,
    given nothing newer, keeps its own."""
    n1, n2 = SessionRegistry("n1"), SessionRegistry("n2")
    from_n2 = _records(_connect(n2, T + 5, T + 6))
    n1.on_remote(from_n2, T + 7)  # nothing local yet on n1
    out = _connect(n1, T, T + 10)
    assert [a for a in out if isinstance(a, Kick)] == [Kick("dev", with_will=True)]
    assert n1.records["dev"].owner == "n2"
    out = n2.on_remote(_records(out), T + 11)
    assert not [a for a in out if isinstance(a, Kick)], "n2 kicked the newer connection"
    assert n2.records["dev"].owner == "n2"


def test_records_crossing_keep_the_later_accepted_connect():
    """n1 accepted first (T) but its sidecar processed the event late (T + 12), after n2's
    (accepted T + 5) was sent: each node gets the other's record; n1 kicks its own, n2
    keeps its own."""
    n1, n2 = SessionRegistry("n1"), SessionRegistry("n2")
    from_n2 = _records(_connect(n2, T + 5, T + 6))
    from_n1 = _records(_connect(n1, T, T + 12))
    assert not [a for a in n2.on_remote(from_n1, T + 13) if isinstance(a, Kick)]
    kicks = [a for a in n1.on_remote(from_n2, T + 13) if isinstance(a, Kick)]
    assert kicks == [Kick("dev", with_will=True)]
    assert n1.records["dev"].owner == n2.records["dev"].owner == "n2"


def test_a_local_connect_after_a_peers_record_is_still_newer():
    """The usual order: n2's record is here before n1 accepts the client again: n1's
    connect is newer (above what n1 knew), whatever the two clocks say."""
    n1, n2 = SessionRegistry("n1"), SessionRegistry("n2")
    from_n2 = _records(_connect(n2, T + 50, T + 51))  # n2's clock runs 50 ms ahead
    n1.on_remote(from_n2, T + 2)
    out = _connect(n1, T + 3, T + 4)
    assert not [a for a in out if isinstance(a, Kick)]
    kicks = [a for a in n2.on_remote(_records(out), T + 5) if isinstance(a, Kick)]
    assert kicks == [Kick("dev", with_will=True)]
    assert n1.records["dev"].owner == n2.records["dev"].owner == "n1"
