"""What the scale benchmark reads from a running cluster: process CPU and memory, when the
nodes' interest is settled (their state.json files), the HAProxy front's limits and load (its
admin socket), and what the nodes sent each other (their /metrics)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.bench.cluster import BenchCluster
from sidecar.devcluster import haproxy
from sidecar.devcluster.layout import Layout


def proc_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of a process."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(int(line.split()[1]) * 1024 for line in
               Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS"))
    return cpu, rss


def usage(cluster: BenchCluster) -> dict[str, tuple[float, int]]:
    """proc_usage of every node's sidecar and Mosquitto, by name ("n1 sidecar", ...)."""
    return {name: proc_usage(pid) for name, pid in cluster.pids().items() if pid}


def wait_until(done: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until `done()`; the time it became true (time.monotonic)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic()


def interest(cluster: BenchCluster, node: str) -> dict[str, Any]:
    return (cluster.state(node).get("routing") or {}).get("interest") or {}


def settled(cluster: BenchCluster, nodes: list[str]) -> bool:
    """Every node's interest is applied by every peer, and known there in full."""
    for node in nodes:
        mine = interest(cluster, node)
        peers = mine.get("peers") or {}
        if set(peers) != set(nodes) - {node} or any(p["deltas_pending"] for p in peers.values()):
            return False
        for other in set(nodes) - {node}:
            held = ((interest(cluster, other).get("peers") or {}).get(node) or {})
            if held.get("keys_held") != mine.get("keys"):
                return False
    return True


def subscribed(cluster: BenchCluster, node: str) -> bool:
    """`node` has persisted every interest change it applied, issued their forwarding
    subscriptions, and Mosquitto answered every SUBSCRIBE: they are in effect."""
    routing = cluster.state(node).get("routing") or {}
    return ((routing.get("interest") or {}).get("persist_pending") == 0
            and (routing.get("fwd") or {}).get("subscribing") == 0)


def routed(cluster: BenchCluster, nodes: list[str]) -> bool:
    """settled, and every node's forwarding subscriptions in effect."""
    return settled(cluster, nodes) and all(subscribed(cluster, n) for n in nodes)


def interest_keys(cluster: BenchCluster, nodes: list[str]) -> int:
    """The interest keys (distinct filters) the nodes hold for their own clients, summed."""
    return sum(int(interest(cluster, n).get("keys") or 0) for n in nodes)


def steady_keys(cluster: BenchCluster, nodes: list[str], timeout: float,
                hold: float = 1.2) -> int:
    """Wait until the cluster is routed and its interest_keys stayed the same for `hold`
    seconds (longer than state.json's rewrite interval: changes still on their way show);
    returns that count."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        keys = interest_keys(cluster, nodes) if routed(cluster, nodes) else None
        now = time.monotonic()
        if keys != last:
            last, since = keys, now
        elif keys is not None and now - since >= hold:
            return keys
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for the interest to settle")


def front_info(cluster: BenchCluster) -> dict[str, str]:
    """HAProxy's `show info` of the cluster's front (Maxconn, Ulimit-n, ...)."""
    return haproxy.info(Layout(cluster.base_port, cluster.run_dir))


def front_sessions(cluster: BenchCluster) -> dict[str, int]:
    """Current connections per front server (node id) from HAProxy's `show stat`."""
    lay = Layout(cluster.base_port, cluster.run_dir)
    out: dict[str, int] = {}
    for row in haproxy.command(lay, "show stat").splitlines():
        cols = row.split(",")
        if len(cols) > 4 and cols[0] == haproxy.BACKEND and cols[1] not in ("BACKEND",
                                                                             "FRONTEND"):
            out[cols[1]] = int(cols[4] or 0)
    return out


def front_pid(cluster: BenchCluster) -> int | None:
    """HAProxy's PID, from the run dir's cluster.json."""
    try:
        state = json.loads((cluster.run_dir / "cluster.json").read_text())
        return int((state.get("haproxy") or {})["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _metric_value(line: str) -> tuple[str, dict[str, str], float]:
    """(name, labels, value) of one Prometheus text line."""
    head, _, value = line.rpartition(" ")
    name, _, rest = head.partition("{")
    labels = dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if "=" in part)
    return name, {k: v.strip('"') for k, v in labels.items()}, float(value)


def parse_peer_traffic(text: str) -> dict[str, list[float]]:
    """peer -> [bytes written on both streams with it, messages sent to it] from a node's
    /metrics text (pure)."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if line.startswith("mqfed_peer_bytes_total{"):
            _, labels, value = _metric_value(line)
            if labels.get("direction") == "out":
                out.setdefault(labels["peer"], [0.0, 0.0])[0] += value
        elif line.startswith("mqfed_peer_messages_sent_total{"):
            _, labels, value = _metric_value(line)
            out.setdefault(labels["peer"], [0.0, 0.0])[1] += value
    return out


def peer_traffic(cluster: BenchCluster) -> dict[str, dict[str, list[float]]]:
    """node -> parse_peer_traffic of its /metrics, read now."""
    out = {}
    for node in cluster.info["nodes"]:
        with urllib.request.urlopen(f"http://{node['metrics']}/metrics", timeout=10) as resp:
            out[node["id"]] = parse_peer_traffic(resp.read().decode())
    return out


def traffic_delta(before: dict, after: dict) -> dict[str, dict[str, list[float]]]:
    """node -> peer -> [bytes, messages] between two _peer_traffic readings (pure)."""
    return {node: {peer: [v - w for v, w in zip(vals, before.get(node, {}).get(peer, [0, 0]),
                                                strict=True)]
                   for peer, vals in peers.items()} for node, peers in after.items()}


def median_traffic(deltas: list[dict[str, dict[str, list[float]]]]) -> dict[str, Any]:
    """Per pair (node -> peer -> [bytes, messages]) and in all (bytes summed over every pair):
    the median over one traffic_delta per publish, so that a frame of the peers' own
    traffic in one publish's window does not count (pure)."""
    pairs = {(node, peer) for d in deltas for node, peers in d.items() for peer in peers}
    per_pair: dict[str, dict[str, list[float]]] = {}
    for node, peer in sorted(pairs):
        values = [d.get(node, {}).get(peer, [0.0, 0.0]) for d in deltas]
        per_pair.setdefault(node, {})[peer] = [_median([v[0] for v in values]),
                                               _median([v[1] for v in values])]
    totals = [sum(v[0] for peers in d.values() for v in peers.values()) for d in deltas]
    return {"pairs": per_pair, "all_bytes": _median(totals)}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
