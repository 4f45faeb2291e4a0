"""Messages re-injected by the sidecar's forwarding connection (`<id>.fwd`) never reach a shared
subscription (the origin node already gave them to one member of each group); plain
subscriptions get them as usual; everything else is routed exactly as before."""

from __future__ import annotations

import time

import pytest

from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    FakeSidecar,
    RawClient,
    give_to_mosquitto,
)

FWD_ID = SIDECAR_ID + ".fwd"
ACL = """topic readwrite t/#
topic readwrite b/#
topic readwrite z/#
user nobody
topic write t/#
"""
# long topic and payload: their allocations have sizes nothing else uses, so a freed message's
# addresses are likely to be reused by the next message of the same shape (pointer-reuse tests)
LONG = "t/" + "L" * 180
BODY = bytes(range(256)) * 2 + b"tail"


class Net:
    """One broker with acl_file (plugin in defer mode), the fake sidecar, the forwarding
    connection, a plain subscriber, two shared members, an acl-denied plain subscriber."""

    def __init__(self, make_broker, clients, opts: dict | None = None) -> None:
        holder = make_broker(plugin=False, name="holder")
        aclfile = holder.dir / "acl"
        aclfile.write_text(ACL)
        give_to_mosquitto(aclfile)
        self.clients = clients
        self.b = make_broker(opts={"acl": "defer", **(opts or {})},
                             extra=f"acl_file {aclfile}")
        self.sc = clients(FakeSidecar(self.b.sock)).start()   # calibrates the session expiry
        self.fwd = self.raw(FWD_ID, sock=self.b.sock, username=SIDECAR_USER, password=SECRET,
                            clean_start=False, session_expiry=3600)
        self.fwd.connect()
        # like the sidecar: plain forwarding subscriptions with No Local, and group membership
        assert self.fwd.subscribe("t/#", 2, no_local=True, sub_id=1) == [2]
        assert self.fwd.subscribe("$share/g/t/#", 2, sub_id=2) == [2]
        self.plain = self.paho("plain", "t/#")
        self.m1 = self.paho("m1", "$share/g/t/#")
        self.m2 = self.paho("m2", "$share/g/t/#")
        self.denied = self.paho("denied", "t/#", username="nobody")
        self.pub = clients(Client("pub", port=self.b.port))
        self.pub.connect()

    def raw(self, cid: str, **kw) -> RawClient:
        if "sock" not in kw:
            kw["port"] = self.b.port
        return self.clients(RawClient(cid, **kw))

    def paho(self, cid: str, filt: str, **kw) -> Client:
        c = self.clients(Client(cid, port=self.b.port, **kw))
        c.connect()
        assert c.subscribe(filt, 2) == [2]
        return c

    def members(self) -> dict[str, list[bytes]]:
        """Payloads received by each member of $share/g/t/#."""
        return {"m1": [m.payload for m in self.m1.messages],
                "m2": [m.payload for m in self.m2.messages],
                "fwd": [m.payload for m in self.fwd.received(lambda m: 2 in m.sub_ids)]}

    def settle(self) -> None:
        """Everything published so far has been routed and delivered."""
        mark = f"mark-{time.monotonic_ns()}".encode()
        self.fwd.publish("t/mark", mark, qos=1)
        assert self.plain.wait_messages(lambda m: m.payload == mark)
        time.sleep(0.3)

    def stats(self) -> dict:
        return self.sc.call("stats")


def plain_payloads(c: Client, topic_prefix: str = "t/") -> list[bytes]:
    return [m.payload for m in c.messages
            if m.topic.startswith(topic_prefix) and m.topic != "t/mark"]


@pytest.fixture
def net(make_broker, clients) -> Net:
    return Net(make_broker, clients)


def shared_total(net: Net) -> list[bytes]:
    return sorted(p for ps in net.members().values() for p in ps)


def test_reinjected_messages_reach_plain_subscribers_only(net):
    for qos in (0, 1):
        net.fwd.publish("t/1", f"F{qos}".encode(), qos=qos)
    net.fwd.publish2("t/1", b"F2")
    for qos in (0, 1):
        net.fwd.publish("t/e", b"", qos=qos)
    net.fwd.publish2("t/e", b"")
    net.settle()
    assert sorted(plain_payloads(net.plain)) == [b"", b"", b"", b"F0", b"F1", b"F2"]
    assert net.members() == {"m1": [], "m2": [], "fwd": []}
    assert net.fwd.received(lambda m: m.topic != "t/mark") == []
    assert plain_payloads(net.denied) == []          # acl_file still decides plain delivery
    st = net.stats()
    assert st["fwd_shared_denied"] >= 6 and st["fwd_qos2_tracked"] == 0

    # an ordinary client's messages: exactly one member each, strict round robin as before
    net.pub.publish("t/1", b"O1", qos=0)
    net.pub.publish("t/1", b"O2", qos=1)
    net.pub.publish("t/1", b"O3", qos=2)
    net.pub.publish("t/2", b"O4", qos=1)
    net.pub.publish("t/e", b"", qos=1)
    net.pub.publish("t/1", b"O6", qos=2)
    # and the control connection's (not re-injections)
    for i in range(3):
        net.sc.publish("t/sc", f"S{i}".encode(), qos=1)
    net.settle()
    ordinary = [b"O1", b"O2", b"O3", b"O4", b"", b"O6", b"S0", b"S1", b"S2"]
    assert shared_total(net) == sorted(ordinary)
    assert sorted(len(v) for v in net.members().values()) == [3, 3, 3]
    assert sorted(plain_payloads(net.plain)) == sorted(
        ordinary + [b"", b"", b"", b"F0", b"F1", b"F2"])
    assert plain_payloads(net.denied) == []


