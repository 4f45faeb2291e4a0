"""The session registry core: replication, takeover, resume elsewhere, discard, deny list."""

from __future__ import annotations

from sidecar.sessions.record import SessionRecord
from sidecar.sessions.registry import (
    LIVE_HOLD_MS,
    MOVE_SETTLE_WAIT_MS,
    SHADOW_USERNAME,
    Admit,
    Deny,
    Discard,
    Drain,
    Hold,
    Kick,
    Materialize,
    Publish,
    SessionRegistry,
)


class Cluster:
    """Registries of nodes n1..nN; every Publish is delivered to the others at once."""

    def __init__(self, n: int = 3) -> None:
        self.nodes = {f"n{i}": SessionRegistry(f"n{i}") for i in range(1, n + 1)}
        self.now = 1_000_000
        self.actions: dict[str, list] = {k: [] for k in self.nodes}

    def run(self, node: str, actions: list) -> None:
        pending = [(node, actions)]
        while pending:
            at, acts = pending.pop(0)
            self.actions[at] += [a for a in acts if not isinstance(a, Publish)]
            for a in acts:
                if isinstance(a, Publish):
                    for other, reg in self.nodes.items():
                        if other != at:
                            pending.append((other, reg.on_remote([a.record], self.now)))

    def take(self, node: str, kind: type) -> list:
        got = [a for a in self.actions[node] if isinstance(a, kind)]
        self.actions[node] = [a for a in self.actions[node] if not isinstance(a, kind)]
        return got

    def connect(self, node: str, client: str, clean: bool = False, expiry: int | None = 600,
                present: bool = False, username: str | None = None) -> None:
        self.now += 10
        self.run(node, self.nodes[node].on_connect(client, username, "mqtt5", clean, expiry,
                                                   present, self.now))

    def disconnect(self, node: str, client: str, kept: bool = True, expiry: int = 600) -> None:
        self.now += 10
        self.run(node, self.nodes[node].on_disconnect(client, False, kept, expiry, self.now))


def test_a_connect_is_known_everywhere_and_denied_elsewhere():
    c = Cluster()
    c.connect("n1", "dev", clean=True)
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "a/#", 1, c.now))
    for node in ("n2", "n3"):
        rec = c.nodes[node].records["dev"]
        assert (rec.owner, rec.online, rec.subscriptions) == ("n1", True, {"a/#": 1})
        assert c.take(node, Deny) == [Deny("dev")]
    assert c.take("n1", Deny) == []


def test_resume_elsewhere_materializes_then_drains_the_old_owner():
    c = Cluster()
    c.connect("n1", "dev", clean=True)
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "a/#", 1, c.now))
    c.disconnect("n1", "dev")
    # the client tries n3: denied there, so n3 makes the session first
    n3 = c.nodes["n3"]
    c.run("n3", n3.on_connect_rejected("dev", "denied", c.now))
    [mat] = c.take("n3", Materialize)
    assert mat.record.subscriptions == {"a/#": 1}
    c.connect("n3", "dev", username=SHADOW_USERNAME)  # the shadow connects, subscribes
    c.run("n3", n3.on_subscribe("dev", "a/#", 1, c.now))  # (ignored: not the client)
    c.run("n3", n3.on_disconnect("dev", False, True, 600, c.now))
    c.run("n3", n3.on_materialized("dev", True, c.now))
    assert c.take("n3", Admit) == [Admit("dev")]
    c.connect("n3", "dev", present=True)
    assert n3.records["dev"].subscriptions == {"a/#": 1}
    assert not n3.records["dev"].fresh
    assert c.take("n1", Drain) == [Drain("dev", "n3", ("a/#",))]
    assert c.take("n2", Drain) == [] and c.take("n2", Discard) == []
    c.run("n1", c.nodes["n1"].on_drained("dev", True, c.now))
    assert c.take("n1", Deny) == [Deny("dev")]
    assert n3.counters["moves"] == 1


