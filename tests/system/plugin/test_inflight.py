"""QoS 2 messages between PUBREC and PUBCOMP when their client leaves (plugin `inflight.c`,
issue 17), on a real Mosquitto: the plugin keeps them at the client's disconnect (command
`unreleased`), and `release` sends them to a client under the same packet ids, followed by
their PUBREL, or only the PUBREL for those whose PUBREC Mosquitto had read (the client has
them, and may have completed them); an id in use there gets a new id; a client offline there
keeps them for its resume or the next node; without a session there they are dropped."""

from __future__ import annotations

import base64
import time

from tests.harness.procs import wait_for
from tests.system.plugin.helpers import RawClient


def _raw(clients, broker, client_id: str, **kw) -> RawClient:
    c = clients(RawClient(client_id, port=broker.port, **kw))
    c.connect()
    return c


def _left_between_pubrec_and_pubcomp(clients, broker, sidecar, name: str, topic: str,
                                     count: int, sub_id: int | None = None) -> list[int]:
    """`name` (persistent) gets `count` QoS 2 messages, answers their PUBRELs with nothing,
    and disconnects; returns their packet ids."""
    sub = _raw(clients, broker, name, session_expiry=300, hold_pubrel=True)
    sub.subscribe(topic, 2, sub_id=sub_id)
    pub = clients(RawClient(f"pub-{time.time_ns()}", port=broker.port))
    pub.connect()
    for i in range(count):
        pub.publish2(topic, f"m{i}".encode())
    wait_for(lambda: len(sub.pubrels) >= count, 5, "the PUBRELs")
    assert [m.payload for m in sub.messages] == [f"m{i}".encode() for i in range(count)]
    mids = [m.mid for m in sub.messages]
    assert sub.pubrels == mids
    sub.disconnect()
    sidecar.wait_type("disconnect", client=name)
    return mids


def test_unreleased_keeps_what_awaited_its_pubcomp_and_release_sends_only_the_pubrels(
        broker, sidecar, clients):
    mids = _left_between_pubrec_and_pubcomp(clients, broker, sidecar, "leaver", "inf/a", 3,
                                            sub_id=5)
    kept = sidecar.call("unreleased", client="leaver")
    assert kept["ok"] is True
    assert [(m["mid"], m["topic"], base64.b64decode(m["payload"]), m["qos"],
             m.get("subscription_ids"), m.get("pubrel")) for m in kept["messages"]] == [
        (mid, "inf/a", f"m{i}".encode(), 2, [5], True) for i, mid in enumerate(mids)]
    assert sidecar.call("stats")["inflight_reading"] == "ok"

    # where it resumed (here: another client id on this Mosquitto, connected): the client
    # read these PUBLISHes and answered PUBREC, so it needs only the PUBRELs; one that had
    # completed them (its PUBCOMP lost) would take a PUBLISH as new
    back = _raw(clients, broker, "resumer", session_expiry=300)
    done = sidecar.call("release", client="resumer", messages=kept["messages"])
    assert done["ok"] is True, done
    wait_for(lambda: back.pubrels == mids, 5, "the PUBRELs under the same ids")
    back.publish("inf/still", b"", qos=1)  # its PUBCOMPs (ids unknown here) kept it connected
    assert back.messages == []
    stats = sidecar.call("stats")
    assert stats["unreleased_pubrel"] == 3, stats
    assert stats["unreleased_same_id"] == 0 and stats["unreleased_new_id"] == 0, stats
    # as a PUBLISH (an older node's release, without `pubrel`): same ids, then the PUBRELs
    again = _raw(clients, broker, "resumer-2", session_expiry=300)
    plain = [{k: v for k, v in m.items() if k != "pubrel"} for m in kept["messages"]]
    assert sidecar.call("release", client="resumer-2", messages=plain)["ok"] is True
    got = again.wait_messages(lambda m: m.topic == "inf/a", count=3)
    assert [(m.mid, m.payload, m.qos, m.sub_ids) for m in got] == [
        (mid, f"m{i}".encode(), 2, [5]) for i, mid in enumerate(mids)]
    wait_for(lambda: again.pubrels == mids, 5, "the PUBRELs after the PUBLISHes")
    assert sidecar.call("stats")["unreleased_same_id"] == 3