def test_pending_qos2_reinjection_does_not_leak_into_other_traffic(net):
    """QoS 2 re-injections wait for their PUBREL while ordinary QoS 0/1/2 messages and QoS 0/1
    re-injections flow; each message ends up exactly where it belongs."""
    fwd, pub = net.fwd, net.pub
    a = fwd.publish("t/1", b"F2a", qos=2)             # PUBREC received, PUBREL held
    b = fwd.publish("t/1", b"F2b", qos=2)
    e = fwd.publish("t/1", b"", qos=2)
    assert net.stats()["fwd_qos2_tracked"] == 3
    pub.publish("t/1", b"O1", qos=0)
    pub.publish("t/1", b"O2", qos=1)
    fwd.publish("t/1", b"F0c", qos=0)
    fwd.publish("t/1", b"F1d", qos=1)
    pub.publish("t/1", b"O3", qos=1)
    pub.publish("t/1", b"O4", qos=0)
    pub.publish("t/1", b"O5", qos=2)
    fwd.pubrel(b)
    pub.publish("t/1", b"O6", qos=1)
    fwd.pubrel(e)
    pub.publish("t/1", b"O7", qos=0)
    fwd.pubrel(a)
    for i in range(8, 11):
        pub.publish("t/1", f"O{i}".encode(), qos=1)
        fwd.publish("t/1", f"F1-{i}".encode(), qos=1)
    net.settle()
    ordinary = [f"O{i}".encode() for i in range(1, 11)]
    fwd_msgs = [b"F2a", b"F2b", b"", b"F0c", b"F1d"] + [f"F1-{i}".encode() for i in range(8, 11)]
    assert shared_total(net) == sorted(ordinary)
    assert all(net.members().values()), net.members()          # round robin still rotates
    assert sorted(plain_payloads(net.plain)) == sorted(ordinary + fwd_msgs)
    st = net.stats()
    assert st["fwd_qos2_tracked"] == 0 and st["fwd_qos2_forgotten"] == 0


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_will_in_the_same_moment_still_reaches_a_shared_member(net, qos):
    """A will identical to a re-injection (topic, payload, QoS), published by a client that
    disconnects right after the re-injection: the will is an ordinary message."""
    n = 6
    for i in range(n):
        w = net.raw(f"will-{qos}-{i}", will=(LONG, BODY, qos))
        w.connect()
        if qos == 2:
            mid = net.fwd.publish(LONG, BODY, qos=2)
            w.drop()
            time.sleep(0.05)
            net.fwd.pubrel(mid)
        else:
            net.fwd.publish(LONG, BODY, qos=qos, wait=False)
            w.drop()
    net.settle()
    assert plain_payloads(net.plain).count(BODY) == 2 * n       # n re-injections + n wills
    assert shared_total(net) == [BODY] * n                      # the wills, once each
    assert plain_payloads(net.denied) == []


def test_client_with_plain_and_shared_subscriptions(net):
    """Plain subscriptions are routed before shared ones: a client holding both gets a
    re-injection through each matching plain subscription and never through its shared one."""
    both = net.raw("both")
    both.connect()
    assert both.subscribe("b/#", 2, sub_id=1) == [2]
    assert both.subscribe("$share/h/b/#", 2, sub_id=2) == [2]
    both2 = net.raw("both2")
    both2.connect()
    assert both2.subscribe("b/#", 2, sub_id=1) == [2]
    assert both2.subscribe("b/+", 2, sub_id=3) == [2]
    assert both2.subscribe("$share/h/b/#", 2, sub_id=4) == [2]
    hm = net.raw("hm")
    hm.connect()
    assert hm.subscribe("$share/h/b/#", 2, sub_id=5) == [2]
    net.fwd.subscribe("$share/h/b/#", 2)
    for i, qos in enumerate([0, 1, 2, 1]):
        if qos == 2:
            net.fwd.publish2("b/1", f"F{i}".encode())
        else:
            net.fwd.publish("b/1", f"F{i}".encode(), qos=qos)
    for i in range(6):
        net.pub.publish("b/1", f"O{i}".encode(), qos=1)
    net.settle()

    def by_sid(c: RawClient) -> dict[int, list[bytes]]:
        out: dict[int, list[bytes]] = {}
        for m in c.received():
            for s in m.sub_ids:
                out.setdefault(s, []).append(m.payload)
        return {k: sorted(v) for k, v in out.items()}

    fwd_p = [f"F{i}".encode() for i in range(4)]
    ord_p = [f"O{i}".encode() for i in range(6)]
    got_both, got_both2, got_hm = by_sid(both), by_sid(both2), by_sid(hm)
    assert got_both[1] == sorted(fwd_p + ord_p)
    assert got_both2[1] == sorted(fwd_p + ord_p) and got_both2[3] == sorted(fwd_p + ord_p)
    shared = (got_both.get(2, []) + got_both2.get(4, []) + got_hm.get(5, [])
              + [m.payload for m in net.fwd.received(lambda m: m.topic == "b/1")])
    assert sorted(shared) == ord_p                  # each ordinary message once, no F*


