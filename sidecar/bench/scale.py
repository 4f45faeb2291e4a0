"""`mqfed bench --scale`: the control plane under many subscriptions and clients, on a real
cluster (3 nodes, or one cluster per size of `node_counts`, one after the other).

Five phases, chosen by `phases`, run in this order; times are taken from outside
(state.json, written every 0.2-0.5 s, so the bulk, churn and join times are ± 0.5 s; the lag
figures come from the nodes' own interest-apply histograms):
1. bulk: one client on n1 subscribes `filters` distinct filters (SUBSCRIBE packets of 100):
   time until every peer routes them (holds the forwarding subscriptions and n1 saw them
   applied), CPU seconds and memory growth per 10,000 filters in every sidecar and Mosquitto;
2. churn: one client per node subscribes and unsubscribes `churn_rate` filters per second in
   all (each), for `churn_seconds`: interest lag p50/p99 over that time (bucket-interpolated);
3. clients: `clients` light MQTT 3.1.1 clients connect through the HAProxy front (beyond
   its maxconn, straight to the nodes in turn), each subscribes to its own topic; one QoS 1
   publish from n1 to every topic: connect time, every client reached (the missing named),
   delivery time, memory per client in every Mosquitto, sidecar and the front
   (`sidecar.bench.scale_clients`);
4. fanout: `fanout` subscribers spread evenly over the nodes on one topic, `fanout_publishes`
   publishes from n1 one after another: arrival p50/p99, and the messages and bytes n1 wrote
   to each peer per publish (a message crosses to each other node once);
5. join: `mqfed add-node`, then the time until the new node knows everyone's interest (every
   peer's keys held there, the criterion before 2026-11-26), and until it routes it: also
   persisted, its forwarding subscriptions issued and every SUBSCRIBE answered by Mosquitto.
"""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from sidecar.bench.cluster import BenchCluster
from sidecar.bench.scale_clients import (
    render_clients,
    render_fanout,
    run_clients,
    run_fanout,
)
from sidecar.bench.scale_state import settled, subscribed, usage, wait_until

PER_PACKET = 100
OUTSTANDING = 20  # SUBSCRIBE/UNSUBSCRIBE packets in flight per client
LAG_METRIC = "mqfed_interest_apply_seconds_bucket"


PHASES = ("bulk", "churn", "clients", "fanout", "join")  # in the order they run


@dataclass(frozen=True)
class ScaleOptions:
    run_dir: Path
    base_port: int
    filters: int = 100_000
    churn_rate: int = 2000  # subscribes per second, and as many unsubscribes, in all
    churn_seconds: float = 60.0
    timeout: float = 300.0  # per phase
    phases: tuple[str, ...] = PHASES
    node_counts: tuple[int, ...] = (3,)  # one cluster of each size, one after the other
    clients: int = 10_000
    fanout: int = 1000  # subscribers
    fanout_publishes: int = 10
    fanout_size: int = 100  # payload bytes


