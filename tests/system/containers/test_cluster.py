"""The cluster in containers: routing through the front, a killed node, a partition.

Every test starts its own etcd + 3 nodes + HAProxy (about 10 s) and removes them after.
Clients reach containers only through ports published on 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

from tests.system.containers.dockercluster import Cluster
from tests.system.node.mqtt import Client


def _client(port: int, name: str) -> Client:
    c = Client(port, f"{name}-{uuid.uuid4().hex[:6]}")
    assert c.wait_connected(10), f"{name} could not connect to 127.0.0.1:{port}"
    return c


def _payloads(sub: Client, topic: str) -> set[bytes]:
    return {m.payload for m in list(sub.messages) if m.topic == topic}


def wait_route(pub: Client, sub: Client, topic: str, timeout: float = 45.0) -> float:
    """Publish probes on `topic` until `sub` receives one: cross-node routing is up (interest
    exchanged, streams connected). Returns how long it took."""
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < timeout:
        payload = f"probe-{n}".encode()
        pub.publish(topic, payload, qos=1)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            if payload in _payloads(sub, topic) or any(
                    p.startswith(b"probe-") for p in _payloads(sub, topic)):
                return time.monotonic() - start
            time.sleep(0.02)
        n += 1
    raise AssertionError(f"no message on {topic} reached the subscriber in {timeout:.0f}s")


def _routing_summary(state: dict) -> dict:
    """Per peer: stream states and last error; plus the interest this node holds."""
    routing = state.get("routing") or {}
    peers = {p: (v.get("outbound", {}).get("state"), v.get("inbound", {}).get("state"),
                 v.get("last_error")) for p, v in (routing.get("peers") or {}).items()}
    return {"pid": state.get("pid"), "peers": peers, "interest": len(state.get("interest") or []),
            "forwarding_subscriptions": routing.get("forwarding_subscriptions"),
            "forwarded": routing.get("forwarded"), "received": routing.get("received")}


def _node_of(cluster: Cluster, client_id: str) -> str:
    for name, node in cluster.nodes.items():
        if client_id in (node.state().get("sessions") or {}):
            return name
    return "?"


class QoS1Load:
    """Publishes 0, 1, 2, ... on `topic` at QoS 1 and `rate`/s from a thread."""

    def __init__(self, pub: Client, topic: str, rate: float) -> None:
        self.pub, self.topic, self.rate = pub, topic, rate
        self.infos: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            n = len(self.infos)
            self.infos.append(self.pub.client.publish(self.topic, str(n).encode(), qos=1))
            next_at += 1.0 / self.rate
            time.sleep(max(0.0, next_at - time.monotonic()))

    def stop(self) -> set[bytes]:
        """Stop; return the payloads the node acknowledged (PUBACK)."""
        self._stop.set()
        self._thread.join(10)
        for info in self.infos:
            info.wait_for_publish(15)
        return {str(i).encode() for i, info in enumerate(self.infos) if info.is_published()}


def test_publish_and_subscribe_across_nodes_through_the_front(cluster: Cluster):
    topic = f"front/{uuid.uuid4().hex[:6]}"
    subs = [_client(cluster.front_port, f"sub{i}") for i in range(3)]
    for s in subs:
        s.subscribe(topic, 1)
    pub = _client(cluster.front_port, "pub")
    try:
        # round robin spread the four connections over the nodes
        ids = [c.client._client_id.decode() for c in [*subs, pub]]
        placed: dict[str, str] = {}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(placed) < len(ids):
            for cid in ids:
                node = placed.get(cid) or _node_of(cluster, cid)
                if node != "?":
                    placed[cid] = node
            time.sleep(0.3)
        assert len(placed) == len(ids), f"clients not found on any node: {placed}"
        pub_node = placed[pub.client._client_id.decode()]
        sub_nodes = {placed[s.client._client_id.decode()] for s in subs}
        assert sub_nodes - {pub_node}, f"no subscriber on another node than the publisher: {placed}"
        assert len(sub_nodes) == 3, f"round robin did not spread the subscribers: {placed}"

        for s in subs:
            wait_route(pub, s, topic)
        sent = [f"m{i}".encode() for i in range(200)]
        for payload in sent:
            pub.publish(topic, payload, qos=1, wait=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
                set(sent) <= _payloads(s, topic) for s in subs):
            time.sleep(0.05)
        for s, cid in zip(subs, ids, strict=False):
            missing = set(sent) - _payloads(s, topic)
            assert not missing, f"{cid} on {placed[cid]} missed {len(missing)} of {len(sent)}"

        # a node's published admin port answers for the whole cluster (it asks the others at
        # the addresses they registered, over the containers' network)
        ctl = subprocess.run(
            [sys.executable, "-m", "sidecar.cli", "ctl", "--node",
             f"127.0.0.1:{cluster.nodes['n1'].admin_port}", "--token", cluster.admin_token,
             "--json", "status"], capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 0, f"mqfed ctl status: {ctl.returncode}\n{ctl.stderr}"
        assert all(f'"{n}"' in ctl.stdout for n in ("n1", "n2", "n3")), ctl.stdout
    finally:
        for c in [*subs, pub]:
            c.close()


def test_killed_node_under_qos1_load_loses_nothing_for_the_others(cluster: Cluster):
    n1, n2, n3 = (cluster.nodes[n] for n in ("n1", "n2", "n3"))
    topic = f"load/{uuid.uuid4().hex[:6]}"
    pub = _client(n1.mqtt_port, "pub")
    sub1, sub2, sub3 = (_client(n.mqtt_port, f"sub-{n.name}") for n in (n1, n2, n3))
    try:
        for s in (sub1, sub2, sub3):
            s.subscribe(topic, 1)
        wait_route(pub, sub2, topic)
        wait_route(pub, sub3, topic)  # n3 is a forwarding target when it dies

        load = QoS1Load(pub, topic, rate=400)
        time.sleep(2.0)
        cluster.kill("n3")  # SIGKILL: no graceful leave
        time.sleep(4.0)
        acked = load.stop()
        assert len(acked) >= 2000, f"only {len(acked)} publishes acknowledged"

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                acked <= _payloads(sub1, topic) and acked <= _payloads(sub2, topic)):
            time.sleep(0.1)
        for name, sub in (("n1", sub1), ("n2", sub2)):
            missing = acked - _payloads(sub, topic)
            assert not missing, (f"subscriber on {name} lost {len(missing)} of {len(acked)} "
                                 f"acknowledged messages, e.g. {sorted(missing)[:5]}")

        # the killed container starts again (what a restart policy does): same run dir, it
        # rejoins and is routed to again
        cluster.restart("n3")
        cluster.wait_ready(nodes=["n3"])
        sub3 = _client(n3.mqtt_port, "sub-n3-again")
        sub3.subscribe(topic, 1)
        wait_route(pub, sub3, topic)
    finally:
        for c in (pub, sub1, sub2, sub3):
            c.close()


def test_partitioned_node_keeps_serving_and_routing_resumes_after(cluster: Cluster):
    n1, n3 = cluster.nodes["n1"], cluster.nodes["n3"]
    topic = f"part/{uuid.uuid4().hex[:6]}"
    pub1, sub1 = _client(n1.mqtt_port, "pub-n1"), _client(n1.mqtt_port, "sub-n1")
    pub3, sub3 = _client(n3.mqtt_port, "pub-n3"), _client(n3.mqtt_port, "sub-n3")
    clients = [pub1, sub1, pub3, sub3]
    try:
        sub1.subscribe(f"{topic}/#", 1)
        sub3.subscribe(f"{topic}/#", 1)
        wait_route(pub1, sub3, f"{topic}/to3")
        wait_route(pub3, sub1, f"{topic}/to1")

        cluster.partition("n3")  # n3 loses its peers and etcd, keeps its clients
        time.sleep(8.0)  # past the etcd lease (5 s) and the peer streams' dead timeout
        # both sides keep serving: existing and new clients, local delivery
        for side, node, pub, sub in (("n1", n1, pub1, sub1), ("n3", n3, pub3, sub3)):
            assert pub.client.is_connected() and sub.client.is_connected(), \
                f"a client of {side} was disconnected by the partition"
            fresh = _client(node.mqtt_port, f"new-{side}")
            clients.append(fresh)
            fresh.subscribe(f"{topic}/local-{side}", 1)
            payloads = {f"{side}-{i}".encode() for i in range(20)}
            for p in payloads:
                pub.publish(f"{topic}/local-{side}", p, qos=1)
            fresh.wait_count(20, timeout=10, topic=f"{topic}/local-{side}")
            sub.wait_count(20, timeout=10, topic=f"{topic}/local-{side}")
            assert payloads <= _payloads(fresh, f"{topic}/local-{side}"), \
                f"{side} did not serve its clients during the partition"
            assert payloads <= _payloads(sub, f"{topic}/local-{side}")
        assert n1.ready() and n3.ready(), "a node reported not ready during the partition"
        # the partition is real: nothing crosses it (QoS 1: the origin queues it for the peer)
        during = {f"d{i}".encode() for i in range(50)}
        for p in during:
            pub1.publish(f"{topic}/during-to3", p, qos=1, wait=False)
            pub3.publish(f"{topic}/during-to1", p, qos=1, wait=False)
        time.sleep(2.0)
        assert not _payloads(sub3, f"{topic}/during-to3"), "n1 reached n3 across the partition"
        assert not _payloads(sub1, f"{topic}/during-to1"), "n3 reached n1 across the partition"

        cluster.heal("n3")
        took3 = wait_route(pub1, sub3, f"{topic}/after-to3", timeout=60)
        took1 = wait_route(pub3, sub1, f"{topic}/after-to1", timeout=60)
        print(f"cross-node delivery back {took3:.1f}s (n1->n3) / {took1:.1f}s (n3->n1) "
              "after reconnecting")
        sent = {f"a{i}".encode() for i in range(100)}
        for p in sent:
            pub1.publish(f"{topic}/again", p, qos=1, wait=False)
            pub3.publish(f"{topic}/again", p + b"-3", qos=1, wait=False)
        deadline = time.monotonic() + 20
        want3 = sent | {p + b"-3" for p in sent}
        while time.monotonic() < deadline and not (
                want3 <= _payloads(sub3, f"{topic}/again")
                and want3 <= _payloads(sub1, f"{topic}/again")):
            time.sleep(0.05)
        for name, sub in (("n1", sub1), ("n3", sub3)):
            missing = want3 - _payloads(sub, f"{topic}/again")
            assert not missing, f"after the partition {name} missed {len(missing)} messages"
        # what was published during the partition was queued by its origin and arrives now
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                during <= _payloads(sub3, f"{topic}/during-to3")
                and during <= _payloads(sub1, f"{topic}/during-to1")):
            time.sleep(0.1)
        for name, sub, t in (("n3", sub3, "during-to3"), ("n1", sub1, "during-to1")):
            missing = during - _payloads(sub, f"{topic}/{t}")
            assert not missing, (f"{len(missing)} of {len(during)} QoS 1 messages published "
                                 f"during the partition never reached {name}")
    finally:
        for c in clients:
            c.close()


def test_crashed_sidecar_restarts_in_its_container_and_clients_stay_connected(cluster: Cluster):
    """The entrypoint restarts a crashed sidecar in place; it adopts the running Mosquitto."""
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    topic = f"crash/{uuid.uuid4().hex[:6]}"
    sub = _client(n1.mqtt_port, "sub-n1")
    pub = _client(n2.mqtt_port, "pub-n2")
    try:
        sub.subscribe(f"{topic}/#", 1)
        wait_route(pub, sub, f"{topic}/before")
        before = n1.state()
        code, out = n1.exec("sh", "-c", f"kill -9 {before['pid']}")
        assert code == 0, out
        deadline = time.monotonic() + 30
        after: dict = {}
        while time.monotonic() < deadline:
            after = n1.state()
            if after.get("pid") not in (None, before["pid"]) and after.get("ready"):
                break
            time.sleep(0.2)
        assert after.get("pid") != before["pid"] and after.get("ready"), \
            f"the sidecar did not come back: {after.get('pid')}, ready {after.get('ready')}"
        assert after["mosquitto_pid"] == before["mosquitto_pid"], "Mosquitto was restarted"
        assert sub.client.is_connected(), "the sidecar's crash disconnected a client"
        try:
            wait_route(pub, sub, f"{topic}/after", timeout=30)
        except AssertionError as exc:  # name what was not up (this test failed once in CI)
            raise AssertionError(f"{exc}; n1: {_routing_summary(n1.state())};"
                                 f" n2: {_routing_summary(n2.state())}") from None
    finally:
        sub.close()
        pub.close()
