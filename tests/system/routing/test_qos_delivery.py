"""Delivery guarantees across nodes at every QoS, at volume (issue 14).

On a real 3-node cluster, an MQTT 5 and an MQTT 3.1.1 publisher on n2 each publish 2,500
messages at QoS 0, 1 and 2 (5,000 per QoS), flat out and paced. Two subscribers at each QoS,
on n1 and n3, must get every message they must, in per-publisher order, exactly once where the
effective QoS is 2. Every publish must be acknowledged with a success reason code.

Subscribers announce a Receive Maximum of 65,535. Without one, Mosquitto 2.0.11 keeps at most
`max_inflight_messages` (20) QoS > 0 messages in flight to a subscriber and queues the rest, and
once that window fills it delivers out of order (measured on a single Mosquitto with no plugin;
in its source, `db__message_insert` lets a new message into a freed in-flight slot ahead of the
queued ones). That reordering belongs to the subscriber's own broker, not to the hop, and shows
whenever a slow subscriber (here paho threads sharing a busy 2-core machine) lets the window
fill; a single broker does it as well.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from tests.system.node.mqtt import Client
from tests.system.routing.conftest import Cluster, module_cluster

PER_PUBLISHER = 2500
PACED_RATE = 1500.0  # messages/s per publisher, all QoS together


class Publisher:
    """Publishes `PER_PUBLISHER` messages at each QoS on `<prefix>/<name>/q<qos>`, the QoS
    interleaved, and records each publish's outcome."""

    def __init__(self, port: int, prefix: str, name: str, v5: bool,
                 count: int = PER_PUBLISHER) -> None:
        self.prefix, self.name, self.count = prefix, name, count
        self.client = Client(port, f"{prefix.replace('/', '-')}-{name}", v5=v5)
        assert self.client.wait_connected(), f"publisher {name} could not connect"
        self.refused: list[tuple[int, str]] = []
        self.client.client.on_publish = self._on_publish
        self.infos: list[mqtt.MQTTMessageInfo] = []
        self.reconnects = 0
        self.client.client.on_connect = self._on_connect

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.reconnects += 1

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.refused.append((mid, str(reason_code)))

    def run(self, rate: float | None) -> None:
        start = time.monotonic()
        for seq in range(self.count):
            for qos in (0, 1, 2):
                topic = f"{self.prefix}/{self.name}/q{qos}"
                info = self.client.client.publish(topic, str(seq).encode(), qos=qos)
                assert info.rc == mqtt.MQTT_ERR_SUCCESS, (self.name, seq, info.rc)
                self.infos.append(info)
            if rate is not None:
                time.sleep(max(0.0, start + (seq + 1) * 3 / rate - time.monotonic()))

    def finish(self) -> None:
        for info in self.infos:
            info.wait_for_publish(60)
        assert all(i.is_published() for i in self.infos), f"{self.name}: publishes unacked"
        assert not self.refused, f"{self.name}: broker refused {self.refused[:5]}"


