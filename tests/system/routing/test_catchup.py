"""A subscription counts cluster-wide from its SUBACK (issue 18), on a real 3-node cluster:
subscribe on n2 with a fresh filter, publish on n1 the moment the SUBACK arrives, and the message
arrives exactly once; a message published before the subscription (beyond catchup.margin) does
not. Rounds are pipelined: up to WINDOW subscriptions in flight, each SUBACK publishing at once
from the subscriber's network thread."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.harness.procs import wait_for

pytestmark = pytest.mark.timeout(600)

ROUNDS = 1000
WINDOW = 50
MARGIN = 0.05  # catchup.margin's default
_ids = itertools.count()


class Peer:
    """A paho client that counts what it receives per (topic, payload)."""

    def __init__(self, port: int, v5: bool = True) -> None:
        self.got: Counter[tuple[str, bytes]] = Counter()
        self.lock = threading.Lock()
        self.subacks: dict[int, Callable[[list], None]] = {}
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"cu-{next(_ids)}",
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311)
        # at most Mosquitto's Receive Maximum (20) QoS > 0 publishes in flight: beyond it
        # Mosquitto refuses a QoS 2 PUBLISH (PUBREC 0x97), which paho does not resend
        self.c.max_inflight_messages_set(20)
        self.c.max_queued_messages_set(0)
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        up = threading.Event()
        self.c.on_connect = lambda *a: up.set()
        self.c.connect("127.0.0.1", port, keepalive=30)
        self.c.loop_start()
        assert up.wait(10), f"no CONNACK from port {port}"

    def _on_message(self, client, userdata, msg) -> None:
        with self.lock:
            self.got[(msg.topic, msg.payload)] += 1

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        with self.lock:
            then = self.subacks.pop(mid)
        then([getattr(rc, "value", rc) for rc in reason_codes])

    def subscribe(self, filt: str, options: SubscribeOptions,
                  then: Callable[[list], None]) -> None:
        """Send a SUBSCRIBE; `then(reason codes)` runs on the SUBACK."""
        with self.lock:  # (the SUBACK may come before subscribe() returns)
            rc, mid = self.c.subscribe(filt, options=options)
            assert rc == mqtt.MQTT_ERR_SUCCESS, rc
            self.subacks[mid] = then

    def count(self) -> int:
        with self.lock:
            return sum(self.got.values())

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def rounds(n: int, start: Callable[[int, Callable[[], None]], None]) -> None:
    """Run `start(i, done)` for i in range(n), at most WINDOW not done at a time."""
    slots = threading.Semaphore(WINDOW)
    for i in range(n):
        assert slots.acquire(timeout=30), f"round {i}: no SUBACK for 30 s"
        start(i, slots.release)
    for _ in range(WINDOW):
        assert slots.acquire(timeout=30)


def settle(peers: list[Peer], expected: int) -> None:
    """Wait for `expected` messages in all, then a while longer for any duplicate."""
    try:
        wait_for(lambda: sum(p.count() for p in peers) >= expected, 60, "")
    except TimeoutError:
        pass  # the check that follows says what is missing
    time.sleep(1.0)


def exactly_once(peer: Peer, wanted: set[tuple[str, bytes]]) -> None:
    with peer.lock:
        got = dict(peer.got)
    missing = wanted - set(got)
    extra = set(got) - wanted
    twice = {k: v for k, v in got.items() if v > 1}
    assert not missing and not extra and not twice, (
        f"{len(missing)} missing (e.g. {sorted(missing)[:3]}), {len(extra)} unexpected "
        f"(e.g. {sorted(extra)[:3]}), {len(twice)} more than once (e.g. {list(twice)[:3]})")


def replayed(cluster, node: str) -> dict[str, float]:
    m = cluster.metrics(node)
    return {src: m.get(("mqfed_catchup_replayed_total", (("source", src),)), 0.0)
            for src in ("plugin", "sidecar")}


@pytest.mark.parametrize("v5", [True, False], ids=["v5", "v311"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_right_after_suback_arrives_exactly_once(shared_cluster, v5, qos):
    cluster = shared_cluster
    tag = f"{'5' if v5 else '3'}q{qos}"
    sub = Peer(cluster.ports["n2"], v5)
    # several publishers: each keeps at most 20 QoS > 0 publishes in flight (Mosquitto's
    # Receive Maximum); more would wait in paho, no longer "right after the SUBACK"
    pubs = [Peer(cluster.ports["n1"], v5) for _ in range(4)]
    before = replayed(cluster, "n1")

    def start(i: int, done: Callable[[], None]) -> None:
        topic = f"cu/{tag}/{i}"

        def on_suback(codes: list) -> None:
            assert codes[0] < 0x80, codes
            pubs[i % len(pubs)].c.publish(topic, b"m", qos=qos)
            done()

        sub.subscribe(topic, SubscribeOptions(qos=qos), on_suback)

    try:
        rounds(ROUNDS, start)
        settle([sub], ROUNDS)
        exactly_once(sub, {(f"cu/{tag}/{i}", b"m") for i in range(ROUNDS)})
        after = replayed(cluster, "n1")
        assert after["plugin"] > before["plugin"], "no catch-up happened: the test proves little"
    finally:
        for p in (sub, *pubs):
            p.close()


def test_other_peers_interest_and_shared_members(shared_cluster):
    """Through another node's filter (the forwarder's own ring), and for a fresh shared group
    with members on n2 and n3: each message once, to one member."""
    cluster = shared_cluster
    watcher = Peer(cluster.ports["n3"])
    done_w = threading.Event()
    watcher.subscribe("ov/#", SubscribeOptions(qos=1), lambda codes: done_w.set())
    assert done_w.wait(5)
    cluster.wait_interest("n3", "ov/#")
    sub, pub = Peer(cluster.ports["n2"]), Peer(cluster.ports["n1"])
    m2, m3 = Peer(cluster.ports["n2"]), Peer(cluster.ports["n3"])
    before = replayed(cluster, "n1")

    def start(i: int, done: Callable[[], None]) -> None:
        def on_suback(codes: list) -> None:
            pub.c.publish(f"ov/{i}", b"o", qos=1)
            done()

        sub.subscribe(f"ov/{i}", SubscribeOptions(qos=1), on_suback)

    def start_shared(i: int, done: Callable[[], None]) -> None:
        left = [2]
        lock = threading.Lock()

        def on_suback(codes: list) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:  # both members have their SUBACK
                pub.c.publish(f"sh/{i}", b"s", qos=1)
                done()

        for member in (m2, m3):
            member.subscribe(f"$share/g{i}/sh/{i}", SubscribeOptions(qos=1), on_suback)

    try:
        rounds(ROUNDS, start)
        rounds(ROUNDS, start_shared)
        settle([sub], ROUNDS)
        settle([m2, m3], ROUNDS)
        exactly_once(sub, {(f"ov/{i}", b"o") for i in range(ROUNDS)})
        with m2.lock, m3.lock:
            both = m2.got + m3.got
        wanted = {(f"sh/{i}", b"s") for i in range(ROUNDS)}
        twice = [k for k, v in both.items() if v > 1]
        assert both == Counter(dict.fromkeys(wanted, 1)), (
            f"{len(both)} topics, {sum(both.values())} deliveries; missing e.g. "
            f"{sorted(wanted - set(both))[:5]}, twice e.g. {twice[:5]}")
        after = replayed(cluster, "n1")
        assert after["sidecar"] > before["sidecar"], "nothing came from the forwarder's ring"
    finally:
        for p in (watcher, sub, pub, m2, m3):
            p.close()


def test_no_local_subscription(shared_cluster):
    """A No Local subscriber gets the other node's message once, never its own."""
    cluster = shared_cluster
    sub, pub = Peer(cluster.ports["n2"]), Peer(cluster.ports["n1"])

    def start(i: int, done: Callable[[], None]) -> None:
        def on_suback(codes: list) -> None:
            sub.c.publish(f"nl/{i}", b"own", qos=1)
            pub.c.publish(f"nl/{i}", b"other", qos=1)
            done()

        sub.subscribe(f"nl/{i}", SubscribeOptions(qos=1, noLocal=True), on_suback)

    try:
        rounds(ROUNDS, start)
        settle([sub], ROUNDS)
        exactly_once(sub, {(f"nl/{i}", b"other") for i in range(ROUNDS)})
    finally:
        sub.close()
        pub.close()


