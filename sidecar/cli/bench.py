"""`mqfed bench`: throughput and latency of one cluster hop, against a plain Mosquitto bridge."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from sidecar.bench import payload
from sidecar.bench.drain import DrainOptions, render_drain, run_drain
from sidecar.bench.run import BRIDGE_OFFSET, BenchOptions, run
from sidecar.bench.scale import PHASES, ScaleOptions, render_scale, run_scale
from sidecar.bench.sessions import SessionsOptions, render_sessions, run_sessions
from sidecar.bench.table import render
from sidecar.cli.progress import Progress, elapsed_since
from sidecar.devcluster.layout import MAX_NODES

DEFAULT_BASE_PORT = 22883
DEFAULT_RUN_DIR = Path("run/bench")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected more than 0, got {text}")
    return value


def _cases(text: str) -> str:
    if not text or set(text) - set("abc") or len(set(text)) != len(text):
        raise argparse.ArgumentTypeError(f"expected some of a, b, c (e.g. abc), got {text!r}")
    return "".join(sorted(text))


def _phases(text: str) -> tuple[str, ...]:
    wanted = [p.strip() for p in text.split(",") if p.strip()]
    unknown = set(wanted) - set(PHASES)
    if not wanted or unknown:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(PHASES)}, got {text!r}")
    return tuple(p for p in PHASES if p in wanted)


def _node_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(p) for p in text.split(","))
    except ValueError:
        counts = ()
    if not counts or any(not 2 <= n <= MAX_NODES - 1 for n in counts):
        raise argparse.ArgumentTypeError(
            f"expected cluster sizes from 2 to {MAX_NODES - 1}, e.g. 3,5,9, got {text!r}")
    return counts


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register `mqfed bench` on the `mqfed` parser."""
    p = sub.add_parser(
        "bench", help="measure throughput and latency of a cross-node hop",
        description="Start a 2-node mqfed cluster (`mqfed up`) and two stock Mosquittos joined "
        "by a plain bridge, then measure, with paho publishers and one subscriber: (a) "
        "publisher and subscriber on node n1, (b) publisher on n1 and subscriber on n2, (c) "
        "publisher on bridge broker A and subscriber on B. Prints throughput at the "
        "subscriber, p50/p99/max latency, loss, duplicates, reordering, CPU per process and "
        "the ratio b/a; stops everything it started. Ports for base port P: the cluster uses "
        f"P..P+401 (see `mqfed up -h`), the bridge brokers P+{BRIDGE_OFFSET} and "
        f"P+{BRIDGE_OFFSET + 1}; all on 127.0.0.1.")
    p.add_argument("--rate", type=_non_negative, default=0.0,
                   help="messages per second over all publishers; 0 = flat out (default)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--messages", type=_positive_int,
                        help="messages per case over all publishers (default: 20000)")
    amount.add_argument("--seconds", type=_positive, help="publish for this long per case")
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=1, help="QoS (default: 1)")
    p.add_argument("--protocol", choices=("5", "3.1.1"), default="5",
                   help="the publishers' MQTT version (default: 5)")
    p.add_argument("--size", type=int, default=100,
                   help=f"payload bytes, at least {payload.MIN_SIZE} (default: 100)")
    p.add_argument("--publishers", type=_positive_int, default=1,
                   help="publisher processes, sharing rate and messages (default: 1)")
    p.add_argument("--window", type=_positive_int, default=100,
                   help="most outstanding publishes per publisher; at QoS >= 1 at most the "
                   "broker's Receive Maximum (Mosquitto: 20) (default: 100)")
    p.add_argument("--cases", type=_cases, default="abc", help="which cases (default: abc)")
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                   help=f"folder for the cluster and bridge files (default: ./{DEFAULT_RUN_DIR})")
    p.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                   help=f"first port used (default: {DEFAULT_BASE_PORT})")
    p.add_argument("--traces", type=Path, metavar="DIR",
                   help="write trace records (docs/traces.md) into DIR, for `mqfed audit`")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    scale = p.add_argument_group(
        "--scale", "Instead: the control plane on a 3-node cluster (or one cluster per size in "
        "--nodes). Phases: bulk (FILTERS distinct filters subscribed on n1: time until every "
        "peer routes them, CPU and memory per 10,000), churn (subscription churn across the "
        "nodes: interest lag p50/p99), clients (CLIENTS clients through the HAProxy front, a "
        "topic each, one publish to every topic: all reached, times, memory per client), "
        "fanout (subscribers spread over the nodes on one topic: arrival p50/p99, peer-stream "
        "bytes per publish), join (a joining node: time until it routes everything). Uses "
        "--run-dir and --base-port.")
    scale.add_argument("--scale", action="store_true", help="run the scale benchmark")
    scale.add_argument("--filters", type=_positive_int, default=100_000,
                       help="filters subscribed on n1 (default: 100000)")
    scale.add_argument("--churn-rate", type=_positive_int, default=2000,
                       help="subscribes per second, and as many unsubscribes, over all nodes "
                       "(default: 2000)")
    scale.add_argument("--churn-seconds", type=_non_negative, default=60.0,
                       help="how long the churn runs; 0 skips it (default: 60)")
    scale.add_argument("--phases", type=_phases, default=PHASES,
                       help=f"which phases, comma-separated (default: {','.join(PHASES)}); "
                       "they run in that order")
    scale.add_argument("--nodes", type=_node_counts, default=(3,), metavar="N[,N...]",
                       help="cluster sizes, e.g. 3,5,9: the phases on a fresh cluster of "
                       "each size in RUN_DIR/<N>-nodes, then a table (default: 3)")
    scale.add_argument("--clients", type=_positive_int, default=10_000,
                       help="clients of the clients phase (default: 10000)")
    scale.add_argument("--fanout", type=_positive_int, default=1000,
                       help="subscribers of the fanout phase (default: 1000)")
    scale.add_argument("--fanout-publishes", type=_positive_int, default=10,
                       help="publishes of the fanout phase, one after another (default: 10)")
    sess = p.add_argument_group(
        "--sessions", "Instead: persistent sessions on a 3-node cluster. N sessions made over "
        "the nodes (time until every node holds them, memory per session), MOVES of them "
        "resumed on another node (CONNECT to CONNACK p50/p99), then a joining node (time "
        "until it serves them all). Uses --run-dir and --base-port.")
    sess.add_argument("--sessions", type=_positive_int, metavar="N",
                      help="run the session benchmark with N sessions")
    sess.add_argument("--moves", type=_positive_int, default=200,
                      help="sessions resumed on another node (default: 200)")
    sess.add_argument("--queue", type=_non_negative_int, default=8000,
                      help="then one session with this many messages queued on n1, resumed "
                      "on n3: time until all arrived (default: 8000; 0 skips it)")
    drain = p.add_argument_group(
        "--drain", "Instead: how long draining a node takes (`mqfed ctl drain`), on a 3-node "
        "cluster. CLIENTS clients, PERSISTENT of them with persistent sessions, connect to n1 "
        "through the front; n1 is drained: time until no client is left, no session is owned "
        "there, and it is drained; reconnects and session present. Uses --run-dir and "
        "--base-port.")
    drain.add_argument("--drain", action="store_true", help="run the drain benchmark")
    drain.add_argument("--drain-clients", type=_positive_int, default=1000,
                       help="clients on the drained node (default: 1000)")
    drain.add_argument("--drain-persistent", type=_positive_int, default=100,
                       help="of them with persistent sessions (default: 100)")
    p.set_defaults(func=cmd_bench)


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _report(args: argparse.Namespace, run_it: Callable[..., dict], opts: object,
            render_it: Callable[[dict], str], watched: bool = False) -> int:
    """Run one benchmark (`run_it(opts, say)`, or `run_it(opts, say, watch)` if `watched`),
    stopping what it started on Ctrl-C, SIGTERM or SIGHUP, and print its report (JSON with
    --json). On a terminal a progress bar shows the messages received in each case
    (`watched`) or the time elapsed and the current step."""
    progress = Progress.for_command(args.json)

    def say(text: str) -> None:
        progress.say(text)
        progress.note(text.rstrip(" .")[:60])

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)  # stop what was started, as for Ctrl-C
    try:
        with progress:
            if watched:
                report = run_it(opts, progress.say, progress.watch)
            else:
                with progress.watch("bench", elapsed_since(), unit="s"):
                    report = run_it(opts, say)
    except KeyboardInterrupt:
        say("mqfed bench: interrupted; everything it started is stopped")
        return 130
    except Exception as exc:
        say(f"mqfed bench: error: {exc}")
        return 1
    print(json.dumps(report) if args.json else render_it(report), flush=True)
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    return _report(args, run_scale, ScaleOptions(
        run_dir=args.run_dir.resolve(), base_port=args.base_port, filters=args.filters,
        churn_rate=args.churn_rate, churn_seconds=args.churn_seconds, phases=args.phases,
        node_counts=args.nodes, clients=args.clients, fanout=args.fanout,
        fanout_publishes=args.fanout_publishes), render_scale)


