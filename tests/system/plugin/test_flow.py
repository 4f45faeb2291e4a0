"""Flow control, replay after a sidecar restart, snapshots and buffer overflow."""

from __future__ import annotations

import time

import pytest

from tests.system.plugin.helpers import NEVER, Client, EventModel, FakeSidecar, normalize_snapshot


def assert_no_gap(events: list[dict], first: int = 1) -> None:
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(first, first + len(seqs))), (
        f"gap: {len(seqs)} events, first missing after "
        f"{next((a for a, b in zip(seqs, seqs[1:], strict=False) if b != a + 1), None)}")


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 1000000], ids=["flow-controlled", "no-flow-control"])
def test_burst_of_5000_subscribes(make_broker, clients, window):
    """5,000 subscribe events at once with Mosquitto's default max_queued_messages (1000):
    with the event window the sidecar sees seq 1..N without a gap; the control run without a
    window shows the burst really overruns Mosquitto's queue."""
    b = make_broker(opts={} if window is None else {"event_window": window})
    sc = clients(FakeSidecar(b.sock)).start()
    c = clients(Client("burst", port=b.port))
    c.connect()
    filters = [(f"burst/{i}/+", i % 3) for i in range(5000)]
    for i in range(0, 5000, 1000):
        c.subscribe(filters[i:i + 1000], timeout=30)
    if window is None:
        subs = sc.wait_type("subscribe", client="burst", count=5000, timeout=60)
        events = sc.wait_synced(timeout=30)
        assert_no_gap(events)
        assert [(e["filter"], e["qos"]) for e in subs] == filters
        assert "being dropped" not in b.log()
        assert sc.call("stats")["subscriptions"] == 5000
    else:
        sc.wait_events(lambda e: False, timeout=3)
        got = [e for e in sc.unique_events() if e["type"] == "subscribe"]
        assert len(got) < 5000
        assert "Outgoing messages are being dropped" in b.log()


def scenario_part1(port: int, clients) -> dict[str, Client]:
    a = clients(Client("pa", port=port, session_expiry=600, clean_start=False))
    a.connect()
    a.subscribe("a/1", 1)
    a.subscribe("$share/g/a/2", 2)
    b = clients(Client("pb", port=port, protocol=4, clean_start=False))
    b.connect()
    b.subscribe("b/#", 1)
    return {"pa": a, "pb": b}


def scenario_part2(port: int, clients, made: dict[str, Client]) -> None:
    """Happens while the sidecar is away."""
    made["pa"].subscribe("a/3", 0)
    made["pa"].unsubscribe("a/1")
    made["pb"].disconnect()                       # offline persistent session
    c = clients(Client("pc", port=port))
    c.connect()
    c.subscribe("c/+", 2)
    d = clients(Client("pd", port=port, protocol=4))
    d.connect()
    d.subscribe("d/x")
    d.disconnect()                                # gone entirely
    made["pc"] = c


TRUTH = {
    "pa": {"username": None, "protocol": "mqtt5", "clean_start": False, "session_expiry": 600,
           "online": True, "subs": {"$share/g/a/2": 2, "a/3": 0}},
    "pb": {"username": None, "protocol": "mqtt311", "clean_start": False,
           "session_expiry": NEVER, "online": False, "subs": {"b/#": 1}},
    "pc": {"username": None, "protocol": "mqtt5", "clean_start": True, "session_expiry": 0,
           "online": True, "subs": {"c/+": 2}},
}


def test_sidecar_restart_resume_loses_nothing(make_broker, clients):
    b = make_broker()
    sc1 = clients(FakeSidecar(b.sock)).start()
    made = scenario_part1(b.port, clients)
    sc1.wait_synced()
    sc1.auto_ack = False            # the last few events stay unacked in the plugin's buffer
    made["pa"].subscribe("a/unacked", 1)
    sc1.wait_type("subscribe", filter="a/unacked")
    made["pa"].unsubscribe("a/unacked")
    sc1.wait_type("unsubscribe", filter="a/unacked")
    sc1.disconnect()

    scenario_part2(b.port, clients, made)

    sc2 = clients(FakeSidecar(b.sock)).continue_from(sc1)
    assert sc2.connect() is True    # its persistent session
    rep = sc2.resume(sc1.contig + 1)
    assert rep["ok"] is True and rep["epoch"] == sc1.epoch
    events = sc2.wait_synced()
    assert_no_gap(events)
    assert EventModel().apply_all(events).clients == TRUTH
    _, snap = sc2.snapshot()
    assert normalize_snapshot(snap) == TRUTH