def test_published_before_the_subscribe_is_not_delivered(shared_cluster):
    """Published on n1 longer than catchup.margin before n2 subscribes: not delivered, whether
    no node wanted it (the plugin's ring) or n3 did (the forwarder's)."""
    cluster = shared_cluster
    watcher = Peer(cluster.ports["n3"])
    done_w = threading.Event()
    watcher.subscribe("pre3/#", SubscribeOptions(qos=1), lambda codes: done_w.set())
    assert done_w.wait(5)
    cluster.wait_interest("n3", "pre3/#")
    sub, pub = Peer(cluster.ports["n2"]), Peer(cluster.ports["n1"])
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v")]
    n = 100
    try:
        for i in range(n):
            pub.c.publish(f"pre/{i}", b"early", qos=1, properties=props)
            pub.c.publish(f"pre3/{i}", b"early", qos=1)
        wait_for(lambda: watcher.count() >= n, 10, "n3 got the early messages")
        time.sleep(MARGIN + 0.1)
        acked = threading.Semaphore(0)
        for i in range(n):
            for topic in (f"pre/{i}", f"pre3/{i}"):
                sub.subscribe(topic, SubscribeOptions(qos=1), lambda codes: acked.release())
        for _ in range(2 * n):
            assert acked.acquire(timeout=10)
        time.sleep(1.0)
        with sub.lock:
            assert not sub.got, sorted(sub.got)[:5]
    finally:
        for p in (watcher, sub, pub):
            p.close()


