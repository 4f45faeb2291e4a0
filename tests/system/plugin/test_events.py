"""Events for every type, against a real Mosquitto with the real plugin."""

from __future__ import annotations

import base64
import re
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.system.plugin.helpers import NEVER, Client, ConnectFailed, FakeSidecar


def types(events, client=None):
    return [e["type"] for e in events if client is None or e.get("client") == client]


def test_connect_and_disconnect_fields_for_v5_v311_v31(broker, sidecar, client_factory):
    v5 = client_factory("v5-client", session_expiry=30, clean_start=False, keepalive=17)
    assert v5.connect() is False
    v311 = client_factory("v311-client", protocol=4, clean_start=True)
    v311.connect()
    v31 = client_factory("v31-client", protocol=3, clean_start=False)
    v31.connect()

    c5 = sidecar.wait_type("connect", client="v5-client")[0]
    # accepted at BASIC_AUTH, reported at the next tick: the sidecar orders connects by it
    assert c5["t"] - 1000 <= c5["accepted_ms"] <= c5["t"], c5
    assert c5 | {"t": 0, "seq": 0, "epoch": "", "accepted_ms": 0} == {
        "v": 1, "epoch": "", "seq": 0, "t": 0, "type": "connect", "client": "v5-client",
        "username": None, "protocol": "mqtt5", "clean_start": False, "session_expiry": 30,
        "keepalive": 17, "session_present": False, "accepted_ms": 0, "address": "127.0.0.1",
        "will": False}
    c311 = sidecar.wait_type("connect", client="v311-client")[0]
    assert (c311["protocol"], c311["clean_start"], c311["session_expiry"]) == ("mqtt311", True, 0)
    c31 = sidecar.wait_type("connect", client="v31-client")[0]
    assert (c31["protocol"], c31["clean_start"], c31["session_expiry"]) == ("mqtt31", False, NEVER)
    assert re.fullmatch("[0-9a-f]{16}", c5["epoch"]), c5["epoch"]
    assert c5["epoch"] == sidecar.epoch  # the epoch the stream was (re)synced to

    # a v5 client may change its session expiry in DISCONNECT: the live value is reported
    v5.disconnect(session_expiry=5)
    v311.drop()
    v31.disconnect()
    d5 = sidecar.wait_type("disconnect", client="v5-client")[0]
    assert (d5["taken_over"], d5["session_kept"], d5["session_expiry"]) == (False, True, 5)
    d311 = sidecar.wait_type("disconnect", client="v311-client")[0]
    assert (d311["taken_over"], d311["session_kept"], d311["session_expiry"]) == (False, False, 0)
    d31 = sidecar.wait_type("disconnect", client="v31-client")[0]
    assert (d31["session_kept"], d31["session_expiry"]) == (True, NEVER)

    events = sidecar.wait_synced()
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert {e["epoch"] for e in events} == {sidecar.epoch}
    # the sidecar's own connection never shows up
    assert all(e.get("client") != "mqfed-sidecar" for e in events)
    # quiet by default: one notice at load, nothing else from the plugin
    log = broker.log()
    assert log.count("mqfed plugin 0.1.0 loaded") == 1 and "mqfed:" not in log


def test_username_is_reported(make_broker, clients):
    b = make_broker()
    sc = clients(FakeSidecar(b.sock)).start()
    c = clients(Client("named", port=b.port, username="alice", password="pw"))
    c.connect()
    assert sc.wait_type("connect", client="named")[0]["username"] == "alice"


def test_takeover_disconnect_comes_before_connect(broker, sidecar, client_factory):
    first = client_factory("dup", session_expiry=60, clean_start=False)
    first.connect()
    first.subscribe("t/#", 1)
    sidecar.wait_type("subscribe", client="dup")

    second = client_factory("dup", session_expiry=60, clean_start=False)
    assert second.connect() is True          # Mosquitto resumed the session
    assert first.wait_disconnected()
    ev = sidecar.wait_type("connect", client="dup", count=2)
    dup = [e for e in sidecar.unique_events() if e.get("client") == "dup"]
    assert types(dup) == ["connect", "subscribe", "disconnect", "connect"]
    old, new = dup[2], dup[3]
    assert old["taken_over"] is True and old["session_kept"] is True
    assert old["session_expiry"] == 60
    assert new["session_present"] is True and ev[1] == new

    # a clean-start takeover ends the session
    third = client_factory("dup", clean_start=True)
    assert third.connect() is False
    sidecar.wait_type("connect", client="dup", count=3)
    dup = [e for e in sidecar.unique_events() if e.get("client") == "dup"]
    assert types(dup)[4:] == ["disconnect", "connect"]
    assert dup[4]["taken_over"] is True and dup[4]["session_kept"] is False
    assert dup[5]["session_present"] is False and dup[5]["clean_start"] is True

    # the model: one online client without subscriptions
    _, snap = sidecar.snapshot()
    assert [(c["client"], c["online"], c["subscriptions"]) for c in snap] == [("dup", True, [])]


