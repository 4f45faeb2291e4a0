"""Forwarding shards (`<id>.fwd<k>`, routing.forward_shards): more sidecar connections holding
forwarding subscriptions. A message re-injected by `.fwd` never reaches one, at any QoS, live
or offline (No Local covers only `.fwd`'s own subscriptions: the plugin denies the READ), or
the sidecar would forward it back to its peers; ordinary messages reach them as they reach
`.fwd`; only the sidecar's secret gets such an id; probes can target them."""

from __future__ import annotations

import time

import pytest

from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    ConnectFailed,
    FakeSidecar,
    RawClient,
)

FWD_ID = SIDECAR_ID + ".fwd"
PROBE_TOPIC = "$SYS/broker/mqfed/fwd-probe"


class Net:
    """A broker with the plugin, the fake sidecar, `.fwd` (No Local, like the sidecar), two
    live shards and one shard's offline session, a plain subscriber and a publisher."""

    def __init__(self, make_broker, clients) -> None:
        self.clients = clients
        self.b = make_broker()
        self.sc = clients(FakeSidecar(self.b.sock)).start()
        self.fwd = self.shard(FWD_ID)
        assert self.fwd.subscribe("t/#", 2, no_local=True, sub_id=1) == [2]
        self.s1 = self.shard(FWD_ID + "1")
        assert self.s1.subscribe("t/#", 2, sub_id=2) == [2]
        assert self.s1.subscribe("t/+", 2, sub_id=3) == [2]
        self.s2 = self.shard(FWD_ID + "2")
        assert self.s2.subscribe("t/x", 2, sub_id=4) == [2]
        self.s3 = self.shard(FWD_ID + "3")  # goes offline: its session queues for it
        assert self.s3.subscribe("t/#", 2, sub_id=5) == [2]
        self.s3.disconnect()
        self.plain = clients(Client("plain", port=self.b.port))
        self.plain.connect()
        assert self.plain.subscribe("t/#", 2) == [2]
        self.pub = clients(Client("pub", port=self.b.port))
        self.pub.connect()

    def shard(self, cid: str) -> RawClient:
        c = self.clients(RawClient(cid, sock=self.b.sock, username=SIDECAR_USER,
                                   password=SECRET, clean_start=False, session_expiry=3600))
        c.connect()
        return c

    def settle(self) -> None:
        """Everything published so far has been routed and delivered."""
        mark = f"mark-{time.monotonic_ns()}".encode()
        self.pub.publish("t/mark", mark, qos=1)
        assert self.plain.wait_messages(lambda m: m.payload == mark)
        assert self.s1.wait_messages(lambda m: m.payload == mark, count=2)
        time.sleep(0.3)


def payloads(c: RawClient) -> list[bytes]:
    return sorted(m.payload for m in c.received() if m.topic != "t/mark")


@pytest.fixture
def net(make_broker, clients) -> Net:
    return Net(make_broker, clients)


def test_reinjections_never_reach_a_shard(net):
    net.fwd.publish("t/x", b"F0", qos=0)
    net.fwd.publish("t/x", b"F1", qos=1)
    net.fwd.publish2("t/x", b"F2")
    held = net.fwd.publish("t/x", b"F2-held", qos=2)  # routed at its PUBREL, later
    net.pub.publish("t/x", b"O1", qos=1)  # an ordinary message in between
    net.fwd.pubrel(held)
    net.fwd.publish("t/y/z", b"F1-deep", qos=1)
    net.settle()
    reinjected = [b"F0", b"F1", b"F1-deep", b"F2", b"F2-held"]
    assert sorted(m.payload for m in net.plain.messages
                  if m.topic != "t/mark") == sorted(reinjected + [b"O1"])
    # the shards get the ordinary message, through each matching subscription, and no
    # re-injection; `.fwd` none of its own (No Local)
    assert payloads(net.s1) == [b"O1", b"O1"]
    assert payloads(net.s2) == [b"O1"]
    assert payloads(net.fwd) == [b"O1"]
    st = net.sc.call("stats")
    assert st["fwd_shared_denied"] >= 2 * 3 + 2  # s1 twice and s2 once per t/x message, ...
    assert st["fwd_qos2_tracked"] == 0
    # the offline shard's session queued the ordinary messages only
    s3 = net.shard(FWD_ID + "3")
    assert s3.connack == (True, 0)
    got = s3.wait_messages(lambda m: m.topic != "t/mark", count=1)
    time.sleep(0.3)
    assert sorted(m.payload for m in s3.received(lambda m: m.topic != "t/mark")) == [b"O1"], got


def test_a_shard_counts_as_forwarding_for_probes_and_shedding(net):
    # a probe can target a shard (the sidecar's gap tracker is per connection)
    net.sc.call("deliver", client=FWD_ID + "2", topic=PROBE_TOPIC, payload="cA==", qos=1)
    assert net.s2.wait_messages(lambda m: m.topic == PROBE_TOPIC)
    rep = net.sc.call("deliver", client=FWD_ID + "64", topic=PROBE_TOPIC, payload="cA==", qos=1)
    assert rep["ok"] is False and rep["error"] == "unknown_client"
    # the shards' filters are forwarding filters (shed.c): t/#, t/+, t/x, counted once each
    assert net.sc.call("stats")["fwd_filters"] == 3


@pytest.mark.parametrize("suffix", ["1", "63"])
def test_a_shard_id_needs_the_secret(make_broker, clients, suffix):
    b = make_broker()
    clients(FakeSidecar(b.sock)).start()
    impostor = clients(RawClient(FWD_ID + suffix, sock=b.sock, username=SIDECAR_USER,
                                 password="wrong"))
    with pytest.raises(ConnectFailed):
        impostor.connect()
    ok = clients(RawClient(FWD_ID + suffix, sock=b.sock, username=SIDECAR_USER,
                           password=SECRET))
    assert ok.connect() is False


@pytest.mark.parametrize("suffix", ["64", "01", "x", ".1"])
def test_other_ids_after_fwd_are_reserved_not_shards(make_broker, clients, suffix):
    b = make_broker()
    clients(FakeSidecar(b.sock)).start()
    c = clients(RawClient(FWD_ID + suffix, sock=b.sock, username=SIDECAR_USER,
                          password=SECRET))
    with pytest.raises(ConnectFailed):
        c.connect()
