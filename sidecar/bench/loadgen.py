"""`mqfed load`: traffic through a running cluster, from publishers on some nodes to one
subscriber on each of some nodes, optionally traced for `mqfed audit`.

Shares the publisher processes (`load.py`), the measuring subscriber (`measure.py`) and the
trace writer (`traces.py`) with `mqfed bench`. Every subscriber subscribes `load/<run>/#`,
so every subscriber should get every message. One fault can be injected on purpose: the
subscriber on one node drops its connection for a while (`Pause`); its session and
subscription stay in place, so at QoS 0 the broker drops what it misses on that path.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from sidecar.bench.load import ACK_TIMEOUT, LoadSpec, PublisherPool
from sidecar.bench.measure import PROBE, Subscriber, summarize, wait_complete
from sidecar.bench.traces import ReceivedTracer, TraceWriter, sub_line
from sidecar.bench.watch import Watch, amount, no_watch

PROBE_TIMEOUT = 20.0
SESSION_EXPIRY = 300  # seconds a paused subscriber's session outlives its connection


@dataclass(frozen=True)
class Pause:
    """The subscriber on `node` is disconnected from `at` s after the start for `seconds`."""

    node: str
    at: float
    seconds: float


@dataclass(frozen=True)
class LoadOptions:
    """One load run (rate and messages are totals over all publishers)."""

    nodes: dict[str, tuple[str, int]]  # node id -> (host, MQTT port)
    publish_on: tuple[str, ...]
    subscribe_on: tuple[str, ...]
    publishers: int = 1  # per publishing node
    rate: float = 0.0  # 0 = flat out
    messages: int | None = 10000
    seconds: float | None = None
    qos: int = 1
    protocol: str = "5"  # the publishers' MQTT version
    size: int = 100
    window: int = 100
    traces: Path | None = None
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    pause: Pause | None = None
    session_expiry: int = 0  # the subscribers' sessions (0: none, unless `pause`)
    subscribe_via: tuple[str, int] | None = None  # subscribers connect here (a front), not
    # to their node; their records name the node "front"


def topic_of(run: str, node: str, index: int) -> str:
    return f"load/{run}/{node}/{index}"


def specs(opts: LoadOptions) -> list[LoadSpec]:
    """One spec per publisher: `publishers` on each node of `publish_on`."""
    pairs = [(node, j) for node in opts.publish_on for j in range(opts.publishers)]
    n = len(pairs)
    out = []
    for k, (node, j) in enumerate(pairs):
        host, port = opts.nodes[node]
        messages = None
        if opts.messages:
            messages = opts.messages // n + (1 if k < opts.messages % n else 0)
        out.append(LoadSpec(port=port, host=host, topic=topic_of(opts.run, node, j),
                            qos=opts.qos, size=opts.size, rate=opts.rate / n, messages=messages,
                            seconds=opts.seconds, window=opts.window,
                            client_id=f"load-{opts.run}-pub-{k}",
                            traces=str(opts.traces) if opts.traces else None,
                            run=opts.run, node=node, protocol=opts.protocol))
    return out


def _probe(node: str, host: str, port: int, topic: str, qos: int,
           subs: list[Subscriber]) -> None:
    """Publish warm-up messages from `node` until every subscriber got one."""
    for sub in subs:
        sub.probe_seen.clear()
    client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                         client_id=f"load-probe-{os.getpid()}-{node}", protocol=mqtt.MQTTv5)
    client.connect(host, port, keepalive=30)
    client.loop_start()
    try:
        deadline = time.monotonic() + PROBE_TIMEOUT
        while not all(s.probe_seen.is_set() for s in subs):
            if time.monotonic() > deadline:
                missing = [s.client._client_id.decode() for s in subs
                           if not s.probe_seen.is_set()]
                raise RuntimeError(f"no warm-up message from {node} reached {missing} "
                                   f"within {PROBE_TIMEOUT:.0f}s")
            client.publish(topic, b"probe", qos=qos)
            time.sleep(0.1)
    finally:
        client.disconnect()
        client.loop_stop()


def _time_limit(opts: LoadOptions) -> float:
    busy = opts.seconds or (opts.messages or 0) / (opts.rate if opts.rate > 0 else 1000.0)
    return busy + 2 * ACK_TIMEOUT + 10


def _pauser(sub: Subscriber, pause: Pause, started: float, errors: list[str]) -> None:
    try:
        time.sleep(max(0.0, started + pause.at - time.monotonic()))
        sub.pause()
        time.sleep(pause.seconds)
        sub.resume()
    except Exception as exc:  # reported with the run
        errors.append(f"pause of the subscriber on {pause.node}: {exc}")


def run_load(opts: LoadOptions, say: Callable[[str], None],
             show: Watch = no_watch) -> dict[str, Any]:
    """Run the load; returns what each subscriber got (and writes traces if asked). `show`
    is shown the messages received by all subscribers (or the seconds elapsed)."""
    trace = TraceWriter(opts.traces, f"recv-{opts.run}") if opts.traces else None
    subs: dict[str, Subscriber] = {}
    tracers: list[ReceivedTracer] = []
    pool = PublisherPool(specs(opts))
    errors: list[str] = []
    try:
        for node in opts.subscribe_on:
            host, port = opts.subscribe_via or opts.nodes[node]
            sub = Subscriber(port, f"load/{opts.run}/#", opts.qos, f"load-{opts.run}-sub-{node}",
                             host=host, trace=trace is not None,
                             session_expiry=opts.session_expiry
                             or (SESSION_EXPIRY if opts.pause else 0))
            subs[node] = sub
            sub.start()
            if trace is not None:
                tracers.append(ReceivedTracer(trace, opts.run, _sub_id(node),
                                              _where(node, opts), sub.records))
        pool.start()
        for node in opts.publish_on:
            host, port = opts.nodes[node]
            _probe(node, host, port, f"load/{opts.run}/{node}/{PROBE}", opts.qos,
                   list(subs.values()))
        _trace_subscriptions(trace, "sub", opts, subs)
        for tracer in tracers:
            tracer.start()
        say(f"run {opts.run}: publishing from {','.join(opts.publish_on)} to subscribers on "
            f"{','.join(opts.subscribe_on)} ...")
        pauser = None
        started = time.monotonic()
        if opts.pause:
            pauser = threading.Thread(target=_pauser, args=(subs[opts.pause.node], opts.pause,
                                                            started, errors), daemon=True)
            pauser.start()
        with show(f"load {opts.run}", *amount([s.records for s in subs.values()],
                                                opts.messages, opts.seconds)):
            pool.go()
            results = pool.results(_time_limit(opts))
            if pauser is not None:
                pauser.join()
            total = sum(r.sent for r in results)
            for sub in subs.values():
                wait_complete(sub, total, idle=3.0)
        _trace_subscriptions(trace, "unsub", opts, subs)
    finally:
        pool.stop()
        for tracer in tracers:
            tracer.stop()
        for sub in subs.values():
            sub.close()
        if trace is not None:
            trace.close()
    sent = {r.index: r.sent for r in results}
    first = min((r.first_ns for r in results if r.sent), default=0)
    last = max((r.last_ns for r in results), default=0)
    return {
        "run": opts.run, "sent": total, "traces": str(opts.traces) if opts.traces else None,
        "subscribers": {_sub_id(node): asdict(summarize(sub.records, sent, first, last))
                        for node, sub in subs.items()},
        "publisher_errors": [r.error for r in results if r.error] + errors,
        "publisher_pids": pool.pids,
    }


def _sub_id(node: str) -> str:
    return f"sub-{node}"


def _where(node: str, opts: LoadOptions) -> str:
    """The node a subscriber's records name: its own, or "front" (`subscribe_via`)."""
    return "front" if opts.subscribe_via else node


def _trace_subscriptions(trace: TraceWriter | None, kind: str, opts: LoadOptions,
                         subs: dict[str, Subscriber]) -> None:
    if trace is None:
        return
    now = time.time_ns()
    for node, sub in subs.items():
        qos = sub.granted_qos if sub.granted_qos is not None else opts.qos
        trace.write(sub_line(kind, opts.run, _sub_id(node), _where(node, opts), sub.filter, qos,
                             now))
