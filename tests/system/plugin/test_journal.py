"""The journal (journal.c): a QoS > 0 message the forwarding connection (.fwd) gets is written
to a file before Mosquitto acknowledges it, and stays there until the sidecar confirms every
copy .fwd got; a killed Mosquitto leaves the unconfirmed ones in a file it no longer locks."""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import signal
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar.journal.record import fingerprint, pack_fingerprints, parse
from tests.harness.procs import wait_for
from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    FakeSidecar,
    RawClient,
    mosquitto_dir,
)

FWD_ID = SIDECAR_ID + ".fwd"


class Node:
    """A broker with the plugin and a journal, the fake sidecar, and .fwd subscribed to t/#."""

    def __init__(self, make_broker, clients, journal: Path) -> None:
        self.clients = clients
        self.journal = journal
        self.b = make_broker(opts={"journal_dir": str(journal)})
        self.sc = clients(FakeSidecar(self.b.sock)).start()
        self.fwd = clients(RawClient(FWD_ID, sock=self.b.sock, username=SIDECAR_USER,
                                     password=SECRET, clean_start=False, session_expiry=3600))
        self.fwd.connect()
        assert self.fwd.subscribe("t/#", 2, no_local=True, sub_id=1) == [2]

    def client(self, cid: str) -> RawClient:
        c = self.clients(RawClient(cid, port=self.b.port))
        c.connect()
        return c

    def stats(self) -> dict:
        return self.sc.call("stats")["journal"]

    def files(self) -> list[Path]:
        return sorted(self.journal.glob("journal-*.bin"))

    def entries(self) -> list[tuple[str, bytes]]:
        (path,) = self.files()
        return [(e.topic, e.payload) for e in parse(path.read_bytes()).entries]

    def confirm(self, *copies: tuple[str, bytes]) -> None:
        fps = pack_fingerprints([fingerprint(t, p) for t, p in copies])
        self.sc.send({"v": 1, "cmd": "confirm", "fps": base64.b64encode(fps).decode()})


@pytest.fixture
def journal_dir():
    path = mosquitto_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(make_broker, clients, journal_dir) -> Node:
    return Node(make_broker, clients, journal_dir)


