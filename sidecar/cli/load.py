"""`mqfed load`: traffic through a running cluster, optionally traced for `mqfed audit`."""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from pathlib import Path
from typing import Any

from sidecar.bench import payload
from sidecar.bench.loadgen import LoadOptions, Pause, run_load
from sidecar.cli.progress import Progress

NODE_RE = re.compile(r"^([A-Za-z0-9_.-]+)=(.+):(\d+)$")


def _node(text: str) -> tuple[str, str, int]:
    m = NODE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected ID=HOST:PORT, got {text!r}")
    return m.group(1), m.group(2), int(m.group(3))


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _pause(text: str) -> Pause:
    parts = text.split(":")
    try:
        node, at, seconds = parts[0], float(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        raise argparse.ArgumentTypeError(f"expected NODE:AT:SECONDS, got {text!r}") from None
    if len(parts) != 3 or at < 0 or seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected NODE:AT:SECONDS, got {text!r}")
    return Pause(node, at, seconds)


def _ids(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def cluster_nodes(run_dir: Path) -> dict[str, tuple[str, int]]:
    """The nodes of a cluster started by `mqfed up --run-dir RUN_DIR` (its cluster.json)."""
    data = json.loads((run_dir / "cluster.json").read_text())
    return {n["id"]: (n.get("host", "127.0.0.1"), int(n["ports"]["mqtt"]))
            for n in data["nodes"]}


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register `mqfed load` on the `mqfed` parser."""
    p = sub.add_parser(
        "load", help="send traffic through a running cluster (optionally traced)",
        description="Publish from paho publishers on some nodes to one subscriber on each of "
        "some nodes (topic load/<run>/<node>/<i>; every subscriber subscribes load/<run>/#), "
        "then print what each subscriber got. With --traces DIR, write trace records "
        "(docs/traces.md) for `mqfed audit --traces DIR`.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", type=_node, action="append", metavar="ID=HOST:PORT",
                       help="a node's MQTT address (repeat for each node)")
    where.add_argument("--cluster", type=Path, metavar="RUN_DIR",
                       help="the run dir of a cluster started with `mqfed up`")
    p.add_argument("--publish-on", type=_ids, help="node ids with publishers (default: first)")
    p.add_argument("--subscribe-on", type=_ids, help="node ids with a subscriber (default: all)")
    p.add_argument("--publishers", type=int, default=1, help="publishers per node (default: 1)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="messages per second over all publishers; 0 = flat out (default)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--messages", type=int, help="messages in all (default: 10000)")
    amount.add_argument("--seconds", type=float, help="publish for this long")
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=1, help="QoS (default: 1)")
    p.add_argument("--protocol", choices=("5", "3.1.1"), default="5",
                   help="the publishers' MQTT version (default: 5)")
    p.add_argument("--size", type=int, default=100, help="payload bytes (default: 100)")
    p.add_argument("--window", type=int, default=100,
                   help="most outstanding publishes per publisher (default: 100)")
    p.add_argument("--traces", type=Path, metavar="DIR", help="write trace records into DIR")
    p.add_argument("--run", help="run id in topics and traces (default: random)")
    p.add_argument("--pause", type=_pause, metavar="NODE:AT:SECONDS",
                   help="fault injection: the subscriber on NODE disconnects AT s after the "
                   "start for SECONDS (session kept: at QoS 0 what it misses is lost)")
    p.add_argument("--session-expiry", type=int, default=0, metavar="SECONDS",
                   help="the subscribers keep a session this long (they resume it when their "
                   "node restarts or moves them; default: none)")
    p.add_argument("--subscribe-via", type=_address, metavar="HOST:PORT",
                   help="the subscribers connect here (e.g. the cluster's front) instead of "
                   "to their node, and reconnect there (their records name the node 'front')")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_load)


def _options(args: argparse.Namespace) -> LoadOptions:
    if args.cluster:
        nodes = cluster_nodes(args.cluster)
    else:
        nodes = {ident: (host, port) for ident, host, port in args.node}
    publish_on = args.publish_on or (next(iter(nodes)),)
    subscribe_on = args.subscribe_on or tuple(nodes)
    unknown = {*publish_on, *subscribe_on, *([args.pause.node] if args.pause else [])} - set(nodes)
    if unknown:
        raise ValueError(f"unknown node(s): {', '.join(sorted(unknown))}")
    if args.pause and args.pause.node not in subscribe_on:
        raise ValueError(f"--pause: no subscriber on {args.pause.node}")
    if args.size < payload.MIN_SIZE:
        raise ValueError(f"--size must be at least {payload.MIN_SIZE}")
    extra: dict[str, Any] = {"run": args.run} if args.run else {}
    return LoadOptions(nodes=nodes, publish_on=publish_on, subscribe_on=subscribe_on,
                       publishers=args.publishers, rate=args.rate,
                       messages=None if args.seconds else args.messages or 10000,
                       seconds=args.seconds, qos=args.qos, protocol=args.protocol,
                       size=args.size, window=args.window,
                       traces=args.traces.resolve() if args.traces else None,
                       pause=args.pause, session_expiry=max(0, args.session_expiry),
                       subscribe_via=args.subscribe_via,
                       **extra)


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def render(report: dict[str, Any]) -> str:
    lines = [f"mqfed load: run {report['run']}, {report['sent']} messages sent"]
    for sub, st in report["subscribers"].items():
        lines.append(f"  {sub}: {st['unique']} received, {st['lost']} lost, "
                     f"{st['duplicates']} duplicates, {st['out_of_order']} out of order, "
                     f"p50 {st['p50_ms']:.3f} ms, p99 {st['p99_ms']:.3f} ms")
    lines += [f"  publisher error: {e}" for e in report["publisher_errors"]]
    if report["traces"]:
        lines.append(f"traces in {report['traces']} (audit: mqfed audit --traces "
                     f"{report['traces']})")
    return "\n".join(lines)


def cmd_load(args: argparse.Namespace) -> int:
    try:
        opts = _options(args)
    except (OSError, ValueError, KeyError) as exc:
        print(f"mqfed load: error: {exc}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    progress = Progress.for_command(args.json)  # on a terminal: the messages received so far
    try:
        with progress:
            report = run_load(opts, progress.say, progress.watch)
    except KeyboardInterrupt:
        print("mqfed load: interrupted; its publishers are stopped", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"mqfed load: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report) if args.json else render(report), flush=True)
    return 1 if report["publisher_errors"] else 0