class _Client:
    """A paho MQTT v5 client sending (UN)SUBSCRIBE packets, at most OUTSTANDING unanswered."""

    def __init__(self, port: int, client_id: str) -> None:
        self.slots = threading.Semaphore(OUTSTANDING)
        self.refused = 0
        self._idle = threading.Condition()
        self._open = 0
        self.c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                             client_id=client_id, protocol=mqtt.MQTTv5)
        up = threading.Event()
        self.c.on_connect = lambda *a: up.set()
        self.c.on_subscribe = self._answered
        self.c.on_unsubscribe = self._answered
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        if not up.wait(10):
            raise RuntimeError(f"no CONNACK from 127.0.0.1:{port}")

    def _answered(self, client, userdata, mid, reason_codes, properties) -> None:
        self.refused += sum(1 for rc in reason_codes or () if rc.is_failure)
        self.slots.release()
        with self._idle:
            self._open -= 1
            self._idle.notify_all()

    def _take(self) -> None:
        if not self.slots.acquire(timeout=60):
            raise RuntimeError("no SUBACK/UNSUBACK within 60 s")
        with self._idle:
            self._open += 1

    def subscribe(self, filters: list[str]) -> None:
        self._take()
        self.c.subscribe([(f, 0) for f in filters])

    def unsubscribe(self, filters: list[str]) -> None:
        self._take()
        self.c.unsubscribe(filters)

    def settle(self, timeout: float = 60) -> None:
        with self._idle:
            if not self._idle.wait_for(lambda: self._open == 0, timeout):
                raise RuntimeError("(UN)SUBACKs missing")

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def _lag_buckets(cluster: BenchCluster) -> dict[float, float]:
    """The interest-apply histogram summed over every node: upper bound (s) -> count."""
    out: dict[float, float] = {}
    for node in cluster.info["nodes"]:
        with urllib.request.urlopen(f"http://{node['metrics']}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith(LAG_METRIC):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                out[bound] = out.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _quantile(buckets: dict[float, float], q: float) -> float | None:
    """Quantile (ms) of a cumulative histogram, linear within the bucket."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if not total:
        return None
    rank, low, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return low * 1000
            span = buckets[bound] - below
            return (low + (bound - low) * ((rank - below) / span if span else 1)) * 1000
        low, below = bound, buckets[bound]
    return low * 1000


def _per_10k(before: dict, after: dict, count: int) -> dict[str, dict[str, float]]:
    scale = 10_000 / count
    return {name: {"cpu_s": round((after[name][0] - before[name][0]) * scale, 3),
                   "mem_mib": round((after[name][1] - before[name][1]) * scale / 2**20, 2)}
            for name in before if name in after}


def _bulk(cluster: BenchCluster, opts: ScaleOptions, say) -> dict[str, Any]:
    say(f"bulk: {opts.filters:,} filters on n1 ...")
    nodes = [n["id"] for n in cluster.info["nodes"]]
    before = usage(cluster)
    client = _Client(cluster.port("n1"), "scale-bulk")
    start = time.monotonic()
    names = [f"scale/{i // 1000}/{i % 1000}" for i in range(opts.filters)]
    for i in range(0, len(names), PER_PACKET):
        client.subscribe(names[i:i + PER_PACKET])
    client.settle()
    subacked = time.monotonic()
    routed = wait_until(lambda: all(
        ((cluster.state(n).get("routing") or {}).get("forwarding_subscriptions") or 0)
        >= opts.filters for n in nodes if n != "n1") and settled(cluster, nodes),
        opts.timeout, "every peer to route the bulk filters")
    after = usage(cluster)
    return {"client": client, "result": {
        "filters": opts.filters, "refused": client.refused,
        "subacked_s": round(subacked - start, 2), "routed_s": round(routed - start, 2),
        "routed_after_suback_s": round(routed - subacked, 2),
        "per_10k_filters": _per_10k(before, after, opts.filters),
        "sidecar_bytes_per_remote_filter": {
            n: round((after[f"{n} sidecar"][1] - before[f"{n} sidecar"][1]) / opts.filters)
            for n in nodes if n != "n1"}}}


def _churn(cluster: BenchCluster, opts: ScaleOptions, say) -> dict[str, Any]:
    nodes = [n["id"] for n in cluster.info["nodes"]]
    say(f"churn: {opts.churn_rate:,} subscribes + {opts.churn_rate:,} unsubscribes per second "
        f"over {len(nodes)} nodes for {opts.churn_seconds:.0f} s ...")
    clients = {n: _Client(cluster.port(n), f"scale-churn-{n}") for n in nodes}
    held: dict[str, deque[str]] = {n: deque() for n in nodes}
    tick = 0.05
    per_tick = max(1, round(opts.churn_rate * tick / len(nodes)))
    run = uuid.uuid4().hex[:6]
    seq = 0

    def add(node: str) -> None:
        nonlocal seq
        batch = [f"churn/{run}/{node}/{seq + i}" for i in range(per_tick)]
        seq += per_tick
        held[node].extend(batch)
        clients[node].subscribe(batch)

    for _ in range(int(1 / tick)):  # one second's worth held before the unsubscribes start
        for node in nodes:
            add(node)
    for c in clients.values():
        c.settle()
    wait_until(lambda: settled(cluster, nodes), opts.timeout, "the churn base to settle")
    before = _lag_buckets(cluster)
    start = time.monotonic()
    ticks = 0
    while time.monotonic() - start < opts.churn_seconds:
        for node in nodes:
            add(node)
            clients[node].unsubscribe([held[node].popleft() for _ in range(per_tick)])
        ticks += 1
        time.sleep(max(0.0, start + ticks * tick - time.monotonic()))
    elapsed = time.monotonic() - start
    for c in clients.values():
        c.settle()
    wait_until(lambda: settled(cluster, nodes), opts.timeout, "the churn to settle")
    after = _lag_buckets(cluster)
    delta = {b: after.get(b, 0) - before.get(b, 0) for b in after}
    changes = 2 * ticks * per_tick * len(nodes)
    result = {"changes_per_s": round(changes / elapsed), "seconds": round(elapsed, 1),
              "deltas_applied": int(delta.get(float("inf"), 0)),
              "lag_p50_ms": _round(_quantile(delta, 0.5)),
              "lag_p99_ms": _round(_quantile(delta, 0.99)),
              "refused": sum(c.refused for c in clients.values())}
    return {"clients": clients, "result": result}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _join(cluster: BenchCluster, opts: ScaleOptions, say) -> dict[str, Any]:
    say("join: mqfed add-node ...")
    start = time.monotonic()
    entry = cluster.add_node()
    ready = time.monotonic()
    nodes = [n["id"] for n in cluster.info["nodes"]]
    known = wait_until(lambda: settled(cluster, nodes), opts.timeout,
                       f"{entry['id']} to know everyone's interest")
    routed = wait_until(lambda: settled(cluster, nodes) and subscribed(cluster, entry["id"]),
                        opts.timeout, f"{entry['id']} to route everyone's interest")
    return {"node": entry["id"],
            "forwarding_subscriptions":
                (cluster.state(entry["id"]).get("routing") or {}).get("forwarding_subscriptions"),
            "add_node_s": round(ready - start, 2), "known_after_ready_s": round(known - ready, 2),
            "routed_after_ready_s": round(routed - ready, 2)}


def _run_one(opts: ScaleOptions, count: int, run_dir: Path,
             say: Callable[[str], None]) -> dict[str, Any]:
    """The chosen phases on a fresh `count`-node cluster in `run_dir`; stops it at the end."""
    cluster = BenchCluster(run_dir, opts.base_port, timeout=60 + 20 * count, nodes=count)
    clients: list[_Client] = []
    report: dict[str, Any] = {"kind": "scale", "nodes": count}
    nodes = [f"n{i}" for i in range(1, count + 1)]
    try:
        say(f"starting a {count}-node cluster in {run_dir} ...")
        cluster.up()
        wait_until(lambda: settled(cluster, nodes), max(60, opts.timeout), "the cluster to mesh")
        if "bulk" in opts.phases:
            bulk = _bulk(cluster, opts, say)
            clients.append(bulk["client"])
            report["bulk"] = bulk["result"]
        if "churn" in opts.phases and opts.churn_seconds > 0:
            churn = _churn(cluster, opts, say)
            clients.extend(churn["clients"].values())
            report["churn"] = churn["result"]
        if "clients" in opts.phases:
            report["clients"] = run_clients(cluster, opts.clients, opts.timeout, say)
        if "fanout" in opts.phases:
            report["fanout"] = run_fanout(cluster, opts.fanout, opts.fanout_publishes,
                                          opts.fanout_size, opts.timeout, say)
        if "join" in opts.phases:
            report["join"] = _join(cluster, opts, say)
    finally:
        for c in clients:
            c.close()
        complaint = cluster.down()
        if complaint:
            say(f"mqfed down: {complaint}")
    return report


def run_scale(opts: ScaleOptions, say: Callable[[str], None]) -> dict[str, Any]:
    """The chosen phases on a fresh cluster in `opts.run_dir` (one node count), or on one
    cluster per node count in `opts.run_dir`/<N>-nodes, one after the other."""
    if len(opts.node_counts) == 1:
        return _run_one(opts, opts.node_counts[0], opts.run_dir, say)
    return {"kind": "scale", "series": [_run_one(opts, n, opts.run_dir / f"{n}-nodes", say)
                                        for n in opts.node_counts]}


def render_scale(report: dict[str, Any]) -> str:
    """The report as lines of text."""
    if "series" not in report:
        return _render_one(report)
    parts = [f"== {r['nodes']} nodes ==\n{_render_one(r)}" for r in report["series"]]
    return "\n".join([*parts, "", _render_series(report["series"])])


def _render_one(report: dict[str, Any]) -> str:
    lines: list[str] = []
    if "bulk" in report:
        b = report["bulk"]
        lines += [
            f"bulk: {b['filters']:,} filters on n1 ({b['refused']} refused): all SUBACKs in "
            f"{b['subacked_s']} s, routed by every peer {b['routed_s']} s after the first "
            f"SUBSCRIBE ({b['routed_after_suback_s']} s after the last SUBACK)",
            "  per 10,000 filters: " + ", ".join(
                f"{name} {v['cpu_s']} CPU-s {v['mem_mib']} MiB"
                for name, v in sorted(b["per_10k_filters"].items())),
            "  sidecar memory per remote filter: " + ", ".join(
                f"{n} {v} B" for n, v in sorted(b["sidecar_bytes_per_remote_filter"].items()))]
    if "churn" in report:
        c = report["churn"]
        lines.append(f"churn: {c['changes_per_s']:,} changes/s for {c['seconds']} s "
                     f"({c['refused']} refused): interest lag p50 {c['lag_p50_ms']} ms, "
                     f"p99 {c['lag_p99_ms']} ms over {c['deltas_applied']:,} applied deltas")
    if "clients" in report:
        lines += render_clients(report["clients"])
    if "fanout" in report:
        lines += render_fanout(report["fanout"])
    if "join" in report:
        j = report["join"]
        lines.append(f"join: {j['node']} added in {j['add_node_s']} s, knowing everyone's "
                     f"interest {j['known_after_ready_s']} s and routing it "
                     f"({j['forwarding_subscriptions']:,} forwarding subscriptions, persisted "
                     f"and SUBACKed) {j['routed_after_ready_s']} s after it was ready")
    return "\n".join(lines)


def _range(values: dict[str, float]) -> str:
    low, high = min(values.values(), default=0), max(values.values(), default=0)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def _cell(report: dict[str, Any], phase: str, text: Callable[[dict[str, Any]], str]) -> str:
    return text(report[phase]) if phase in report else "-"


SERIES_COLUMNS: list[tuple[str, str, Callable[[dict[str, Any]], str]]] = [
    ("bulk routed s", "bulk", lambda b: f"{b['routed_after_suback_s']}"),
    ("churn lag p50/p99 ms", "churn", lambda c: f"{c['lag_p50_ms']}/{c['lag_p99_ms']}"),
    ("clients reached", "clients", lambda c: f"{c['reached']:,}/{c['clients']:,}"),
    ("clients connect s", "clients", lambda c: f"{c['subacked_s']}"),
    ("clients delivered s", "clients", lambda c: f"{c['delivered_s']}"),
    ("fanout reached", "fanout", lambda f: f"{f['reached']:,}/{f['subscribers']:,}"),
    ("fanout p50/p99 ms", "fanout", lambda f: f"{f['p50_ms']}/{f['p99_ms']}"),
    ("n1->peer msg/pub", "fanout", lambda f: _range(f["n1_messages_per_publish_per_peer"])),
    ("n1->peer B/pub", "fanout", lambda f: _range(f["n1_bytes_per_publish_per_peer"])),
    ("all peer B/pub", "fanout", lambda f: f"{f['all_peer_bytes_per_publish']:,}"),
    ("join routed s", "join", lambda j: f"{j['routed_after_ready_s']}"),
]


def _render_series(runs: list[dict[str, Any]]) -> str:
    """One row per node count, a column per figure of the phases that ran."""
    columns = [c for c in SERIES_COLUMNS if any(c[1] in r for r in runs)]
    rows = [["nodes", *(c[0] for c in columns)]]
    rows += [[str(r["nodes"]), *(_cell(r, phase, text) for _, phase, text in columns)]
             for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
                     for row in rows)
