"""A batch of messages from peers re-injected inside Mosquitto (`$CONTROL/mqfed/inject`,
issue 25): every message reaches plain subscribers in order with its properties, never a
shared subscription nor the forwarding connections; a malformed batch is refused whole."""

from __future__ import annotations

import json
import time

import pytest

from sidecar.local.batch import (
    INJECT_REPLY,
    INJECT_TOPIC,
    Record,
    encode_batch,
    encode_record,
)
from sidecar.message import MessageProperties
from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    FakeSidecar,
    RawClient,
    inject,
    user_props,
)

FWD_ID = SIDECAR_ID + ".fwd"
PROPS = MessageProperties(user=(("k", "v"), ("k", "w")), content_type="text/plain",
                          payload_format=1, correlation_data=b"\x00c", response_topic="r/1",
                          message_expiry=300)


class Net:
    """A broker, the fake sidecar, `.fwd` (plain and shared forwarding subscriptions), a plain
    v5 subscriber and two members of a shared group."""

    def __init__(self, make_broker, clients) -> None:
        self.clients = clients
        self.b = make_broker()
        self.sc = clients(FakeSidecar(self.b.sock)).start()
        self.fwd = clients(RawClient(FWD_ID, sock=self.b.sock, username=SIDECAR_USER,
                                     password=SECRET, clean_start=False, session_expiry=3600))
        self.fwd.connect()
        assert self.fwd.subscribe("t/#", 2, no_local=True, sub_id=1) == [2]
        assert self.fwd.subscribe("$share/g/t/#", 2, sub_id=2) == [2]
        self.plain = self.paho("plain", "t/#")
        self.m1 = self.paho("m1", "$share/g/t/#")
        self.m2 = self.paho("m2", "$share/g/t/#")
        self.batch_id = 0

    def paho(self, cid: str, filt: str) -> Client:
        c = self.clients(Client(cid, port=self.b.port))
        c.connect()
        assert c.subscribe(filt, 2) == [2]
        return c

    def inject(self, data: bytes | None = None, records: list | None = None,
               timeout: float = 5.0) -> dict:
        """Send a batch; the plugin's reply to it."""
        self.batch_id += 1
        if data is None:
            data = encode_batch(self.batch_id, records or [])
        return inject(self.sc, self.batch_id, data, timeout)

    def settle(self) -> None:
        """Everything published so far has been routed and delivered."""
        mark = f"mark-{time.monotonic_ns()}".encode()
        self.sc.publish("t/mark", mark, qos=1)
        assert self.plain.wait_messages(lambda m: m.payload == mark)
        time.sleep(0.3)

    def shared(self) -> list[bytes]:
        return [m.payload for c in (self.m1, self.m2) for m in c.messages
                if m.topic != "t/mark"]

    def fwd_copies(self) -> list[bytes]:
        return [m.payload for m in self.fwd.received(
            lambda m: m.topic != "t/mark" and m.topic != INJECT_REPLY)]


@pytest.fixture
def net(make_broker, clients) -> Net:
    return Net(make_broker, clients)


def plain(net: Net) -> list[tuple[str, bytes, int]]:
    return [(m.topic, m.payload, m.qos) for m in net.plain.messages if m.topic != "t/mark"]


