"""Links (linkout.c, linkin.c; issue 25 slice 3): the plugin's own MQTT connection to a
peer's Mosquitto. With capture on and a link set (`links`, `link_filters`), a client's message
that the link's filters match goes to the peer as MQFB records, written at the TICK, and is
injected there (its subscribers get it in order, with its properties); nothing reaches the
capture socket for it. After a cut connection the link writes again what was not PUBACKed and
the peer drops what it had injected. A link needs the peer's link secret, and may only inject.

Two real Mosquittos with the plugin; the harness's cuttable TCP proxy between them where a
test holds the answers back and resets the connection."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from sidecar.local.batch import Record, encode_batch
from tests.harness.procs import wait_for
from tests.harness.proxy import CuttableProxy
from tests.system.plugin.capture_peer import CapturePeer
from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Client,
    ConnectFailed,
    FakeSidecar,
    RawClient,
    free_port,
    mosquitto_dir,
)

pytestmark = pytest.mark.timeout(90)

LINK_SECRET = "link-secret-0123456789abcdef"
USER_PROPS = b"\x26\x00\x01k\x00\x01v"


class Pair:
    """Node a (capture on, its fake sidecar and `.fwd` on `t/#`, a publisher) links to node b
    (a subscriber on `t/#`), directly or through a Proxy."""

    def __init__(self, make_broker, clients, request, proxy: bool = False,
                 b_opts: dict | None = None, b_extra: str = "") -> None:
        self.clients = clients
        d = mosquitto_dir()
        request.addfinalizer(lambda: shutil.rmtree(d, ignore_errors=True))
        self.peer = CapturePeer(str(d / "capture.sock"))
        request.addfinalizer(self.peer.close)
        self.a = make_broker(name="a", opts={"capture_socket": str(d / "capture.sock")})
        self.b = make_broker(name="b", opts={"link_secret": LINK_SECRET, **(b_opts or {})},
                             extra=b_extra)
        self.sa = clients(FakeSidecar(self.a.sock)).start()
        self.sb = clients(FakeSidecar(self.b.sock)).start()
        self.fwd = clients(RawClient(SIDECAR_ID + ".fwd", sock=self.a.sock,
                                     username=SIDECAR_USER, password=SECRET,
                                     clean_start=False, session_expiry=3600))
        self.fwd.connect()
        assert self.fwd.subscribe("t/#", 2, no_local=True) == [2]
        assert self.fwd.subscribe("u/#", 2, no_local=True) == [2]
        self.peer.wait_hellos(1)
        self.proxy = CuttableProxy(self.b.port) if proxy else None
        if self.proxy:
            request.addfinalizer(self.proxy.close)
        self.sub = clients(Client("sub", port=self.b.port))
        self.sub.connect()
        assert self.sub.subscribe("t/#", 2) == [2]
        self.pub = clients(RawClient("pub", port=self.a.port))
        self.pub.connect()

    def link(self, password: str = LINK_SECRET, filters: tuple[str, ...] = ("t/#",)) -> None:
        port = self.proxy.port if self.proxy else self.b.port
        rep = self.sa.call("links", node="a", links=[{
            "peer": "b", "host": "127.0.0.1", "port": port, "username": "mqfed-link",
            "password": password}])
        assert rep["ok"] is True, rep
        rep = self.sa.call("link_filters", peer="b", add=list(filters))
        assert rep["ok"] is True, rep

    def links(self) -> dict:
        return self.sa.call("stats")["links"]

    def wait_up(self) -> None:
        wait_for(lambda: self.links()["up"] == 1, 10, "the link is up")

    def got(self) -> list[bytes]:
        with self.sub.cond:
            return [m.payload for m in self.sub.messages]


@pytest.fixture
def pair(make_broker, clients, request) -> Pair:
    return Pair(make_broker, clients, request)


def test_messages_cross_a_link_in_order_with_their_properties(pair):
    pair.link()
    pair.wait_up()
    sent = []   # QoS i % 3
    for i in range(300):
        payload = f"m{i:03d}".encode()
        if i % 3 == 2:
            pair.pub.publish2(f"t/{i % 7}", payload)
        else:
            pair.pub.publish(f"t/{i % 7}", payload, qos=i % 3, props=USER_PROPS)
        sent.append(payload)
    pair.pub.publish("u/1", b"not the link's", qos=1)
    got = pair.sub.wait_messages(lambda m: True, count=300, timeout=15)
    # in order within each QoS (across QoS levels Mosquitto itself sends a QoS 0 message
    # ahead of a QoS 2 one routed before it, to a subscriber on the publisher's node too)
    assert sorted(m.payload for m in got) == sent
    for qos in (0, 1, 2):
        assert [m.payload for m in got if m.qos == qos] == sent[qos::3]
    assert all(m.properties.UserProperty == [("k", "v")] for m in got
               if int(m.payload[1:]) % 3 != 2)
    # the records went by the link, not to the capture socket (only the unlinked topic did)
    recs = pair.peer.wait_records(1)
    assert [r.topic for r in recs] == ["u/1"]
    wait_for(lambda: pair.links()["held_bytes"] == 0, 10, "every batch PUBACKed")
    st = pair.links()
    assert (st["links"], st["records"], st["refused"], st["failures"]) == (1, 300, 0, 0)
    assert st["acked"] == st["batches"] > 0
    assert pair.sb.call("stats")["links"]["in_connected"] == 1
    # the sender's `.fwd` got no MQTT copy either
    pair.sa.publish("t/mark", b"mark", qos=1)
    assert pair.fwd.wait_messages(lambda m: m.payload == b"mark")
    assert [m.payload for m in pair.fwd.received()] == [b"mark"]


def test_a_cut_link_sends_again_what_was_not_acked_and_the_peer_drops_repeats(
        make_broker, clients, request):
    pair = Pair(make_broker, clients, request, proxy=True)
    pair.link()
    pair.wait_up()
    for i in range(20):
        pair.pub.publish("t/a", f"first{i}".encode(), qos=1)
    pair.sub.wait_messages(lambda m: True, count=20)
    pair.proxy.hold_answers()        # b injects the next ones, a never hears so
    for i in range(30):
        pair.pub.publish("t/a", f"second{i}".encode(), qos=1)
    pair.sub.wait_messages(lambda m: True, count=50)
    time.sleep(0.3)
    assert pair.links()["held_bytes"] > 0
    pair.proxy.drop()                # a reconnects and writes them again (DUP)
    pair.proxy.restore()
    for i in range(10):
        pair.pub.publish("t/a", f"third{i}".encode(), qos=1)
    pair.sub.wait_messages(lambda m: True, count=60)
    wait_for(lambda: pair.links()["held_bytes"] == 0, 15, "every batch PUBACKed")
    time.sleep(0.3)
    expected = ([f"first{i}".encode() for i in range(20)]
                + [f"second{i}".encode() for i in range(30)]
                + [f"third{i}".encode() for i in range(10)])
    assert pair.got() == expected
    st = pair.links()
    assert st["resent"] >= 1 and st["connects"] == 2 and st["failures"] >= 1
    assert pair.sb.call("stats")["links"]["in_duplicates"] >= 1


def test_a_link_with_a_wrong_secret_is_refused_and_keeps_its_records(pair):
    pair.link(password="not-the-secret-at-all")
    pair.pub.publish("t/x", b"waits", qos=1)
    wait_for(lambda: pair.links()["failures"] >= 2, 10, "the link was refused")
    st = pair.links()
    assert st["up"] == 0 and st["held_bytes"] > 0 and st["records"] == 1
    assert "bad credentials" in pair.a.log()
    assert pair.sb.call("stats")["links"]["in_refused"] >= 1
    assert pair.got() == []
    pair.link()                      # the right one: what waited goes
    assert [m.payload for m in pair.sub.wait_messages(lambda m: True)] == [b"waits"]


def test_link_identities_are_guarded_and_a_link_may_only_inject(pair, clients):
    lid = "mqfed-sidecar-link.x.1"
    for user, pw in (("mqfed-link", "wrong"), ("someone", LINK_SECRET), (None, None)):
        with pytest.raises(ConnectFailed):
            clients(Client(lid, port=pair.b.port, username=user, password=pw)).connect()
    # a node without plugin_opt_link_secret accepts no link
    with pytest.raises(ConnectFailed):
        clients(Client(lid, port=pair.a.port, username="mqfed-link",
                       password=LINK_SECRET)).connect()
    raw = clients(RawClient(lid, port=pair.b.port, username="mqfed-link", password=LINK_SECRET))
    raw.connect()
    rec = [Record(f"t/{i}", f"r{i}".encode(), 1, seq=i, origin="x") for i in (1, 2, 3)]
    raw.publish("$CONTROL/mqfed/inject", encode_batch(1, rec), qos=1)
    # the same batch again (as after a lost PUBACK), and one more record
    raw.publish("$CONTROL/mqfed/inject", encode_batch(2, rec + [
        Record("t/4", b"r4", 1, seq=4, origin="x")]), qos=1)
    got = pair.sub.wait_messages(lambda m: True, count=4)
    time.sleep(0.3)
    assert pair.got() == [b"r1", b"r2", b"r3", b"r4"] == [m.payload for m in got]
    # a record without its origin is refused whole; and nothing but the inject topic
    raw.publish("$CONTROL/mqfed/inject", encode_batch(3, [Record("t/5", b"r5", 1, seq=5)]),
                qos=1)
    time.sleep(0.3)
    assert b"r5" not in pair.got()
    assert "link record" in pair.b.log()
    assert raw.subscribe("t/#", 1) == [0x87]
    raw.publish("t/plain", b"no", qos=1)
    time.sleep(0.3)
    assert b"no" not in pair.got()


def test_bad_link_commands_get_clear_errors(pair):
    call = pair.sa.call
    assert call("links", node="a", links="x")["error"] == "bad_request"
    bad = [{"peer": "b", "host": "localhost", "port": 1, "username": "u", "password": "p"},
           {"peer": "b/c", "host": "127.0.0.1", "port": 1, "username": "u", "password": "p"},
           {"peer": "b", "host": "127.0.0.1", "port": 0, "username": "u", "password": "p"},
           {"peer": "b", "host": "127.0.0.1", "port": 1, "username": "", "password": "p"}]
    for entry in bad:
        rep = call("links", node="a", links=[entry])
        assert rep["error"] == "bad_request" and rep["why"], (entry, rep)
    assert call("link_filters", peer="nobody", add=["t/#"])["error"] == "unknown_peer"
    pair.link()
    assert call("links", node="other", links=[])["why"] == "the node id cannot change"
    for add in (["t/#/x"], ["$share/g/t"], [1]):
        assert call("link_filters", peer="b", add=add)["error"] == "bad_request"
    # removing every link abandons what it held (counted)
    pair.sa.call("links", node="a", links=[{"peer": "b", "host": "127.0.0.1",
                                             "port": free_port(), "username": "mqfed-link",
                                             "password": LINK_SECRET}])
    pair.pub.publish("t/held", b"x", qos=1)
    assert call("links", node="a", links=[])["ok"] is True
    st = pair.links()
    assert (st["links"], st["abandoned"]) == (0, 1)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_links_are_valgrind_clean(make_broker, clients, request, tmp_path):
    """linkout.c and linkin.c under valgrind, one broker linked to itself through the proxy:
    batches of every QoS, PUBACKs held back then a cut (a resend the receiver drops), a
    refused link, a link to a closed port, bad commands, and records held at shutdown."""
    if shutil.which("valgrind") is None:
        pytest.fail("valgrind is not installed")
    vglog = tmp_path / "valgrind.log"
    supp = str(Path(__file__).with_name("mosquitto.supp"))
    d = mosquitto_dir()
    request.addfinalizer(lambda: shutil.rmtree(d, ignore_errors=True))
    peer = CapturePeer(str(d / "capture.sock"))
    request.addfinalizer(peer.close)
    b = make_broker(name="links-valgrind", opts={"capture_socket": str(d / "capture.sock"),
                                                 "link_secret": LINK_SECRET},
                    wrapper=["valgrind", "--error-exitcode=99",
                             "--errors-for-leak-kinds=definite", "--leak-check=full",
                             "--trace-children=no", f"--suppressions={supp}",
                             f"--log-file={vglog}"])
    sc = clients(FakeSidecar(b.sock)).start()
    fwd = clients(RawClient(SIDECAR_ID + ".fwd", sock=b.sock, username=SIDECAR_USER,
                            password=SECRET, clean_start=False, session_expiry=3600))
    fwd.connect(timeout=20)
    assert fwd.subscribe("t/#", 2, no_local=True) == [2]
    peer.wait_hellos(1, timeout=20)
    proxy = CuttableProxy(b.port)
    request.addfinalizer(proxy.close)
    sub = clients(Client("sub", port=b.port))
    sub.connect(timeout=20)
    sub.subscribe("t/#", 2, timeout=20)
    pub = clients(RawClient("pub", port=b.port))
    pub.connect(timeout=20)

    def link(*entries: dict) -> None:
        assert sc.call("links", node="self", links=list(entries), timeout=20)["ok"] is True

    def stats() -> dict:
        return sc.call("stats", timeout=20)["links"]

    me = {"peer": "me", "host": "127.0.0.1", "port": proxy.port, "username": "mqfed-link",
          "password": LINK_SECRET}
    link(me)
    assert sc.call("link_filters", peer="me", add=["t/#", "t/+"], timeout=20)["ok"] is True
    assert sc.call("link_filters", peer="me", remove=["t/+"], timeout=20)["ok"] is True
    wait_for(lambda: stats()["up"] == 1, 30, "the link is up")
    for i in range(12):   # each comes to `sub` twice: routed here, and injected by the link
        if i % 3 == 2:
            pub.publish2("t/a", f"m{i}".encode())
        else:
            pub.publish("t/a", f"m{i}".encode(), qos=i % 3, props=USER_PROPS)
    assert len(sub.wait_messages(lambda m: True, count=24, timeout=30)) >= 24
    proxy.hold_answers()
    for i in range(6):
        pub.publish("t/b", f"h{i}".encode(), qos=1)
    sub.wait_messages(lambda m: m.topic == "t/b", count=12, timeout=30)
    proxy.drop()
    proxy.restore()
    wait_for(lambda: stats()["held_bytes"] == 0, 30, "every batch PUBACKed")
    assert stats()["in_duplicates"] >= 1
    # a refused link and one to a closed port keep what they take until the exit
    link(me, {**me, "peer": "bad", "password": "not-the-link-secret"},
         {**me, "peer": "dead", "port": free_port()})
    for p in ("bad", "dead"):
        assert sc.call("link_filters", peer=p, add=["t/x"], timeout=20)["ok"] is True
    pub.publish("t/x", b"held", qos=1)
    wait_for(lambda: stats()["failures"] >= 3, 30, "the bad and dead links failed")
    assert sc.call("links", node="self", links="x", timeout=20)["error"] == "bad_request"
    assert sc.call("link_filters", peer="bad", add=["t/#/x"], timeout=20)["error"] == \
        "bad_request"
    assert stats()["held_bytes"] > 0
    for c in (sub, pub, fwd, sc):
        c.close()
    rc = b.stop(timeout=60)
    report = vglog.read_text()
    summary = re.findall(r"ERROR SUMMARY: (\d+) errors", report)
    assert summary and summary[-1] == "0", report[-6000:]
    assert rc == 0, f"exit code {rc}\n{report[-4000:]}"
    assert "definitely lost: 0 bytes" in report or "no leaks are possible" in report, \
        report[-4000:]


class SlowReader(RawClient):
    """A subscriber that takes `delay` seconds over each QoS 1 message before its PUBACK."""

    def __init__(self, *args, delay: float, **kw) -> None:
        super().__init__(*args, **kw)
        self.delay = delay

    def _handle(self, first: int, body: bytes) -> None:
        if first >> 4 == 3:
            time.sleep(self.delay)
        super()._handle(first, body)


def test_a_link_paces_itself_to_a_slow_subscribers_queue(make_broker, clients, request):
    """B's subscriber reads ~400 messages/s with a Receive Maximum of 10 and B's
    `max_queued_messages` is 100; 2,000 QoS 1 messages published flat out on A reach it all,
    in order: the link sends while the queue B measures after each batch (its reply) plus what
    is unanswered stays under half the bound. Without that B drops what overflows."""
    pair = Pair(make_broker, clients, request, b_opts={"max_queued_messages": 100},
                b_extra="max_queued_messages 100")
    slow = clients(SlowReader("slow", port=pair.b.port, receive_maximum=10, delay=0.0025))
    slow.connect()
    assert slow.subscribe("t/slow", 1) == [1]
    pair.link()
    pair.wait_up()
    sent = [f"s{i:04d}".encode() for i in range(2000)]
    for payload in sent:
        pair.pub.publish("t/slow", payload, qos=1)
    got = slow.wait_messages(lambda m: True, count=2000, timeout=40)
    assert [m.payload for m in got] == sent
    assert "dropped" not in pair.b.log()
    st = pair.links()["list"][0]
    assert st["paced"] > 0, st
