"""`mqfed bench --sessions N`: what persistent sessions cost, on a real 3-node cluster.

1. make: N MQTT 5 clients (session expiry 1 h) connect to n1, n2, n3 in turn, subscribe one
   filter each and leave: time until every node's registry holds them all, and the memory each
   sidecar and Mosquitto grew by per session;
2. join: `mqfed add-node`, then the time until the new node holds every record and keeps every
   one of those clients off until it has made its session (its deny list);
3. handover: `moves` of those sessions resumed on another node than their owner, one after the
   other: time from CONNECT to a CONNACK with session present (the refused first CONNECT and
   paho's reconnect, 0.05 s minimum here, included), p50 and p99;
4. live traffic: `messages` QoS 1 messages published flat out on n2 to a subscriber on n1,
   before the sessions are made and again with them (and their replicas) in place: msgs/s.
Times come from outside (state.json, written every 0.2-0.5 s, counts refreshed once a second).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar.bench.cluster import BenchCluster
from sidecar.bench.scale import _per_10k
from sidecar.bench.scale_state import usage, wait_until

EXPIRY = 3600
WORKERS = 4


@dataclass(frozen=True)
class SessionsOptions:
    run_dir: Path
    base_port: int
    sessions: int = 10_000
    moves: int = 200
    messages: int = 20_000
    queue: int = 8_000
    timeout: float = 300.0


def _connect(port: int, client_id: str, clean: bool, retry: bool = False,
             on_message: Callable[..., None] | None = None) -> tuple[mqtt.Client, bool, float]:
    """A connected paho v5 client, session present, and seconds to the CONNACK."""
    client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                         client_id=client_id, protocol=mqtt.MQTTv5,
                         reconnect_on_failure=retry)
    client.reconnect_delay_set(0.05, 0.5)
    up = threading.Event()
    present: list[bool] = []

    def on_connect(c, u, flags, reason_code, props) -> None:
        if not reason_code.is_failure:
            present.append(bool(flags.session_present))
            up.set()

    client.on_connect = on_connect
    if on_message is not None:
        client.on_message = on_message
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = EXPIRY
    start = time.monotonic()
    client.connect("127.0.0.1", port, 30, clean_start=clean, properties=props)
    client.loop_start()
    if not up.wait(30):
        client.loop_stop()
        raise RuntimeError(f"{client_id}: no CONNACK from 127.0.0.1:{port}")
    return client, present[0], time.monotonic() - start


def _make_one(port: int, client_id: str, topic: str) -> None:
    client, _, _ = _connect(port, client_id, clean=True)
    done = threading.Event()
    client.on_subscribe = lambda *a: done.set()
    client.subscribe(topic, 1)
    if not done.wait(30):
        raise RuntimeError(f"{client_id}: no SUBACK")
    client.disconnect()
    client.loop_stop()


def _records(cluster: BenchCluster, node: str, key: str = "sessions") -> int:
    return int((cluster.state(node).get("cluster_sessions") or {}).get(key) or 0)


def _throughput(cluster: BenchCluster, messages: int, run: str, say) -> dict[str, Any]:
    """`messages` QoS 1 messages flat out from n2 to a subscriber on n1: msgs/s, received."""
    topic = f"sbt/{run}/{time.monotonic_ns()}"
    got, probed = threading.Event(), threading.Event()
    count = [0]

    def on_message(c, u, msg) -> None:
        if msg.topic.endswith("/probe"):
            probed.set()
            return
        count[0] += 1
        if count[0] >= messages:
            got.set()

    sub, _, _ = _connect(cluster.port("n1"), f"sbt-sub-{run}", clean=True)
    sub.on_message = on_message
    done = threading.Event()
    sub.on_subscribe = lambda *a: done.set()
    sub.subscribe(f"{topic}/#", 1)
    done.wait(30)
    pub, _, _ = _connect(cluster.port("n2"), f"sbt-pub-{run}", clean=True)
    for _ in range(100):  # until n2 routes to the subscriber
        pub.publish(f"{topic}/probe", "", qos=1)
        if probed.wait(0.1):
            break
    start = time.monotonic()
    for i in range(messages):
        pub.publish(f"{topic}/d", str(i), qos=1)
    got.wait(120)
    took = time.monotonic() - start
    for c in (pub, sub):
        c.disconnect()
        c.loop_stop()
    say(f"  live traffic: {count[0]:,} of {messages:,} in {took:.1f} s")
    return {"messages": messages, "received": count[0],
            "msgs_per_s": round(count[0] / took) if took else 0}


def _make(cluster: BenchCluster, opts: SessionsOptions, run: str, say) -> dict[str, Any]:
    nodes = [n["id"] for n in cluster.info["nodes"]]
    say(f"make: {opts.sessions:,} persistent sessions over {', '.join(nodes)} ...")
    before = usage(cluster)
    base = {n: _records(cluster, n) for n in nodes}
    start = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        jobs = [pool.submit(_make_one, cluster.port(nodes[i % len(nodes)]),
                            f"sb-{run}-{i}", f"sb/{run}/{i}") for i in range(opts.sessions)]
        for job in jobs:
            job.result()
    made = time.monotonic()
    known = wait_until(lambda: all(_records(cluster, n) - base[n] >= opts.sessions for n in nodes),
                       opts.timeout, "every node to hold every session")
    replicas = wait_until(lambda: sum(_records(cluster, n, "replicas") for n in nodes)
                          >= opts.sessions, opts.timeout, "a replica of every session")
    after = usage(cluster)
    per = _per_10k(before, after, opts.sessions)
    return {"sessions": opts.sessions, "made_s": round(made - start, 1),
            "known_everywhere_after_s": round(known - made, 2),
            "replicated_after_s": round(replicas - made, 2),
            "bytes_per_session": {name: round(v["mem_mib"] * 2**20 / 10_000)
                                  for name, v in per.items()},
            "cpu_s_per_10k": {name: v["cpu_s"] for name, v in per.items()}}


def _join(cluster: BenchCluster, opts: SessionsOptions, say) -> dict[str, Any]:
    say("join: mqfed add-node ...")
    start = time.monotonic()
    entry = cluster.add_node()
    ready = time.monotonic()
    node = entry["id"]
    held = wait_until(lambda: _records(cluster, node) >= opts.sessions, opts.timeout,
                      f"{node} to hold every session")
    denied = wait_until(lambda: int((cluster.state(node).get("cluster_sessions") or {})
                                     .get("denied") or 0) >= opts.sessions, opts.timeout,
                        f"{node} to deny every session held elsewhere")
    return {"node": node, "add_node_s": round(ready - start, 2),
            "records_after_ready_s": round(held - ready, 2),
            "serving_after_ready_s": round(denied - ready, 2)}


def _handover(cluster: BenchCluster, opts: SessionsOptions, run: str, say) -> dict[str, Any]:
    nodes = ["n1", "n2", "n3"]
    moves = min(opts.moves, opts.sessions)
    say(f"handover: {moves} sessions resumed on another node ...")
    times, present = [], 0
    for i in range(moves):
        owner = i % len(nodes)  # where _make connected it
        port = cluster.port(nodes[(owner + 1) % len(nodes)])
        client, sp, took = _connect(port, f"sb-{run}-{i}", clean=False, retry=True)
        present += sp
        times.append(took)
        client.disconnect()
        client.loop_stop()
    times.sort()
    return {"moves": moves, "session_present": present,
            "p50_ms": round(times[len(times) // 2] * 1000, 1),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 1)}


def _queue_move(cluster: BenchCluster, opts: SessionsOptions, run: str,
                say) -> dict[str, Any]:
    """One session with `opts.queue` messages queued on n1 (published on n2 while it is
    offline) resumed on n3: CONNECT until the last message arrives, and their order."""
    say(f"queue move: {opts.queue:,} messages queued on n1, resumed on n3 ...")
    topic, client_id = f"sq/{run}", f"sq-{run}"
    _make_one(cluster.port("n1"), client_id, topic)
    publisher = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                            client_id=f"sqp-{run}", protocol=mqtt.MQTTv5)
    publisher.max_inflight_messages_set(100)
    publisher.connect("127.0.0.1", cluster.port("n2"))
    publisher.loop_start()
    try:
        infos = [publisher.publish(topic, str(i).encode(), qos=1) for i in range(opts.queue)]
        for info in infos:
            info.wait_for_publish(opts.timeout)
    finally:
        publisher.disconnect()
        publisher.loop_stop()
    time.sleep(1.0)  # routed into the offline session
    got: list[int] = []
    arrived = threading.Event()

    def on_message(c, u, msg) -> None:
        got.append(int(msg.payload))
        if len(got) >= opts.queue:
            arrived.set()

    start = time.monotonic()
    client, present, _ = _connect(cluster.port("n3"), client_id, clean=False, retry=True,
                                  on_message=on_message)
    arrived.wait(opts.timeout)
    took = time.monotonic() - start
    client.disconnect()
    client.loop_stop()
    return {"messages": opts.queue, "received": len(got), "session_present": present,
            "in_order": got == list(range(opts.queue)), "seconds": round(took, 2)}


def run_sessions(opts: SessionsOptions, say: Callable[[str], None]) -> dict[str, Any]:
    """The three phases on a fresh 3-node cluster in `opts.run_dir`; stops it at the end."""
    cluster = BenchCluster(opts.run_dir, opts.base_port, timeout=120, nodes=3)
    run = f"{int(time.time()) % 100000}"
    report: dict[str, Any] = {"kind": "sessions", "nodes": 3}
    try:
        say(f"starting a 3-node cluster in {opts.run_dir} ...")
        cluster.up()
        say("live traffic before the sessions ...")
        report["traffic_before"] = _throughput(cluster, opts.messages, run + "a", say)
        report["make"] = _make(cluster, opts, run, say)
        say("live traffic with them ...")
        report["traffic_with"] = _throughput(cluster, opts.messages, run + "b", say)
        report["handover"] = _handover(cluster, opts, run, say)
        if opts.queue:
            report["queue_move"] = _queue_move(cluster, opts, run, say)
        report["join"] = _join(cluster, opts, say)
    finally:
        complaint = cluster.down()
        if complaint:
            say(f"mqfed down: {complaint}")
    return report


def render_sessions(report: dict[str, Any]) -> str:
    m, h, j = report["make"], report["handover"], report["join"]
    b, w = report["traffic_before"], report["traffic_with"]
    per = ", ".join(f"{name} {b} B" for name, b in sorted(m["bytes_per_session"].items()))
    return "\n".join([
        f"make: {m['sessions']:,} sessions in {m['made_s']} s, held by every node "
        f"{m['known_everywhere_after_s']} s after the last, replicated "
        f"{m['replicated_after_s']} s after it",
        f"  memory per session: {per}",
        f"handover: {h['moves']} resumed elsewhere, {h['session_present']} with session "
        f"present; CONNECT to CONNACK p50 {h['p50_ms']} ms, p99 {h['p99_ms']} ms",
        f"join: {j['node']} added in {j['add_node_s']} s; holds every record "
        f"{j['records_after_ready_s']} s and serves every session {j['serving_after_ready_s']}"
        " s after it was ready",
        f"live traffic n2 -> n1, QoS 1 flat out: {b['msgs_per_s']:,} msgs/s without sessions,"
        f" {w['msgs_per_s']:,} with them ({w['received']:,} of {w['messages']:,} received)",
        *_queue_line(report.get("queue_move"))])


def _queue_line(q: dict[str, Any] | None) -> list[str]:
    if not q:
        return []
    return [f"queue move: {q['messages']:,} messages queued on n1, resumed on n3 (session "
            f"present {'yes' if q['session_present'] else 'NO'}): {q['received']:,} received"
            f" in {q['seconds']} s, in order: {'yes' if q['in_order'] else 'NO'}"]
