"""Retained messages on real clusters: replication, Retain Handling, deletes, conflicting
writes, a restarted Mosquitto, a partition that heals, Message Expiry."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import threading
import time

from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.harness.procs import pid_alive, wait_for
from tests.system.node.mqtt import Client
from tests.system.retained.helpers import (
    expiry_props,
    index_values,
    index_versions,
    read_retained,
    retained_status,
    wait_converged,
)

NODES = ["n1", "n2", "n3"]


def _client(cluster, node: str, cid: str) -> Client:
    client = Client(cluster.ports[node], cid)
    assert client.wait_connected(), f"{cid} could not connect to {node}"
    return client


def _subscribe(client: Client, filt: str, rh: int, rap: bool = False) -> None:
    done = threading.Event()
    client.client.on_subscribe = lambda *a: done.set()
    client.client.subscribe(filt, options=SubscribeOptions(
        qos=1, retainHandling=rh, retainAsPublished=rap))
    assert done.wait(5), f"no SUBACK for {filt}"


def test_set_anywhere_read_everywhere_once_then_delete_everywhere(cluster_factory):
    cluster = cluster_factory(3)
    live = {n: _client(cluster, n, f"live-{n}") for n in NODES}
    for node, client in live.items():
        _subscribe(client, "cfg/#", rh=0, rap=(node == "n2"))
    pub = _client(cluster, "n1", "pub-n1")
    pub.publish("cfg/a", b"v1", qos=1, retain=True)
    wait_converged(cluster, NODES, 1)
    time.sleep(0.5)
    for node, client in live.items():  # live subscribers: exactly once, on every node
        got = [(m.topic, m.payload) for m in client.messages]
        assert got == [("cfg/a", b"v1")], (node, got)
    assert live["n2"].messages[0].retain, "Retain As Published keeps the flag (remote node)"
    assert not live["n3"].messages[0].retain
    assert not live["n1"].messages[0].retain

    for node in ("n2", "n3"):
        # Retain Handling 0: sent at every subscribe, with the retain flag
        rh0 = _client(cluster, node, f"rh0-{node}")
        _subscribe(rh0, "cfg/#", rh=0)
        got = rh0.wait_count(1)
        assert [(m.topic, m.payload, m.retain) for m in got] == [("cfg/a", b"v1", True)]
        _subscribe(rh0, "cfg/#", rh=0)
        assert len(rh0.wait_count(2)) == 2, "RH 0 sends again on a repeated subscribe"
        # Retain Handling 1: only if the subscription is new
        rh1 = _client(cluster, node, f"rh1-{node}")
        _subscribe(rh1, "cfg/#", rh=1)
        assert [m.payload for m in rh1.wait_count(1)] == [b"v1"]
        _subscribe(rh1, "cfg/#", rh=1)
        # Retain Handling 2: never
        rh2 = _client(cluster, node, f"rh2-{node}")
        _subscribe(rh2, "cfg/#", rh=2)
        time.sleep(0.5)
        assert len(rh1.messages) == 1, "RH 1 sends nothing on a repeated subscribe"
        assert rh2.messages == [], "RH 2 never sends retained messages"
        for c in (rh0, rh1, rh2):
            c.close()

    deleter = _client(cluster, "n3", "del-n3")
    deleter.publish("cfg/a", b"", qos=1, retain=True)
    wait_converged(cluster, NODES, 1)
    wait_for(lambda: all(retained_status(cluster, n)["tombstones"] == 1 for n in NODES), 10,
             "the delete everywhere")
    wait_converged(cluster, NODES, 1)
    for node in NODES:
        assert read_retained(cluster.ports[node], "cfg/#") == {}, f"deleted on {node}"
        status = retained_status(cluster, node)
        assert (status["live"], status["tombstones"]) == (0, 1), (node, status)
    time.sleep(0.3)
    for node, client in live.items():  # the delete reaches live subscribers once, too
        assert [m.payload for m in client.messages] == [b"v1", b""], node
    for c in (*live.values(), pub, deleter):
        c.close()


def _writer(port: int, cid: str, topics: list[str], count: int, errors: list) -> None:
    try:
        client = Client(port, cid)
        assert client.wait_connected()
        rng = random.Random(cid)
        infos = [client.client.publish(rng.choice(topics), f"{cid}:{i}".encode(),
                                       qos=rng.choice((0, 1, 2)), retain=True)
                 for i in range(count)]
        for info in infos:
            info.wait_for_publish(30)
        client.close()
    except Exception as exc:  # pragma: no cover - reported by the test
        errors.append(exc)


def _values(cluster, nodes: list[str], filt: str) -> dict[str, dict[str, bytes]]:
    return {n: read_retained(cluster.ports[n], filt) for n in nodes}


def test_conflicting_writes_from_three_nodes_converge(cluster_factory):
    cluster = cluster_factory(3)
    topics = [f"conflict/{i}" for i in range(25)]
    errors: list = []
    threads = [threading.Thread(target=_writer, args=(cluster.ports[n], f"w-{n}", topics,
                                                      334 if n != "n3" else 332, errors))
               for n in NODES]  # 1,000 writes at once
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors

    def processed() -> bool:  # every local write was accepted or found overwritten locally
        return all(sum(retained_status(cluster, n).get(k, 0) for k in (
            "local_accepted", "local_overwritten")) == (334 if n != "n3" else 332)
            for n in NODES)

    wait_for(processed, 60, "every write processed by its node")
    digest = wait_converged(cluster, NODES, len(topics), timeout=60)
    values = _values(cluster, NODES, "conflict/#")
    for node in NODES:
        assert values[node] == index_values(cluster, node), f"{node}'s Mosquitto = its index"
    assert values["n1"] == values["n2"] == values["n3"], "every Mosquitto holds the same"
    assert set(values["n1"]) == set(topics)
    # the winner: each write is in its own node's file, which keeps a topic's highest version
    versions = {n: index_versions(cluster, n) for n in NODES}
    winners = {t: max(versions[n][t] for n in NODES) for t in topics}
    for node in NODES:
        assert versions[node] == winners, f"{node} holds the highest-HLC write of every topic"
        assert values[node] == {t: v[2] for t, v in winners.items()}, node
    assert {retained_status(cluster, n)["digest"] for n in NODES} == {digest}
    accepted = sum(retained_status(cluster, n)["local_accepted"] for n in NODES)
    assert accepted > 25, "writes from several nodes were accepted"


def _node_pid(cluster, node: str, key: str) -> int:
    return cluster.state(node).get(key) or 0


def test_restarted_mosquitto_gets_the_retained_set_back(cluster_factory):
    cluster = cluster_factory(3)
    pub = _client(cluster, "n1", "pub-restart")
    for i in range(50):
        pub.publish(f"keep/{i}", f"v{i}".encode(), qos=1, retain=True, wait=False)
    pub.publish("keep/gone", b"x", qos=1, retain=True)
    pub.publish("keep/gone", b"", qos=1, retain=True)
    wait_converged(cluster, NODES, 51)
    wait_for(lambda: all(retained_status(cluster, n)["tombstones"] == 1 for n in NODES), 10,
             "the delete everywhere")
    wait_converged(cluster, NODES, 51)
    expected = {f"keep/{i}": f"v{i}".encode() for i in range(50)}
    assert read_retained(cluster.ports["n2"], "keep/#") == expected
    old = _node_pid(cluster, "n2", "mosquitto_pid")
    sidecar = _node_pid(cluster, "n2", "pid")
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: _node_pid(cluster, "n2", "mosquitto_pid") not in (0, old)
             and cluster.state("n2").get("ready"), 30, "n2's Mosquitto restarted")
    assert pid_alive(sidecar) and _node_pid(cluster, "n2", "pid") == sidecar, "sidecar stayed"
    wait_for(lambda: read_retained(cluster.ports["n2"], "keep/#", quiet=0.3) == expected, 20,
             "n2's retained set is back")
    pub.close()


def _block(cluster, node: str, peers: list[str]) -> None:
    (cluster.run_dir / "nodes" / node / "blocked-peers").write_text("\n".join(peers))


def _unblock(cluster, node: str) -> None:
    (cluster.run_dir / "nodes" / node / "blocked-peers").unlink(missing_ok=True)


def _cut(cluster, node: str, other: str) -> bool:
    peers = cluster.routing(node).get("peers", {})
    return peers.get(other, {}).get("outbound", {}).get("state") != "up"


def test_partition_with_conflicting_writes_heals(cluster_factory):
    cluster = cluster_factory(3)
    pub1 = _client(cluster, "n1", "pub-part-1")
    for i in range(20):
        pub1.publish(f"part/{i}", b"before", qos=1, retain=True)
    wait_converged(cluster, NODES, 20)
    _block(cluster, "n1", ["n2", "n3"])
    for node in ("n2", "n3"):
        _block(cluster, node, ["n1"])
    wait_for(lambda: all(_cut(cluster, a, b) for a, b in (("n1", "n2"), ("n1", "n3"),
                                                          ("n2", "n1"), ("n3", "n1"))),
             15, "streams between {n1} and {n2, n3} cut")
    pub3 = _client(cluster, "n3", "pub-part-3")
    for i in range(20):  # both sides write the same topics, side b later; b deletes some
        pub1.publish(f"part/{i}", b"side-a", qos=1, retain=True)
    pub1.publish("part/only-a", b"a", qos=1, retain=True)
    wait_for(lambda: retained_status(cluster, "n1")["local_accepted"] == 41, 10,
             "side a's writes stamped")
    for i in range(20):
        pub3.publish(f"part/{i}", b"side-b" if i % 4 else b"", qos=1, retain=True)
    pub3.publish("part/only-b", b"b", qos=1, retain=True)
    wait_for(lambda: read_retained(cluster.ports["n2"], "part/only-b", quiet=0.2) == {
        "part/only-b": b"b"}, 10, "side b's writes replicated within side b")
    a_side, b_side = read_retained(cluster.ports["n1"], "part/#"), \
        read_retained(cluster.ports["n2"], "part/#")
    assert "part/only-b" not in a_side and "part/only-a" not in b_side, "really partitioned"
    for node in NODES:
        _unblock(cluster, node)
    cluster.wait_meshed()
    wait_converged(cluster, NODES, 22, timeout=60)
    values = _values(cluster, NODES, "part/#")
    assert values["n1"] == values["n2"] == values["n3"]
    assert values["n1"]["part/only-a"] == b"a" and values["n1"]["part/only-b"] == b"b"
    # the later write wins per topic (side b wrote after side a's were stamped)
    for i in range(20):
        assert values["n1"].get(f"part/{i}") == (b"side-b" if i % 4 else None), i
    pub1.close()
    pub3.close()


def test_message_expiry_is_honoured_on_every_node(cluster_factory):
    cluster = cluster_factory(3)
    pub = _client(cluster, "n1", "pub-expiry")
    pub.publish("exp/short", b"soon gone", qos=1, retain=True, properties=expiry_props(3))
    pub.publish("exp/long", b"stays", qos=1, retain=True, properties=expiry_props(3600))
    wait_converged(cluster, NODES, 2)
    for node in ("n2", "n3"):
        reader = _client(cluster, node, f"exp-reader-{node}")
        _subscribe(reader, "exp/#", rh=0)
        got = {m.topic: m for m in reader.wait_count(2)}
        assert set(got) == {"exp/short", "exp/long"}, node
        short = got["exp/short"].properties.MessageExpiryInterval
        assert 1 <= short <= 3, (node, short)
        assert 3500 <= got["exp/long"].properties.MessageExpiryInterval <= 3600
        reader.close()
    time.sleep(3.5)
    for node in NODES:
        assert read_retained(cluster.ports[node], "exp/#") == {"exp/long": b"stays"}, node
        wait_for(lambda n=node: retained_status(cluster, n).get("expired") == 1, 5,
                 f"the expired entry counted on {node}")
    pub.close()


def test_new_node_receives_every_retained_message(cluster_factory):
    from tests.system.cluster.conftest import mqfed

    cluster = cluster_factory(3)
    pub = _client(cluster, "n2", "pub-join")
    for i in range(300):
        pub.publish(f"boot/{i}", f"p{i}".encode(), qos=1, retain=True, wait=False)
    pub.publish("boot/deleted", b"x", qos=1, retain=True)
    pub.publish("boot/deleted", b"", qos=1, retain=True)
    wait_for(lambda: all(retained_status(cluster, n).get("tombstones") == 1 for n in NODES),
             20, "the delete everywhere")
    digest = wait_converged(cluster, NODES, 301)
    result = mqfed("add-node", "--run-dir", str(cluster.run_dir), "--json")
    assert result.returncode == 0, result.stderr
    entry = json.loads(result.stdout)
    node = entry["id"]
    cluster.ports[node] = int(entry["mqtt"].rpartition(":")[2])
    assert wait_converged(cluster, [*NODES, node], 301, timeout=60) == digest
    expected = {f"boot/{i}": f"p{i}".encode() for i in range(300)}
    assert read_retained(cluster.ports[node], "boot/#") == expected
    status = retained_status(cluster, node)
    assert status["tombstones"] == 1 and status["live"] == 300
    pub.close()


def test_shared_group_gets_a_retained_publish_once_cluster_wide(cluster_factory):
    cluster = cluster_factory(3)
    members = {n: _client(cluster, n, f"member-{n}") for n in NODES}
    for client in members.values():
        client.subscribe("$share/g/sh/#", qos=1)
    plain = _client(cluster, "n3", "plain-n3")
    plain.subscribe("sh/#", qos=1)
    for node in NODES:
        wait_for(lambda n=node: ["g", "sh/#"] in [r[:2] for r in cluster.state(n).get(
            "interest", [])], 10, f"shared interest on {node}")
    cluster.wait_interest("n3", "sh/#")
    pubs = {n: _client(cluster, n, f"sh-pub-{n}") for n in NODES}
    for i in range(30):
        pubs[NODES[i % 3]].publish(f"sh/{i}", f"m{i}".encode(), qos=1, retain=True)
    wait_converged(cluster, NODES, 30)
    wait_for(lambda: sum(len(c.messages) for c in members.values()) >= 30
             and len(plain.messages) >= 30, 10, "every publish delivered")
    time.sleep(0.5)  # settle: a second copy to the group would come now
    got = sorted(m.payload for c in members.values() for m in c.messages)
    assert got == sorted(f"m{i}".encode() for i in range(30)), "once per group, cluster-wide"
    assert sorted(m.payload for m in plain.messages) == sorted(f"m{i}".encode()
                                                               for i in range(30))
    for c in (*members.values(), plain, *pubs.values()):
        c.close()


def test_returning_node_repopulates_from_its_sqlite_index_then_catches_up(cluster_factory):
    """n2 stops (sidecar and Mosquitto); while it is away n1 changes the retained set. n2
    starts cut off from its peers: its new Mosquitto gets what its SQLite index held; once the
    streams come up, anti-entropy brings the changes."""
    from tests.system.cluster.conftest import mqfed

    cluster = cluster_factory(3)
    pub = _client(cluster, "n1", "pub-return")
    for i in range(40):
        pub.publish(f"ret/{i}", b"old", qos=1, retain=True)
    wait_converged(cluster, NODES, 40)
    result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n2")
    assert result.returncode == 0, result.stderr
    pub.publish("ret/0", b"", qos=1, retain=True)
    pub.publish("ret/1", b"new", qos=1, retain=True)
    pub.publish("ret/new", b"new", qos=1, retain=True)
    wait_converged(cluster, ["n1", "n3"], 41)
    _block(cluster, "n2", ["n1", "n3"])
    result = mqfed("start-node", "--run-dir", str(cluster.run_dir), "n2")
    assert result.returncode == 0, result.stderr
    old = {f"ret/{i}": b"old" for i in range(40)}
    wait_for(lambda: read_retained(cluster.ports["n2"], "ret/#", quiet=0.3) == old, 20,
             "n2's Mosquitto repopulated from its own index")
    assert retained_status(cluster, "n2")["remote_applied"] == 0, "nothing came from peers"
    _unblock(cluster, "n2")
    wait_converged(cluster, NODES, 41)
    expected = {**old, "ret/1": b"new", "ret/new": b"new"}
    del expected["ret/0"]
    assert read_retained(cluster.ports["n2"], "ret/#") == expected
    pub.close()


def test_old_tombstones_and_expired_messages_are_forgotten_everywhere(cluster_factory):
    """With `retained.tombstone_grace` = 8 s, deletes and expired messages are forgotten on
    every node (index and SQLite) once that old, the digests agree again, values stay, and
    a node joining afterwards is not sent them."""
    from tests.system.cluster.conftest import mqfed

    cluster = cluster_factory(3, env={"MQFED_RETAINED_TOMBSTONE_GRACE": "8"})
    pub = _client(cluster, "n1", "pub-purge")
    for i in range(4):
        pub.publish(f"gc/{i}", b"v", qos=1, retain=True)
    pub.publish("gc/expiring", b"short", qos=1, retain=True, properties=expiry_props(1))
    wait_converged(cluster, NODES, 5)  # a delete racing the value's arrival may lose to it
    deleter = _client(cluster, "n2", "del-purge")
    for i in range(2):
        deleter.publish(f"gc/{i}", b"", qos=1, retain=True)
    wait_for(lambda: all(retained_status(cluster, n).get("tombstones") == 2 for n in NODES),
             20, "the deletes everywhere")
    wait_for(lambda: all(retained_status(cluster, n).get("purged") == 3 for n in NODES), 30,
             "2 tombstones and 1 expired message forgotten on every node")
    digest = wait_converged(cluster, NODES, 2)
    for node in NODES:
        status = retained_status(cluster, node)
        assert (status["live"], status["tombstones"], status["expired"]) == (2, 0, 0), node
        assert read_retained(cluster.ports[node], "gc/#") == {"gc/2": b"v", "gc/3": b"v"}
        db = sqlite3.connect(f"file:{cluster.run_dir / 'nodes' / node / 'retained.sqlite'}"
                             "?mode=ro", uri=True)
        assert sorted(r[0] for r in db.execute("SELECT topic FROM retained")) == [
            "gc/2", "gc/3"], node
        db.close()
        metrics = cluster.metrics(node)
        assert metrics[("mqfed_retained_purged_total", ())] == 3
        assert metrics[("mqfed_retained_entries", (("kind", "tombstones"),))] == 0
    result = mqfed("add-node", "--run-dir", str(cluster.run_dir), "--json",
                   env={"MQFED_RETAINED_TOMBSTONE_GRACE": "8"})
    assert result.returncode == 0, result.stderr
    entry = json.loads(result.stdout)
    cluster.ports[entry["id"]] = int(entry["mqtt"].rpartition(":")[2])
    assert wait_converged(cluster, [*NODES, entry["id"]], 2, timeout=60) == digest
    assert retained_status(cluster, entry["id"])["tombstones"] == 0
    pub.close()
    deleter.close()
