"""One benchmark run: (a) publisher and subscriber on mqfed node n1, (b) publisher on n1 and
subscriber on n2, (c) the same pair over a plain Mosquitto bridge; figures and b/a."""

from __future__ import annotations

import gc
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from sidecar.bench import targets
from sidecar.bench.bridge import BridgePair
from sidecar.bench.cluster import BenchCluster
from sidecar.bench.load import ACK_TIMEOUT, LoadSpec, PublisherPool
from sidecar.bench.measure import PROBE, Subscriber, summarize, wait_complete
from sidecar.bench.observe import CpuMeter, LogWatch
from sidecar.bench.traces import ReceivedTracer, TraceWriter, sub_line
from sidecar.bench.watch import Watch, amount, no_watch
from sidecar.devcluster.layout import PORT_SPAN
from sidecar.devcluster.net import port_problem

BRIDGE_OFFSET = PORT_SPAN  # bridge brokers A and B listen on P+402 and P+403
TITLES = {"a": "mqfed, same node (n1 -> n1)", "b": "mqfed, cross node (n1 -> n2)",
          "c": "Mosquitto bridge (A -> B)"}
PROBE_TIMEOUT = 20.0


@dataclass(frozen=True)
class BenchOptions:
    """The knobs of one run (rates and counts are totals over all publishers)."""

    run_dir: Path
    base_port: int
    rate: float = 0.0  # 0 = flat out
    messages: int | None = 20000
    seconds: float | None = None
    qos: int = 1
    protocol: str = "5"  # the publishers' MQTT version
    size: int = 100
    publishers: int = 1
    window: int = 100
    cases: str = "abc"
    traces: Path | None = None  # write trace records (docs/traces.md) into this folder
    run: str = ""  # run id prefix of the trace records (default: random)


@dataclass(frozen=True)
class Target:
    """Where one case publishes and subscribes."""

    key: str
    pub_port: int
    sub_port: int
    pub_node: str = ""
    sub_node: str = ""


def _split(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def _specs(opts: BenchOptions, target: Target, run: str) -> list[LoadSpec]:
    n = opts.publishers
    return [LoadSpec(port=target.pub_port, topic=f"bench/{target.key}/{i}", qos=opts.qos,
                     size=opts.size, rate=opts.rate / n,
                     messages=_split(opts.messages, n, i) if opts.messages else None,
                     seconds=opts.seconds, window=opts.window,
                     client_id=f"bench-pub-{target.key}-{i}",
                     traces=str(opts.traces) if opts.traces else None, run=run,
                     node=target.pub_node, protocol=opts.protocol) for i in range(n)]


def _probe(port: int, topic: str, qos: int, sub: Subscriber) -> None:
    """Publish warm-up messages until the subscriber gets one: the route exists."""
    client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                         client_id=f"bench-probe-{os.getpid()}", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        deadline = time.monotonic() + PROBE_TIMEOUT
        while not sub.probe_seen.wait(0.1):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no warm-up message reached the subscriber within "
                                   f"{PROBE_TIMEOUT:.0f}s ({topic})")
            client.publish(topic, b"probe", qos=qos)
    finally:
        client.disconnect()
        client.loop_stop()


def _time_limit(opts: BenchOptions) -> float:
    if opts.seconds:
        busy = opts.seconds
    else:
        busy = (opts.messages or 0) / (opts.rate if opts.rate > 0 else 1000.0)
    return busy + 2 * ACK_TIMEOUT + 10


def run_case(opts: BenchOptions, target: Target, pids: dict[str, int],
             logs: list[Path], show: Watch = no_watch) -> dict[str, Any]:
    """Run one case; returns its figures, CPU use and new log warnings. `show` is shown
    the messages received (or the seconds elapsed) while it publishes."""
    run = f"{opts.run or uuid.uuid4().hex[:8]}-{target.key}"
    sub = Subscriber(target.sub_port, f"bench/{target.key}/#", opts.qos,
                     f"bench-sub-{target.key}-{os.getpid()}", trace=opts.traces is not None)
    pool = PublisherPool(_specs(opts, target, run))
    watch = LogWatch(logs)
    trace = TraceWriter(opts.traces, f"recv-{run}") if opts.traces else None
    tracer = None
    try:
        sub.start()
        pool.start()
        _probe(target.pub_port, f"bench/{target.key}/{PROBE}", opts.qos, sub)
        if trace is not None:
            tracer = ReceivedTracer(trace, run, f"sub-{target.key}", target.sub_node,
                                    sub.records)
            trace.write(sub_line("sub", run, tracer.sub, target.sub_node, sub.filter,
                                 _granted(sub, opts.qos), time.time_ns()))
            tracer.start()
        meter = CpuMeter({**pids, "bench (subscriber)": os.getpid()}, exclude=pool.pids)
        watch.mark()
        meter.start()
        gc.disable()  # the subscriber's full collections paused it 10-25 ms: noise, not the hop
        try:
            with show(f"case {target.key}", *amount([sub.records], opts.messages,
                                                     opts.seconds)):
                pool.go()
                results = pool.results(_time_limit(opts))
                last = wait_complete(sub, sum(r.sent for r in results))
        finally:
            gc.enable()
        cpu = meter.stop(until=last)
        wall = max(last - meter.started, 1e-3)
    finally:
        pool.stop()
        if tracer is not None:
            tracer.stop()
            trace.write(sub_line("unsub", run, tracer.sub, target.sub_node, sub.filter,
                                 _granted(sub, opts.qos), time.time_ns()))
        if trace is not None:
            trace.close()
        sub.close()
    cpu["publishers"] = round(100 * sum(r.cpu_seconds for r in results) / wall, 1)
    others = [{"process": name, "pid": pid, "percent": pct}
              for name, pid, pct in meter.busiest_others()]
    first = min((r.first_ns for r in results if r.sent), default=0)
    stats = summarize(sub.records, {r.index: r.sent for r in results}, first,
                      max(r.last_ns for r in results))
    return {"case": target.key, "title": TITLES[target.key], **asdict(stats),
            "acked": sum(r.acked for r in results), "ack_failures": sum(r.failed for r in results),
            "publisher_disconnects": sum(r.disconnects for r in results),
            "publisher_errors": [r.error for r in results if r.error],
            "publisher_pids": pool.pids,
            "cpu_percent": cpu, "cpu_others": others, "log_warnings": watch.new_warnings()}