def test_a_stream_goes_on_in_order_from_the_suback(shared_cluster):
    """A publisher streams on n1; n2 subscribes mid-stream: from the SUBACK on it gets every
    message, in order, none twice (what catch-up replays comes before what follows it)."""
    cluster = shared_cluster
    sub, pub = Peer(cluster.ports["n2"]), Peer(cluster.ports["n1"])
    before = cluster.routing("n1").get("catchup", {})
    order: dict[str, list[int]] = {}
    sub.c.on_message = lambda c, u, m: order.setdefault(m.topic, []).append(int(m.payload))
    try:
        for r in range(10):
            topic = f"st/{r}"
            sent = [0]
            stop = threading.Event()
            mark: list[int] = []

            def stream(topic=topic, sent=sent, stop=stop) -> None:
                while not stop.is_set():
                    pub.c.publish(topic, str(sent[0]).encode(), qos=1)
                    sent[0] += 1
                    time.sleep(0.001)

            thread = threading.Thread(target=stream)
            thread.start()
            time.sleep(0.05)
            acked = threading.Event()

            def on_suback(codes: list, sent=sent, mark=mark, acked=acked) -> None:
                mark.append(sent[0])  # every seq from here on was published after the SUBACK
                acked.set()

            sub.subscribe(topic, SubscribeOptions(qos=1), on_suback)
            assert acked.wait(5)
            time.sleep(0.2)
            stop.set()
            thread.join()
            last = sent[0] - 1
            wait_for(lambda t=topic, last=last: order.get(t, [-1])[-1] >= last, 10,
                     f"{topic} up to {last}")
            got = order[topic]
            assert got == list(range(got[0], last + 1)), (topic, got[:5], len(got))
            assert got[0] <= mark[0], (topic, got[0], mark[0])
        # (the order machinery ran: messages for n2 waited behind a replay)
        wait_for(lambda: cluster.routing("n1").get("catchup", {}).get("held_total", 0)
                 > before.get("held_total", 0), 5, "messages held behind a catch-up")
    finally:
        sub.close()
        pub.close()