def test_a_newer_connect_elsewhere_kicks_without_will_when_the_session_moves():
    c = Cluster()
    c.connect("n1", "dev")
    c.take("n2", Deny)
    c.connect("n2", "dev", present=True)
    assert c.take("n1", Kick) == [Kick("dev", with_will=False)]
    assert c.take("n1", Drain) == [Drain("dev", "n2")]


def test_takeover_of_a_non_persistent_session_sends_the_will():
    c = Cluster()
    c.connect("n1", "dev", clean=True, expiry=0)
    c.connect("n2", "dev", clean=True, expiry=0)
    assert c.take("n1", Kick) == [Kick("dev", with_will=True)]
    assert c.take("n1", Drain) == [] and c.take("n1", Discard) == []


def test_clean_start_elsewhere_discards_the_old_session():
    c = Cluster()
    c.connect("n1", "dev")
    c.disconnect("n1", "dev")
    c.connect("n2", "dev", clean=True)
    assert c.take("n1", Discard) == [Discard("dev")]
    assert c.take("n1", Drain) == []


def test_simultaneous_connects_settle_on_the_latest_everywhere():
    c = Cluster()
    a = c.nodes["n1"].on_connect("dev", None, "mqtt5", False, 60, False, 5_000_000)
    b = c.nodes["n2"].on_connect("dev", None, "mqtt5", False, 60, False, 5_000_001)
    c.run("n1", a)
    c.run("n2", b)
    owners = {n: r.records["dev"].owner for n, r in c.nodes.items()}
    assert set(owners.values()) == {"n2"}
    assert c.take("n1", Kick) and not c.take("n2", Kick)


def test_an_expired_or_ended_session_is_not_denied_or_materialized():
    c = Cluster()
    c.connect("n1", "dev", expiry=5)
    c.disconnect("n1", "dev", expiry=5)
    n2 = c.nodes["n2"]
    assert "dev" in n2.denied
    later = c.now + 6_000
    assert n2.on_connect_rejected("dev", "denied", later) == []
    c.connect("n1", "gone", expiry=0, clean=True)
    c.disconnect("n1", "gone", kept=False, expiry=0)
    assert n2.records["gone"].deleted and "gone" not in n2.denied


def test_an_unused_shadow_is_discarded_not_drained_when_the_client_goes_elsewhere():
    c = Cluster()
    c.connect("n1", "dev")
    c.disconnect("n1", "dev")
    n3 = c.nodes["n3"]
    c.run("n3", n3.on_connect_rejected("dev", "denied", c.now))
    c.take("n3", Materialize)
    c.run("n3", n3.on_materialized("dev", True, c.now))
    c.connect("n2", "dev", present=True)  # it resumed on n2 instead (n2 made it too)
    assert c.take("n3", Discard) == [Discard("dev")]
    assert c.take("n3", Drain) == []
    assert c.take("n1", Drain) == [Drain("dev", "n2")]


def test_older_records_never_replace_newer_ones():
    reg = SessionRegistry("n1")
    new = SessionRecord("dev", "n2", 10, 12, subscriptions={"a": 1})
    old = SessionRecord("dev", "n3", 9, 20)
    reg.on_remote([new], 0)
    reg.on_remote([old], 0)
    assert reg.records["dev"] == new


def test_a_failed_operation_is_retried_after_a_pause():
    c = Cluster()
    c.connect("n1", "dev")
    c.connect("n2", "dev", present=True)
    n1 = c.nodes["n1"]
    c.take("n1", Kick)
    [drain] = c.take("n1", Drain)
    c.run("n1", n1.on_drained("dev", False, c.now))
    assert n1.on_tick(c.now + 10) == []
    # (kept out while it is drained again, as from the start: its client would take over the
    # shadow, and a copy of a session owned elsewhere admits it only under a claim)
    assert "dev" in n1.denied
    assert n1.on_tick(c.now + 2_000) == [drain]