def _granted(sub: Subscriber, qos: int) -> int:
    return sub.granted_qos if sub.granted_qos is not None else qos


def check_ports(opts: BenchOptions) -> None:
    for port in (opts.base_port + BRIDGE_OFFSET, opts.base_port + BRIDGE_OFFSET + 1):
        problem = port_problem(port)
        if problem:
            raise RuntimeError(f"port {port} (bridge broker) cannot be used: {problem}; "
                               "choose another --base-port")


def run(opts: BenchOptions, say: Callable[[str], None],
        show: Watch = no_watch) -> dict[str, Any]:
    """Start the cluster and the bridge pair, run the cases, stop everything (always)."""
    check_ports(opts)
    cluster = BenchCluster(opts.run_dir / "cluster", opts.base_port)
    bridge = BridgePair(opts.run_dir / "bridge", opts.base_port + BRIDGE_OFFSET,
                        opts.base_port + BRIDGE_OFFSET + 1, opts.qos)
    report: dict[str, Any] = {"options": {k: (str(v) if isinstance(v, Path) else v)
                                          for k, v in asdict(opts).items()}, "cases": []}
    try:
        if {"a", "b"} & set(opts.cases):
            say(f"starting a 2-node mqfed cluster in {cluster.run_dir} ...")
            cluster.up()
        if "c" in opts.cases:
            say(f"starting two bridged Mosquitto brokers in {bridge.run_dir} ...")
            bridge.start()
        report["processes"] = {**cluster.pids(), **{f"bridge {k}": v
                                                    for k, v in bridge.pids.items()}}
        for key in opts.cases:
            say(f"case {key}: {TITLES[key]} ...")
            bridged = {f"bridge {k}": v for k, v in bridge.pids.items()}
            pids, logs = (bridged, bridge.logs()) if key == "c" else (cluster.pids(),
                                                                     cluster.logs())
            before = {n: cluster.routing(n) for n in ("n1", "n2")} if key == "b" else {}
            result = run_case(opts, _target(key, cluster, bridge), pids, logs, show)
            if key == "b":
                time.sleep(0.6)  # state.json is rewritten every 0.5 s
                result["routing"] = {n: _delta(before[n], cluster.routing(n))
                                     for n in ("n1", "n2")}
            report["cases"].append(result)
    finally:
        with _shielded():
            bridge.stop()
            complaint = cluster.down()
        if complaint:
            say(f"mqfed down: {complaint}")
    report.update(_compare(report["cases"]))
    report["cpus"] = os.cpu_count() or 1
    for case in report["cases"]:
        case["broker_cpu_us"] = targets.broker_cpu_us(case)
    report["targets"] = [asdict(ch) for ch in targets.checks(report["options"],
                                                             report["cases"])]
    return report


@contextmanager
def _shielded() -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM while stopping what was started (children inherit it)."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _target(key: str, cluster: BenchCluster, bridge: BridgePair) -> Target:
    if key == "c":
        return Target("c", bridge.port_a, bridge.port_b, "bridge-a", "bridge-b")
    sub_node = "n1" if key == "a" else "n2"
    return Target(key, cluster.port("n1"), cluster.port(sub_node), "n1", sub_node)


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) if k != "pending_local_acks" else v
            for k, v in after.items()}


def _compare(cases: list[dict[str, Any]]) -> dict[str, Any]:
    by = {c["case"]: c for c in cases}
    if "a" not in by or "b" not in by:
        return {}
    a, b = by["a"], by["b"]
    out = {"ratio_b_a": round(b["throughput"] / a["throughput"], 3) if a["throughput"] else None,
           "hop_p50_ms": round(b["p50_ms"] - a["p50_ms"], 3),
           "hop_p99_ms": round(b["p99_ms"] - a["p99_ms"], 3)}
    if "c" in by and by["c"]["throughput"]:
        out["ratio_b_c"] = round(b["throughput"] / by["c"]["throughput"], 3)
    return out