def test_sidecar_restart_snapshot_then_stream(make_broker, clients):
    b = make_broker()
    sc1 = clients(FakeSidecar(b.sock)).start()
    made = scenario_part1(b.port, clients)
    sc1.wait_synced()
    sc1.disconnect()
    scenario_part2(b.port, clients, made)

    sc2 = clients(FakeSidecar(b.sock))     # a sidecar that lost its state
    sc2.connect()
    cut, snap = sc2.snapshot()
    model = EventModel().load_snapshot(snap)
    assert model.clients == TRUTH
    # the stream continues right after the cut
    made["pc"].subscribe("after/cut", 1)
    ev = sc2.wait_type("subscribe", filter="after/cut")[0]
    assert ev["seq"] == cut + 1 or all(
        e["type"] == "heartbeat" for e in sc2.unique_events() if cut < e["seq"] < ev["seq"])
    later = [e for e in sc2.wait_synced() if e["seq"] > cut]
    assert_no_gap(later, cut + 1)
    model.apply_all(later)
    assert model.clients["pc"]["subs"] == {"c/+": 2, "after/cut": 1}


def test_snapshot_equals_live_view_in_chunks(make_broker, clients):
    b = make_broker(opts={"snapshot_chunk": 2})
    sc = clients(FakeSidecar(b.sock)).start()
    made = scenario_part1(b.port, clients)
    scenario_part2(b.port, clients, made)
    extra = clients(Client("pe", port=b.port, username="eve", session_expiry=NEVER,
                           clean_start=False))
    extra.connect()
    extra.subscribe([("e/1", 1), ("e/2", 2)])
    events = sc.wait_synced()
    replies = sc.request("snapshot", expect=None)
    assert sorted(r["chunk"] for r in replies) == [0, 1]
    assert all(r["chunks"] == 2 and r["epoch"] == sc.epoch for r in replies)
    assert [len(r["clients"]) for r in sorted(replies, key=lambda r: r["chunk"])] == [2, 2]
    snap = normalize_snapshot([c for r in replies for c in r["clients"]])
    truth = dict(TRUTH, pe={"username": "eve", "protocol": "mqtt5", "clean_start": False,
                            "session_expiry": NEVER, "online": True,
                            "subs": {"e/1": 1, "e/2": 2}})
    assert snap == truth
    assert EventModel().apply_all(events).clients == truth
    assert replies[0]["seq"] >= events[-1]["seq"]


def test_empty_snapshot_is_one_chunk(broker, clients):
    sc = clients(FakeSidecar(broker.sock))
    sc.connect()
    replies = sc.request("snapshot", expect=None)
    assert len(replies) == 1 and replies[0]["chunks"] == 1 and replies[0]["clients"] == []


def test_overflow_gap_then_snapshot(make_broker, clients):
    b = make_broker(opts={"buffer_max_events": 50})
    sc1 = clients(FakeSidecar(b.sock)).start()
    made = scenario_part1(b.port, clients)
    sc1.wait_synced()
    sc1.disconnect()
    # 120 events while nobody acks: the 50-event buffer overflows
    made["pa"].subscribe([(f"flood/{i}", 0) for i in range(60)])
    made["pa"].unsubscribe([f"flood/{i}" for i in range(60)])
    scenario_part2(b.port, clients, made)

    sc2 = clients(FakeSidecar(b.sock)).continue_from(sc1)
    sc2.connect()
    rep = sc2.resume(sc1.contig + 1)
    assert rep["ok"] is False and rep["error"] == "gap"
    assert rep["oldest"] > sc1.contig + 1
    stats = sc2.call("stats")
    assert stats["overflows"] >= 1
    assert b.log().count("event buffer overflow") == stats["overflows"]
    _, snap = sc2.snapshot()
    assert normalize_snapshot(snap) == TRUTH