def test_freed_qos2_reinjection_never_matches_a_later_message(net):
    """A tracked QoS 2 message whose store is freed without being routed (a DUP resend of the
    same mid; a release with no subscriber) must not be mistaken for a later ordinary message
    that reuses its addresses and has the same topic and payload."""
    fwd, o = net.fwd, net.raw("o2")
    o.connect()
    # 1. DUP resend: Mosquitto keeps the first copy and frees the second one at once
    mid = fwd.publish(LONG, BODY, qos=2)
    fwd.publish(LONG, BODY, qos=2, mid=mid, dup=True)
    o.publish2(LONG, BODY)                            # ordinary, identical, QoS 2
    net.settle()
    assert shared_total(net) == [BODY]
    fwd.pubrel(mid)                                   # the kept copy: plain only
    net.settle()
    assert shared_total(net) == [BODY]
    assert plain_payloads(net.plain).count(BODY) == 2

    # 2. released with nobody subscribed: never seen by a READ check, freed at once
    z = "z/" + "Z" * 180
    fwd.publish2(z, BODY)
    zm = net.paho("zm", "$share/gz/z/#")
    o.publish2(z, BODY)
    assert zm.wait_messages(lambda m: m.topic == z), "ordinary message denied"


def test_qos2_tracking_is_bounded_and_fails_open(make_broker, clients):
    net = Net(make_broker, clients, opts={"fwd_qos2_max": 4})
    mids = [net.fwd.publish("t/1", f"Q{i}".encode(), qos=2) for i in range(6)]
    st = net.stats()
    assert st["fwd_qos2_tracked"] == 4 and st["fwd_qos2_forgotten"] == 2
    for m in mids:
        net.fwd.pubrel(m)
    net.settle()
    # the two forgotten (oldest) ones are routed as without the plugin: one member each
    assert shared_total(net) == [b"Q0", b"Q1"]
    assert sorted(plain_payloads(net.plain)) == sorted(f"Q{i}".encode() for i in range(6))
    assert net.stats()["fwd_qos2_tracked"] == 0


def test_pending_qos2_survives_a_reconnect_with_the_session(net):
    """The forwarding connection drops between PUBREC and PUBREL and comes back to its session:
    the PUBREL it sends then still releases a re-injection (plain only)."""
    mid = net.fwd.publish("t/1", b"across", qos=2)
    net.fwd.drop()
    time.sleep(0.2)
    fwd2 = net.raw(FWD_ID, sock=net.b.sock, username=SIDECAR_USER, password=SECRET,
                   clean_start=False, session_expiry=3600)
    assert fwd2.connect() is True
    assert net.stats()["fwd_qos2_tracked"] == 1
    fwd2.pubrel(mid)
    net.fwd = fwd2
    net.settle()
    assert plain_payloads(net.plain) == [b"across"]
    assert shared_total(net) == []
    # a clean start ends the session: what it still held is forgotten
    net.fwd.publish("t/1", b"lost", qos=2)
    fwd2.drop()
    fwd3 = net.raw(FWD_ID, sock=net.b.sock, username=SIDECAR_USER, password=SECRET,
                   clean_start=True, session_expiry=3600)
    assert fwd3.connect() is False
    st = net.stats()
    assert st["fwd_qos2_tracked"] == 0 and st["fwd_qos2_forgotten"] == 1


def test_grant_mode_without_other_providers(make_broker, clients):
    """With plugin_opt_acl grant (the plugin is the only provider) the same rule holds."""
    b = make_broker()
    clients(FakeSidecar(b.sock)).start()
    fwd = clients(RawClient(FWD_ID, sock=b.sock, username=SIDECAR_USER, password=SECRET))
    fwd.connect()
    fwd.subscribe("$share/g/#", 2)
    plain = clients(Client("plain", port=b.port))
    plain.connect()
    plain.subscribe("#", 2)
    member = clients(Client("member", port=b.port))
    member.connect()
    member.subscribe("$share/g/#", 2)
    fwd.publish("x", b"f0", qos=0)
    fwd.publish("x", b"f1", qos=1)
    fwd.publish2("x", b"f2")
    member.publish("x", b"o1", qos=1)
    member.publish("x", b"o2", qos=1)
    assert len(plain.wait_messages(lambda m: True, count=5)) == 5
    time.sleep(0.3)
    got = [m.payload for m in member.messages] + [m.payload for m in fwd.received()]
    assert sorted(got) == [b"o1", b"o2"]