def test_a_copy_made_ahead_of_its_client_is_held_until_it_connects():
    c = Cluster()
    c.connect("n1", "dev")
    c.disconnect("n1", "dev")
    n3 = c.nodes["n3"]
    c.run("n3", n3.on_connect_rejected("dev", "denied", c.now))
    assert c.take("n3", Hold) == [Hold("dev", True)]
    c.run("n3", n3.on_materialized("dev", True, c.now))
    c.connect("n3", "dev", present=True)
    assert c.take("n3", Hold) == [Hold("dev", False)]
    # the old owner drains (holding its copy after the barrier: the adapter's part)
    assert c.take("n1", Drain) == [Drain("dev", "n3", ())]
    assert "dev" in c.nodes["n1"].holding
    c.run("n1", c.nodes["n1"].on_drained("dev", True, c.now))
    assert c.take("n1", Hold) == [Hold("dev", False)]


def test_the_owner_rebuilds_a_session_its_mosquitto_lost():
    c = Cluster()
    c.connect("n1", "dev")
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "a/#", 1, c.now))
    c.disconnect("n1", "dev")
    n1 = c.nodes["n1"]
    c.run("n1", n1.on_local_snapshot({}, set(), c.now))  # Mosquitto restarted: nothing
    [mat] = c.take("n1", Materialize)
    assert mat.record.subscriptions == {"a/#": 1}
    assert c.take("n1", Deny) == [Deny("dev")]  # no false "no session" meanwhile
    assert c.take("n1", Hold) == []  # it queues: it is the only copy
    c.run("n1", n1.on_materialized("dev", True, c.now))
    assert c.take("n1", Admit) == [Admit("dev")]


def test_subscriptions_of_a_session_that_ends_with_its_connection_are_not_replicated():
    reg = SessionRegistry("n1")
    reg.on_connect("dev", None, "mqtt5", True, 0, False, 1_000)
    assert reg.on_subscribe("dev", "a/#", 1, 1_001) == []
    reg.on_connect("kept", None, "mqtt5", True, 60, False, 1_000)
    [publish] = reg.on_subscribe("kept", "a/#", 1, 1_001)
    assert isinstance(publish, Publish) and publish.record.subscriptions == {"a/#": 1}


def test_after_a_partition_the_registry_heals_to_the_latest_connect():
    """n1 and n2 cannot reach each other; the same client id connects on both (n2 later).
    When the streams come back each sends all its records: both settle on n2's connect, and
    n1 closes its connection and hands its session's queue to n2."""
    n1, n2 = SessionRegistry("n1"), SessionRegistry("n2")
    n1.on_connect("dev", None, "mqtt5", False, 600, False, 5_000_000)
    n1.on_subscribe("dev", "a/#", 1, 5_000_001)
    n2.on_connect("dev", None, "mqtt5", False, 600, False, 5_000_500)
    to_n1 = n1.on_remote(n2.snapshot(), 5_001_000)
    to_n2 = n2.on_remote(n1.snapshot(), 5_001_000)
    assert n1.records["dev"] == n2.records["dev"] and n1.records["dev"].owner == "n2"
    assert Kick("dev", with_will=True) in to_n1  # n2's connect found no session: fresh
    assert Discard("dev") in to_n1 and not any(isinstance(a, Kick) for a in to_n2)


def test_subscription_options_and_identifiers_are_kept_and_replicated():
    from sidecar.sessions import wire
    from sidecar.sessions.record import Subscription

    c = Cluster()
    c.connect("n1", "dev")
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "a/#", 1, c.now))
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "a/#", 1, c.now, options=1 | 0x04 | 0x08,
                                           subscription_id=300))
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "b", 2, c.now, options=2))
    record = c.nodes["n2"].records["dev"]
    assert Subscription.unpack(record.subscriptions["a/#"]) == Subscription(1, True, True, 300)
    assert Subscription.unpack(record.subscriptions["b"]) == Subscription(2)
    again = wire.record_from_proto(wire.record_to_proto(record))
    assert again.subscriptions == record.subscriptions
    # options unknown again (a new QoS): the defaults until the plugin reads them
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "a/#", 0, c.now))
    assert c.nodes["n3"].records["dev"].subscriptions["a/#"] == 0


def test_packing_a_subscription_round_trips():
    from sidecar.sessions.record import Subscription

    for s in (Subscription(0), Subscription(2, True), Subscription(1, False, True, 1),
              Subscription(1, True, True, 268_435_455)):
        assert Subscription.unpack(s.pack()) == s
    assert Subscription(2).pack() == 2  # a plain QoS is the default options


