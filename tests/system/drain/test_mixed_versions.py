"""Mixed versions (issue 20): nodes of an earlier commit (`MQFED_OLD_COMMIT`, default the last
1.1 release of the peer protocol) run beside nodes of this tree. They route live traffic and
retained messages both ways, `ctl status` names the features that are off between them, and
an upgrade of the old nodes one by one (their own graceful stop, then this version on the
same run dir) under QoS 1 traffic from a publisher through the front loses nothing for the
persistent subscribers of the new node. Builds the old version itself (git archive, its
plugin, its protobuf code).

Not shown here: subscribers on the old nodes themselves. A node of 1.2 or earlier has no
drain, and its graceful stop does not wait for the sessions leaving it to move, so what it
held for a client that resumed elsewhere during its stop can be lost (docs/operations.md,
"Upgrading from a version without drain")."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import REPO, connect, mqfed
from tests.system.drain import versions
from tests.system.drain.traffic import TracedDevice, TracedPublisher, new_writer
from tests.system.drain.versions import OLD_COMMIT, MixedCluster

SUBSCRIBERS = 20
RATE = 100.0


@pytest.fixture(scope="module")
def old_tree() -> Iterator[Path]:
    with versions.old_tree(OLD_COMMIT) as tree:
        yield tree


def _retained(port: int, topic: str, timeout: float = 10.0) -> bytes | None:
    """The retained message a new subscriber on `port` gets for `topic`."""
    probe = connect(port)
    try:
        probe.subscribe(topic)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = [p for t, p in probe.messages if t == topic]
            if got:
                return got[-1]
            time.sleep(0.05)
        return None
    finally:
        probe.close()


def _live(cluster: MixedCluster, src: str, dst: str, topic: str) -> None:
    """A message published on `src` reaches a subscriber on `dst` (published again until it
    does: the subscription takes a moment to be routed)."""
    sub = connect(cluster.port(dst))
    pub = connect(cluster.port(src))
    try:
        sub.subscribe(topic)

        def arrived() -> bool:
            pub.publish(topic, b"live")
            return sub.received(topic, b"live")
        wait_for(arrived, 15, f"live {src} -> {dst}", interval=0.3)
    finally:
        pub.close()
        sub.close()


def _kept(cluster: MixedCluster, src: str, dst: str, topic: str) -> None:
    """A retained message written on `src` is read by a new subscriber on `dst`."""
    writer = connect(cluster.port(src))
    writer.client.publish(topic, f"from {src}".encode(), qos=1, retain=True).wait_for_publish(5)
    writer.close()
    wait_for(lambda: _retained(cluster.port(dst), topic, 1.0) == f"from {src}".encode(), 20,
             f"retained {src} -> {dst}")


def _both_ways(cluster: MixedCluster, a: str, b: str, run: str) -> None:
    """Live and retained messages from `a` to `b` and back."""
    for src, dst in ((a, b), (b, a)):
        _live(cluster, src, dst, f"mixed/{run}/{src}-{dst}")
        _kept(cluster, src, dst, f"mixed/{run}/retained/{src}")


def test_mixed_versions_route_both_ways_and_an_upgrade_node_by_node_loses_nothing(
        mixed, old_tree, tmp_path):
    cluster = mixed
    run = uuid.uuid4().hex[:6]
    cluster.start_etcd()
    for ident, tree in (("n1", old_tree), ("n2", old_tree), ("n3", REPO)):
        cluster.start_node(ident, tree)
    for ident in cluster.nodes:
        cluster.wait_ready(ident)
    cluster.wait_meshed()
    cluster.start_front()
    _both_ways(cluster, "n1", "n3", run)

    status = mqfed("ctl", "--node", cluster.admin("n3"), "--json", "status")
    assert status.returncode in (0, 4), status.stderr  # the 1.1 nodes answer too
    links = {(s["node_id"], p["peer"]): p for s in json.loads(status.stdout)["statuses"]
             for p in s.get("peers", [])}
    old = links[("n3", "n1")]
    assert old["protocol"] == "1.1"
    assert old["features_off"] == ["catch-up", "drain", "records", "session-claims",
                                   "session-cuts", "session-cuts-anywhere", "session-order",
                                   "session-replicas", "wills"]
    text = mqfed("ctl", "--node", cluster.admin("n3"), "status").stdout
    assert "mixed versions" in text and "neither publishes the other's wills" in text
    refused = mqfed("ctl", "--node", cluster.admin("n3"), "drain", "n1")
    assert refused.returncode == 1 and "n1 has no drain" in refused.stderr

    # under traffic: persistent subscribers on the new node, a QoS 1 publisher through the
    # front (it moves from node to node as they are upgraded)
    traces = tmp_path / "traces"
    topics = [f"up/{run}/{i}" for i in range(SUBSCRIBERS)]
    writer = new_writer(traces, f"pub-{run}-0")
    devices = [TracedDevice(f"up-{run}-{i}") for i in range(SUBSCRIBERS)]
    publisher = None
    upgrades = []
    try:
        for dev, topic in zip(devices, topics, strict=True):
            assert dev.connect(cluster.port("n3")) is False
            dev.subscribe(topic, 1)
        publisher = TracedPublisher(cluster.front, topics, RATE, writer, run)

        def warm() -> bool:
            cold = [t for d, t in zip(devices, topics, strict=True)
                    if not any(m.payload == b"warm-up" for m in d.messages)]
            for topic in cold:
                publisher.client.publish(topic, b"warm-up", qos=1)
            return not cold
        wait_for(warm, 30, "every subscriber's warm-up message", interval=0.5)
        publisher.start()
        for ident in ("n1", "n2"):  # the old nodes, one after the other
            time.sleep(2)
            started = time.monotonic()
            cluster.stop_node(ident)
            cluster.start_node(ident, REPO)
            cluster.wait_ready(ident)
            cluster.wait_meshed()
            upgrades.append(f"{ident} {time.monotonic() - started:.1f}s")
        _both_ways(cluster, "n1", "n2", run + "b")  # all new now
        text = mqfed("ctl", "--node", cluster.admin("n1"), "status").stdout
        assert "mixed versions" not in text
        time.sleep(2)
        publisher.stop()
        assert len(publisher.acked) == len(publisher.sent), "publishes never acknowledged"
        expected = {t: {s for s, topic in publisher.sent.items() if topic == t} for t in topics}
        for dev, topic in zip(devices, topics, strict=True):
            try:
                wait_for(lambda d=dev, t=topic: d.seqs() >= expected[t], 20,
                         f"{dev.client_id}'s messages")
            except TimeoutError:
                pass  # counted below
    finally:
        writer.close()
        if publisher is not None:
            publisher.close()
        for dev in devices:
            dev.leave()
    lost = {dev.client_id: sorted(expected[t] - dev.seqs())
            for dev, t in zip(devices, topics, strict=True) if expected[t] - dev.seqs()}
    copies = sum(len(dev.copies) for dev in devices)
    print(f"upgraded {', '.join(upgrades)} from {OLD_COMMIT}: {len(publisher.sent)} published, "
          f"{copies} copies, {sum(map(len, lost.values()))} lost, "
          f"{copies - sum(len(dev.seqs()) for dev in devices)} duplicates (and warm-ups), "
          f"publisher moved {publisher.reconnects} times")
    assert not lost, {c: (len(s), s[:5]) for c, s in lost.items()}
    assert publisher.reconnects >= 1, "the publisher was moved by an upgrade"