def cmd_sessions(args: argparse.Namespace) -> int:
    return _report(args, run_sessions, SessionsOptions(
        run_dir=args.run_dir.resolve(), base_port=args.base_port, sessions=args.sessions,
        moves=args.moves, messages=args.messages or 20_000, queue=args.queue),
        render_sessions)


def cmd_drain(args: argparse.Namespace) -> int:
    if args.drain_persistent > args.drain_clients:
        print("mqfed bench: error: --drain-persistent must not exceed --drain-clients",
              file=sys.stderr)
        return 2
    return _report(args, run_drain, DrainOptions(
        run_dir=args.run_dir.resolve(), base_port=args.base_port, clients=args.drain_clients,
        persistent=args.drain_persistent), render_drain)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.drain:
        return cmd_drain(args)
    if args.scale:
        return cmd_scale(args)
    if args.sessions:
        return cmd_sessions(args)
    if args.size < payload.MIN_SIZE:
        print(f"mqfed bench: error: --size must be at least {payload.MIN_SIZE}", file=sys.stderr)
        return 2
    opts = BenchOptions(run_dir=args.run_dir.resolve(), base_port=args.base_port,
                        rate=args.rate, messages=None if args.seconds else args.messages or 20000,
                        seconds=args.seconds, qos=args.qos, protocol=args.protocol,
                        size=args.size,
                        publishers=args.publishers, window=args.window, cases=args.cases,
                        traces=args.traces.resolve() if args.traces else None)
    return _report(args, run, opts, render, watched=True)