def test_a_client_that_leaves_right_after_our_pubrels_gets_them_again(
        broker, sidecar, clients):
    """Mosquitto has no message for a PUBREL the plugin sent: a client that leaves before its
    PUBCOMP (here: it never answers) would lose the message. Sent in the last 2 s, they are
    kept again at its disconnect: for its resume here, or the next node's drain. One sent
    longer ago was answered: nothing is kept."""
    mids = _left_between_pubrec_and_pubcomp(clients, broker, sidecar, "src", "inf/h", 3)
    kept = sidecar.call("unreleased", client="src")["messages"]
    hopper = _raw(clients, broker, "hopper", session_expiry=300, hold_pubrel=True)
    assert sidecar.call("release", client="hopper", messages=kept)["ok"] is True
    wait_for(lambda: hopper.pubrels == mids, 5, "the PUBRELs")
    hopper.disconnect()
    sidecar.wait_type("disconnect", client="hopper")
    again = sidecar.call("unreleased", client="hopper")["messages"]
    assert [(m["mid"], m.get("pubrel")) for m in again] == [(mid, True) for mid in mids]
    assert sidecar.call("stats")["unreleased_pubrel_again"] == 3
    back = clients(RawClient("hopper", port=broker.port, clean_start=False,
                             session_expiry=300))
    assert back.connect() is True
    wait_for(lambda: back.pubrels == mids, 5, "the PUBRELs again")
    assert back.messages == []
    # answered long ago
    time.sleep(2.2)
    back.disconnect()
    sidecar.wait_type("disconnect", client="hopper", count=2)
    assert sidecar.call("unreleased", client="hopper")["messages"] == []


def test_a_pubrel_near_the_next_ids_moves_mosquittos_counter_past_it(
        broker, sidecar, clients):
    fresh = _raw(clients, broker, "fresh", session_expiry=300)  # its next id is 1
    fresh.subscribe("inf/n", 1)
    item = {**_item(3, "inf/n", b"old"), "pubrel": True}
    assert sidecar.call("release", client="fresh", messages=[item])["ok"] is True
    wait_for(lambda: fresh.pubrels == [3], 5, "the PUBREL")
    pub = clients(RawClient(f"pub-{time.time_ns()}", port=broker.port))
    pub.connect()
    pub.publish("inf/n", b"new", qos=1)
    got = fresh.wait_messages(lambda m: m.topic == "inf/n")
    assert got[0].payload == b"new" and got[0].mid == 4, got  # not 3: its PUBCOMP may be late


def test_a_pubrels_pubcomp_gives_the_client_no_place_more_in_its_window(
        broker, sidecar, clients):
    """Mosquitto gives a place back at every PUBCOMP, its id known or not: without taking it
    back, one message more would be in flight than the client allows, and a new message
    would overtake the queued ones."""
    rm = _raw(clients, broker, "window", session_expiry=300, hold_pubrec=True,
              receive_maximum=2)
    rm.subscribe("inf/w", 2)
    pub = clients(RawClient(f"pub-{time.time_ns()}", port=broker.port))
    pub.connect()
    pub.publish2("inf/w", b"w0")
    first = rm.wait_messages(lambda m: m.topic == "inf/w")[0]
    pub.publish2("inf/w", b"w1")
    rm.wait_messages(lambda m: m.topic == "inf/w", count=2)  # the window is full
    item = {**_item(40000, "inf/w", b"old"), "pubrel": True}
    assert sidecar.call("release", client="window", messages=[item])["ok"] is True
    wait_for(lambda: 40000 in rm.pubrels, 5, "the PUBREL")
    time.sleep(0.2)  # its PUBCOMP is in
    for i in range(2, 7):
        pub.publish2("inf/w", f"w{i}".encode())
    time.sleep(0.3)
    assert [m.payload for m in rm.received(lambda m: m.topic == "inf/w")] == [b"w0", b"w1"]
    rm._send(0x50, first.mid.to_bytes(2, "big"))  # PUBREC; its PUBREL, PUBCOMP free a place
    got = rm.wait_messages(lambda m: m.topic == "inf/w", count=3)
    assert [m.payload for m in got][:3] == [b"w0", b"w1", b"w2"]  # the queue's order
    assert sidecar.call("stats")["unreleased_quota_clamped"] >= 1


def test_a_message_still_waiting_for_its_pubrec_is_kept_too(broker, sidecar, clients):
    sub = _raw(clients, broker, "no-pubrec", session_expiry=300, hold_pubrec=True)
    sub.subscribe("inf/r", 2)
    pub = clients(RawClient(f"pub-{time.time_ns()}", port=broker.port))
    pub.connect()
    pub.publish2("inf/r", b"r0")
    got = sub.wait_messages(lambda m: m.topic == "inf/r")
    sub.disconnect()
    sidecar.wait_type("disconnect", client="no-pubrec")
    kept = sidecar.call("unreleased", client="no-pubrec")["messages"]
    assert [(m["mid"], base64.b64decode(m["payload"])) for m in kept] == [(got[0].mid, b"r0")]
    # the next node has them: the old owner forgets them (a retried drain sends them no more)
    sidecar.call("unreleased", client="no-pubrec", forget=[got[0].mid])
    assert sidecar.call("unreleased", client="no-pubrec")["messages"] == []


def test_a_client_back_on_its_node_has_nothing_kept_and_a_session_end_forgets(
        broker, sidecar, clients):
    _left_between_pubrec_and_pubcomp(clients, broker, sidecar, "returner", "inf/b", 1)
    assert len(sidecar.call("unreleased", client="returner")["messages"]) == 1
    back = _raw(clients, broker, "returner", clean_start=False, session_expiry=300)
    wait_for(lambda: back.pubrels, 5, "Mosquitto's own PUBREL at the resume")
    back.disconnect()  # it answered the PUBREL: nothing waits any more
    sidecar.wait_type("disconnect", client="returner", count=2)
    assert sidecar.call("unreleased", client="returner")["messages"] == []
    assert sidecar.call("unreleased", client="never-seen")["messages"] == []


