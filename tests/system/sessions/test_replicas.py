"""Replicas (issue 17): a session's queued messages outlive its owner node. With the default
`sessions.replicas = 2`, the owner and one other node hold them; the owner is killed with -9
(Mosquitto and sidecar) and the client resumes on another node with nothing lost."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.sessions.clients import Device, publish


def _replica_node(cluster, owner: str) -> str:
    """The node whose copy of the (only) session queues, once there is one."""
    others = [n for n in ("n1", "n2", "n3") if n != owner]

    def queueing() -> list[str]:
        return [n for n in others
                if (cluster.state(n).get("cluster_sessions") or {}).get("replicas_queueing")]
    wait_for(lambda: len(queueing()) == 1, 15, "one replica queueing")
    return queueing()[0]


def _kill(cluster, node: str) -> None:
    result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), node, "--kill")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("resume_on", ["replica", "other"])
def test_owner_killed_while_the_client_is_offline_loses_nothing(own_cluster, resume_on):
    cluster = own_cluster
    topic = f"replica/{resume_on}"
    dev = Device(f"dev-{time.time_ns()}")
    assert dev.connect(cluster.ports["n1"], clean=True) is False
    dev.subscribe(topic, 1)
    cluster.wait_interest("n1", topic)
    dev.leave()
    replica = _replica_node(cluster, "n1")
    other = ({"n2", "n3"} - {replica}).pop()
    publish(cluster.ports[other], topic, 200)
    _kill(cluster, "n1")
    started = time.monotonic()
    target = replica if resume_on == "replica" else other
    assert dev.connect(cluster.ports[target], timeout=20) is True, "session present"
    took = time.monotonic() - started
    got = dev.wait_count(200, timeout=20)
    assert got == list(range(200)), f"got {len(got)}; missing " \
        f"{sorted(set(range(200)) - set(got))[:10]}"
    print(f"resumed on the {resume_on} node {target} {took:.2f} s after the kill")
    # its subscription survived too
    publish(cluster.ports[replica], topic, 10, start=200)
    assert dev.wait_count(210)[200:] == list(range(200, 210))
    dev.leave()


def test_owner_killed_with_the_client_online_loses_nothing(own_cluster):
    """The replica, held while its client is online, keeps what it refused for a while and,
    once the owner has been down for the grace, replays it from the kill minus the margin,
    with the messages' v5 properties (each carries its number as a user property)."""
    cluster = own_cluster
    topic = "replica/online"
    dev = Device(f"dev-{time.time_ns()}")
    dev.connect(cluster.ports["n1"], clean=True)
    dev.subscribe(topic, 1)
    cluster.wait_interest("n1", topic)
    # a replica exists (held: its client is online)
    wait_for(lambda: sum((cluster.state(n).get("cluster_sessions") or {}).get("replicas", 0)
                         for n in ("n2", "n3")) == 1, 15, "a replica")
    pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id=f"pub-{time.time_ns()}", protocol=mqtt.MQTTv5)
    acked: set[int] = set()
    numbers: dict[int, int] = {}
    lock = threading.Lock()

    def on_publish(client, userdata, mid, reason_code, properties) -> None:
        if not reason_code.is_failure:
            with lock:
                acked.add(mid)

    pub.on_publish = on_publish
    pub.connect("127.0.0.1", cluster.ports["n2"])
    pub.loop_start()
    stop = threading.Event()

    def run() -> None:
        i = 0
        while not stop.is_set():
            # not under `lock`: paho calls on_publish holding its own lock, which publish takes
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [("n", str(i))]
            mid = pub.publish(topic, str(i), qos=1, properties=props).mid
            with lock:
                numbers[mid] = i
            i += 1
            time.sleep(0.003)

    sender = threading.Thread(target=run)
    sender.start()
    try:
        time.sleep(1.5)
        _kill(cluster, "n1")
        dev.client.disconnect()
        dev.client.loop_stop()
        assert dev.connect(cluster.front, timeout=20) is True, "session present"
        time.sleep(3.0)
    finally:
        stop.set()
        sender.join()
    with lock:
        sent = {numbers[m] for m in acked if m in numbers}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not sent <= set(dev.payloads()):
        time.sleep(0.1)
    got = dev.payloads()
    lost = sorted(sent - set(got))
    print(f"acknowledged {len(sent)}, received {len(got)}, duplicates "
          f"{len(got) - len(set(got))}, lost {len(lost)}")
    assert not lost, f"lost {len(lost)} acknowledged messages: {lost[:20]}"
    bare = [m.payload for m in dev.messages
            if getattr(m.properties, "UserProperty", None) != [("n", m.payload.decode())]]
    assert not bare, f"{len(bare)} of {len(dev.messages)} without their properties: {bare[:10]}"
    pub.loop_stop()
    dev.leave()


def _partition(cluster, sides: dict[str, list[str]]) -> None:
    """Fault injection: each node refuses streams with the nodes listed for it (a file the
    sidecar reads; empty lists heal)."""
    for node, blocked in sides.items():
        (cluster.run_dir / "nodes" / node / "blocked-peers").write_text(" ".join(blocked))


def _stream(cluster, node: str, other: str) -> str | None:
    peers = cluster.routing(node).get("peers", {})
    return peers.get(other, {}).get("outbound", {}).get("state")


def test_a_partition_heals_into_one_registry_where_the_latest_connect_wins(own_cluster):
    """n1 | n2 n3: the session's client, offline on n1, resumes on n2 while messages wait on
    n1's side. Healed, every node agrees on n2 and n1 hands over what it queued."""
    cluster = own_cluster
    topic = "partition/x"
    dev = Device(f"dev-{time.time_ns()}")
    dev.connect(cluster.ports["n1"], clean=True)
    dev.subscribe(topic, 1)
    cluster.wait_interest("n1", topic)
    dev.leave()
    _replica_node(cluster, "n1")
    _partition(cluster, {"n1": ["n2", "n3"], "n2": ["n1"], "n3": ["n1"]})
    try:
        wait_for(lambda: _stream(cluster, "n2", "n1") != "up"
                 and _stream(cluster, "n1", "n2") != "up", 15, "the partition")
        publish(cluster.ports["n1"], topic, 20)  # queued on n1's side only
        assert dev.connect(cluster.ports["n2"], timeout=20) is True, "session present"
        publish(cluster.ports["n3"], topic, 20, start=20)
        got = dev.wait_count(20)
        assert set(range(20, 40)) <= set(got), f"missing {sorted(set(range(20, 40)) - set(got))}"
        wait_for(lambda: {(cluster.state(n).get("cluster_sessions") or {}).get("owned")
                          for n in ("n1", "n2")} == {1}, 5,
                 "both sides owning it during the partition")
    finally:
        _partition(cluster, {"n1": [], "n2": [], "n3": []})
    cluster.wait_meshed()
    got = dev.wait_count(40, timeout=20)
    assert set(got) == set(range(40)), f"missing {sorted(set(range(40)) - set(got))}"

    def owners() -> set[int]:
        return {(cluster.state(n).get("cluster_sessions") or {}).get("owned", 0)
                for n in ("n1", "n2", "n3")}
    wait_for(lambda: sorted(owners()) == [0, 1], 10, "one owner")
    assert (cluster.state("n2").get("cluster_sessions") or {}).get("owned") == 1
    twice = sorted({n for n in got if got.count(n) > 1})
    print(f"received {len(got)} of 40, duplicates {len(got) - len(set(got))}: {twice[:20]}")
    publish(cluster.ports["n1"], topic, 5, start=40)  # one subscription, on n2
    assert dev.wait_count(45)[-5:] == list(range(40, 45))
    dev.leave()
