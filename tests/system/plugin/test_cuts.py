"""A moving session's cut mode on a real Mosquitto (hold.c, cut.c; docs/architecture.md §5,
"Exactly once across a move under traffic"): the old copy records the identities of what it
queued and refuses the new node's messages from that node's cut on; the new copy arms at a
tick with its own cut and, released, leaves out what the old copy had: each message once."""

from __future__ import annotations

import signal
import time

from sidecar.local.batch import INJECT_TOPIC, Record, cut_record, encode_batch
from tests.harness.procs import wait_for
from tests.system.plugin.helpers import (
    REPLIES,
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


def wait_marker(fwd: RawClient, payload: bytes) -> int:
    """Until the marker `payload` came; returns the connect time a new copy's carries (after
    a NUL; 0: none, an old copy's own cut)."""
    deadline = time.monotonic() + 5
    while True:
        for m in fwd.received(lambda m: m.topic == PROBE):
            name, _, connect = m.payload.partition(b"\0")
            if name == payload:
                return int(connect or 0)
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
    inject_(cut_record("leaver", "n4", 2, now_hlc(5)),     # the new node's cut
            cut_record("leaver", "n5", 1, now_hlc(-5000)))  # made before it left: ignored
    inject_(*msgs("n2", "o/a", [1, 2]), *msgs("n4", "o/c", [1, 2, 3]), *msgs("n5", "o/d", [1]))
    pub = client_factory("local-pub")
    pub.connect()
    pub.publish("o/l", "local-1", qos=1)
    time.sleep(0.2)
    assert sidecar.call("hold", client="leaver", on=True, cut=True)["ok"]  # at the tick
    assert wait_marker(fwd, b"cut:leaver") == 0  # (an old copy's own: no connect time)
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
    # (the new node's connect, a few ms after this one: a cut in the very millisecond of the
    # client's connect here is another move's, ignored, and the test failed when it was)
    inject_(cut_record("taken", "n4", 3, now_hlc(5)))
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
    connected = time.time() * 1000
    assert c.connect() is True
    # armed at the tick, with its cut, which says when its client connected (peers apply it
    # only to a copy the client used before)
    assert abs(wait_marker(fwd, b"cut:mover") - connected) < 1000
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


def _kept_while_away(client_factory, sidecar, clients, broker, name: str, topic: str):
    """`name` moved here (its live hold in cut mode, armed at its connect), 2 messages of n2
    kept, its client gone again (on to another node) before the hold's release; returns the
    forwarding connection."""
    fwd = forwarding(clients, broker)
    inject_ = Injector(sidecar)
    offline(client_factory, sidecar, name, topic)
    assert sidecar.call("hold", client=name, on=True, live=True, cut=True)["ok"]
    c = client_factory(name, session_expiry=300, clean_start=False)
    assert c.connect() is True
    wait_marker(fwd, f"cut:{name}".encode())
    inject_(*msgs("n2", topic.rstrip("#") + "a", [1, 2]))
    wait_for(lambda: sidecar.call("stats")["ring_messages"] == 2, 5, "kept")
    c.disconnect()
    sidecar.wait_type("disconnect", client=name, count=2)
    return fwd


def test_what_a_release_replays_for_a_client_away_is_granted_to_its_next_move(
        broker, sidecar, client_factory, clients):
    """The replay is a targeted delivery (no READ check saw it), yet the session queued it:
    the next move's new copy must leave it out too (before: not granted, so it came twice)."""
    _kept_while_away(client_factory, sidecar, clients, broker, "away", "aw/#")
    assert sidecar.call("hold", client="away", on=False)["ok"]
    wait_for(lambda: sidecar.call("stats")["held"] == 0, 5, "replayed")
    granted = sidecar.call("granted", client="away")["granted"]
    assert [seq for _, seq in granted] == [1, 2], granted


def test_a_hold_that_comes_while_a_release_waits_to_replay_is_a_cut_mode_one(
        broker, sidecar, client_factory, clients):
    """The move settled (the release), its replay waits for a tick without injection, and the
    client's next move holds the copy before that tick: the replay goes into the session at
    once, granted, and the hold is the old copy's in cut mode (its marker, its cut). Before,
    the plugin took it for a chained move (no cut): both copies delivered the overlap."""
    for attempt in range(5):  # (a loaded machine may write the drain's hold too late)
        name = f"quick{attempt}"
        fwd = _kept_while_away(client_factory, sidecar, clients, broker, name, f"qk{attempt}/#")
        before = len(fwd.received(lambda m: m.topic == PROBE))
        broker.proc.send_signal(signal.SIGSTOP)  # the release and the batch in one iteration
        try:
            sidecar.send({"v": 1, "id": f"rel{attempt}", "reply": REPLIES + f"rel{attempt}",
                          "cmd": "hold", "client": name, "on": False})
            # (on another connection; the commands may be read in separate loop iterations,
            # the fake sidecar's acks between them: a batch in each of the next iterations, so
            # the replay waits whichever the release's is)
            for i in range(6):
                fwd.publish(INJECT_TOPIC, encode_batch(90 + i, [Record("other/t", b"x", 1)]),
                            qos=0)
            sidecar.send({"v": 1, "id": f"drain{attempt}", "reply": REPLIES + f"drain{attempt}",
                          "cmd": "hold", "client": name, "on": True, "cut": True})
            time.sleep(1.5)  # (paho's thread writes the commands: slow on a loaded machine)
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        wait_for(lambda f=fwd, b=before: len(f.received(lambda m: m.topic == PROBE)) > b, 5,
                 "the old copy's cut marker")
        if sidecar.call("stats")["replays_flushed"] == 1:
            break
    stats = sidecar.call("stats")
    assert stats["replays_flushed"] == 1 and stats["ring_messages"] == 0, stats
    assert [seq for _, seq in sidecar.call("granted", client=name)["granted"]] == [1, 2]
    assert sidecar.call("hold", client=name, on=False)["ok"]
    again = client_factory(name, session_expiry=300, clean_start=False)
    assert again.connect() is True
    got = again.wait_messages(lambda m: m.topic.startswith(f"qk{attempt}/"), count=2)
    assert [m.payload for m in got] == [b"n2:1", b"n2:2"]


def test_an_old_copy_keeps_the_cut_of_each_new_node_and_ignores_one_for_an_older_connect(
        broker, sidecar, client_factory):
    """A cut goes to every peer (the new node may not know which node the client left last):
    an old copy applies each node's, one per node (a chain of quick moves), and ignores the
    cut of a connect older than its client's last connect here."""
    inject_ = Injector(sidecar)
    offline(client_factory, sidecar, "chained", "k/#")
    connected = now_hlc(-20)  # (its connect here: a few ms before)
    inject_(cut_record("chained", "n4", 3, now_hlc(5)),
            cut_record("chained", "n5", 2, now_hlc(10)),
            cut_record("chained", "n6", 1, connected - (500 << 16)))  # an older connect's
    inject_(*msgs("n4", "k/a", [2, 3]), *msgs("n5", "k/b", [1, 2]), *msgs("n6", "k/c", [1, 2]))
    assert [seq for _, seq in sidecar.call("granted", client="chained")["granted"]] == \
        [2, 1, 1, 2]
    st = sidecar.call("stats")
    assert (st["cut_refused"], st["cuts_applied"], st["cuts_ignored"]) == (2, 2, 1), st



def test_a_chained_moves_old_copy_is_held_in_cut_mode(broker, sidecar, client_factory, clients):
    """The client moved here (a live hold in cut mode) and went on to another node before its
    old queue came: the onward move's hold (the drain's, in cut mode, with what this copy's own
    old copy had) puts the live ring into the session at the next tick without those, and
    sends this node's own cut there: its messages before are in the session, those after are
    refused (the onward copy keeps them). The ring kept nothing of the onward node's from its
    cut on. Before, a chained move had no cut: both copies delivered the overlap."""
    fwd = forwarding(clients, broker)
    inject_ = Injector(sidecar)
    offline(client_factory, sidecar, "chain", "ch/#")
    assert sidecar.call("hold", client="chain", on=True, live=True, cut=True)["ok"]
    c = client_factory("chain", session_expiry=300, clean_start=False)
    assert c.connect() is True
    wait_marker(fwd, b"cut:chain")
    inject_(*msgs("n2", "ch/a", [1, 2]))
    pub = client_factory("local-pub")
    pub.connect()
    pub.publish("ch/l", "local-1", qos=1)
    wait_for(lambda: sidecar.call("stats")["ring_messages"] == 3, 5, "kept")
    c.disconnect()
    sidecar.wait_type("disconnect", client="chain", count=2)
    inject_(cut_record("chain", "n4", 2, now_hlc(5)))  # the onward node's cut
    inject_(*msgs("n4", "ch/b", [1, 2, 3]), *msgs("n3", "ch/c", [7]))
    wait_for(lambda: sidecar.call("stats")["ring_messages"] == 5, 5, "kept while away")
    before = len(fwd.received(lambda m: m.topic == PROBE))
    # the drain's hold, with what the old copy had: n2's messages below its cut 2
    assert sidecar.call("hold", client="chain", on=True, cut=True, cuts=[["n2", 2]])["ok"]
    wait_for(lambda: len(fwd.received(lambda m: m.topic == PROBE)) > before, 5, "its own cut")
    assert wait_marker(fwd, b"cut:chain") > 0  # (the first: the new copy's, with its connect)
    assert fwd.received(lambda m: m.topic == PROBE)[-1].payload == b"cut:chain"
    pub.publish("ch/l", "local-2", qos=1)  # after its own cut: the onward copy's
    inject_(*msgs("n2", "ch/a", [3]))      # held plainly now: refused
    stats = sidecar.call("stats")
    assert (stats["chains_cut"], stats["ring_messages"], stats["cut_refused"],
            stats["cut_skipped"]) == (1, 0, 2, 1), stats
    # what went into the session is granted to the onward move (identities, n2:1 left out)
    assert [seq for _, seq in sidecar.call("granted", client="chain")["granted"]] == [2, 1, 7]
    assert sidecar.call("hold", client="chain", on=False)["ok"]
    again = client_factory("chain", session_expiry=300, clean_start=False)
    assert again.connect() is True
    again.wait_messages(lambda m: m.topic.startswith("ch/"), count=4)
    time.sleep(0.3)
    assert [m.payload for m in again.messages] == [b"n2:2", b"local-1", b"n4:1", b"n3:7"]
