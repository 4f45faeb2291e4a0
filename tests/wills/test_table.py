"""The will table core: what the owner records, who publishes a dead node's wills and when."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.hlc import HybridClock, Timestamp
from sidecar.rendezvous import choose
from sidecar.wills.liveness import Liveness
from sidecar.wills.record import ARMED, DELAYED, DONE, LEAVING, LOST, WillMessage, WillRecord
from sidecar.wills.table import (
    DONE_KEEP_MS,
    FIRING_AHEAD_MS,
    MOSQUITTO_LAG_MS,
    OWNER_MARGIN_MS,
    PURGE_EVERY_MS,
    RETRY_MS,
    Cancel,
    Fire,
    Forget,
    Notice,
    Persist,
    Store,
    WillTable,
)

T0 = 1_700_000_000_000
GRACE = 3000
WILL = WillMessage("w/t", b"bye", 1, False)


def hlc(ms: int) -> int:
    return Timestamp(ms, 0).pack()


@dataclass
class Registry:
    """The session registry's latest connect per client (a fake `Connections`)."""

    latest: dict[str, int] = field(default_factory=dict)

    def latest_connect(self, client: str) -> int | None:
        return self.latest.get(client)


def table(node: str, members=("n1", "n2", "n3", "n4"), ready_ms: int = 0,
          connections: Registry | None = None) -> WillTable:
    lv = Liveness(node, GRACE)
    lv.on_view({m: 1 for m in members}, T0)
    return WillTable(node, lv, connections or Registry(), HybridClock(max_drift_ms=None),
                     ready_ms=ready_ms, epoch="e1")


def stores(actions) -> list[WillRecord]:
    return [a.record for a in actions if isinstance(a, Store)]


def fires(actions) -> list[WillRecord]:
    return [a.record for a in actions if isinstance(a, Fire)]


def kill(t: WillTable, node: str, at: int) -> None:
    """`node`'s lease expires and its streams go down at `at`; confirmed GRACE later."""
    t.liveness.on_view({m: 1 for m in t.liveness.members if m != node}, at)
    t.liveness.on_stream(node, False, at)
    t.liveness.tick(at + GRACE, t.owners)


# ---- the owner ---------------------------------------------------------------------------
def test_connect_with_a_will_arms_it_and_without_one_supersedes_the_older():
    t = table("n1")
    [armed] = stores(t.on_connect("c", hlc(T0), WILL, True, 60, "e1", T0))
    assert (armed.state, armed.owner, armed.epoch, armed.connect_hlc, armed.will) == (
        ARMED, "n1", "e1", hlc(T0), WILL)
    [gone] = stores(t.on_connect("c", hlc(T0 + 5), None, True, 60, "e1", T0 + 5))
    assert (gone.state, gone.outcome, gone.connect_hlc) == (DONE, "superseded", hlc(T0 + 5))
    assert t.on_connect("c", hlc(T0 + 9), None, True, 60, "e1", T0 + 9) == []
    assert t.on_connect("d", hlc(T0), None, False, 0, "e1", T0) == []
    assert t.counters["unknown"] == 1


def test_disconnect_fates():
    t = table("n1")
    for c in "abcd":
        t.on_connect(c, hlc(T0), WILL, True, 60, "e1", T0)
    outcome = {}
    for c, fate in zip("abcd", ("sent", "none", None, "delayed"), strict=True):
        [r] = stores(t.on_disconnect(c, fate, 30, T0 + 100))
        outcome[c] = (r.state, r.outcome, r.will is not None)
    assert outcome == {"a": (DONE, "sent_by_owner", False), "b": (DONE, "cleared", False),
                       "c": (DONE, "unknown", False), "d": (DELAYED, "", True)}
    delayed = t.records["d"]
    assert (delayed.since_ms, delayed.expiry) == (T0 + 100, 30)
    assert t.on_disconnect("d", "sent", 0, T0 + 200) == []  # not armed any more
    assert t.on_disconnect("nobody", "sent", 0, T0) == []