def _item(mid: int, topic: str, payload: bytes) -> dict:
    return {"mid": mid, "topic": topic, "payload": base64.b64encode(payload).decode(), "qos": 2}


def test_an_id_in_use_gets_a_new_id_and_a_client_without_a_session_nothing(
        broker, sidecar, clients):
    busy = _raw(clients, broker, "busy", session_expiry=300, hold_pubrel=True)
    busy.subscribe("inf/c", 2)
    pub = clients(RawClient(f"pub-{time.time_ns()}", port=broker.port))
    pub.connect()
    pub.publish2("inf/c", b"first")
    wait_for(lambda: busy.pubrels, 5, "busy's PUBREL")
    in_use = busy.pubrels[0]  # Mosquitto waits for its PUBCOMP: the id is taken
    item = _item(in_use, "inf/x", b"x")
    assert sidecar.call("release", client="busy", messages=[item])["ok"] is True
    got = busy.wait_messages(lambda m: m.topic == "inf/x")
    assert got and got[0].mid != in_use
    # a PUBREL under an id in use would complete another message: it goes as a PUBLISH
    rel = {**_item(in_use, "inf/y", b"y"), "pubrel": True}
    assert sidecar.call("release", client="busy", messages=[rel])["ok"] is True
    got = busy.wait_messages(lambda m: m.topic == "inf/y")
    assert got and got[0].mid != in_use and busy.pubrels.count(in_use) == 1
    assert sidecar.call("release", client="nobody-here", messages=[item])["ok"] is True
    wait_for(lambda: sidecar.call("stats")["unreleased_dropped"] == 1, 5, "one dropped")
    assert sidecar.call("stats")["unreleased_new_id"] == 2


def test_a_client_offline_here_keeps_them_for_its_resume_or_the_next_node(
        broker, sidecar, clients):
    away = _raw(clients, broker, "away", session_expiry=300)
    away.subscribe("inf/d", 2)
    away.disconnect()
    sidecar.wait_type("disconnect", client="away")
    owed = [_item(900, "inf/d", b"o1"), _item(901, "inf/d", b"o2")]
    assert sidecar.call("release", client="away", messages=owed)["ok"] is True
    # offline: kept, and listed for a drain that would move the session on
    wait_for(lambda: len(sidecar.call("unreleased", client="away")["messages"]) == 2, 5,
             "kept for the session")
    assert [m["mid"] for m in sidecar.call("unreleased", client="away")["messages"]] == \
        [900, 901]
    back = clients(RawClient("away", port=broker.port, clean_start=False, session_expiry=300))
    assert back.connect() is True
    got = back.wait_messages(lambda m: m.topic == "inf/d", count=2)
    assert [(m.mid, m.payload) for m in got] == [(900, b"o1"), (901, b"o2")]
    wait_for(lambda: back.pubrels == [900, 901], 5, "their PUBRELs")
    assert sidecar.call("unreleased", client="away")["messages"] == []


def test_a_release_with_one_bad_message_keeps_none(broker, sidecar, clients):
    away = _raw(clients, broker, "half", session_expiry=300)
    away.subscribe("inf/h", 2)
    away.disconnect()
    sidecar.wait_type("disconnect", client="half")
    bad = {**_item(902, "inf/h", b"b"), "payload": "%%%"}
    rep = sidecar.call("release", client="half", messages=[_item(901, "inf/h", b"a"), bad])
    assert rep["ok"] is False and rep["error"] == "bad_request", rep
    time.sleep(0.3)  # a tick would have kept an accepted one for the offline session
    assert sidecar.call("unreleased", client="half")["messages"] == []
    assert sidecar.call("release", client="half", messages=[_item(901, "inf/h", b"a")])["ok"]
    wait_for(lambda: len(sidecar.call("unreleased", client="half")["messages"]) == 1, 5,
             "the good one kept")


def test_release_refuses_bad_messages(broker, sidecar):
    good = {"mid": 1, "topic": "a", "payload": "", "qos": 2}
    for bad in ({"client": "x"}, {"messages": [good]}, {"client": "x", "messages": {}},
                {"client": "x", "messages": [{**good, "mid": 0}]},
                {"client": "x", "messages": [{**good, "mid": 65536}]},
                {"client": "x", "messages": [{**good, "qos": 0}]},
                {"client": "x", "messages": [{**good, "topic": "a/#"}]},
                {"client": "x", "messages": [{**good, "payload": "%%%"}]},
                {"client": "x", "messages": [{**good, "pubrel": 1}]},
                {"client": "x", "messages": [good] * 257}):
        rep = sidecar.call("release", **bad)
        assert rep["ok"] is False and rep["error"] == "bad_request", (bad, rep)
    assert sidecar.call("unreleased")["error"] == "bad_request"
    assert sidecar.call("unreleased", client="x", forget=7)["error"] == "bad_request"
