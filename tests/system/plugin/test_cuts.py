"""A moving session's cut mode on a real Mosquitto (hold.c, cut.c; docs/architecture.md §5,
"Exactly once across a move under traffic"): the old copy records the identities of what it
queued and refuses the new node's messages from that node's cut on; the new copy arms at a
tick with its own cut and, released, leaves out what the old copy had: each message once."""

from __future__ import annotations

import time

from sidecar.local.batch import Record, cut_record, encode_batch
from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    FakeSidecar,
    RawClient,
    inject,
)

PROBE = "$SYS/broker/mqfed/fwd-probe"


class Injector:
    """Batches from peers, numbered."""

    def __init__(self, sidecar) -> None:
        self.sidecar, self.batch = sidecar, 0

    def __call__(self, *records: Record) -> dict:
        self.batch += 1
        reply = inject(self.sidecar, self.batch, encode_batch(self.batch, list(records)))
        assert reply["ok"], reply
        return reply


def msgs(origin: str, topic: str, seqs, qos: int = 1) -> list[Record]:
    return [Record(topic, f"{origin}:{s}".encode(), qos, seq=s, origin=origin) for s in seqs]


def forwarding(clients, broker) -> RawClient:
    fwd = clients(RawClient(SIDECAR_ID + ".fwd", sock=broker.sock, username=SIDECAR_USER,
                            password=SECRET, clean_start=False, session_expiry=3600))
    fwd.connect()
    return fwd


def wait_marker(fwd: RawClient, payload: bytes) -> None:
    deadline = time.monotonic() + 5
    while payload not in [m.payload for m in fwd.received(lambda m: m.topic == PROBE)]:
        assert time.monotonic() < deadline, f"no marker {payload!r}"
        time.sleep(0.02)


def offline(client_factory, sidecar, name: str, topic: str) -> None:
    c = client_factory(name, session_expiry=300, clean_start=False)
    c.connect()
    c.subscribe(topic, 2)
    c.disconnect()
    sidecar.wait_type("disconnect", client=name)


def now_hlc(delta_ms: int = 0) -> int:
    return (int(time.time() * 1000) + delta_ms) << 16


def test_the_old_copy_records_what_it_queued_and_refuses_the_new_nodes_messages_from_its_cut(
        broker, sidecar, client_factory, clients):
    fwd = forwarding(clients, broker)
    inject_ = Injector(sidecar)
    offline(client_factory, sidecar, "leaver", "o/#")     # recorded from its disconnect on
    inject_(cut_record("leaver", "n4", 2, now_hlc()),      # the new node's cut
            cut_record("leaver", "n5", 1, now_hlc(-5000)))  # made before it left: ignored
    inject_(*msgs("n2", "o/a", [1, 2]), *msgs("n4", "o/c", [1, 2, 3]), *msgs("n5", "o/d", [1]))
    pub = client_factory("local-pub")
    pub.connect()
    pub.publish("o/l", "local-1", qos=1)
    time.sleep(0.2)
    assert sidecar.call("hold", client="leaver", on=True, cut=True)["ok"]  # at the tick
    wait_marker(fwd, b"cut:leaver")
    pub.publish("o/l", "local-2", qos=1)          # after its own cut: the new copy's
    inject_(*msgs("n3", "o/b", [8]))              # held now: refused
    granted = sidecar.call("granted", client="leaver")["granted"]
    assert [seq for _, seq in granted] == [1, 2, 1, 1] and len({o for o, _ in granted}) == 3
    assert sidecar.call("hold", client="leaver", on=False)["ok"]
    again = client_factory("leaver", session_expiry=300, clean_start=False)
    assert again.connect() is True
    again.wait_messages(lambda m: m.topic.startswith("o/"), count=5)
    time.sleep(0.3)
    assert [m.payload for m in again.messages] == [b"n2:1", b"n2:2", b"n4:1", b"n5:1",
                                                   b"local-1"]
    st = sidecar.call("stats")
    assert (st["cut_refused"], st["cuts_applied"], st["cuts_ignored"]) == (2, 1, 1), st
    assert sidecar.call("granted", client="leaver")["error"] == "not_moving"  # back: over


