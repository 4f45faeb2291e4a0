"""What the scale benchmark reads from a running cluster: process CPU and memory, and when
the nodes' interest is settled (from their state.json files)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.bench.cluster import BenchCluster


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