def test_a_copy_being_drained_keeps_its_client_out_and_a_failed_drain_lets_it_back():
    """Its client coming back during the drain would take over the drain's shadow; after a
    failed drain the copy (its subscriptions given back by the adapter) may be resumed: its
    client, trying, is kept out once and claimed (claims.py), then admitted."""
    c = Cluster()
    c.connect("n1", "dev")
    c.connect("n2", "dev", present=True)
    n1 = c.nodes["n1"]
    assert c.take("n1", Drain) and "dev" in n1.denied
    assert not [a for a in n1.on_drained("dev", False, c.now) if isinstance(a, Admit)]
    admits = [a for a in n1.on_connect_rejected("dev", "denied", c.now)
              if isinstance(a, Admit)]
    assert admits == [Admit("dev")] and "dev" not in n1.denied


def _arriving(up: set[str], ordered: set[str]) -> tuple[Cluster, SessionRegistry]:
    """`dev`'s session made on n1, offline; its client tries n3, which sees `up` (the peers up)
    and `ordered` (those marking the end of their hand-overs: `session-order`) and makes the
    session (its Hold taken from the actions)."""
    c = Cluster()
    c.connect("n1", "dev")
    c.disconnect("n1", "dev")
    n3 = c.nodes["n3"]
    n3.on_peers(up, c.now, ordered)
    c.run("n3", n3.on_connect_rejected("dev", "denied", c.now))
    c.run("n3", n3.on_materialized("dev", True, c.now))
    return c, n3


def test_a_moved_client_gets_the_old_queue_before_what_reaches_it_meanwhile():
    """Its copy is held live until the old owner's last backlog frame is in: the plugin keeps
    what reaches the client there until then."""
    c, n3 = _arriving({"n1", "n2"}, {"n1", "n2"})
    assert c.take("n3", Hold) == [Hold("dev", True, live=True, source="n1")]
    c.connect("n3", "dev", present=True)
    assert c.take("n3", Hold) == []  # still held: the old queue comes first
    assert c.take("n1", Drain) == [Drain("dev", "n3", ())]
    released = n3.on_backlog_in("dev", c.now)
    assert released[0] == Hold("dev", False)
    # peers learn that the move settled (a connect elsewhere waited for it)
    [settled] = [a.record for a in released if isinstance(a, Publish)]
    assert settled.settles_by_ms == 0 and settled.owner == "n3"
    assert n3.on_backlog_in("dev", c.now) == []  # (only once)
    assert n3.counters["ordered_moves"] == 1 and not n3.awaiting and not n3.live_held


def test_a_live_hold_without_the_end_of_the_old_queue_goes_off_after_a_while():
    c, n3 = _arriving({"n1"}, {"n1"})
    c.connect("n3", "dev", present=True)
    c.take("n3", Hold)
    assert n3.on_tick(c.now + LIVE_HOLD_MS - 1) == []
    assert Hold("dev", False) in n3.on_tick(c.now + LIVE_HOLD_MS)
    assert n3.counters["order_timeouts"] == 1


def test_no_live_hold_when_the_old_owner_does_not_mark_its_last_frame_or_is_down():
    for up, ordered in (({"n1"}, set()), (set(), {"n1"})):
        c, _ = _arriving(up, ordered)
        assert c.take("n3", Hold) == [Hold("dev", True)]
        c.connect("n3", "dev", present=True)
        assert c.take("n3", Hold) == [Hold("dev", False)]


def test_a_clean_start_or_a_move_onwards_ends_a_live_hold():
    c, n3 = _arriving({"n1", "n2"}, {"n1", "n2"})
    c.take("n3", Hold)
    c.connect("n3", "dev", clean=True)  # a fresh session: nothing comes to wait for
    assert c.take("n3", Hold) == [Hold("dev", False)] and not n3.awaiting

