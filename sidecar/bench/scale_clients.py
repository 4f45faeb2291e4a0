"""The scale benchmark's client phases, with light clients (`sidecar.bench.swarm`):
- clients: many clients connect through the HAProxy front, each subscribes to its own topic;
  one publish to every topic from n1; all reached, the times, memory per client;
- fanout: subscribers spread evenly over the nodes (direct), one topic; a short series of
  publishes from n1; arrival p50/p99, and the messages and bytes each node wrote to its peers
  per publish (from their /metrics, read around each publish; the median of the publishes).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.bench.cluster import BenchCluster
from sidecar.bench.measure import percentile
from sidecar.bench.scale_state import (
    front_info,
    front_pid,
    front_sessions,
    interest_keys,
    median_traffic,
    peer_traffic,
    proc_usage,
    routed,
    steady_keys,
    traffic_delta,
    usage,
    wait_until,
)
from sidecar.bench.swarm import LightClient, open_client, raise_fd_limit

CONNECTING = 100  # handshakes in flight at once
WINDOW = 20  # QoS 1 publishes in flight (Mosquitto's default max_inflight_messages)
FRONT_MARGIN = 8  # front connections left free below HAProxy's maxconn
FD_SPARE = 500
DELIVERY_TIMEOUT = 60.0
MISSING_SHOWN = 20


def plan_ports(count: int, front_port: int, front_room: int,
               node_ports: Sequence[int]) -> list[int]:
    """The port each of `count` clients connects to: the front for the first `front_room`,
    then the nodes directly, in turn (pure)."""
    direct = [node_ports[i % len(node_ports)] for i in range(max(0, count - front_room))]
    return [front_port] * min(count, front_room) + direct


def spread(count: int, items: Sequence[Any]) -> list[Any]:
    """`items` in turn, `count` of them (pure)."""
    return [items[i % len(items)] for i in range(count)]


async def _connect_all(ports: Sequence[int], ids: Sequence[str],
                       topics: Sequence[str]) -> tuple[list[LightClient | None], list[str],
                                                         float, float]:
    """Connect and subscribe (QoS 1) client i to topics[i]; (clients, errors, time of the
    last CONNACK, time of the last SUBACK), times from time.perf_counter."""
    gate = asyncio.Semaphore(CONNECTING)
    last = {"connack": 0.0, "suback": 0.0}
    errors: list[str] = []

    async def one(i: int) -> LightClient | None:
        async with gate:
            client = None
            try:
                client = await open_client(ports[i], ids[i])
                last["connack"] = max(last["connack"], time.perf_counter())
                granted = await asyncio.wait_for(client.subscribe([(topics[i], 1)]), 30)
                last["suback"] = max(last["suback"], time.perf_counter())
                if granted[:1] == b"\x80":
                    errors.append(f"{ids[i]}: SUBSCRIBE refused")
                return client
            except (TimeoutError, OSError, ConnectionError) as exc:
                errors.append(f"{ids[i]} (port {ports[i]}): {exc!r}")
                if client is not None:
                    client.close()
                return None

    clients = await asyncio.gather(*(one(i) for i in range(len(ports))))
    return list(clients), errors, last["connack"], last["suback"]


async def _publish_each(pub: LightClient, topics: Sequence[str], payload: bytes) -> float:
    """One QoS 1 publish to every topic, WINDOW in flight; the time of the first send."""
    gate = asyncio.Semaphore(WINDOW)
    first = time.perf_counter()

    async def one(topic: str) -> None:
        async with gate:
            await asyncio.wait_for(pub.publish_qos1(topic, payload), 30)

    await asyncio.gather(*(one(t) for t in topics))
    return first


async def _until_reached(clients: Sequence[LightClient | None], count: int,
                         timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if all(c is not None and len(c.arrivals) >= count for c in clients):
            return
        await asyncio.sleep(0.02)


def _close(clients: Sequence[LightClient | None]) -> None:
    for c in clients:
        if c is not None:
            c.close()


def _nodes(cluster: BenchCluster) -> list[str]:
    return [n["id"] for n in cluster.info["nodes"]]


async def _clients(cluster: BenchCluster, count: int, timeout: float, say) -> dict[str, Any]:
    nodes = _nodes(cluster)
    info = front_info(cluster)
    maxconn = int(info.get("Maxconn") or 0)
    room = max(0, maxconn - FRONT_MARGIN) if maxconn else count
    ports = plan_ports(count, cluster.base_port, room, [cluster.port(n) for n in nodes])
    via_front = ports.count(cluster.base_port)
    direct = {n: ports.count(cluster.port(n)) for n in nodes}
    if via_front < count:
        say(f"clients: the front takes at most {maxconn} connections (HAProxy's maxconn, from "
            f"its open-files limit {info.get('Ulimit-n')}): {via_front:,} through it, "
            f"{count - via_front:,} straight to the nodes")
    run = uuid.uuid4().hex[:6]
    ids = [f"sc-{run}-{i}" for i in range(count)]
    topics = [f"clients/{run}/{i}" for i in range(count)]
    hpid = front_pid(cluster)
    keys = await asyncio.to_thread(steady_keys, cluster, nodes, timeout)
    before = usage(cluster)
    front_before = proc_usage(hpid)[1] if hpid else 0
    say(f"clients: connecting {count:,} clients, one topic each ...")
    start = time.perf_counter()
    clients, errors, connack, suback = await _connect_all(ports, ids, topics)
    pub = None
    try:
        per_front = front_sessions(cluster)
        await asyncio.to_thread(
            wait_until, lambda: interest_keys(cluster, nodes) >= keys + count - len(errors)
            and routed(cluster, nodes), timeout, "every node to route the clients' topics")
        routed_at = time.perf_counter()
        after = usage(cluster)
        front_after = proc_usage(hpid)[1] if hpid else 0
        say(f"clients: one QoS 1 publish from n1 to each of {count:,} topics ...")
        pub = await open_client(cluster.port("n1"), f"sc-{run}-pub")
        first = await _publish_each(pub, topics, b"x" * 16)
        acked = time.perf_counter()
        await _until_reached(clients, 1, DELIVERY_TIMEOUT)
        missing = [ids[i] for i, c in enumerate(clients) if c is None or not c.arrivals]
        arrivals = [c.arrivals[0][0] for c in clients if c is not None and c.arrivals]
    finally:
        _close(clients)
        if pub is not None:
            pub.close()
    on_node = {n: per_front.get(n, 0) + direct[n] for n in nodes}
    return {
        "clients": count, "via_front": via_front, "front_maxconn": maxconn,
        "direct": {n: v for n, v in direct.items() if v}, "on_node": on_node,
        "connect_errors": len(errors), "errors_shown": errors[:MISSING_SHOWN],
        "connacked_s": round(connack - start, 2), "subacked_s": round(suback - start, 2),
        "routed_after_suback_s": round(routed_at - suback, 2),
        "reached": len(arrivals), "missing": len(missing), "missing_shown": missing[:MISSING_SHOWN],
        "publish_acked_s": round(acked - first, 3),
        "delivered_s": round(max(arrivals) - first, 3) if arrivals else None,
        "bytes_per_client": _per_client(before, after, on_node, count),
        "front_bytes_per_client": round((front_after - front_before) / via_front)
        if via_front and hpid else None,
    }


def _per_client(before: dict, after: dict, on_node: dict[str, int],
                count: int) -> dict[str, dict[str, int]]:
    """Resident-memory growth of each process per client on its node, and per client in
    the cluster."""
    out = {}
    for name in before:
        if name not in after:
            continue
        grew = after[name][1] - before[name][1]
        node = name.split(" ", 1)[0]
        out[name] = {"per_node_client": round(grew / on_node[node]) if on_node.get(node) else 0,
                     "per_cluster_client": round(grew / count)}
    return out


async def _fanout(cluster: BenchCluster, count: int, publishes: int, size: int,
                  timeout: float, say) -> dict[str, Any]:
    nodes = _nodes(cluster)
    run = uuid.uuid4().hex[:6]
    topic = f"fanout/{run}"
    homes = spread(count, nodes)
    say(f"fanout: {count:,} subscribers over {len(nodes)} nodes, {publishes} publishes ...")
    keys = await asyncio.to_thread(steady_keys, cluster, nodes, timeout)
    clients, errors, _, _ = await _connect_all([cluster.port(n) for n in homes],
                                               [f"fo-{run}-{i}" for i in range(count)],
                                               [topic] * count)
    pub = None
    latencies: list[float] = []
    spans: list[float] = []
    try:
        await asyncio.to_thread(
            wait_until, lambda: interest_keys(cluster, nodes) >= keys + len(set(homes))
            and routed(cluster, nodes), timeout, "every node to route the fan-out topic")
        pub = await open_client(cluster.port("n1"), f"fo-{run}-pub")
        deltas = []
        for k in range(publishes):
            payload = k.to_bytes(4, "big") + b"f" * max(0, size - 4)
            before = peer_traffic(cluster)
            sent = time.perf_counter()
            await asyncio.wait_for(pub.publish_qos1(topic, payload), 30)
            await _until_reached(clients, k + 1, DELIVERY_TIMEOUT)
            deltas.append(traffic_delta(before, peer_traffic(cluster)))
            got = [c.arrivals[k][0] - sent for c in clients
                   if c is not None and len(c.arrivals) > k]
            latencies += got
            if got:
                spans.append(max(got))
            await asyncio.sleep(0.2)
    finally:
        _close(clients)
        if pub is not None:
            pub.close()
    reached = sum(1 for c in clients if c is not None and len(c.arrivals) >= publishes)
    missing = [f"fo-{run}-{i}" for i, c in enumerate(clients)
               if c is None or len(c.arrivals) < publishes]
    ordered = sorted(latencies)
    traffic = median_traffic(deltas)
    n1 = traffic["pairs"].get("n1", {})
    return {
        "subscribers": count, "publishes": publishes, "payload_bytes": size,
        "on_node": {n: homes.count(n) for n in nodes}, "connect_errors": len(errors),
        "reached": reached, "missing": len(missing), "missing_shown": missing[:MISSING_SHOWN],
        "p50_ms": round(percentile(ordered, 50) * 1000, 2) if ordered else None,
        "p99_ms": round(percentile(ordered, 99) * 1000, 2) if ordered else None,
        "max_ms": round(ordered[-1] * 1000, 2) if ordered else None,
        "all_reached_p50_ms": round(percentile(sorted(spans), 50) * 1000, 2) if spans else None,
        "peer_traffic_per_publish": traffic["pairs"],
        "n1_messages_per_publish_per_peer": {p: v[1] for p, v in n1.items()},
        "n1_bytes_per_publish_per_peer": {p: round(v[0]) for p, v in n1.items()},
        "all_peer_bytes_per_publish": round(traffic["all_bytes"]),
    }


def run_clients(cluster: BenchCluster, count: int, timeout: float,
                say: Callable[[str], None]) -> dict[str, Any]:
    """The clients phase (needs about one file descriptor per client in this process)."""
    raise_fd_limit(count + FD_SPARE)
    return asyncio.run(_clients(cluster, count, timeout, say))


def run_fanout(cluster: BenchCluster, count: int, publishes: int, size: int, timeout: float,
               say: Callable[[str], None]) -> dict[str, Any]:
    """The fan-out phase."""
    raise_fd_limit(count + FD_SPARE)
    return asyncio.run(_fanout(cluster, count, publishes, size, timeout, say))


def _missing(result: dict[str, Any]) -> str:
    if not result["missing"]:
        return ""
    shown = ", ".join(result["missing_shown"])
    more = result["missing"] - len(result["missing_shown"])
    return f"; MISSING {result['missing']:,}: {shown}" + (f" and {more:,} more" if more else "")


def render_clients(c: dict[str, Any]) -> list[str]:
    """The clients phase as lines of text."""
    direct = ", ".join(f"{n} {v:,}" for n, v in c["direct"].items())
    lines = [
        f"clients: {c['clients']:,} clients, {c['via_front']:,} through the front"
        + (f" (its maxconn {c['front_maxconn']:,}; straight to {direct})" if direct else "")
        + f", one topic each ({c['connect_errors']} connect errors): all CONNACKs in "
        f"{c['connacked_s']} s, all SUBACKs in {c['subacked_s']} s, routed by every node "
        f"{c['routed_after_suback_s']} s later",
        f"  one QoS 1 publish from n1 to each topic: reached {c['reached']:,} of "
        f"{c['clients']:,}{_missing(c)}; all PUBACKs {c['publish_acked_s']} s, "
        f"the last arrival {c['delivered_s']} s after the first publish",
        "  clients per node: " + ", ".join(f"{n} {v:,}" for n, v in c["on_node"].items()),
        "  memory per client on the node (per client in the cluster): " + ", ".join(
            f"{name} {v['per_node_client']:,} B ({v['per_cluster_client']:,} B)"
            for name, v in sorted(c["bytes_per_client"].items()))
        + (f"; front (HAProxy) {c['front_bytes_per_client']:,} B"
           if c["front_bytes_per_client"] is not None else "")]
    for err in c["errors_shown"]:
        lines.append(f"  error: {err}")
    return lines


def render_fanout(f: dict[str, Any]) -> list[str]:
    """The fan-out phase as lines of text."""
    n1 = ", ".join(f"n1->{p} {f['n1_messages_per_publish_per_peer'][p]} msg {v:,} B"
                   for p, v in sorted(f["n1_bytes_per_publish_per_peer"].items()))
    return [
        f"fanout: {f['subscribers']:,} subscribers on one topic ("
        + ", ".join(f"{n} {v:,}" for n, v in f["on_node"].items())
        + f"), {f['publishes']} QoS 1 publishes of {f['payload_bytes']} B from n1: "
        f"{f['reached']:,} reached by all{_missing(f)}; arrival after the publish p50 "
        f"{f['p50_ms']} ms, p99 {f['p99_ms']} ms, max {f['max_ms']} ms (the last of a "
        f"publish's arrivals p50 {f['all_reached_p50_ms']} ms)",
        f"  per publish (median over the publishes), messages and bytes n1 wrote to each peer "
        f"(both streams): {n1}; every node's writes to its peers "
        f"{f['all_peer_bytes_per_publish']:,} B"]
