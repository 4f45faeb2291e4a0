"""Commands on $CONTROL/mqfed/v1: deliver, kick, deny/admit, stats, errors."""

from __future__ import annotations

import base64
import json
import time

import pytest

from tests.system.plugin.helpers import CONTROL, REPLIES, Client, ConnectFailed, user_props


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_deliver_to_online_client_without_subscription(broker, sidecar, client_factory):
    rcv = client_factory("rcv")
    rcv.connect()
    sidecar.wait_type("connect", client="rcv")
    rep = sidecar.call("deliver", client="rcv", topic="direct/x", payload=b64(b"\x00hello"),
                       qos=1, properties={"user": [["a", "1"], ["b", "2"], ["a", "3"]],
                                          "content_type": "text/plain",
                                          "correlation_data": b64(b"cid"),
                                          "response_topic": "back/here",
                                          "payload_format": 0, "message_expiry": 60})
    assert rep == {"v": 1, "id": rep["id"], "cmd": "deliver", "ok": True, "queued": False}
    msg = rcv.wait_messages(lambda m: m.topic == "direct/x")[0]
    assert msg.payload == b"\x00hello" and msg.qos == 1 and msg.retain is False
    assert user_props(msg.properties) == [("a", "1"), ("b", "2"), ("a", "3")]
    assert msg.properties.ContentType == "text/plain"
    assert msg.properties.CorrelationData == b"cid"
    assert msg.properties.ResponseTopic == "back/here"
    assert 0 < msg.properties.MessageExpiryInterval <= 60
    # delivering produces no event
    sidecar.wait_synced()
    assert [e["type"] for e in sidecar.unique_events() if e.get("client") == "rcv"] == [
        "connect"]


def test_deliver_to_offline_session_is_queued(broker, sidecar, client_factory):
    c = client_factory("sleeper", session_expiry=300, clean_start=False)
    c.connect()
    c.disconnect()
    sidecar.wait_type("disconnect", client="sleeper")
    rep = sidecar.call("deliver", client="sleeper", topic="q/1", payload=b64(b"later"), qos=1)
    assert rep["ok"] is True and rep["queued"] is True
    time.sleep(0.2)
    again = client_factory("sleeper", session_expiry=300, clean_start=False)
    assert again.connect() is True
    msg = again.wait_messages(lambda m: m.topic == "q/1")
    assert msg and msg[0].payload == b"later"


def test_deliver_batch_queues_many_in_order_and_counts_them(broker, sidecar, client_factory):
    """A moving session's queue in one command; `queued` counts them for `ctl sessions`."""
    c = client_factory("mover", session_expiry=300, clean_start=False)
    c.connect()
    c.disconnect()
    sidecar.wait_type("disconnect", client="mover")
    items = [{"topic": f"q/{i}", "payload": b64(str(i).encode()), "qos": 1}
             for i in range(600)]
    items[-1]["qos"] = 2  # (paho hands a QoS 2 message over at PUBREL: kept last for order)
    items[1]["properties"] = {"user": [["k", "v"]]}
    rep = sidecar.call("deliver_batch", client="mover", messages=items)
    assert (rep["ok"], rep["delivered"], rep["queued"]) == (True, 600, True), rep
    assert sidecar.call("queued", clients=["mover"])["queued"] == {"mover": 600}
    again = client_factory("mover", session_expiry=300, clean_start=False)
    assert again.connect() is True
    got = again.wait_messages(lambda m: m.topic.startswith("q/"), count=600)
    assert [m.payload for m in got] == [str(i).encode() for i in range(600)]
    assert got[-1].qos == 2
    assert user_props(got[1].properties) == [("k", "v")]
    bad = [items[0], {"topic": "q/+", "payload": "", "qos": 1}, items[2]]
    rep = sidecar.call("deliver_batch", client="mover", messages=bad)
    assert (rep["ok"], rep["error"], rep["delivered"]) == (False, "bad_request", 1), rep
    assert sidecar.call("deliver_batch", client="nobody", messages=[])["error"] == \
        "unknown_client"
    assert sidecar.call("deliver_batch", client="mover", messages="x")["error"] == "bad_request"


def test_deliver_with_subscription_identifiers(broker, sidecar, client_factory):
    """A moved session's queued copy goes to its client with the Subscription Identifiers
    the old node's Mosquitto gave it, as one broker delivers a queued message."""
    c = client_factory("ids", session_expiry=300, clean_start=False)
    c.connect()
    c.disconnect()
    sidecar.wait_type("disconnect", client="ids")
    items = [{"topic": "s/1", "payload": b64(b"1"), "qos": 1, "subscription_ids": [7]},
             {"topic": "s/2", "payload": b64(b"2"), "qos": 2,
              "subscription_ids": [1, 268435455], "properties": {"user": [["k", "v"]]}},
             {"topic": "s/3", "payload": b64(b"3"), "qos": 1}]
    assert sidecar.call("deliver_batch", client="ids", messages=items)["delivered"] == 3
    again = client_factory("ids", session_expiry=300, clean_start=False)
    assert again.connect() is True
    got = again.wait_messages(lambda m: m.topic.startswith("s/"), count=3)
    by_topic = {m.topic: m for m in got}  # (paho hands the QoS 2 one over at its PUBREL)
    assert {t: getattr(m.properties, "SubscriptionIdentifier", None)
            for t, m in by_topic.items()} == {"s/1": [7], "s/2": [1, 268435455], "s/3": None}
    assert user_props(by_topic["s/2"].properties) == [("k", "v")]
    for bad in ([0], [268435456], ["7"], 7, [1.5], list(range(1, 66))):
        rep = sidecar.call("deliver", client="ids", topic="s/x", payload="", qos=1,
                           subscription_ids=bad)
        assert rep["error"] == "bad_request", bad
    assert again.wait_messages(lambda m: m.topic == "s/x", timeout=0.3) == []


