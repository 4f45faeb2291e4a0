"""QoS 2 messages between PUBREC and PUBCOMP when their client leaves (plugin `inflight.c`,
issue 17), on a real Mosquitto: the plugin keeps them at the client's disconnect (command
`unreleased`), and `release` sends them to a client under the same packet ids, followed by
their PUBREL; an id in use there gets a new id; a client offline there keeps them for its
resume or the next node; without a session there they are dropped."""

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


def test_unreleased_keeps_what_awaited_its_pubcomp_and_release_uses_the_same_ids(
        broker, sidecar, clients):
    mids = _left_between_pubrec_and_pubcomp(clients, broker, sidecar, "leaver", "inf/a", 3,
                                            sub_id=5)
    kept = sidecar.call("unreleased", client="leaver")
    assert kept["ok"] is True
    assert [(m["mid"], m["topic"], base64.b64decode(m["payload"]), m["qos"],
             m.get("subscription_ids")) for m in kept["messages"]] == [
        (mid, "inf/a", f"m{i}".encode(), 2, [5]) for i, mid in enumerate(mids)]
    assert sidecar.call("stats")["inflight_reading"] == "ok"

    # where it resumed (here: another client id on this Mosquitto, connected)
    back = _raw(clients, broker, "resumer", session_expiry=300)
    done = sidecar.call("release", client="resumer", messages=kept["messages"])
    assert done["ok"] is True, done
    got = back.wait_messages(lambda m: m.topic == "inf/a", count=3)
    assert [(m.mid, m.payload, m.qos, m.sub_ids) for m in got] == [
        (mid, f"m{i}".encode(), 2, [5]) for i, mid in enumerate(mids)]
    wait_for(lambda: back.pubrels == mids, 5, "the PUBRELs under the same ids")
    stats = sidecar.call("stats")
    assert stats["unreleased_same_id"] == 3 and stats["unreleased_new_id"] == 0, stats


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
    assert sidecar.call("release", client="nobody-here", messages=[item])["ok"] is True
    wait_for(lambda: sidecar.call("stats")["unreleased_dropped"] == 1, 5, "one dropped")
    assert sidecar.call("stats")["unreleased_new_id"] == 1


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
                {"client": "x", "messages": [good] * 257}):
        rep = sidecar.call("release", **bad)
        assert rep["ok"] is False and rep["error"] == "bad_request", (bad, rep)
    assert sidecar.call("unreleased")["error"] == "bad_request"
    assert sidecar.call("unreleased", client="x", forget=7)["error"] == "bad_request"