def test_resume_refuses_future_seq_and_other_epoch(broker, clients):
    sc = clients(FakeSidecar(broker.sock))
    sc.connect()
    assert sc.call("resume", from_seq=10**6)["error"] == "gap"
    assert sc.call("resume", from_seq=1, epoch="0000000000000000")["error"] == "gap"
    assert sc.call("resume", from_seq="x")["error"] == "bad_request"
    assert sc.call("resume", from_seq=1)["ok"] is True


def test_window_limits_unacked_events(make_broker, clients):
    b = make_broker(opts={"event_window": 10})
    sc = clients(FakeSidecar(b.sock, auto_ack=False))
    sc.connect()
    sc.resume(1)
    c = clients(Client("win", port=b.port))
    c.connect()
    c.subscribe([(f"w/{i}", 0) for i in range(30)])
    sc.wait_events(lambda e: False, timeout=0.5)
    assert len(sc.unique_events()) == 10
    st = sc.call("stats")
    assert st["published"] == 10 and st["buffered"] >= 31 and st["acked"] == 0
    sc.send({"v": 1, "cmd": "ack", "seq": 10})
    assert len(sc.wait_events(lambda e: True, count=20)) == 20
    assert_no_gap(sc.unique_events())


def test_sidecar_crash_then_new_connection_resumes(make_broker, clients):
    b = make_broker()
    sc1 = clients(FakeSidecar(b.sock)).start()
    made = scenario_part1(b.port, clients)
    sc1.wait_synced()
    sc1.drop()                                # no DISCONNECT packet
    scenario_part2(b.port, clients, made)
    sc2 = clients(FakeSidecar(b.sock)).continue_from(sc1)
    assert sc2.connect() is True
    assert sc2.resume(sc1.contig + 1)["ok"] is True
    events = sc2.wait_synced()
    assert_no_gap(events)
    assert EventModel().apply_all(events).clients == TRUTH


def test_second_sidecar_connection_takes_over_silently(make_broker, clients):
    b = make_broker()
    sc1 = clients(FakeSidecar(b.sock)).start()
    c = clients(Client("x", port=b.port))
    c.connect()
    sc1.wait_type("connect", client="x")
    sc2 = clients(FakeSidecar(b.sock)).continue_from(sc1)
    sc2.connect()
    assert sc1.wait_disconnected()
    assert sc2.resume(sc2.contig + 1)["ok"] is True
    c.subscribe("after/takeover")
    sc2.wait_type("subscribe", client="x")
    events = sc2.wait_synced()
    assert_no_gap(events)
    assert [e["type"] for e in events if e["type"] != "heartbeat"] == ["connect", "subscribe"]


def test_ack_of_another_epoch_is_ignored(make_broker, clients):
    b = make_broker(opts={"event_window": 5})
    sc = clients(FakeSidecar(b.sock, auto_ack=False))
    sc.connect()
    sc.resume(1)
    c = clients(Client("ep", port=b.port))
    c.connect()
    c.subscribe([(f"ep/{i}", 0) for i in range(10)])
    sc.wait_events(lambda e: False, timeout=0.3)
    sc.send({"v": 1, "cmd": "ack", "seq": 8, "epoch": "ffffffffffffffff"})
    st = sc.call("stats")
    assert st["acked"] == 0 and st["published"] == 5
    sc.send({"v": 1, "cmd": "ack", "seq": 5, "epoch": sc.epoch})
    sc.wait_events(lambda e: False, timeout=0.3)
    assert sc.call("stats")["acked"] == 5
    assert len(sc.unique_events()) == 10


def test_overflow_while_streaming_shows_the_gap(make_broker, clients):
    """A sidecar that stops acking: past buffer_max_events the buffer is dropped and the stream
    goes on after the jump, so the sidecar sees the gap (never a silent stall)."""
    b = make_broker(opts={"buffer_max_events": 30, "event_window": 10})
    sc = clients(FakeSidecar(b.sock, auto_ack=False))
    sc.connect()
    sc.resume(1)
    c = clients(Client("ov", port=b.port))
    c.connect()
    c.subscribe([(f"ov/{i}", 0) for i in range(40)])
    c.subscribe("ov/after", 1)
    after = sc.wait_events(lambda e: e["seq"] > 31, timeout=5)
    assert after, "the stream stalled after the overflow"
    seqs = [e["seq"] for e in sc.unique_events()]
    assert seqs[:10] == list(range(1, 11))
    assert seqs[10] == 32                                        # the visible gap
    assert "event buffer overflow (buffer_max_events)" in b.log()
    cut, snap = sc.snapshot()
    assert {s["filter"] for s in snap[0]["subscriptions"]} == {
        *(f"ov/{i}" for i in range(40)), "ov/after"}