def _moved_on_before_the_old_queue() -> tuple[Cluster, SessionRegistry]:
    """`dev` resumed on n3 (held live, waiting for n1's queue), then gone on to n2 before
    that queue arrived."""
    c, n3 = _arriving({"n1", "n2"}, {"n1", "n2"})
    c.connect("n3", "dev", present=True)
    c.disconnect("n3", "dev")
    c.connect("n2", "dev", present=True)
    return c, n3


def test_a_copy_whose_client_moved_on_takes_the_old_queue_before_it_is_drained():
    """A chain of quick moves n1 -> n3 -> n2: n3 drains to n2 only once n1's queue is in its
    copy (ahead of what the live hold kept), so n2 gets the messages in publish order."""
    c, n3 = _moved_on_before_the_old_queue()
    assert c.take("n3", Drain) == [] and n3.takes_backlog("dev")
    assert not c.nodes["n1"].takes_backlog("dev")
    c.run("n3", n3.on_backlog_in("dev", c.now))
    assert c.take("n3", Drain) == [Drain("dev", "n2", ())]
    assert not n3.awaiting and not n3.live_held and not n3.takes_backlog("dev")
    assert n3.counters["order_chained"] == 1 and n3.counters["order_moved_on"] == 0
    assert n3.counters["ordered_moves"] == 0 and n3.on_backlog_in("dev", c.now) == []


def test_a_copy_whose_client_moved_on_is_drained_when_the_old_queue_does_not_come():
    c, n3 = _moved_on_before_the_old_queue()
    c.run("n3", n3.on_tick(c.now + LIVE_HOLD_MS - 30))
    assert c.take("n3", Drain) == []
    c.run("n3", n3.on_tick(c.now + LIVE_HOLD_MS))
    assert c.take("n3", Drain) == [Drain("dev", "n2", ())]
    assert n3.counters["order_timeouts"] == 1 and not n3.takes_backlog("dev")


def test_a_copy_waiting_for_the_old_queue_is_discarded_at_a_clean_start_elsewhere():
    c, n3 = _arriving({"n1", "n2"}, {"n1", "n2"})
    c.connect("n3", "dev", present=True)
    c.disconnect("n3", "dev")
    c.connect("n2", "dev", clean=True)
    assert c.take("n3", Discard) == [Discard("dev")] and c.take("n3", Drain) == []
    assert not n3.awaiting and n3.counters["order_moved_on"] == 1
    assert not n3.takes_backlog("dev")


def _moving_to_n3_then_trying_n2() -> tuple[Cluster, SessionRegistry, SessionRegistry]:
    """`dev` resumed on n3 (held live, n1's queue on its way), left at once and tried n2,
    which made the session there (n2 sees n3 up)."""
    c, n3 = _arriving({"n1", "n2"}, {"n1", "n2"})
    c.connect("n3", "dev", present=True)
    n2 = c.nodes["n2"]
    assert 0 < n2.records["dev"].settles_by_ms - c.now <= MOVE_SETTLE_WAIT_MS
    c.disconnect("n3", "dev")
    n2.on_peers({"n1", "n3"}, c.now, {"n1", "n3"})
    c.take("n2", Admit)
    c.run("n2", n2.on_connect_rejected("dev", "denied", c.now))
    assert c.take("n2", Materialize)
    c.run("n2", n2.on_materialized("dev", True, c.now))
    return c, n3, n2


def test_a_connect_elsewhere_waits_until_the_last_move_settled():
    """n3 still takes n1's queue: n2 keeps the client out (no CONNACK, it retries) until n3
    says the move settled, so the move to n2 does not chain (in cut mode: exactly once)."""
    c, n3, n2 = _moving_to_n3_then_trying_n2()
    assert c.take("n2", Admit) == [] and "dev" in n2.denied
    assert n2.counters["settle_waited"] == 1
    c.run("n3", n3.on_backlog_in("dev", c.now))
    assert c.take("n2", Admit) == [Admit("dev")] and not n2.settle_waits
    assert n2.records["dev"].settles_by_ms == 0
    c.connect("n2", "dev", present=True)
    assert c.take("n3", Drain) == [Drain("dev", "n2", ())]
    assert n3.counters["order_chained"] == 0 and n3.counters["ordered_moves"] == 1