def test_deliver_for_a_subscription_the_client_left_is_refused(broker, sidecar, client_factory):
    """A shared group's pick made before the member's UNSUBSCRIBE is not delivered after it."""
    member = client_factory("member")
    member.connect()
    member.subscribe("$share/g/jobs/#", 1)
    sidecar.wait_type("subscribe", client="member")
    ok = sidecar.call("deliver", client="member", topic="jobs/1", payload=b64(b"1"), qos=1,
                      subscription="$share/g/jobs/#")
    assert ok["ok"] is True
    assert member.wait_messages(lambda m: m.topic == "jobs/1")
    member.unsubscribe("$share/g/jobs/#")
    refused = sidecar.call("deliver", client="member", topic="jobs/2", payload=b64(b"2"), qos=1,
                           subscription="$share/g/jobs/#")
    assert refused["ok"] is False and refused["error"] == "not_subscribed"
    time.sleep(0.3)
    assert not [m for m in member.messages if m.topic == "jobs/2"]


def test_deliver_errors(broker, sidecar, client_factory):
    assert sidecar.call("deliver", client="nobody", topic="t", payload="", qos=0)["error"] == (
        "unknown_client")
    c = client_factory("target")
    c.connect()
    sidecar.wait_type("connect", client="target")
    for bad in [
        {"topic": "t", "payload": "!!!", "qos": 0},
        {"topic": "t/#", "payload": "", "qos": 0},
        {"topic": "t", "payload": "", "qos": 3},
        {"topic": "t", "payload": ""},
        {"topic": "t", "payload": "", "qos": 1, "properties": {"nope": 1}},
        {"topic": "t", "payload": "", "qos": 1, "properties": {"user": [["only-key"]]}},
    ]:
        assert sidecar.call("deliver", client="target", **bad)["error"] == "bad_request", bad
    assert c.wait_messages(lambda m: True, timeout=0.3) == []


def test_kick_online_then_offline(broker, sidecar, client_factory):
    c = client_factory("kick-me", session_expiry=300, clean_start=False)
    c.connect()
    sidecar.wait_type("connect", client="kick-me")
    assert sidecar.call("kick", client="kick-me")["ok"] is True
    assert c.wait_disconnected()
    d = sidecar.wait_type("disconnect", client="kick-me")[0]
    assert d["taken_over"] is False and d["session_kept"] is True
    # now an offline session: never kicked (use-after-free in 2.0.11)
    rep = sidecar.call("kick", client="kick-me")
    assert rep["ok"] is False and rep["error"] == "not_connected"
    assert sidecar.call("kick", client="never-seen")["error"] == "not_connected"
    time.sleep(1.5)  # let session_expiry__check run: it is where the use-after-free would hit
    assert broker.alive()
    again = client_factory("kick-me", session_expiry=300, clean_start=False)
    assert again.connect() is True


def test_kick_with_will(broker, sidecar, client_factory):
    watcher = client_factory("watcher")
    watcher.connect()
    watcher.subscribe("wills/#", 1)
    c = client_factory("willing", will=("wills/willing", b"gone"))
    c.connect()
    sidecar.wait_type("connect", client="willing")
    assert sidecar.call("kick", client="willing", with_will=True)["ok"] is True
    assert watcher.wait_messages(lambda m: m.topic == "wills/willing")
    c2 = client_factory("nowill", will=("wills/nowill", b"gone"))
    c2.connect()
    sidecar.wait_type("connect", client="nowill")
    assert sidecar.call("kick", client="nowill")["ok"] is True
    assert c2.wait_disconnected()
    assert watcher.wait_messages(lambda m: m.topic == "wills/nowill", timeout=0.5) == []


@pytest.mark.parametrize("protocol", [5, 4])
def test_deny_retry_refuse_admit(broker, sidecar, clients, protocol):
    def attempt():
        return clients(Client("blocked", port=broker.port, protocol=protocol)).connect()

    assert sidecar.call("deny", client="blocked", mode="retry")["ok"] is True
    with pytest.raises(ConnectFailed) as e:
        attempt()
    assert e.value.reason is None            # no CONNACK at all: a network failure
    assert sidecar.call("deny", client="blocked", mode="refuse")["ok"] is True
    with pytest.raises(ConnectFailed) as e:
        attempt()
    assert e.value.reason == 135   # not authorized (paho maps the v3.1.1 rc 5 to 135)
    st = sidecar.call("stats")
    assert st["denied"] == 1 and st["denied_connects"] == 2
    assert sidecar.call("admit", client="blocked")["ok"] is True
    attempt()
    rejected = sidecar.wait_type("connect_rejected", client="blocked", count=2)
    assert [r["reason"] for r in rejected] == ["denied", "denied"]
    connects = sidecar.wait_type("connect", client="blocked")
    assert len(connects) == 1 and connects[0]["seq"] > rejected[1]["seq"]
    assert sidecar.call("stats")["denied"] == 0


