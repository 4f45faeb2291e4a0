"""Access: only the sidecar drives/reads the plugin; everything else is decided exactly as
without the plugin (password_file, acl_file, dynamic-security)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.system.plugin.helpers import (
    CONTROL,
    DYNSEC_SO,
    REPLIES,
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Broker,
    Client,
    ConnectFailed,
    FakeSidecar,
    give_to_mosquitto,
)


def try_connect(port: int, client_id: str, username=None, password=None, protocol=5):
    """'ok', 'refused:<rc>' or 'no-connack'."""
    c = Client(client_id, port=port, username=username, password=password, protocol=protocol)
    try:
        c.connect()
        c.disconnect()
        return "ok"
    except ConnectFailed as e:
        return f"refused:{e.reason}" if e.reason is not None else "no-connack"
    finally:
        c.close()


# ---- the plugin's own topics -------------------------------------------------------------

def test_ordinary_client_cannot_read_plugin_topics(broker, sidecar, client_factory):
    spy = client_factory("spy")
    spy.connect()
    assert spy.subscribe("$SYS/#", 0) == [0]                       # allowed: other $SYS topics
    assert spy.subscribe("$SYS/broker/mqfed/#", 1) == [135]       # refused outright
    assert spy.subscribe("$SYS/broker/mqfed/events", 1) == [135]
    assert spy.subscribe("$share/g/$SYS/broker/mqfed/events", 1) == [135]
    v3spy = client_factory("spy311", protocol=4)
    v3spy.connect()
    assert v3spy.subscribe("$SYS/broker/mqfed/#", 1) == [128]
    # trigger events and replies
    other = client_factory("other")
    other.connect()
    other.subscribe("x/y", 1)
    other.publish("r/x", b"1", retain=True)
    sidecar.wait_type("retained", client="other")
    sidecar.call("stats")
    time.sleep(0.3)
    leaked = [m.topic for m in spy.messages + v3spy.messages if "mqfed" in m.topic]
    assert leaked == []
    assert [e["type"] for e in sidecar.unique_events() if e.get("client") == "spy"] == [
        "connect", "subscribe"]                                    # only the $SYS/# one


def test_ordinary_client_cannot_drive_the_control_topic(broker, sidecar, client_factory,
                                                        clients):
    victim = client_factory("victim")
    victim.connect()
    sidecar.wait_type("connect", client="victim")
    # the sidecar's username and secret are refused away from the private socket
    with pytest.raises(ConnectFailed) as refused:
        client_factory("attacker2", username=SIDECAR_USER, password=SECRET).connect()
    assert refused.value.reason == 135
    # an ordinary client, and a shadow (the sidecar's username and secret, on the private
    # socket, another client id): neither drives the plugin
    for cid, user in [("attacker", None), ("attacker2", SIDECAR_USER)]:
        att = clients(Client(cid, sock=broker.sock if user else None,
                             port=None if user else broker.port, username=user,
                             password=SECRET if user else None))
        att.connect()
        for cmd in [{"cmd": "kick", "client": "victim"},
                    {"cmd": "deny", "client": "later", "mode": "refuse"},
                    {"cmd": "stats"}]:
            att.publish(CONTROL, json.dumps({"v": 1, "id": cid, "reply": REPLIES + cid, **cmd}))
        att.subscribe(REPLIES + "#", 1)
    time.sleep(0.5)
    assert not victim.disconnected
    assert try_connect(broker.port, "later") == "ok"
    assert sidecar.call("stats")["denied"] == 0
    assert "attacker" not in sidecar.replies and "attacker2" not in sidecar.replies


def test_sidecar_identity_requires_the_secret(broker, sidecar, clients):
    for user, pw in [(SIDECAR_USER, "wrong"), (SIDECAR_USER, None), ("someone", SECRET),
                     (None, None)]:
        imp = clients(FakeSidecar(broker.sock, username=user, password=pw))
        with pytest.raises(ConnectFailed) as e:
            imp.connect()
        assert e.value.reason == 135, (user, pw)
    # over TCP too
    assert try_connect(broker.port, SIDECAR_ID, SIDECAR_USER, "wrong") == "refused:135"
    # the real sidecar was never disturbed
    assert not sidecar.disconnected
    assert sidecar.call("stats")["ok"] is True
    rej = sidecar.wait_type("connect_rejected", client=SIDECAR_ID, count=5)
    assert all(r["reason"] == "auth" for r in rej)
    # five refusals in a row: one warning line (rate-limited), the count comes with the next
    warnings = [line for line in broker.log().splitlines() if "mqfed: refused client" in line]
    assert len(warnings) == 1 and "uses the sidecar's client id without its credentials" \
        in warnings[0], warnings


# ---- same decisions with and without the plugin -----------------------------------------

def start(make_broker, with_plugin: bool, **kw) -> Broker:
    return make_broker(plugin=with_plugin, **kw)


@pytest.mark.parametrize("with_plugin", [True, False], ids=["plugin", "no-plugin"])
def test_password_file_same_with_and_without_plugin(make_broker, clients, with_plugin):
    holder = make_broker(plugin=False, name="holder")
    pwfile = holder.dir / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(pwfile), "alice", "right"], check=True,
                   capture_output=True)
    give_to_mosquitto(pwfile)
    b = start(make_broker, with_plugin, opts={"auth": "defer"},
              extra=f"password_file {pwfile}", allow_anonymous=False)
    sc = clients(FakeSidecar(b.sock)).start() if with_plugin else None
    got = {
        "good": try_connect(b.port, "c1", "alice", "right"),
        "good311": try_connect(b.port, "c2", "alice", "right", protocol=4),
        "bad": try_connect(b.port, "c3", "alice", "wrong"),
        "no-password": try_connect(b.port, "c4", "alice"),
        "unknown-user": try_connect(b.port, "c5", "mallory", "x"),
        "anonymous": try_connect(b.port, "c6"),
    }
    assert got == {"good": "ok", "good311": "ok", "bad": "refused:135",
                   "no-password": "refused:135", "unknown-user": "refused:135",
                   "anonymous": "refused:135"}
    if sc:
        sc.wait_synced()
        seen = {e["client"]: e["type"] for e in sc.unique_events()
                if e["type"] in ("connect", "connect_rejected")}
        assert seen == {"c1": "connect", "c2": "connect", "c3": "connect_rejected",
                        "c4": "connect_rejected", "c5": "connect_rejected",
                        "c6": "connect_rejected"}


ACL = """\
topic readwrite open/#
topic read ro/#
topic write wo/#
"""


@pytest.mark.parametrize("with_plugin", [True, False], ids=["plugin", "no-plugin"])
def test_acl_file_same_with_and_without_plugin(make_broker, clients, with_plugin):
    holder = make_broker(plugin=False, name="holder")
    aclfile = holder.dir / "acl"
    aclfile.write_text(ACL)
    give_to_mosquitto(aclfile)
    b = start(make_broker, with_plugin, opts={"acl": "defer"}, extra=f"acl_file {aclfile}")
    sc = clients(FakeSidecar(b.sock)).start() if with_plugin else None
    sub = clients(Client("sub", port=b.port))
    sub.connect()
    subacks = {f: sub.subscribe(f, 1)[0] for f in ["open/#", "ro/#", "wo/#", "secret/#", "#"]}
    pub = clients(Client("pub", port=b.port))
    pub.connect()
    for t in ["open/1", "ro/1", "wo/1", "secret/1"]:
        pub.publish(t, t.encode(), qos=1)
    pub.publish("open/end", b"end", qos=1)
    sub.wait_messages(lambda m: m.topic == "open/end")
    received = sorted({m.topic for m in sub.messages})
    # 2.0.11's acl_file grants every subscription and filters at delivery (READ)
    assert subacks == {"open/#": 1, "ro/#": 1, "wo/#": 1, "secret/#": 1, "#": 1}
    assert received == ["open/1", "open/end"]
    if sc:
        sc.wait_synced()
        assert [e["filter"] for e in sc.unique_events() if e["type"] == "subscribe"] == [
            "open/#", "ro/#", "wo/#", "secret/#", "#"]
        assert [e["topic"] for e in sc.unique_events() if e["type"] == "retained"] == []


def dynsec_ctrl(port: int, *args: str) -> None:
    subprocess.run(["mosquitto_ctrl", "-h", "127.0.0.1", "-p", str(port), "-u", "admin",
                    "-P", "adminpw", "dynsec", *args], check=True, capture_output=True,
                   timeout=10)


@pytest.mark.parametrize("with_plugin", [True, False], ids=["plugin", "no-plugin"])
def test_dynamic_security_same_with_and_without_plugin(make_broker, clients, with_plugin):
    holder = make_broker(plugin=False, name="holder")
    dsfile = holder.dir / "dynsec.json"
    subprocess.run(["mosquitto_ctrl", "dynsec", "init", str(dsfile), "admin", "adminpw"],
                   check=True, capture_output=True)
    give_to_mosquitto(dsfile)
    extra = f"plugin {DYNSEC_SO}\nplugin_opt_config_file {dsfile}"
    b = start(make_broker, with_plugin, opts={"auth": "defer", "acl": "defer"}, extra=extra,
              allow_anonymous=False)
    sc = clients(FakeSidecar(b.sock)).start() if with_plugin else None
    dynsec_ctrl(b.port, "createClient", "bob", "-p", "bobpw")
    dynsec_ctrl(b.port, "createRole", "tr")
    dynsec_ctrl(b.port, "addRoleACL", "tr", "publishClientSend", "t/#", "allow")
    dynsec_ctrl(b.port, "addRoleACL", "tr", "subscribePattern", "t/#", "allow")
    dynsec_ctrl(b.port, "addClientRole", "bob", "tr")
    got = {
        "admin": try_connect(b.port, "a1", "admin", "adminpw"),
        "admin-bad": try_connect(b.port, "a2", "admin", "nope"),
        "unknown": try_connect(b.port, "a3", "nobody", "x"),
        "anonymous": try_connect(b.port, "a4"),
    }
    bob = clients(Client("bob-c", port=b.port, username="bob", password="bobpw"))
    bob.connect()
    got["bob-sub"] = [bob.subscribe(f, 1)[0] for f in ["t/#", "x/#"]]
    bob.publish("t/1", b"one", qos=1)
    bob.publish("x/1", b"no", qos=1)
    bob.publish("t/end", b"end", qos=1)
    bob.wait_messages(lambda m: m.topic == "t/end")
    got["bob-received"] = sorted({m.topic for m in bob.messages})
    assert got == {"admin": "ok", "admin-bad": "refused:135", "unknown": "refused:135",
                   "anonymous": "refused:135", "bob-sub": [1, 135],
                   "bob-received": ["t/1", "t/end"]}
    if sc:
        sc.wait_synced()
        assert [e["filter"] for e in sc.unique_events()
                if e["type"] == "subscribe" and e["client"] == "bob-c"] == ["t/#"]


def test_dynsec_role_change_kick_removes_denied_subscriptions(make_broker, clients):
    """A dynamic-security role change kicks the client; Debian's re-check then silently removes
    the subscriptions the new rules deny. The plugin reports exactly those as unsubscribes."""
    holder = make_broker(plugin=False, name="holder")
    dsfile = holder.dir / "dynsec.json"
    subprocess.run(["mosquitto_ctrl", "dynsec", "init", str(dsfile), "admin", "adminpw"],
                   check=True, capture_output=True)
    give_to_mosquitto(dsfile)
    b = make_broker(opts={"auth": "defer", "acl": "defer"}, allow_anonymous=False,
                    extra=f"plugin {DYNSEC_SO}\nplugin_opt_config_file {dsfile}")
    sc = clients(FakeSidecar(b.sock)).start()
    dynsec_ctrl(b.port, "createClient", "bob", "-p", "bobpw")
    dynsec_ctrl(b.port, "createRole", "tr")
    for acl in [("publishClientSend", "#"), ("subscribePattern", "t/#"),
                ("subscribePattern", "keep/#")]:
        dynsec_ctrl(b.port, "addRoleACL", "tr", *acl, "allow")
    dynsec_ctrl(b.port, "addClientRole", "bob", "tr")
    bob = clients(Client("bob-c", port=b.port, username="bob", password="bobpw",
                         session_expiry=300, clean_start=False))
    bob.connect()
    assert bob.subscribe([("t/#", 1), ("t/x", 2), ("keep/1", 1)]) == [1, 2, 1]
    sc.wait_type("subscribe", client="bob-c", count=3)

    dynsec_ctrl(b.port, "removeRoleACL", "tr", "subscribePattern", "t/#")
    assert bob.wait_disconnected()
    sc.wait_type("disconnect", client="bob-c")
    evs = [(e["type"], e.get("filter")) for e in sc.wait_synced() if e.get("client") == "bob-c"]
    assert evs[:4] == [("connect", None), ("subscribe", "t/#"), ("subscribe", "t/x"),
                       ("subscribe", "keep/1")]
    assert sorted(evs[4:6]) == [("unsubscribe", "t/#"), ("unsubscribe", "t/x")]
    assert evs[6:] == [("disconnect", None)]
    _, snap = sc.snapshot()
    assert {s["filter"] for s in snap[0]["subscriptions"]} == {"keep/1"}

    # Mosquitto agrees: the resumed session only delivers keep/1
    bob2 = clients(Client("bob-c", port=b.port, username="bob", password="bobpw",
                          session_expiry=300, clean_start=False))
    assert bob2.connect() is True
    bob2.publish("t/x", b"gone", qos=1)
    bob2.publish("keep/1", b"kept", qos=1)
    bob2.wait_messages(lambda m: m.topic == "keep/1")
    assert sorted({m.topic for m in bob2.messages}) == ["keep/1"]


def acl_broker(make_broker, acl: str, extra: str = ""):
    holder = make_broker(plugin=False, name="holder")
    aclfile = holder.dir / "acl"
    aclfile.write_text(acl)
    give_to_mosquitto(aclfile)
    return make_broker(opts={"acl": "defer"}, extra=f"acl_file {aclfile}\n{extra}")


def test_sidecar_offline_session_keeps_receiving(make_broker, clients):
    """Mosquitto queues messages for the sidecar's offline session (a sidecar restart loses
    nothing): the read check then runs on the offline session, which is still the sidecar."""
    b = acl_broker(make_broker, "topic write cluster/#\n")
    sc = clients(FakeSidecar(b.sock))
    sc.connect()
    sc.subscribe("cluster/#", 1)
    sc.disconnect()
    pub = clients(Client("pub", port=b.port))
    pub.connect()
    pub.publish("cluster/1", b"while-away", qos=1)
    sc2 = clients(FakeSidecar(b.sock))
    assert sc2.connect() is True
    got = sc2.wait_messages(lambda m: m.topic == "cluster/1")
    assert got and got[0].payload == b"while-away"


def test_sidecar_retained_messages_pass_check_retain_source(make_broker, clients):
    b = acl_broker(make_broker, "topic read ret/#\n", extra="check_retain_source true")
    sc = clients(FakeSidecar(b.sock)).start()
    sc.publish("ret/from-cluster", b"replicated", qos=1, retain=True)
    sub = clients(Client("reader", port=b.port))
    sub.connect()
    sub.subscribe("ret/#", 1)
    got = sub.wait_messages(lambda m: m.topic == "ret/from-cluster")
    assert got and got[0].payload == b"replicated" and got[0].retain


@pytest.mark.parametrize("with_plugin", [True, False], ids=["plugin", "no-plugin"])
def test_enhanced_auth_cannot_claim_the_sidecar_id(make_broker, with_plugin):
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    b = make_broker(plugin=with_plugin)

    def attempt(cid: str) -> int | None:
        result: list[int] = []
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5,
                        transport="unix", reconnect_on_failure=False)
        c.on_connect = lambda cl, ud, fl, rc, pr=None: result.append(rc.value)
        props = Properties(PacketTypes.CONNECT)
        props.AuthenticationMethod = "SCRAM-SHA-1"
        props.AuthenticationData = b"x"
        c.connect(b.sock, properties=props)
        c.loop_start()
        deadline = time.monotonic() + 3
        while not result and time.monotonic() < deadline:
            time.sleep(0.02)
        c.loop_stop()
        c.disconnect()
        return result[0] if result else None

    assert attempt("someone") == 140                     # bad authentication method: unchanged
    assert attempt(SIDECAR_ID) == (135 if with_plugin else 140)


FWD_ID = SIDECAR_ID + ".fwd"


def test_forwarding_identity_is_trusted_and_silent(make_broker, clients):
    """The sidecar's hot-path connection `<id>.fwd`: needs the secret, bypasses the user's ACL
    (it re-injects cluster traffic on any topic) and never shows up in events."""
    b = acl_broker(make_broker, "topic read nothing/#\n")
    sc = clients(FakeSidecar(b.sock)).start()
    imp = clients(Client(FWD_ID, sock=b.sock, username=SIDECAR_USER, password="wrong"))
    with pytest.raises(ConnectFailed) as e:
        imp.connect()
    assert e.value.reason == 135
    assert sc.wait_type("connect_rejected", client=FWD_ID)[0]["reason"] == "auth"
    fwd = clients(Client(FWD_ID, sock=b.sock, username=SIDECAR_USER, password=SECRET))
    fwd.connect()                          # raises ConnectFailed if refused
    fwd.subscribe("secret/#", 1)          # the ACL file grants nobody this
    fwd.publish("ret/x", b"r", qos=1, retain=True)
    time.sleep(0.3)
    kinds = {(ev["type"], ev.get("client")) for ev in sc.wait_synced()}
    assert not any(client == FWD_ID for kind, client in kinds if kind != "connect_rejected")
    # its identity passes reads the ACL file refuses to everyone else
    sc.publish("secret/2", b"from-cluster", qos=1)
    got = fwd.wait_messages(lambda m: m.topic == "secret/2")
    assert got and got[0].payload == b"from-cluster"
    other = clients(Client("ordinary", port=b.port))
    other.connect()
    other.subscribe("secret/#", 1)
    sc.publish("secret/3", b"x", qos=1)
    assert fwd.wait_messages(lambda m: m.topic == "secret/3")
    assert not other.wait_messages(lambda m: m.topic == "secret/3", timeout=0.5)