def test_a_connect_elsewhere_is_admitted_when_the_move_takes_too_long():
    c, _, n2 = _moving_to_n3_then_trying_n2()
    until = n2.records["dev"].settles_by_ms
    c.run("n2", n2.on_tick(until - 1))
    assert c.take("n2", Admit) == []
    c.run("n2", n2.on_tick(until))
    assert c.take("n2", Admit) == [Admit("dev")]
    assert n2.counters["settle_waits_expired"] == 1


def test_no_wait_for_a_move_on_an_owner_that_is_down_or_whose_clock_is_far_off():
    from dataclasses import replace
    c, _, n2 = _moving_to_n3_then_trying_n2()
    c.run("n2", n2.on_peers({"n1"}, c.now, {"n1"}))  # n3's stream went down
    assert c.take("n2", Admit) == [Admit("dev")]
    c, n3, n2 = _moving_to_n3_then_trying_n2()
    record = n2.records["dev"]
    ahead = replace(record, settles_by_ms=c.now + 10 * MOVE_SETTLE_WAIT_MS,
                    change_hlc=record.change_hlc + 1)
    c.run("n2", n2.on_remote([ahead], c.now))
    assert c.take("n2", Admit) == [Admit("dev")]


def test_a_copy_made_for_an_arriving_client_follows_its_move_elsewhere_meanwhile():
    """n3 makes the copy (live, its hand-over from n1) while the client connects to n2 first:
    the hold's source becomes n2, whose hand-over comes and to which n3's cut goes (it went to
    n1, which was no longer the old copy: 20 of n2's own messages came twice)."""
    c, n3 = _arriving({"n1", "n2"}, {"n1", "n2"})
    assert c.take("n3", Hold) == [Hold("dev", True, live=True, source="n1")]
    c.connect("n2", "dev", present=True)
    assert c.take("n3", Hold) == [Hold("dev", True, live=True, source="n2")]
    c.connect("n2", "dev", present=True)  # (the same owner again: nothing new)
    assert c.take("n3", Hold) == []


def test_a_drain_abandoned_because_its_client_came_back_leaves_the_session_here():
    """The client connected on n2 (n1 drains), then back on n1 before n1's deny took effect:
    the adapter finds the record n1's again and abandons the drain; n1 keeps the session, no
    failure is counted and nothing is drained."""
    c = Cluster()
    c.connect("n1", "dev")
    c.disconnect("n1", "dev")
    c.connect("n2", "dev", present=True)
    n1 = c.nodes["n1"]
    assert c.take("n1", Drain) == [Drain("dev", "n2", ())] and n1.busy == {"dev": "drain"}
    c.disconnect("n2", "dev")
    c.connect("n1", "dev", present=True)  # slipped in before the deny
    assert n1.records["dev"].owner == "n1"
    c.run("n1", n1.on_abandoned("dev", c.now))
    assert not n1.busy and n1.counters["failures"] == 0
    assert c.take("n1", Drain) == [] and n1.presence["dev"] == "online"
    assert c.take("n2", Drain) == [Drain("dev", "n1", ())]  # n2's copy comes back here


def test_a_cut_goes_only_to_a_copy_the_client_used():
    """Cut mode's cuts go to every peer (a quick reconnect can outrun the record naming the
    old node): a node passes one on only for a copy its client used (the plugin then checks
    that the client's last connect there came before the cut's)."""
    c = Cluster()
    c.connect("n1", "dev")
    c.disconnect("n1", "dev")
    n1, n3 = c.nodes["n1"], c.nodes["n3"]
    c.run("n3", n3.on_connect_rejected("dev", "denied", c.now))  # a copy made ahead on n3
    c.run("n3", n3.on_materialized("dev", True, c.now))
    assert n1.cut_applies("dev")  # n1: the copy its client used
    assert not n3.cut_applies("dev")  # a copy the client never used
    assert not c.nodes["n2"].cut_applies("dev")  # no copy at all
    assert not n1.cut_applies("other")
    c.connect("n3", "dev", present=True)  # it moved on to n3: n3's copy is its session now
    assert n3.cut_applies("dev")