def test_admission_closed_refuses_every_client_but_the_sidecar(broker, sidecar, clients):
    """A drain: connects close without a CONNACK (clients retry elsewhere), connections
    already up stay, the sidecar's own connections still get in; opening admits again."""
    before = clients(Client("early", port=broker.port))
    before.connect()
    assert sidecar.call("admission", open=False)["ok"] is True
    for protocol in (5, 4):
        with pytest.raises(ConnectFailed) as e:
            clients(Client(f"late{protocol}", port=broker.port, protocol=protocol)).connect()
        assert e.value.reason is None  # no CONNACK: a network failure, retried elsewhere
    st = sidecar.call("stats")
    assert st["admission"] is False and st["drained_connects"] == 2
    assert before.c.is_connected()
    rejected = sidecar.wait_type("connect_rejected", client="late5")
    assert rejected[0]["reason"] == "draining"
    assert sidecar.call("admission", open=True)["ok"] is True
    assert clients(Client("late5", port=broker.port)).connect() is False
    assert sidecar.call("stats")["admission"] is True
    assert sidecar.call("admission")["error"] == "bad_request"


def test_stats(broker, sidecar, client_factory):
    c = client_factory("st", session_expiry=10, clean_start=False)
    c.connect()
    c.subscribe([("s/1", 0), ("s/2", 1)])
    sidecar.wait_type("subscribe", client="st", count=2)
    c2 = client_factory("st2")
    c2.connect()
    sidecar.wait_synced()
    st = sidecar.call("stats")
    assert st["ok"] is True and st["cmd"] == "stats" and st["epoch"] == sidecar.epoch
    assert st["clients"] == 2 and st["sessions"] == 2 and st["subscriptions"] == 2
    assert st["seq"] == sidecar.unique_events()[-1]["seq"] >= 4
    assert st["events_total"] == st["seq"] and st["overflows"] == 0
    assert st["calibration"] == {"session_expiry": "ok"}
    for key in ("acked", "buffered", "buffered_bytes", "denied"):
        assert isinstance(st[key], int)
    c.disconnect()
    sidecar.wait_type("disconnect", client="st")
    st = sidecar.call("stats")
    assert (st["clients"], st["sessions"], st["subscriptions"]) == (1, 2, 2)


def test_bad_commands(broker, sidecar):
    assert sidecar.call("stats", v=2)["error"] == "unsupported_version"
    assert sidecar.call("launch-rockets")["error"] == "unknown_command"
    rid = "no-cmd"
    sidecar.send({"v": 1, "id": rid, "reply": REPLIES + rid})
    sidecar.send(b"{not json")
    sidecar.send({"v": 1, "id": "elsewhere", "reply": "some/other/topic", "cmd": "stats"})
    assert sidecar.call("kick")["error"] == "bad_request"
    assert sidecar.call("deny", client="x", mode="maybe")["error"] == "bad_request"
    deadline = time.monotonic() + 3
    while rid not in sidecar.replies and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sidecar.replies[rid][0]["error"] == "bad_request"
    assert "elsewhere" not in sidecar.replies
    assert not sidecar.other
    log = broker.log()
    assert "malformed command" in log and "usable id and reply topic" in log
    assert broker.alive()


def test_commands_from_the_sidecar_id_on_another_topic_are_ignored(broker, sidecar):
    """$CONTROL callbacks match the exact topic only."""
    rid = "wrong-topic"
    sidecar.send({"v": 1, "id": rid, "reply": REPLIES + rid, "cmd": "stats"},
                 topic=CONTROL + "/extra")
    time.sleep(0.3)
    assert rid not in sidecar.replies
    assert json.loads(json.dumps(sidecar.call("stats")))["ok"] is True


def test_deny_many_clients_in_one_command(broker, sidecar, clients):
    rep = sidecar.call("deny", clients=["many-1", "many-2", "many-3"], mode="session")
    assert rep["ok"] is True
    assert sidecar.call("stats")["denied"] >= 3
    for cid in ("many-1", "many-3"):
        with pytest.raises(ConnectFailed):
            clients(Client(cid, port=broker.port, clean_start=False,
                           session_expiry=60)).connect()
        clients(Client(cid, port=broker.port, clean_start=True)).connect()  # a clean start
    for bad in ({"clients": "many-1", "mode": "session"},
                {"clients": ["ok", 3], "mode": "session"},
                {"client": "x", "clients": ["y"], "mode": "session"},
                {"clients": [""], "mode": "retry"}):
        rep = sidecar.call("deny", **bad)
        assert rep["ok"] is False and rep["error"] == "bad_request", (bad, rep)
