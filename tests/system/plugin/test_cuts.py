"""A moving session's cuts on a real Mosquitto (hold.c, cut mode; docs/architecture.md §5,
"Exactly once across a move under traffic"): per origin node, the messages below its cut go
to the session's old copy and those at or above it to the new one, so a message routed on
both nodes while the client moves reaches it once."""

from __future__ import annotations

import time

from sidecar.local.batch import Record, cut_record, encode_batch
from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
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


def markers(fwd: RawClient) -> list[bytes]:
    return [m.payload for m in fwd.received(lambda m: m.topic == PROBE)]


def offline(client_factory, sidecar, name: str, topic: str) -> None:
    c = client_factory(name, session_expiry=300, clean_start=False)
    c.connect()
    c.subscribe(topic, 2)
    c.disconnect()
    sidecar.wait_type("disconnect", client=name)


def test_the_new_copy_arms_with_its_cut_and_leaves_out_what_went_below_an_origins_cut(
        broker, sidecar, client_factory, clients):
    fwd = forwarding(clients, broker)
    inject_ = Injector(sidecar)
    offline(client_factory, sidecar, "mover", "c/#")
    assert sidecar.call("hold", client="mover", on=True, live=True, cut=True)["ok"]
    inject_(*msgs("n2", "c/a", [1, 2]))          # before its client: the old copy's
    c = client_factory("mover", session_expiry=300, clean_start=False)
    assert c.connect() is True
    deadline = time.monotonic() + 5
    while markers(fwd) != [b"cut:mover"]:        # armed at the tick, with its marker
        assert time.monotonic() < deadline, markers(fwd)
        time.sleep(0.02)
    inject_(*msgs("n2", "c/a", [3, 4, 5]), *msgs("n3", "c/b", [10, 11]),
            Record("c/a", b"n2:q0", 0, seq=4, origin="n2"))   # QoS 0: kept whatever its seq
    pub = client_factory("local-pub")
    pub.connect()
    pub.publish("c/l", "local", qos=1)                          # this node's: after its cut
    inject_(cut_record("mover", "n2", 5),         # n2's messages below 5 went to the old copy
            cut_record("someone-else", "n3", 1))  # no hold in cut mode: it waits, unused
    time.sleep(0.3)
    assert [m.payload for m in c.messages] == []
    assert sidecar.call("hold", client="mover", on=False)["ok"]
    got = c.wait_messages(lambda m: m.topic.startswith("c/"), count=5)
    time.sleep(0.3)
    assert [m.payload for m in c.messages] == [b"n2:5", b"n3:10", b"n3:11", b"n2:q0",
                                               b"local"], got
    st = sidecar.call("stats")
    assert (st["cuts_applied"], st["cuts_pending"], st["cut_skipped"]) == (1, 1, 2)


def test_the_old_copy_queues_below_each_cut_and_is_held_at_a_tick_with_its_own(
        broker, sidecar, client_factory, clients):
    fwd = forwarding(clients, broker)
    inject_ = Injector(sidecar)
    offline(client_factory, sidecar, "leaver", "o/#")
    inject_(cut_record("leaver", "n4", 1))       # before its hold: waits for it
    assert sidecar.call("hold", client="leaver", on=True, old=True)["ok"]
    inject_(*msgs("n2", "o/a", [1, 2]), *msgs("n4", "o/c", [1]))
    inject_(cut_record("leaver", "n2", 4), *msgs("n2", "o/a", [3, 4, 5]),
            *msgs("n3", "o/b", [7]))              # n3 has not cut: its messages still come
    pub = client_factory("local-pub")
    pub.connect()
    pub.publish("o/l", "local-1", qos=1)
    time.sleep(0.2)
    assert sidecar.call("hold", client="leaver", on=True, cut=True)["ok"]   # held at the tick
    deadline = time.monotonic() + 5
    while markers(fwd) != [b"cut:leaver"]:
        assert time.monotonic() < deadline, markers(fwd)
        time.sleep(0.02)
    pub.publish("o/l", "local-2", qos=1)          # after its own cut: the new copy's
    inject_(*msgs("n3", "o/b", [8]))
    time.sleep(0.2)
    assert sidecar.call("hold", client="leaver", on=False)["ok"]
    again = client_factory("leaver", session_expiry=300, clean_start=False)
    assert again.connect() is True
    again.wait_messages(lambda m: m.topic.startswith("o/"), count=5)
    time.sleep(0.3)
    assert [m.payload for m in again.messages] == [b"n2:1", b"n2:2", b"n2:3", b"n3:7",
                                                   b"local-1"]
    assert sidecar.call("stats")["cut_refused"] == 3


def test_hold_refuses_bad_cut_options(broker, sidecar):
    for bad in ({"cut": "yes"}, {"old": 1}, {"old": True, "on": False}):
        reply = sidecar.call("hold", **{"client": "c", "on": True, **bad})
        assert reply["ok"] is False and reply["error"] == "bad_request", (bad, reply)


def test_a_malformed_cut_refuses_its_batch(broker, sidecar):
    for bad in (Record("t", b"", 0, client="c", origin="n2", kind=2),    # a topic
                Record("", b"", 0, client="", origin="n2", kind=2),      # no client
                Record("", b"", 0, client="c", kind=2)):                 # no origin
        reply = inject(sidecar, 1, encode_batch(1, [bad]))
        assert reply["ok"] is False, reply