def locked(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_wanted_messages_are_journaled_until_every_copy_is_confirmed(node):
    pub = node.client("pub")
    pub.publish("t/a", b"one", qos=1)
    pub.publish("t/a", b"two", qos=1)
    pub.publish("t/a", b"zero", qos=0)       # QoS 0: nothing acknowledged, nothing kept
    pub.publish("other/x", b"nobody", qos=1)  # no peer wants it
    node.fwd.wait_messages(lambda m: m.payload == b"zero")
    assert node.entries() == [("t/a", b"one"), ("t/a", b"two")]
    assert locked(node.files()[0]), "the running Mosquitto holds its journal"
    st = node.stats()
    assert st["on"] and st["written"] == 2 and st["live"] == 2
    node.confirm(("t/a", b"one"))
    wait_for(lambda: node.stats()["live"] == 1, 5, "one entry trimmed")
    assert node.entries() == [("t/a", b"two")]
    node.confirm(("t/a", b"elsewhere"))      # a copy it never journaled
    node.confirm(("t/a", b"two"))
    wait_for(lambda: node.stats()["live"] == 0, 5, "all trimmed")
    wait_for(lambda: node.files()[0].stat().st_size == 8, 5, "an empty journal truncated")
    assert node.stats()["unmatched"] == 1


def test_each_copy_of_a_message_needs_its_confirmation(node):
    """Two forwarding subscriptions match: Mosquitto routes .fwd two copies, and the sidecar
    acks (confirms) each; the entry waits for both."""
    assert node.fwd.subscribe("t/+", 2, no_local=True, sub_id=2) == [2]
    pub = node.client("pub")
    pub.publish("t/b", b"twice", qos=1)
    assert len(node.fwd.wait_messages(lambda m: m.payload == b"twice", 2)) == 2
    node.confirm(("t/b", b"twice"))
    wait_for(lambda: node.stats()["confirmations"] == 1, 5, "the first confirmation")
    assert node.stats()["live"] == 1
    node.confirm(("t/b", b"twice"))
    wait_for(lambda: node.stats()["live"] == 0, 5, "trimmed after the second")


def test_identical_messages_are_interchangeable(node):
    pub = node.client("pub")
    for _ in range(3):
        pub.publish("t/same", b"v", qos=1)
    node.confirm(("t/same", b"v"), ("t/same", b"v"))
    wait_for(lambda: node.stats()["live"] == 1, 5, "two of three trimmed")
    assert node.entries() == [("t/same", b"v")]


def test_a_qos2_message_is_kept_from_its_pubrec_until_confirmed(node):
    pub = node.client("pub2")
    mid = pub.publish("t/q2", b"exactly", qos=2)  # PUBREC, no PUBREL yet: not routed
    assert node.entries() == [("t/q2", b"exactly")]
    node.confirm(("t/q2", b"exactly"))          # no copy routed yet: matches nothing
    wait_for(lambda: node.stats()["unmatched"] == 1, 5, "the early confirmation ignored")
    assert node.stats()["live"] == 1
    pub.pubrel(mid)
    node.fwd.wait_messages(lambda m: m.payload == b"exactly")
    node.confirm(("t/q2", b"exactly"))
    wait_for(lambda: node.stats()["live"] == 0, 5, "trimmed once routed and confirmed")


def test_a_shared_group_copy_served_locally_needs_no_confirmation(node):
    """Mosquitto gives each message of a shared group to one member: .fwd (forwarded, to be
    confirmed) or the local member (nothing to forward: trimmed at once)."""
    assert node.fwd.subscribe("$share/g/s/#", 2, sub_id=3) == [2]
    member = node.client("member")
    member.subscribe("$share/g/s/#", 1)
    pub = node.client("pub")
    for i in range(10):
        pub.publish("s/x", str(i).encode(), qos=1)
    member.wait_messages(lambda m: True, 1)
    wait_for(lambda: len(node.fwd.received(lambda m: m.topic == "s/x"))
             + len(member.received()) >= 10, 5, "all ten delivered")
    to_fwd = sorted(m.payload for m in node.fwd.received(lambda m: m.topic == "s/x"))
    assert 0 < len(to_fwd) < 10
    wait_for(lambda: node.stats()["live"] == len(to_fwd), 5, "local deliveries trimmed")
    assert sorted(p for _, p in node.entries()) == to_fwd


def test_a_killed_mosquitto_leaves_what_was_not_confirmed(node):
    pub = node.client("pub")
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v")]
    props.ContentType = "text/plain"
    c = node.clients(Client("propub", port=node.b.port))
    c.connect()
    c.publish("t/p", b"with-props", qos=1, properties=props)
    for i in range(3):
        pub.publish("t/k", str(i).encode(), qos=1)
    node.confirm(("t/k", b"0"))
    wait_for(lambda: node.stats()["live"] == 3, 5, "one confirmed")
    (path,) = node.files()
    node.b.proc.send_signal(signal.SIGKILL)
    wait_for(lambda: not node.b.alive(), 5, "Mosquitto killed")
    assert not locked(path), "a dead run's journal is free to replay"
    entries = parse(path.read_bytes()).entries
    assert [(e.topic, e.payload, e.qos) for e in entries] == [
        ("t/p", b"with-props", 1), ("t/k", b"1", 1), ("t/k", b"2", 1)]
    assert entries[0].properties.user == (("k", "v"),)
    assert entries[0].properties.content_type == "text/plain"


def test_a_graceful_stop_removes_an_empty_journal_and_keeps_a_live_one(make_broker, clients,
                                                                       journal_dir):
    first = Node(make_broker, clients, journal_dir)
    (path,) = first.files()
    first.b.stop()
    assert not path.exists(), "nothing live: nothing to replay"
    second = Node(make_broker, clients, journal_dir)
    second.client("pub").publish("t/a", b"kept", qos=1)
    (path,) = second.files()
    second.b.stop()
    assert [e.payload for e in parse(path.read_bytes()).entries] == [b"kept"]


def test_without_the_option_nothing_is_written(make_broker, clients, journal_dir):
    b = make_broker()
    sc = clients(FakeSidecar(b.sock)).start()
    assert sc.call("stats")["journal"]["on"] is False
    assert not list(journal_dir.iterdir())


def test_a_relative_journal_dir_is_refused(make_broker):
    with pytest.raises((RuntimeError, TimeoutError)):
        make_broker(opts={"journal_dir": "relative/dir"})


def test_a_long_journal_is_rewritten_with_its_live_entries(node):
    """Past 4 MiB, and four times what is live, the file is rewritten (a .tmp renamed over
    it): only the unconfirmed entry is left, and it is still whole."""
    pub = node.client("pub")
    pub.publish("t/keep", b"unconfirmed", qos=1)
    big = b"x" * 100_000
    for i in range(50):
        pub.publish(f"t/big/{i}", big, qos=1)
    node.confirm(*[(f"t/big/{i}", big) for i in range(50)])
    wait_for(lambda: node.stats()["compactions"] >= 1, 10, "a compaction")
    st = node.stats()
    assert st["live"] == 1 and st["errors"] == 0
    assert node.files()[0].stat().st_size < 1000
    assert node.entries() == [("t/keep", b"unconfirmed")]
    assert not list(node.journal.glob("*.tmp"))