def test_the_owner_counts_its_delayed_will_sent_once_mosquitto_is_due():
    t = table("n1")
    t.on_connect("c", hlc(T0), WillMessage("w", b"", 0, False, delay=10), True, 0, "e1", T0)
    t.on_disconnect("c", "delayed", 0, T0)  # expiry 0: Mosquitto 2.0.11 still waits 10 s
    due = T0 + 10_000 + OWNER_MARGIN_MS
    assert stores(t.on_tick(due - 1)) == []
    [done] = stores(t.on_tick(due))
    assert (done.state, done.outcome) == (DONE, "sent_by_owner")


def test_a_delayed_will_of_a_client_back_elsewhere_without_a_session_is_cancelled_here():
    """One broker drops a pending delayed will when its client connects again within the
    delay; with a session expiry of 0 no session moves (whose resume would cancel it), so the
    owner cancels it in its Mosquitto once it learns of the newer connect."""
    t = table("n1")
    later = WillMessage("w", b"", 0, False, delay=10)
    for client, expiry in (("gone", 0), ("kept", 60)):
        t.on_connect(client, hlc(T0), later, True, expiry, "e1", T0)
        t.on_disconnect(client, "delayed", expiry, T0 + 100)
    elsewhere = [WillRecord(c, "n2", "e9", hlc(T0 + 500), hlc(T0 + 500), "n2", DONE,
                            outcome="superseded") for c in ("gone", "kept")]
    actions = t.on_remote(elsewhere, T0 + 600)
    assert [a.client for a in actions if isinstance(a, Cancel)] == ["gone"]
    assert t.counters["cancelled_reconnected"] == 1
    # (a session with expiry: its drain resumes it there, which cancels it)
    # an older connection's record cancels nothing
    t.on_connect("old", hlc(T0 + 1000), later, True, 0, "e1", T0 + 1000)
    t.on_disconnect("old", "delayed", 0, T0 + 1100)
    stale = WillRecord("old", "n2", "e9", hlc(T0 + 10), hlc(T0 + 2000), "n2", DONE,
                       outcome="superseded")
    assert not [a for a in t.on_remote([stale], T0 + 2100) if isinstance(a, Cancel)]


# ---- a dead owner ------------------------------------------------------------------------
def _replicated(owner_will: WillMessage = WILL, state: str = ARMED, since: int = T0,
                expiry: int | None = 60) -> WillRecord:
    return WillRecord("dev", "n1", "e1", hlc(T0), hlc(T0), "n1", state, "", since, expiry,
                      owner_will)


def _survivors() -> dict[str, WillTable]:
    out = {n: table(n) for n in ("n2", "n3", "n4")}
    for t in out.values():
        t.on_remote([_replicated()], T0)
    return out


def test_exactly_one_survivor_publishes_once_the_owner_is_confirmed_dead():
    survivors = _survivors()
    for t in survivors.values():
        assert t.on_tick(T0 + 1000) == []  # alive: its Mosquitto holds the will
        kill(t, "n1", T0 + 1000)
    fired = {n: fires(t.on_tick(T0 + 1000 + GRACE)) for n, t in survivors.items()}
    chosen = choose("dev", ["n2", "n3", "n4"])
    assert {n for n, f in fired.items() if f} == {chosen}
    t = survivors[chosen]
    assert fires(t.on_tick(T0 + 5000 + GRACE)) == []  # firing: not twice
    [done] = stores(t.on_fired("dev", hlc(T0), True, T0 + 5000))
    assert (done.state, done.outcome, done.writer) == (DONE, "published", chosen)
    assert t.counters["published_dead_node"] == 1
    for n, other in survivors.items():  # the record reaches the others: nothing more to do
        if n != chosen:
            other.on_remote([done], T0 + 5001)
            assert fires(other.on_tick(T0 + 60_000)) == []