def test_a_cut_that_comes_before_its_client_left_waits_for_it(broker, sidecar, client_factory):
    """A takeover: the new node's connect (and cut) can come before the client's old
    connection here is closed."""
    inject_ = Injector(sidecar)
    c = client_factory("taken", session_expiry=300, clean_start=False)
    c.connect()
    c.subscribe("w/#", 1)
    inject_(cut_record("taken", "n4", 3, now_hlc()))
    c.disconnect()
    sidecar.wait_type("disconnect", client="taken")
    inject_(*msgs("n4", "w/a", [2, 3, 4]))
    assert [seq for _, seq in sidecar.call("granted", client="taken")["granted"]] == [2]
    assert sidecar.call("stats")["cut_refused"] == 2


def test_the_new_copy_arms_with_its_cut_and_leaves_out_what_the_old_copy_had(
        broker, sidecar, client_factory, clients):
    fwd = forwarding(clients, broker)
    inject_ = Injector(sidecar)
    # an old copy on this broker gives the identities in the form an old node sends them
    offline(client_factory, sidecar, "oldie", "x/#")
    inject_(*msgs("n3", "x/a", [10]))
    granted = sidecar.call("granted", client="oldie")["granted"]
    offline(client_factory, sidecar, "mover", "c/#")
    assert sidecar.call("hold", client="mover", on=True, live=True, cut=True)["ok"]
    inject_(*msgs("n2", "c/a", [1, 2]))           # before its client: the old copy's
    c = client_factory("mover", session_expiry=300, clean_start=False)
    assert c.connect() is True
    wait_marker(fwd, b"cut:mover")                # armed at the tick, with its cut
    inject_(*msgs("n2", "c/a", [3, 4, 5]), *msgs("n3", "c/b", [10, 11]),
            Record("c/a", b"n2:q0", 0, seq=4, origin="n2"))   # QoS 0: the old copy drops it
    pub = client_factory("local-pub")
    pub.connect()
    pub.publish("c/l", "local", qos=1)            # this node's, after its cut: its own
    time.sleep(0.3)
    assert [m.payload for m in c.messages] == []
    # the old node (n2) had its own messages below 5 and n3's 10
    assert sidecar.call("hold", client="mover", on=False, granted=granted,
                        cuts=[["n2", 5]])["ok"]
    c.wait_messages(lambda m: m.topic.startswith("c/"), count=4)
    time.sleep(0.3)
    assert [m.payload for m in c.messages] == [b"n2:5", b"n3:11", b"n2:q0", b"local"]
    assert sidecar.call("stats")["cut_skipped"] == 3


def test_cut_options_and_releases_are_checked(broker, sidecar):
    for bad in ({"cut": "yes"}, {"granted": "x", "on": False},
                {"granted": [["zz", 1]], "on": False}, {"granted": [["0" * 16, -1]], "on": False},
                {"cuts": [["n2"]], "on": False}, {"cuts": [["n2", 1]], "on": True}):
        reply = sidecar.call("hold", **{"client": "c", "on": True, **bad})
        assert reply["ok"] is False and reply["error"] == "bad_request", (bad, reply)
    assert sidecar.call("granted", client="nobody")["error"] == "not_moving"


def test_a_malformed_cut_refuses_its_batch(broker, sidecar):
    for bad in (Record("t", b"", 0, client="c", origin="n2", kind=2),    # a topic
                Record("", b"", 0, client="", origin="n2", kind=2),      # no client
                Record("", b"", 0, client="c", kind=2)):                 # no origin
        reply = inject(sidecar, 1, encode_batch(1, [bad]))
        assert reply["ok"] is False, reply


def test_what_a_full_offline_queue_drops_is_not_granted_so_the_new_copy_keeps_it(
        make_broker, clients):
    """Mosquitto drops a message for an offline session that holds max_queued_messages: the
    old copy does not list it as its own, so the new copy, released, delivers it (before, it
    left it out as the old copy's: lost)."""
    b = make_broker(extra="max_queued_messages 3", opts={"max_queued_messages": 3})
    sidecar = clients(FakeSidecar(b.sock)).start()

    def client_factory(cid: str, **kw) -> Client:
        return clients(Client(cid, port=b.port, **kw))

    forwarding(clients, b)
    inject_ = Injector(sidecar)
    offline(client_factory, sidecar, "full", "f/#")
    inject_(*msgs("n2", "f/a", range(1, 6)))           # 3 queued, 2 dropped
    time.sleep(0.2)
    granted = sidecar.call("granted", client="full")["granted"]
    assert [seq for _, seq in granted] == [1, 2, 3]
    assert sidecar.call("stats")["offline_queue_full"] == 2