def test_takeover_of_offline_session_yields_no_second_disconnect(broker, sidecar, client_factory):
    a = client_factory("off", session_expiry=60, clean_start=False)
    a.connect()
    a.subscribe("o/1", 1)
    a.disconnect()
    sidecar.wait_type("disconnect", client="off")
    b = client_factory("off", session_expiry=60, clean_start=False)
    assert b.connect() is True
    sidecar.wait_type("connect", client="off", count=2)
    sidecar.wait_synced()
    assert types(sidecar.unique_events(), "off") == ["connect", "subscribe", "disconnect",
                                                       "connect"]
    assert sidecar.unique_events()[-1]["session_present"] is True


def test_v311_takeover_session_present(broker, sidecar, client_factory):
    a = client_factory("v3dup", protocol=4, clean_start=False)
    a.connect()
    a.subscribe("x/#", 2)
    b = client_factory("v3dup", protocol=4, clean_start=False)
    assert b.connect() is True
    sidecar.wait_type("connect", client="v3dup", count=2)
    dup = [e for e in sidecar.wait_synced() if e.get("client") == "v3dup"]
    assert types(dup) == ["connect", "subscribe", "disconnect", "connect"]
    assert dup[2]["session_kept"] is True and dup[2]["session_expiry"] == NEVER
    assert dup[3]["session_present"] is True


def test_shared_filter_is_verbatim(broker, sidecar, client_factory):
    c = client_factory("sharer")
    c.connect()
    c.subscribe("$share/g/f", 1)
    c.subscribe("$share/grp2/a/+/c", 0)
    subs = sidecar.wait_type("subscribe", client="sharer", count=2)
    assert [(e["filter"], e["qos"], e["options"], e["subscription_id"]) for e in subs] == [
        ("$share/g/f", 1, None, None), ("$share/grp2/a/+/c", 0, None, None)]
    c.unsubscribe("$share/g/f")
    assert sidecar.wait_type("unsubscribe", client="sharer")[0]["filter"] == "$share/g/f"


def test_qos_downgrade_reports_granted_qos(make_broker, clients):
    b = make_broker(tcp_extra="max_qos 1")
    sc = clients(FakeSidecar(b.sock)).start()
    c = clients(Client("down", port=b.port))
    c.connect()
    assert c.subscribe("d/#", 2) == [1]
    assert sc.wait_type("subscribe", client="down")[0]["qos"] == 1


def test_resubscribe_and_unsubscribe_change_the_model_only(broker, sidecar, client_factory):
    c = client_factory("resub")
    c.connect()
    c.subscribe("r/a", 1)
    c.subscribe("r/a", 1)          # no change: no event
    c.subscribe("r/a", 0)          # a genuine downgrade to qos 0 must be reported
    c.unsubscribe("never/subscribed")
    c.unsubscribe("r/a")
    c.subscribe("r/a", 2)
    sidecar.wait_synced()
    evs = [(e["type"], e.get("filter"), e.get("qos"))
           for e in sidecar.unique_events() if e.get("client") == "resub"][1:]
    assert evs == [("subscribe", "r/a", 1), ("subscribe", "r/a", 0),
                   ("unsubscribe", "r/a", None), ("subscribe", "r/a", 2)]


def test_connect_refused_by_password_file(make_broker, clients):
    b0 = make_broker(name="pwgen")  # only to own a folder for the password file
    pwfile = b0.dir / "passwd"
    import subprocess

    from tests.system.plugin.helpers import give_to_mosquitto
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(pwfile), "bob", "right"], check=True)
    give_to_mosquitto(pwfile)
    b = make_broker(opts={"auth": "defer"}, extra=f"password_file {pwfile}",
                    allow_anonymous=False)
    sc = clients(FakeSidecar(b.sock)).start()
    bad = clients(Client("intruder", port=b.port, username="bob", password="wrong"))
    with pytest.raises(ConnectFailed) as e:
        bad.connect()
    assert e.value.reason in (5, 134, 135)
    good = clients(Client("bob-client", port=b.port, username="bob", password="right"))
    good.connect()
    sc.wait_type("connect", client="bob-client")
    rej = sc.wait_type("connect_rejected", client="intruder")[0]
    assert rej["reason"] == "auth" and rej["username"] == "bob"
    assert "intruder" not in [e.get("client") for e in sc.unique_events()
                              if e["type"] in ("connect", "disconnect")]