def test_a_batch_reaches_plain_subscribers_in_order_with_its_properties(net):
    recs = [Record("t/a", b"A0", 0, properties=PROPS, client="pub-1", seq=1),
            Record("t/a", b"A1", 1, seq=2), Record("t/b", b"B2", 2, seq=3),
            Record("t/e", b"", 1, seq=4)]
    # one record encoded apart: a batch is the records' bytes joined
    reply = net.inject(data=encode_batch(1, [encode_record(r) for r in recs]))
    # `queued`: the fullest live subscriber's queue past its in-flight window (paho: empty)
    assert reply == {"v": 1, "cmd": "inject", "batch": 1, "ok": True, "count": 4, "queued": 0}
    net.settle()
    got = plain(net)   # paho hands a QoS 2 message over at its PUBREL: order within QoS < 2
    assert [g for g in got if g[2] < 2] == [("t/a", b"A0", 0), ("t/a", b"A1", 1),
                                            ("t/e", b"", 1)]
    assert sorted(got) == sorted([("t/a", b"A0", 0), ("t/a", b"A1", 1), ("t/b", b"B2", 2),
                                  ("t/e", b"", 1)])
    p = net.plain.messages[0].properties
    assert user_props(p) == [("k", "v"), ("k", "w")]
    assert (p.ContentType, p.PayloadFormatIndicator, p.CorrelationData, p.ResponseTopic) == (
        "text/plain", 1, b"\x00c", "r/1")
    assert 0 < p.MessageExpiryInterval <= 300
    # never a shared member (the origin's group already picked one), never `.fwd` (a loop)
    assert net.shared() == [] and net.fwd_copies() == []
    st = net.sc.call("stats")
    assert (st["inject_batches"], st["inject_messages"], st["inject_refused"]) == (1, 4, 0)
    # each message: the group's one pick, and `.fwd`'s plain subscription (No Local cannot
    # apply: an injected message has no publisher)
    assert st["fwd_shared_denied"] == 4 * 2

    # ordinary traffic right after is routed as before: one member each, `.fwd` gets its copy
    pub = net.clients(Client("pub", port=net.b.port))
    pub.connect()
    for i in range(4):
        pub.publish("t/o", f"O{i}".encode(), qos=1)
    net.settle()
    # each exactly once in the group (m1, m2 or `.fwd`'s membership), and `.fwd` has every
    # one (through its plain subscription, the group's pick perhaps as well)
    picked_fwd = [m.payload for m in net.fwd.received(
        lambda m: 2 in m.sub_ids and m.topic == "t/o")]
    assert sorted(net.shared() + picked_fwd) == [b"O0", b"O1", b"O2", b"O3"]
    assert sorted({m.payload for m in net.fwd.received(lambda m: m.topic == "t/o")}) == [
        b"O0", b"O1", b"O2", b"O3"]


def test_many_equal_messages_and_messages_without_subscribers(net):
    """Records nobody subscribes to make no READ check: the plugin passes over them."""
    recs = []
    for i in range(50):
        recs.append(Record("u/none", b"x", 1))          # no subscriber at all
        recs.append(Record("t/same", b"same", i % 3))   # equal messages
    assert net.inject(records=recs)["count"] == 100
    net.settle()
    assert [p for _, p, _ in plain(net)] == [b"same"] * 50
    assert net.shared() == [] and net.fwd_copies() == []


@pytest.mark.parametrize("bad", [
    b"MQFB",                                                      # short header
    b"XQFB\x01\x00\x01\x00" + bytes(8),                           # magic
    encode_batch(0, [Record("t/ok", b"1", 1)])[:-1],              # truncated record
    encode_batch(0, [Record("t/ok", b"1", 1)]) + b"\x00",         # trailing bytes
    encode_batch(0, [Record("t/ok", b"1", 1), Record("t/#", b"2", 1)]),   # a wildcard topic
    encode_batch(0, [Record("t/ok", b"1", 1), Record("t/x", b"2", 1, kind=7)]),
    encode_batch(0, [Record("t/ok", b"1", 1)])[:-15] + b"\x0b\x01" + bytes(13),
])
def test_a_malformed_batch_is_refused_whole(net, bad):
    net.batch_id = -1   # the reply names batch 0 (or, for a short header, batch 0 too)
    reply = net.inject(data=bad)
    assert reply["ok"] is False and reply["error"]
    net.settle()
    assert plain(net) == [] and net.shared() == []
    assert net.sc.call("stats")["inject_refused"] == 1


def test_only_the_sidecar_may_inject(net):
    other = net.clients(Client("intruder", port=net.b.port))
    other.connect()
    other.publish(INJECT_TOPIC, encode_batch(1, [Record("t/x", b"evil", 1)]), qos=1)
    net.settle()
    assert plain(net) == []


def test_the_forwarding_connection_injects_and_gets_its_reply_at_qos_0(net):
    """The sidecar sends batches on `.fwd` (its hot path): the reply comes back there, at QoS 0
    (no packet id among the copies it tracks in order)."""
    net.fwd.publish(INJECT_TOPIC, encode_batch(9, [Record("t/f", b"F1", 1)]), qos=0)
    assert net.plain.wait_messages(lambda m: m.payload == b"F1")
    deadline = time.monotonic() + 5
    while not (replies := net.fwd.received(lambda m: m.topic == INJECT_REPLY)):
        assert time.monotonic() < deadline, "no inject reply on .fwd"
        time.sleep(0.05)
    assert [(json.loads(m.payload), m.qos) for m in replies] == [
        ({"v": 1, "cmd": "inject", "batch": 9, "ok": True, "count": 1, "queued": 0}, 0)]
    assert net.fwd_copies() == [] and net.shared() == []