@pytest.mark.slow
def test_churn_events_rebuild_the_snapshot(make_broker, clients):
    """Many clients at once, with shared ids (takeovers in the same loop iteration), persistent
    and clean sessions, abrupt drops: the model rebuilt from events equals the snapshot."""
    import random
    import threading

    b = make_broker(opts={"event_window": 50})
    sc = clients(FakeSidecar(b.sock)).start()
    rnd = random.Random(7)
    plans = []
    for _ in range(60):
        cid = f"churn-{rnd.randrange(20)}"
        plans.append(dict(cid=cid, proto=rnd.choice([5, 4]), clean=rnd.random() < 0.4,
                          expiry=rnd.choice([0, 30, NEVER]), subs=rnd.randrange(4),
                          end=rnd.choice(["stay", "disconnect", "drop"])))
    made: list[Client] = []
    lock = threading.Lock()

    def run(plan):
        kw = {"protocol": plan["proto"], "clean_start": plan["clean"]}
        if plan["proto"] == 5:
            kw["session_expiry"] = plan["expiry"]
        c = Client(plan["cid"], port=b.port, **kw)
        with lock:
            made.append(clients(c))
        try:
            c.connect()
            for j in range(plan["subs"]):
                c.subscribe(f"churn/{plan['cid']}/{j}", j % 3, timeout=1)
            if plan["end"] == "disconnect":
                c.disconnect()
            elif plan["end"] == "drop":
                c.drop()
        except Exception:
            pass  # taken over mid-way: fine, the broker and the plugin decide

    threads = [threading.Thread(target=run, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    time.sleep(0.5)
    events = sc.wait_synced(timeout=20)
    assert_no_gap(events)
    _, snap = sc.snapshot()
    model = EventModel().apply_all(events)
    assert model.clients == normalize_snapshot(snap)
    st = sc.call("stats")
    assert st["sessions"] == len(snap)
    assert st["clients"] == sum(1 for c in snap if c["online"])
    assert b.alive()


def test_waiting_events_go_in_batches(make_broker, clients):
    """With event_batch, events that wait for the window go several per message (newline
    separated), in order and without a gap."""
    b = make_broker(opts={"event_batch": 100})
    sc = clients(FakeSidecar(b.sock)).start()
    c = clients(Client("batch", port=b.port))
    c.connect()
    filters = [(f"batch/{i}", 1) for i in range(2000)]
    for i in range(0, 2000, 500):
        c.subscribe(filters[i:i + 500], timeout=30)
    subs = sc.wait_type("subscribe", client="batch", count=2000, timeout=60)
    assert_no_gap(sc.wait_synced(timeout=30))
    assert [(e["filter"], e["qos"]) for e in subs] == filters
    assert sc.event_messages < 2000 / 2, f"{sc.event_messages} messages for 2,000 events"


def test_a_client_with_many_subscriptions_is_split_over_chunks(broker, clients):
    """A chunk holds at most 5,000 subscriptions: a client with 12,000 comes as consecutive
    entries in three chunks, which together hold each of its subscriptions once."""
    sc = clients(FakeSidecar(broker.sock)).start()
    c = clients(Client("many", port=broker.port))
    c.connect()
    filters = [(f"many/{i}", i % 3) for i in range(12000)]
    for i in range(0, len(filters), 1000):
        c.subscribe(filters[i:i + 1000], timeout=30)
    sc.wait_type("subscribe", client="many", count=12000, timeout=60)
    cut, entries = sc.snapshot(timeout=30)
    parts = [e for e in entries if e["client"] == "many"]
    assert [len(p["subscriptions"]) for p in parts] == [5000, 5000, 2000]
    got = [(s["filter"], s["qos"]) for p in parts for s in p["subscriptions"]]
    assert sorted(got) == sorted(filters)