def test_session_expiry_reported_and_expired(broker, sidecar, client_factory):
    c = client_factory("short", session_expiry=2, clean_start=False)
    c.connect()
    c.subscribe("s/#", 1)
    assert sidecar.wait_type("connect", client="short")[0]["session_expiry"] == 2
    t0 = time.monotonic()
    c.disconnect()
    d = sidecar.wait_type("disconnect", client="short")[0]
    assert d["session_kept"] is True and d["session_expiry"] == 2
    sidecar.wait_type("session_expired", client="short", timeout=8)
    elapsed = time.monotonic() - t0
    assert 2.0 <= elapsed < 6.0, elapsed
    # Mosquitto really dropped it: the session is not resumed
    again = client_factory("short", session_expiry=2, clean_start=False)
    assert again.connect() is False
    ev = sidecar.wait_type("connect", client="short", count=2)[1]
    assert ev["session_present"] is False
    assert sidecar.call("stats")["subscriptions"] == 0


def test_retained_with_properties_and_empty_payload(broker, sidecar, client_factory):
    c = client_factory("pub")
    c.connect()
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k1", "v1"), ("k2", "v2"), ("k1", "again")]
    props.ContentType = "application/json"
    props.PayloadFormatIndicator = 1
    props.CorrelationData = b"\x00\x01corr"
    props.ResponseTopic = "resp/here"
    props.MessageExpiryInterval = 300
    c.publish("ret/a", b'{"x":1}', qos=1, retain=True, properties=props)
    c.publish("ret/plain", b"\xff\x00bin", qos=0, retain=True)
    c.publish("not/retained", b"x", qos=1, retain=False)
    c.publish("ret/a", b"", qos=1, retain=True)  # delete
    evs = sidecar.wait_type("retained", count=3)
    a, plain, delete = evs[:3]
    assert a["client"] == "pub" and a["topic"] == "ret/a" and a["qos"] == 1
    assert base64.b64decode(a["payload"]) == b'{"x":1}'
    assert a["properties"] == {
        "user": [["k1", "v1"], ["k2", "v2"], ["k1", "again"]],
        "content_type": "application/json", "payload_format": 1,
        "correlation_data": base64.b64encode(b"\x00\x01corr").decode(),
        "response_topic": "resp/here"}   # message_expiry: stripped by Mosquitto before plugins
    assert base64.b64decode(plain["payload"]) == b"\xff\x00bin" and plain["qos"] == 0
    assert plain["properties"] == {}
    assert delete["topic"] == "ret/a" and delete["payload"] == ""
    sidecar.wait_synced()
    assert len([e for e in sidecar.unique_events() if e["type"] == "retained"]) == 3


def test_v311_retained(broker, sidecar, client_factory):
    c = client_factory("pub311", protocol=4)
    c.connect()
    c.publish("ret/311", b"v", qos=2, retain=True)
    ev = sidecar.wait_type("retained", client="pub311")[0]
    assert ev["qos"] == 2 and ev["properties"] == {}


def test_kick_recheck_is_not_reported_as_subscribes(broker, sidecar, client_factory):
    """Debian's CVE-2021-34434 fix re-runs the subscribe ACL check with qos 0 for every
    subscription of a kicked persistent client: no subscribe events may come of it."""
    c = client_factory("kicked", session_expiry=60, clean_start=False)
    c.connect()
    c.subscribe("k/1", 1)
    c.subscribe("k/2", 2)
    c.subscribe("$share/g/k/3", 1)
    sidecar.wait_type("subscribe", client="kicked", count=3)
    assert sidecar.call("kick", client="kicked")["ok"] is True
    assert c.wait_disconnected()
    sidecar.wait_type("disconnect", client="kicked")
    evs = [e for e in sidecar.wait_synced() if e.get("client") == "kicked"]
    assert types(evs) == ["connect", "subscribe", "subscribe", "subscribe", "disconnect"]
    assert evs[-1]["session_kept"] is True
    _, snap = sidecar.snapshot()
    assert {s["filter"]: s["qos"] for s in snap[0]["subscriptions"]} == {
        "k/1": 1, "k/2": 2, "$share/g/k/3": 1}
    # it still has them in Mosquitto: reconnect gets the session back
    again = client_factory("kicked", session_expiry=60, clean_start=False)
    assert again.connect() is True