def _check(sub: Client, sub_qos: int, prefix: str, publishers: list[str],
           ordered: bool, count: int = PER_PUBLISHER) -> list[str]:
    """What is wrong with what `sub` got (empty: nothing)."""
    seqs: dict[tuple[str, int], list[int]] = defaultdict(list)
    for m in list(sub.messages):
        _, pub, q = m.topic.rsplit("/", 2)
        seqs[(pub, int(q[1:]))].append(int(m.payload))
    problems = []
    for pub in publishers:
        for pub_qos in (0, 1, 2):
            got = seqs[(pub, pub_qos)]
            effective = min(pub_qos, sub_qos)
            missing = sorted(set(range(count)) - set(got))
            dups = len(got) - len(set(got))
            firsts = list(dict.fromkeys(got))
            where = f"sub q{sub_qos} <- {pub} q{pub_qos}"
            if missing:
                problems.append(f"{where}: lost {len(missing)}, first {missing[:8]}")
            if effective == 2 and dups:
                problems.append(f"{where}: {dups} duplicates at QoS 2")
            if effective == 0 and dups:
                problems.append(f"{where}: {dups} duplicates at QoS 0")
            if ordered and firsts != sorted(firsts):
                bad = next(i for i in range(1, len(firsts)) if firsts[i] < firsts[i - 1])
                problems.append(f"{where}: out of order at {firsts[bad - 1:bad + 2]}")
    return problems


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[Cluster]:
    """The module's cluster, overload shedding off: these tests check delivery. A shed paho
    v5 publisher resends every queued message at its reconnect, past Mosquitto's Receive
    Maximum (paho issue #492), and Mosquitto refuses those QoS 2 ones with Quota exceeded:
    it failed so once on a loaded CI machine. Shedding has its own tests (test_overload)."""
    yield from module_cluster({"MQFED_OVERLOAD_BACKLOG_MAX": "1000000"})


@pytest.mark.parametrize("mode", ["flat_out", "paced"])
def test_every_qos_arrives_complete_in_order_exactly_once(shared_cluster, mode):
    _every_qos(shared_cluster, mode)
    # the default path: each frame re-injected as batches (routing.inject_batches)
    assert all(shared_cluster.routing(n)["inject"]["batches"] > 0 for n in ("n1", "n3"))


def test_every_qos_arrives_complete_one_publish_per_message(cluster_factory):
    """The same with `routing.inject_batches` off (on by default, where the receiving sidecar
    re-injects each frame as batches the plugin publishes inside Mosquitto, issue 25): one
    PUBLISH per message through the re-injection window, so both paths stay tested."""
    cluster = cluster_factory(3, env={"MQFED_ROUTING_INJECT_BATCHES": "false"})
    _every_qos(cluster, "paced")
    assert all(cluster.routing(n)["inject"] is None for n in ("n1", "n3"))


def _every_qos(cluster, mode: str) -> None:
    prefix = f"qosvol/{mode}"
    subs: list[tuple[Client, int]] = []
    for node in ("n1", "n3"):
        for qos in (0, 1, 2):
            sub = Client(cluster.ports[node], f"qv-{mode}-{node}-q{qos}",
                         receive_maximum=65535)
            assert sub.wait_connected()
            sub.subscribe(f"{prefix}/#", qos=qos)
            subs.append((sub, qos))
    for node in ("n1", "n3"):
        cluster.wait_interest(node, f"{prefix}/#")
    pubs = [Publisher(cluster.ports["n2"], prefix, "v5", v5=True),
            Publisher(cluster.ports["n2"], prefix, "v311", v5=False)]
    threads = [threading.Thread(target=p.run, args=(PACED_RATE if mode == "paced" else None,))
               for p in pubs]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for p in pubs:
            p.finish()
        expected = 2 * 3 * PER_PUBLISHER
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(len({(m.topic, m.payload) for m in list(s.messages)}) >= expected
                   for s, _ in subs):
                break
            time.sleep(0.25)
        time.sleep(1.0)  # late duplicates, if any, arrive
        problems = [p for s, q in subs
                    for p in _check(s, q, prefix, ["v5", "v311"], ordered=True)]
        shed = [(n, cluster.routing(n).get("overload", {})) for n in ("n2",)]
        reconnects = {p.name: p.reconnects for p in pubs}
        assert not problems, f"{problems[:12]} (overload on n2: {shed}, reconnects {reconnects})"
        for node in ("n1", "n3"):
            window = cluster.routing(node)["fwd"]["reinject"]
            assert window["refused"] == 0, (node, window)
            inject = cluster.routing(node)["inject"]   # None: one PUBLISH per message
            assert inject is None or inject["refused"] == inject["timeouts"] == 0, inject
    finally:
        for p in pubs:
            p.client.close()
        for s, _ in subs:
            s.close()