def test_a_failed_publish_is_retried():
    t = table("n2", members=("n1", "n2"))
    t.on_remote([_replicated()], T0)
    kill(t, "n1", T0)
    [f] = fires(t.on_tick(T0 + GRACE))
    assert t.on_fired("dev", f.connect_hlc, False, T0 + GRACE) == []
    assert fires(t.on_tick(T0 + GRACE + RETRY_MS - 1)) == []
    assert fires(t.on_tick(T0 + GRACE + RETRY_MS)) == [f]
    assert t.counters["publish_failures"] == 1


def test_the_delay_counts_from_the_death_and_is_capped_by_the_session_expiry():
    t = table("n2", members=("n1", "n2"))
    t.on_remote([_replicated(WillMessage("w", b"", 1, False, delay=20), expiry=8)], T0)
    kill(t, "n1", T0 + 1000)  # streams down at T0 + 1 s
    assert fires(t.on_tick(T0 + 1000 + 8000 - 1)) == []
    assert len(fires(t.on_tick(T0 + 1000 + 8000))) == 1


def test_a_delayed_will_of_a_dead_owner_is_due_from_its_disconnect():
    t = table("n2", members=("n1", "n2"))
    delayed = _replicated(WillMessage("w", b"", 1, False, delay=10), DELAYED, since=T0)
    t.on_remote([delayed], T0)
    kill(t, "n1", T0 + 2000)
    assert t.due_ms(t.records["dev"]) == T0 + 10_000
    assert fires(t.on_tick(T0 + 9999)) == []
    assert len(fires(t.on_tick(T0 + 10_000))) == 1


def test_a_client_that_connected_again_anywhere_is_skipped():
    reg = Registry({"dev": hlc(T0 + 500)})
    t = table("n2", members=("n1", "n2"), connections=reg)
    t.on_remote([_replicated()], T0)
    kill(t, "n1", T0)
    actions = t.on_tick(T0 + GRACE)
    assert fires(actions) == []
    [done] = stores(actions)
    assert (done.state, done.outcome) == (DONE, "skipped")
    assert t.counters["skipped_reconnected"] == 1


def test_nothing_is_published_for_others_before_the_warm_up():
    t = table("n2", members=("n1", "n2"), ready_ms=T0 + 60_000)
    t.on_remote([_replicated()], T0)
    kill(t, "n1", T0)
    assert fires(t.on_tick(T0 + GRACE)) == []
    assert len(fires(t.on_tick(T0 + 60_000))) == 1


# ---- handover, lost Mosquitto, false death -----------------------------------------------
def test_a_draining_node_hands_its_wills_over_and_never_publishes_them_itself():
    owner = table("n1", members=("n1", "n2", "n3"))
    owner.on_connect("a", hlc(T0), WILL, True, 60, "e1", T0)
    owner.on_connect("b", hlc(T0), WillMessage("w", b"", 1, False, delay=5), True, 60, "e1", T0)
    owner.on_disconnect("b", "delayed", 60, T0 + 100)
    owner.on_connect("c", hlc(T0), WILL, True, 60, "e1", T0)
    owner.on_disconnect("c", "none", 60, T0 + 100)
    handed = owner.handover(T0 + 200)
    assert {r.client: (r.state, r.orphaned, r.since_ms) for r in handed} == {
        "a": (ARMED, LEAVING, T0 + 200), "b": (DELAYED, LEAVING, T0 + 100)}
    survivors = {n: table(n, members=("n1", "n2", "n3")) for n in ("n2", "n3")}
    for t in survivors.values():
        t.on_remote(handed, T0 + 200)
    for client, due in (("a", T0 + 200), ("b", T0 + 5100)):
        chosen = choose(client, ["n2", "n3"])  # the leaving owner (still a member) excluded
        assert fires(owner.on_tick(due)) == []
        for n, t in survivors.items():
            assert fires(t.on_tick(due - 1)) == []
            got = [r.client for r in fires(t.on_tick(due))]
            assert (client in got) == (n == chosen), (client, n)
    assert survivors[choose("a", ["n2", "n3"])].on_fired("a", hlc(T0), True, T0)
    assert survivors[choose("a", ["n2", "n3"])].counters["published_leaving"] == 1