def test_heartbeat(make_broker, clients):
    b = make_broker(opts={"heartbeat_ms": 100})
    sc = clients(FakeSidecar(b.sock, auto_ack=False)).start()
    c = clients(Client("hb", port=b.port))
    c.connect()
    c.subscribe("h/1")
    sc.wait_type("subscribe", client="hb")
    hb = sc.wait_events(lambda e: e["type"] == "heartbeat" and e["clients"] == 1, timeout=3)
    assert hb, "no heartbeat after the subscribe"
    assert hb[-1]["sessions"] == 1 and hb[-1]["subscriptions"] == 1
    # nothing acked yet: every event before the heartbeat is buffered (seq counts from 1)
    assert hb[-1]["buffered"] == hb[-1]["seq"] - 1
    first = hb[-1]["seq"]
    sc.send({"v": 1, "cmd": "ack", "seq": first, "epoch": sc.epoch})
    later = sc.wait_events(lambda e: e["type"] == "heartbeat" and e["seq"] > first + 1,
                           timeout=3)
    assert later, "no heartbeat after the ack"
    assert later[-1]["buffered"] == later[-1]["seq"] - first - 1


def test_sidecar_actions_produce_no_events(broker, sidecar):
    sidecar.subscribe("anything/#", 1)
    sidecar.publish("ret/by-sidecar", b"x", retain=True)
    sidecar.publish("plain/by-sidecar", b"x")
    time.sleep(0.3)
    evs = sidecar.wait_synced()
    assert set(types(evs)) <= {"heartbeat"}


def test_calibration_failure_is_fail_safe(broker, clients, client_factory):
    sc = clients(FakeSidecar(broker.sock, session_expiry=3600)).start()
    assert sc.call("stats")["calibration"] == {"session_expiry": "unknown"}
    v5 = client_factory("v5-unknown", session_expiry=0)
    v5.connect()
    v3 = client_factory("v3-known", protocol=4, clean_start=False)
    v3.connect()
    assert sc.wait_type("connect", client="v5-unknown")[0]["session_expiry"] is None
    assert sc.wait_type("connect", client="v3-known")[0]["session_expiry"] == NEVER
    v5.disconnect()
    d = sc.wait_type("disconnect", client="v5-unknown")[0]
    # unknown: assumed kept (never lose a session), expiry null
    assert d["session_kept"] is True and d["session_expiry"] is None
    sc.disconnect()
    sc2 = clients(FakeSidecar(broker.sock)).continue_from(sc)
    sc2.connect()
    assert sc2.call("stats")["calibration"] == {"session_expiry": "unknown"}  # stays unknown
    assert broker.log().count("session expiry calibration failed") == 1


def test_clients_connected_before_the_sidecar(broker, clients, client_factory):
    early = client_factory("early", session_expiry=77, clean_start=False)
    early.connect()
    early.subscribe("e/#", 1)
    early311 = client_factory("early311", protocol=4)
    early311.connect()
    sc = clients(FakeSidecar(broker.sock)).start()   # calibrates now, streams from seq 1
    ev = sc.wait_type("connect", client="early")[0]
    assert ev["seq"] == 1 and ev["session_expiry"] is None       # not known at that time
    assert sc.wait_type("connect", client="early311")[0]["session_expiry"] == 0
    _, snap = sc.snapshot()
    by_id = {c["client"]: c for c in snap}
    assert by_id["early"]["session_expiry"] == 77                  # read once calibrated
    early.disconnect()
    assert sc.wait_type("disconnect", client="early")[0]["session_expiry"] == 77


def test_sidecar_subscription_gets_each_event_once(broker, sidecar, client_factory):
    sidecar.subscribe("$SYS/broker/mqfed/#", 1)
    c = client_factory("once")
    c.connect()
    c.subscribe("o/1")
    sidecar.wait_type("subscribe", client="once")
    sidecar.wait_synced()
    time.sleep(0.2)
    mine = [e for e in sidecar.events if e.get("client") == "once"]
    assert len(mine) == 2
