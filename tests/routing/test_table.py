"""SubscriptionTable: sessions, subscriptions and refcounted interest from plugin events."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.local.events import (
    Connect,
    ConnectRejected,
    Disconnect,
    Event,
    Heartbeat,
    RetainedSeen,
    SessionExpired,
    Snapshot,
    SnapshotClient,
    SnapshotSubscription,
    Subscribe,
    Unsubscribe,
)
from sidecar.routing import (
    InterestAdded,
    InterestKey,
    InterestRemoved,
    SessionInfo,
    SubscriptionTable,
)

K = InterestKey


def connect(client: str, clean: bool = True, expiry: int | None = 0, **kw: Any) -> Connect:
    fields: dict[str, Any] = dict(
        username=None, protocol="mqtt5", keepalive=60, session_present=False, address=None
    )
    fields.update(kw)
    return Connect("e", 1, 0, client, clean_start=clean, session_expiry=expiry, **fields)


def disconnect(
    client: str, kept: bool = False, taken_over: bool = False, expiry: int | None = None
) -> Disconnect:
    return Disconnect("e", 1, 0, client, taken_over, kept, expiry)


def sub(client: str, filter: str, qos: int = 0) -> Subscribe:
    return Subscribe("e", 1, 0, client, filter, qos)


def unsub(client: str, filter: str) -> Unsubscribe:
    return Unsubscribe("e", 1, 0, client, filter)


def run(table: SubscriptionTable, *events: Event) -> list:
    out: list = []
    for event in events:
        out += table.apply(event)
    return out


def test_interest_key() -> None:
    assert K.parse("a/#") == K(None, "a/#")
    assert K.parse("$share/g/a/+") == K("g", "a/+")
    assert K("g", "a/+").verbatim == "$share/g/a/+"
    assert K(None, "a").verbatim == "a"


def test_refcount_transitions_only() -> None:
    t = SubscriptionTable()
    run(t, connect("a"), connect("b"))
    assert t.apply(sub("a", "x/#")) == [InterestAdded(K(None, "x/#"))]
    assert t.apply(sub("b", "x/#")) == []
    assert t.interest() == {K(None, "x/#"): 2}
    assert t.apply(unsub("a", "x/#")) == []
    assert t.apply(unsub("b", "x/#")) == [InterestRemoved(K(None, "x/#"))]
    assert t.interest() == {}


def test_shared_interest_is_per_group() -> None:
    t = SubscriptionTable()
    run(t, connect("a"), connect("b"))
    assert t.apply(sub("a", "$share/g1/x")) == [InterestAdded(K("g1", "x"))]
    assert t.apply(sub("b", "$share/g2/x")) == [InterestAdded(K("g2", "x"))]
    assert t.apply(sub("b", "x")) == [InterestAdded(K(None, "x"))]
    assert t.apply(sub("a", "$share/g2/x")) == []
    assert t.interest() == {K("g1", "x"): 1, K("g2", "x"): 2, K(None, "x"): 1}


def test_resubscribe_replaces_qos() -> None:
    t = SubscriptionTable()
    run(t, connect("a"), connect("b"), sub("a", "x", 0), sub("b", "x", 1))
    assert t.max_qos(K(None, "x")) == 1
    assert t.apply(sub("a", "x", 2)) == []
    assert t.interest() == {K(None, "x"): 2}
    assert t.subscriptions("a") == {"x": 2}
    assert t.max_qos(K(None, "x")) == 2
    run(t, sub("a", "x", 0))
    assert t.max_qos(K(None, "x")) == 1
    run(t, unsub("b", "x"))
    assert t.max_qos(K(None, "x")) == 0
    with pytest.raises(KeyError):
        t.max_qos(K(None, "nope"))


def test_unknown_unsubscribe_is_noop() -> None:
    t = SubscriptionTable()
    run(t, connect("a"), sub("a", "x"))
    assert t.apply(unsub("a", "y")) == []
    assert t.apply(unsub("zz", "x")) == []
    assert t.interest() == {K(None, "x"): 1}


def test_clean_start_drops_previous_subscriptions() -> None:
    t = SubscriptionTable()
    run(t, connect("a", clean=False, expiry=100), sub("a", "x"), disconnect("a", kept=True))
    assert t.apply(connect("a", clean=True)) == [InterestRemoved(K(None, "x"))]
    assert t.subscriptions("a") == {}
    assert t.sessions()["a"].online


def test_persistent_session_outlives_connection() -> None:
    t = SubscriptionTable()
    run(t, connect("a", clean=False, expiry=100), sub("a", "x"))
    assert t.apply(disconnect("a", kept=True, expiry=50)) == []
    info = t.sessions()["a"]
    assert not info.online and info.persistent and info.session_expiry == 50
    assert t.interest() == {K(None, "x"): 1}
    assert t.apply(connect("a", clean=False, expiry=100, session_present=True)) == []
    assert t.sessions()["a"].online
    assert t.subscriptions("a") == {"x": 0}


def test_disconnect_without_session_drops_everything() -> None:
    t = SubscriptionTable()
    run(t, connect("a"), sub("a", "x"), sub("a", "y"))
    assert t.apply(disconnect("a")) == [
        InterestRemoved(K(None, "x")),
        InterestRemoved(K(None, "y")),
    ]
    assert "a" not in t.sessions()
    assert t.apply(disconnect("a")) == []  # unknown client


def test_takeover_keeps_the_session() -> None:
    t = SubscriptionTable()
    run(t, connect("a", clean=False, expiry=100), sub("a", "x"))
    assert t.apply(disconnect("a", kept=False, taken_over=True)) == []
    assert t.apply(connect("a", clean=False, expiry=100)) == []
    assert t.subscriptions("a") == {"x": 0}
    assert t.sessions()["a"].online


def test_takeover_with_clean_start_drops() -> None:
    t = SubscriptionTable()
    run(t, connect("a", clean=False, expiry=100), sub("a", "x"))
    assert t.apply(disconnect("a", taken_over=True)) == []
    assert t.apply(connect("a", clean=True)) == [InterestRemoved(K(None, "x"))]


def test_session_expired_drops_the_client() -> None:
    t = SubscriptionTable()
    run(t, connect("a", clean=False, expiry=1), sub("a", "x"), disconnect("a", kept=True))
    assert t.apply(SessionExpired("e", 1, 0, "a")) == [InterestRemoved(K(None, "x"))]
    assert t.sessions() == {}
    assert t.apply(SessionExpired("e", 1, 0, "a")) == []


def test_other_events_change_nothing() -> None:
    t = SubscriptionTable()
    assert t.apply(Heartbeat("e", 1, 0, 0, 0, 0, 0)) == []
    assert t.apply(ConnectRejected("e", 1, 0, "a", None, "auth")) == []
    assert t.apply(RetainedSeen("e", 1, 0, "a", "t", b"", 0)) == []
    assert t.sessions() == {}


def test_subscribe_without_connect_creates_session() -> None:
    t = SubscriptionTable()
    assert t.apply(sub("a", "x")) == [InterestAdded(K(None, "x"))]
    assert t.sessions()["a"].online


def test_invalid_filter_is_ignored() -> None:
    t = SubscriptionTable()
    run(t, connect("a"))
    assert t.apply(sub("a", "a/#/b")) == []
    assert t.apply(unsub("a", "a/#/b")) == []
    assert t.ignored_filters == 1 and t.interest() == {}


def test_session_info_persistent() -> None:
    assert SessionInfo(True, clean_start=True, session_expiry=0).persistent is False
    assert SessionInfo(True, clean_start=True, session_expiry=10).persistent is True
    assert SessionInfo(True, clean_start=False, session_expiry=None).persistent is True
    assert SessionInfo(True, clean_start=True, session_expiry=None).persistent is False


def test_load_snapshot_returns_the_diff() -> None:
    t = SubscriptionTable()
    run(t, connect("a"), sub("a", "x"), sub("a", "y"), connect("b"), sub("b", "$share/g/z"))
    snap = Snapshot(
        "e",
        9,
        (
            SnapshotClient(
                "a",
                None,
                "mqtt5",
                True,
                0,
                True,
                (SnapshotSubscription("x", 1), SnapshotSubscription("w", 0)),
            ),
            SnapshotClient("c", "u", "mqtt311", False, 60, False, (SnapshotSubscription("y", 2),)),
        ),
    )
    assert t.load_snapshot(snap) == [InterestRemoved(K("g", "z")), InterestAdded(K(None, "w"))]
    assert t.interest() == {K(None, "x"): 1, K(None, "w"): 1, K(None, "y"): 1}
    assert t.subscriptions("a") == {"x": 1, "w": 0}
    assert t.subscriptions("b") == {}
    assert t.sessions()["c"] == SessionInfo(False, False, 60, "u", "mqtt311")
    assert t.max_qos(K(None, "y")) == 2
    assert t.load_snapshot(snap) == []
    own = t.to_snapshot("e", 9)
    assert (own.epoch, own.seq) == ("e", 9)
    assert [c.client for c in own.clients] == ["a", "c"]
    assert own.clients[0].subscriptions == (
        SnapshotSubscription("w", 0),
        SnapshotSubscription("x", 1),
    )
    assert own.clients[1] == snap.clients[1]


def test_sessions_status_and_len() -> None:
    t = SubscriptionTable()
    run(
        t,
        connect("a"),
        sub("a", "x"),
        connect("b", clean=False, expiry=9),
        disconnect("b", kept=True),
    )
    assert len(t) == 2
    assert t.sessions_status() == {"online": 1, "offline": 1, "subscriptions": 1, "interest": 1}


# ---- property: refcounts equal a naive recount ---------------------------------------------

CLIENTS = ["a", "b", "c"]
FILTERS = ["x", "x/#", "+/y", "$share/g/x", "$share/h/x", "$share/g/+/y"]

events_strategy = st.one_of(
    st.builds(
        lambda c, clean, exp: connect(c, clean=clean, expiry=exp),
        st.sampled_from(CLIENTS),
        st.booleans(),
        st.sampled_from([0, 100, None]),
    ),
    st.builds(
        lambda c, kept, to: disconnect(c, kept=kept, taken_over=to),
        st.sampled_from(CLIENTS),
        st.booleans(),
        st.booleans(),
    ),
    st.builds(sub, st.sampled_from(CLIENTS), st.sampled_from(FILTERS), st.integers(0, 2)),
    st.builds(sub, st.sampled_from(CLIENTS), st.sampled_from(FILTERS), st.integers(0, 2)),
    st.builds(unsub, st.sampled_from(CLIENTS), st.sampled_from(FILTERS)),
    st.builds(lambda c: SessionExpired("e", 1, 0, c), st.sampled_from(CLIENTS)),
)


def naive_interest(subs: dict[str, dict[str, int]]) -> dict[InterestKey, int]:
    out: dict[InterestKey, int] = {}
    for filters in subs.values():
        for f in filters:
            out[K.parse(f)] = out.get(K.parse(f), 0) + 1
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(events_strategy, max_size=40))
def test_interest_equals_naive_recount(events: list[Event]) -> None:
    t = SubscriptionTable()
    live: set[InterestKey] = set()
    for event in events:
        for change in t.apply(event):
            if isinstance(change, InterestAdded):
                assert change.key not in live
                live.add(change.key)
            else:
                assert change.key in live
                live.discard(change.key)
        subs = {c: t.subscriptions(c) for c in CLIENTS}
        assert t.interest() == naive_interest(subs)
        assert set(t.interest()) == live
        for key in live:
            assert t.max_qos(key) == max(
                q for fs in subs.values() for f, q in fs.items() if K.parse(f) == key
            )
    assert t.load_snapshot(t.to_snapshot("e", 1)) == []
    assert t.interest() == naive_interest({c: t.subscriptions(c) for c in CLIENTS})


@settings(max_examples=80, deadline=None)
@given(st.lists(events_strategy, max_size=25), st.lists(events_strategy, max_size=25))
def test_load_snapshot_diff_replays_to_target(first: list[Event], second: list[Event]) -> None:
    t, target = SubscriptionTable(), SubscriptionTable()
    run(t, *first)
    run(target, *second)
    live = set(t.interest())
    for change in t.load_snapshot(target.to_snapshot()):
        if isinstance(change, InterestAdded):
            assert change.key not in live
            live.add(change.key)
        else:
            live.remove(change.key)
    assert live == set(target.interest())
    assert t.interest() == target.interest()
    assert t.sessions() == target.sessions()
