"""Wills in the plugin's events (issue 19): the will a client set at CONNECT, read through the
guarded read of Mosquitto's client structure, and what became of it at its disconnect."""

from __future__ import annotations

import base64
import subprocess

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.system.plugin.helpers import Client, FakeSidecar


def _with_will(client: Client, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
               delay: int | None = None, v5_props: bool = False) -> Client:
    props = None
    if client.protocol == 5 and (delay is not None or v5_props):
        props = Properties(PacketTypes.WILLMESSAGE)
        if delay is not None:
            props.WillDelayInterval = delay
        if v5_props:
            props.UserProperty = [("k", "v"), ("k", "w")]
            props.ContentType = "text/plain"
            props.ResponseTopic = "resp/x"
            props.CorrelationData = b"\x00corr"
            props.PayloadFormatIndicator = 1
            props.MessageExpiryInterval = 90
    client.c.will_set(topic, payload, qos=qos, retain=retain, properties=props)
    return client


def test_connect_reports_the_will_with_its_properties(broker, sidecar, client_factory):
    full = _with_will(client_factory("w-full", session_expiry=60), "will/full", b"\x00gone\xff",
                      qos=2, retain=True, delay=7, v5_props=True)
    full.connect()
    v311 = _with_will(client_factory("w-v311", protocol=4), "will/v311", b"", qos=0)
    v311.connect()
    plain = client_factory("w-none")
    plain.connect()

    w = sidecar.wait_type("connect", client="w-full")[0]["will"]
    assert w == {"topic": "will/full", "payload": base64.b64encode(b"\x00gone\xff").decode(),
                 "qos": 2, "retain": True, "delay": 7,
                 "properties": {"user": [["k", "v"], ["k", "w"]], "content_type": "text/plain",
                                "response_topic": "resp/x",
                                "correlation_data": base64.b64encode(b"\x00corr").decode(),
                                "payload_format": 1, "message_expiry": 90}}
    w311 = sidecar.wait_type("connect", client="w-v311")[0]["will"]
    assert w311 == {"topic": "will/v311", "payload": "", "qos": 0, "retain": False, "delay": 0,
                    "properties": {}}
    assert sidecar.wait_type("connect", client="w-none")[0]["will"] is False
    assert "mqfed:" not in broker.log()  # the read worked: no warning

    # the snapshot carries the will of online clients too
    _, clients = sidecar.snapshot()
    by_id = {c["client"]: c for c in clients}
    assert by_id["w-full"]["will"] == w
    assert by_id["w-none"]["will"] is False


def test_disconnect_says_what_became_of_the_will(broker, sidecar, client_factory):
    dropped = _with_will(client_factory("f-drop"), "will/drop", b"x")
    delayed = _with_will(client_factory("f-delay", session_expiry=60), "will/delay", b"x",
                         delay=30)
    normal = _with_will(client_factory("f-normal"), "will/normal", b"x")
    kicked = _with_will(client_factory("f-kick"), "will/kick", b"x")
    quiet = _with_will(client_factory("f-quiet"), "will/quiet", b"x")
    nowill = client_factory("f-nowill")
    watcher = client_factory("f-watch")
    for c in (dropped, delayed, normal, kicked, quiet, nowill, watcher):
        c.connect()
    watcher.subscribe("will/#", 1)
    for c in ("f-drop", "f-delay", "f-normal", "f-kick", "f-quiet", "f-nowill"):
        sidecar.wait_type("connect", client=c)

    dropped.drop()                      # no DISCONNECT: sent now
    delayed.drop()                      # sent after its delay unless it comes back
    normal.disconnect()                 # a normal DISCONNECT clears it
    assert sidecar.call("kick", client="f-kick", with_will=True)["ok"]
    assert sidecar.call("kick", client="f-quiet", with_will=False)["ok"]
    nowill.drop()

    fate = {c: sidecar.wait_type("disconnect", client=c)[0]["will"]
            for c in ("f-drop", "f-delay", "f-normal", "f-kick", "f-quiet", "f-nowill")}
    assert fate == {"f-drop": "sent", "f-delay": "delayed", "f-normal": "none",
                    "f-kick": "sent", "f-quiet": "none", "f-nowill": "none"}
    got = watcher.wait_messages(lambda m: True, count=2, timeout=5)
    assert sorted(m.topic for m in got) == ["will/drop", "will/kick"]  # as reported


def test_disconnect_with_will_message_reason_keeps_the_will(broker, sidecar, client_factory):
    c = _with_will(client_factory("f-0x04"), "will/0x04", b"x")
    c.connect()
    sidecar.wait_type("connect", client="f-0x04")
    c.c.disconnect(reasoncode=_reason(0x04))
    assert c.wait_disconnected(5)
    c.c.loop_stop()
    assert sidecar.wait_type("disconnect", client="f-0x04")[0]["will"] == "sent"


def _reason(code: int):
    from paho.mqtt.reasoncodes import ReasonCode

    return ReasonCode(PacketTypes.DISCONNECT, identifier=code)


SHIM = """
#include <stddef.h>
/* interposed before libc's: every allocation looks too small to hold what the plugin reads */
size_t malloc_usable_size(void *p) { (void)p; return 0; }
"""


def test_an_unreadable_will_is_unknown_with_one_warning(make_broker, clients, tmp_path):
    """A broker whose client structure is not what the plugin expects (here: its allocation
    looks too small): wills are reported as unknown (null), with one warning, and the broker
    keeps serving."""
    shim = tmp_path / "shim.c"
    shim.write_text(SHIM)
    so = tmp_path / "shim.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(shim)], check=True)
    so.chmod(0o755)
    tmp_path.chmod(0o755)
    b = make_broker(wrapper=["env", f"LD_PRELOAD={so}"])
    sc = clients(FakeSidecar(b.sock)).start()
    for cid in ("u-1", "u-2"):
        c = _with_will(clients(Client(cid, port=b.port)), "will/u", b"x")
        c.connect()
        assert sc.wait_type("connect", client=cid)[0]["will"] is None
        c.drop()
        assert sc.wait_type("disconnect", client=cid)[0]["will"] is None
    assert b.alive()
    assert b.log().count("mqfed: reading client wills failed") == 1, b.log()