def test_a_draining_node_waits_for_a_will_its_mosquitto_sends_now_and_hands_it_over_done():
    """A delayed will due as the drain hands the wills over is sent by this node's Mosquitto
    (it checks once a second): the drain waits for that, then hands it over as done, so no
    survivor sends it again (a CI run got the will twice)."""
    owner = table("n1", members=("n1", "n2", "n3"))
    owner.on_connect("b", hlc(T0), WillMessage("w", b"", 1, False, delay=3), True, 60, "e1", T0)
    owner.on_disconnect("b", "delayed", 60, T0)
    assert not owner.firing_here(T0 + 1_000)
    assert owner.firing_here(T0 + 3_000 - FIRING_AHEAD_MS)
    assert owner.firing_here(T0 + 3_000 + MOSQUITTO_LAG_MS - 1)
    assert not owner.firing_here(T0 + 3_000 + MOSQUITTO_LAG_MS)
    handed = owner.handover(T0 + 3_000 + MOSQUITTO_LAG_MS)
    assert [(r.client, r.state, r.outcome) for r in handed] == [("b", DONE, "published")]
    survivor = table("n2", members=("n1", "n2", "n3"))
    survivor.on_remote(handed, T0 + 5_000)
    assert fires(survivor.on_tick(T0 + 10_000)) == []
    assert owner.counters["sent_by_owner"] == 1


def test_a_restarted_mosquitto_leaves_its_wills_lost_and_they_are_published():
    t = table("n1", members=("n1", "n2"))
    t.on_connect("a", hlc(T0), WILL, True, 60, "e1", T0)
    t.on_connect("b", hlc(T0), WILL, True, 60, "e1", T0)
    t.on_connect("c", hlc(T0), WILL, True, 60, "e1", T0)
    # the same Mosquitto, the sidecar was away: c left meanwhile, a is still online
    actions = t.on_local_snapshot("e1", {"a": (WILL, True), "d": (WILL, True)}, T0 + 10)
    by_client = {r.client: r for r in stores(actions)}
    assert by_client["b"].outcome == by_client["c"].outcome == "unknown"
    assert by_client["d"].state == ARMED and "a" not in by_client
    # then Mosquitto restarts: a new epoch; the old run's wills are lost with it
    actions = t.on_local_snapshot("e2", {}, T0 + 20)
    lost = {r.client: r.orphaned for r in stores(actions)}
    assert lost == {"a": LOST, "d": LOST}
    chosen = choose("a", ["n1", "n2"])
    fired = fires(t.on_tick(T0 + 20))
    assert ("a" in [r.client for r in fired]) == (chosen == "n1")


def test_a_will_published_for_a_client_still_online_here_is_noticed():
    owner = table("n1")
    [armed] = stores(owner.on_connect("c", hlc(T0), WILL, True, 60, "e1", T0))
    published = WillRecord("c", "n1", "e1", armed.connect_hlc, hlc(T0 + 9000), "n2", DONE,
                           outcome="published")
    actions = owner.on_remote([published], T0 + 9000)
    assert [type(a) for a in actions] == [Notice, Persist]
    assert owner.counters["published_while_online"] == 1
    assert owner.on_disconnect("c", "sent", 0, T0 + 10_000) == []  # done already


def test_remote_records_older_than_ours_are_ignored():
    t = table("n2")
    newer_one = _replicated()
    t.on_remote([newer_one], T0)
    older = WillRecord("dev", "n1", "e1", hlc(T0 - 10), hlc(T0 - 10), "n1", ARMED, will=WILL)
    assert t.on_remote([older], T0) == []
    assert t.records["dev"] == newer_one


def test_old_done_records_are_forgotten():
    t = table("n1")
    t.on_connect("c", hlc(T0), WILL, True, 60, "e1", T0)
    t.on_disconnect("c", "none", 0, T0)
    t.on_tick(T0 + 1)  # purged recently
    later = T0 + DONE_KEEP_MS + PURGE_EVERY_MS + 1
    actions = t.on_tick(later)
    assert [a for a in actions if isinstance(a, Forget)] == [Forget(("c",))]
    assert "c" not in t.records