def test_the_reply_says_how_full_the_fullest_subscribers_queue_is(make_broker, clients):
    """A batch puts a whole frame into the subscribers' queues in one loop iteration, past
    which (max_queued_messages) Mosquitto drops: the reply, sent once the batch was routed,
    gives the fullest live subscriber's queue beyond its in-flight window, so the sidecar can
    size its next batches to the room left (sidecar/routing/injection.py)."""
    b = make_broker(extra="max_queued_messages 1000")
    sc = clients(FakeSidecar(b.sock)).start()
    stuck = clients(RawClient("stuck", port=b.port, hold_pubrec=True, receive_maximum=5))
    stuck.connect()
    assert stuck.subscribe("q/#", 2) == [2]
    fast = clients(Client("fast", port=b.port))
    fast.connect()
    assert fast.subscribe("q/#", 2) == [2]
    reply = inject(sc, 1, encode_batch(1, [Record("q/a", str(i).encode(), 2)
                                           for i in range(100)]))
    # 5 in flight (never answered), the rest queued; measured at each READ check, before
    # Mosquitto queues the message checked
    assert reply["ok"] and 94 <= reply["queued"] <= 95, reply
    reply = inject(sc, 2, encode_batch(2, [Record("q/a", b"x", 1) for _ in range(10)]))
    assert 104 <= reply["queued"] <= 105, reply
    # a batch no live client subscribes to measures nothing
    assert inject(sc, 3, encode_batch(3, [Record("u/none", b"x", 1)]))["queued"] == -1
    assert len(fast.wait_messages(lambda m: m.topic == "q/a", count=110)) == 110
    assert len(stuck.wait_messages(lambda m: True, count=6, timeout=1.0)) == 5


def test_a_clients_own_injected_message_skips_its_no_local_subscriptions(net):
    """A message injected from a batch is routed with no client, so Mosquitto's own No Local
    never applies; the record names its publisher, and the plugin keeps it from that client's
    subscriptions here when all those it matches have No Local (issue 17: a session's old copy
    or a replica on this node, while its client publishes on another node), online or not."""
    me = net.clients(RawClient("me", port=net.b.port, clean_start=False, session_expiry=3600))
    me.connect()
    assert me.subscribe("t/#", 1, no_local=True) == [1]
    mixed = net.clients(RawClient("mixed", port=net.b.port))
    mixed.connect()
    assert mixed.subscribe("t/m/#", 1, no_local=True) == [1]
    assert mixed.subscribe("t/+/x", 1) == [1]
    net.settle()   # the options are read at the end of the iteration that added them
    reply = net.inject(records=[Record("t/a", b"own", 1, client="me"),
                                Record("t/a", b"other", 1, client="someone"),
                                Record("t/a", b"anon", 1),
                                Record("t/m/x", b"mixed-own", 1, client="mixed"),
                                Record("t/m/y", b"mixed-nl", 1, client="mixed")])
    assert reply["ok"]
    net.settle()
    assert [m.payload for m in me.received(lambda m: m.topic != "t/mark")] == [
        b"other", b"anon", b"mixed-own", b"mixed-nl"]
    # `mixed` has a plain subscription without No Local on t/m/x: the check cannot tell
    # which of its two subscriptions it is for, so it gets that one (once per subscription,
    # as Mosquitto delivers to overlapping subscriptions); t/m/y only matches No Local
    assert sorted(m.payload for m in mixed.received(lambda m: m.topic != "t/mark")) == [
        b"mixed-own", b"mixed-own"]
    assert [p for _, p, _ in plain(net)] == [b"own", b"other", b"anon", b"mixed-own",
                                             b"mixed-nl"]
    # offline, its session queues none of its own either
    me.disconnect()
    time.sleep(0.2)
    assert net.inject(records=[Record("t/b", b"own-2", 1, client="me"),
                               Record("t/b", b"other-2", 1, client="x")])["ok"]
    net.settle()
    back = net.clients(RawClient("me", port=net.b.port, clean_start=False,
                                 session_expiry=3600))
    back.connect()
    assert [m.payload for m in back.wait_messages(lambda m: m.topic == "t/b")] == [b"other-2"]
    time.sleep(0.5)
    assert [m.payload for m in back.received(lambda m: m.topic == "t/b")] == [b"other-2"]
    assert net.sc.call("stats")["inject_no_local"] == 3


def _stuck_and_fast(make_broker, clients, fast: bool):
    """A broker told max_queued_messages 80 (the plugin's mark near the bound: 30), a fake
    sidecar, a subscriber to `q/#` that never answers a QoS 2 message (in-flight window 5: the
    rest waits in its queue) and, with `fast`, one that reads everything."""
    b = make_broker(extra="max_queued_messages 80", opts={"max_queued_messages": 80})
    sc = clients(FakeSidecar(b.sock)).start()
    stuck = clients(RawClient("stuck", port=b.port, hold_pubrec=True, receive_maximum=5))
    stuck.connect()
    assert stuck.subscribe("q/#", 2) == [2]
    reader = None
    if fast:
        reader = clients(Client("fast", port=b.port))
        reader.connect()
        assert reader.subscribe("q/#", 2) == [2]
    return b, sc, stuck, reader


def _batch(n: int, topic: str = "q/a") -> list[Record]:
    return [Record(topic, str(i).encode(), 2) for i in range(n)]


def test_a_subscriber_near_the_bound_that_holds_another_back_is_left_out(make_broker,
                                                                          clients):
    """One Mosquitto: a subscriber slower than its topics' traffic loses what overflows its
    queue and the others are not slowed. The reply's `queued` paces the sidecar's batches, so
    a client whose queue stayed near the bound (3/8 of max_queued_messages) for 250 ms after
    a batch also reached a client with room is left out of it: the batches go at the others'
    pace and it loses what overflows, as on one broker."""
    b, sc, stuck, fast = _stuck_and_fast(make_broker, clients, fast=True)
    reply = inject(sc, 1, encode_batch(1, _batch(40)))
    assert reply["ok"] and 34 <= reply["queued"] <= 35, reply   # 5 in flight
    # near the bound while `fast` had room: counted for 250 ms more
    assert 35 <= inject(sc, 2, encode_batch(2, _batch(1)))["queued"] <= 36
    time.sleep(0.4)
    assert inject(sc, 3, encode_batch(3, _batch(1)))["queued"] == 0   # fast's, the only one
    st = sc.call("stats")
    assert st["inject_left_out"] == 1 and st["inject_slow_clients"] == 1, st
    assert len(fast.wait_messages(lambda m: m.topic == "q/a", count=42)) == 42
    # gone: forgotten at its disconnect, freed at the next sweep (every second)
    stuck.close()
    time.sleep(1.3)
    assert inject(sc, 4, encode_batch(4, _batch(1)))["queued"] == 0
    assert sc.call("stats")["inject_slow_clients"] == 0


def test_a_subscriber_alone_near_the_bound_is_never_left_out(make_broker, clients):
    """A backlog draining to its one subscriber, or a burst, holds nobody else back: its queue
    keeps counting however long it stays full, so the batches wait for its room and it loses
    nothing. A client under the mark is not tracked at all."""
    b, sc, stuck, _ = _stuck_and_fast(make_broker, clients, fast=False)
    reply = inject(sc, 1, encode_batch(1, _batch(40)))
    assert reply["ok"] and 34 <= reply["queued"] <= 35, reply
    time.sleep(0.4)
    assert 35 <= inject(sc, 2, encode_batch(2, _batch(1)))["queued"] <= 36
    # another subscriber's batch that does not reach `stuck` does not make it hold anyone back
    other = clients(Client("other", port=b.port))
    other.connect()
    assert other.subscribe("r/#", 1) == [1]
    assert inject(sc, 3, encode_batch(3, [Record("r/a", b"x", 1)]))["queued"] == 0
    time.sleep(0.4)
    assert 36 <= inject(sc, 4, encode_batch(4, _batch(1)))["queued"] <= 37
    st = sc.call("stats")
    assert st["inject_left_out"] == 0 and st["inject_slow_clients"] == 1, st


def test_a_slow_subscriber_counts_again_once_its_queue_is_under_the_mark(make_broker,
                                                                         clients):
    """Left out, then its queue drains (here: it reconnects with a clean session, an empty
    queue): measured under the mark it is tracked no longer, and a later backlog is paced to
    it again (250 ms after it holds another back)."""
    b, sc, stuck, fast = _stuck_and_fast(make_broker, clients, fast=True)
    inject(sc, 1, encode_batch(1, _batch(40)))
    time.sleep(0.4)
    assert inject(sc, 2, encode_batch(2, _batch(1)))["queued"] == 0
    stuck.close()
    again = clients(RawClient("stuck", port=b.port, hold_pubrec=True, receive_maximum=5))
    again.connect()
    assert again.subscribe("q/#", 2) == [2]
    assert inject(sc, 3, encode_batch(3, _batch(40)))["queued"] >= 34
    assert sc.call("stats")["inject_left_out"] == 1
