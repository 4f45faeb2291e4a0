"""`mqfed up | down | add-node | stop-node | start-node | rolling-restart | status`: a local
cluster on loopback."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sidecar.cli.progress import Progress
from sidecar.config import NODE_ID_RE
from sidecar.devcluster import haproxy, launcher, rolling
from sidecar.devcluster.layout import (
    DEFAULT_BASE_PORT,
    DEFAULT_CLUSTER,
    DEFAULT_RUN_DIR,
    MAX_NODES,
    addr,
)
from sidecar.devcluster.state import ClusterError, ClusterState
from sidecar.private_files import make_private

MANY_NODES = 5  # `up` of this many nodes or more shows a progress bar on a terminal

LAYOUT_HELP = (
    "Ports for base port P: front (HAProxy) P; node i MQTT P+i, gRPC P+100+i, admin P+200+i, "
    "metrics P+300+i; etcd P+400 (client) and P+401 (peer); all on 127.0.0.1. The run dir "
    "holds cluster.json (what runs, by PID), etcd/, haproxy/ and nodes/<id>/ (config, "
    "node.log, the node's state.json and Mosquitto files)."
)


def _run_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                        help=f"the cluster's folder (default: ./{DEFAULT_RUN_DIR})")


def _timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for each part to be ready (default: 30)")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the local-cluster commands on the `mqfed` parser."""
    p = sub.add_parser("up", help="start a local cluster: etcd, N nodes, an HAProxy front",
                       description="Start etcd, N nodes and an HAProxy TCP front (round robin, "
                       "health-checked) on loopback. Stays in the foreground until Ctrl-C or "
                       "SIGTERM, which stop everything; --detach returns once all is ready. "
                       "The run dir's previous etcd/, haproxy/ and nodes/ are removed first. "
                       + LAYOUT_HELP)
    p.add_argument("--nodes", type=int, default=3, help=f"number of nodes, 1..{MAX_NODES} "
                   "(default: 3)")
    p.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                   help=f"the front's port; the others follow from it (default: "
                   f"{DEFAULT_BASE_PORT})")
    _run_dir(p)
    p.add_argument("--cluster", default=DEFAULT_CLUSTER,
                   help=f"cluster id (default: {DEFAULT_CLUSTER})")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   help="the nodes' log level (default: the node's own, warning)")
    _timeout(p)
    p.add_argument("--detach", action="store_true",
                   help="return once the cluster is ready; stop it with `mqfed down`")
    p.add_argument("--json", action="store_true", help="print the cluster's addresses as JSON")
    p.add_argument("--netns", action="store_true",
                   help="root only: each node (sidecar and Mosquitto) in its own network "
                   "namespace on a bridge (10.213.x.0/24), so that `mqfed chaos` can cut, "
                   "slow and lose real packets between nodes; etcd and the front stay on "
                   "loopback and the bridge; `mqfed down` removes every namespace, veth pair "
                   "and the bridge")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop the local cluster of a run dir",
                       description="Stop everything `mqfed up` and `add-node` started in the "
                       "run dir (by recorded PID), including a foreground `mqfed up`. Logs "
                       "stay in the run dir.")
    _run_dir(p)
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("add-node", help="start one more node and join it to the cluster",
                       description="Start the next node (next free id and ports), join it to "
                       "etcd and to the HAProxy front. " + LAYOUT_HELP)
    _run_dir(p)
    _timeout(p)
    p.add_argument("--json", action="store_true", help="print the node's entry as JSON")
    p.set_defaults(func=cmd_add_node)

    p = sub.add_parser("stop-node", help="stop one node (gracefully, or simulate a crash)",
                       description="Stop one node by PID: SIGTERM by default (the sidecar "
                       "stops its Mosquitto; anything left is stopped after it).")
    _run_dir(p)
    p.add_argument("node", help="node id, e.g. n2")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--kill", action="store_true",
                     help="SIGKILL the sidecar and its Mosquitto (a node crash)")
    how.add_argument("--sidecar-only", action="store_true",
                     help="SIGKILL only the sidecar; Mosquitto keeps running and its clients "
                     "stay connected (start-node adopts it)")
    p.set_defaults(func=cmd_stop_node)

    p = sub.add_parser("start-node", help="start a stopped node again",
                       description="Start a stopped node with its old id, ports and files; "
                       "it adopts its Mosquitto if that still runs.")
    _run_dir(p)
    p.add_argument("node", help="node id, e.g. n2")
    _timeout(p)
    p.add_argument("--json", action="store_true", help="print the node's entry as JSON")
    p.set_defaults(func=cmd_start_node)

    p = sub.add_parser("rolling-restart", help="restart every node, one at a time, losing "
                       "nothing", description="For each node in turn: drain it (`mqfed ctl "
                       "drain`: clients reconnect to the others through the front, sessions "
                       "move with what they queued), stop it gracefully, start it again, and "
                       "wait until it serves (ready, every peer stream up, HAProxy sending it "
                       "clients) before the next.")
    _run_dir(p)
    p.add_argument("--node", dest="only", action="append", default=[],
                   help="restart only this node (repeatable; in the order given)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds each drain, start and wait may take (default: 120)")
    p.add_argument("--json", action="store_true", help="print the steps' times as JSON")
    p.set_defaults(func=cmd_rolling_restart)

    p = sub.add_parser("status", help="show the local cluster of a run dir",
                       description="Show what runs in the run dir (PIDs of stopped parts are "
                       "null).")
    _run_dir(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_status)


# ---- output ---------------------------------------------------------------------------------
def _fail(command: str, exc: Exception) -> int:
    print(f"mqfed {command}: error: {exc}", file=sys.stderr, flush=True)
    return 1


def _first_host(state: ClusterState) -> str:
    first = min(state.nodes.values(), key=lambda n: n.index, default=None)
    return first.host if first is not None else "127.0.0.1"


def _describe(state: ClusterState) -> str:
    lay = state.layout
    front, run_dir = lay.front_port, lay.run_dir
    limit = haproxy.connection_limit(lay)
    lines = [f"mqfed cluster '{state.cluster}' (run dir {run_dir})",
             f"  front (HAProxy, round robin)  {addr(front)}"
             + (f"  (at most {limit:,} connections: HAProxy's maxconn, from its open-files"
                " limit)" if limit else ""),
             f"  etcd                          {addr(lay.etcd_client_port)}  (user mqfed,"
             f" password in {lay.etcd_password_path}; root's in"
             f" {lay.etcd_root_password_path.name})"]
    for node in sorted(state.nodes.values(), key=lambda n: n.index):
        p, h = node.ports, node.host
        where = (f"MQTT {h}:{p.mqtt}  gRPC {h}:{p.grpc}  admin {h}:{p.admin}  "
                 f"metrics {h}:{p.metrics}")
        if state.netns is not None:
            where += f"  (namespace {state.netns.namespace(node.index)})"
        if not node.sidecar:
            where += "  (stopped)" if not node.mosquitto else "  (sidecar stopped)"
        lines.append(f"  {node.id:<4}{where}")
    lines += ["Connect to the front or to any node, e.g.:",
              f"  mosquitto_sub -h 127.0.0.1 -p {front} -t '#' -v",
              f"  mosquitto_pub -h 127.0.0.1 -p {front} -t hello -m world",
              "Inspect it from any node (admin API, token in the run dir):",
              *(f"  mqfed ctl --node {n.host}:{n.ports.admin} --token-file {lay.admin_token_path} "
                "status" for n in sorted(state.nodes.values(), key=lambda n: n.index)[:1]),
              f"  status page (live, the whole cluster): http://{_first_host(state)}:"
              f"{lay.node_ports(1).metrics}/ (every node serves it)",
              f"  metrics and probes: http://{_first_host(state)}:"
              f"{lay.node_ports(1).metrics}/metrics, "
              "/healthz, /readyz",
              f"Logs: {run_dir}/nodes/<id>/node.log, {run_dir}/etcd/etcd.log, "
              f"{run_dir}/haproxy/haproxy.log"]
    return "\n".join(lines)


def _print_json(data: Any) -> None:
    print(json.dumps(data), flush=True)


# ---- commands -------------------------------------------------------------------------------
def cmd_up(args: argparse.Namespace) -> int:
    make_private()  # the cluster's files (logs, configs, state) 0600
    if not NODE_ID_RE.match(args.cluster):
        return _fail("up", ClusterError("--cluster: expected 1-63 letters, digits, '_', '.', "
                                        f"'-', got {args.cluster!r}"))
    run_dir = args.run_dir.resolve()
    opts = launcher.UpOptions(nodes=args.nodes, base_port=args.base_port, run_dir=run_dir,
                              cluster=args.cluster, log_level=args.log_level,
                              timeout=args.timeout, foreground=not args.detach,
                              netns=args.netns)
    try:
        launcher.check(opts)
    except ClusterError as exc:
        return _fail("up", exc)
    if not args.json:
        print(f"starting etcd, {args.nodes} node(s) and HAProxy in {run_dir} ...",
              file=sys.stderr, flush=True)
    # many nodes take a while: on a terminal, a bar of the parts ready
    progress = Progress.for_command(args.json, wanted=args.nodes >= MANY_NODES)
    progress.stage("up", args.nodes + 2, unit="step")
    with launcher.deferred_signals():  # Ctrl-C/SIGTERM stop what was started, at any time
        try:
            with progress:
                state = launcher.up(opts, lambda done, _all, text: progress.set(done, text))
        except ClusterError as exc:
            return _fail("up", exc)
        except KeyboardInterrupt:
            print("mqfed up: interrupted; everything it started is stopped", file=sys.stderr)
            return 130
        if args.json:
            _print_json(state.summary())
        else:
            print(_describe(state))
            print(f"Stop it with: mqfed down --run-dir {run_dir}" if args.detach
                  else "Press Ctrl-C to stop the cluster.", flush=True)
        if args.detach:
            return 0
        try:
            launcher.serve(run_dir)
        except ClusterError as exc:
            return _fail("up", exc)
    if not args.json:
        print("cluster stopped", flush=True)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    run_dir = args.run_dir.resolve()
    try:
        state = launcher.down(run_dir)
    except ClusterError as exc:
        return _fail("down", exc)
    print(f"cluster '{state.cluster}' in {run_dir} stopped", flush=True)
    return 0


def cmd_add_node(args: argparse.Namespace) -> int:
    make_private()  # the cluster's files (logs, configs, state) 0600
    run_dir = args.run_dir.resolve()
    try:
        with launcher.deferred_signals():
            state, node = launcher.add_node(run_dir, args.timeout)
    except ClusterError as exc:
        return _fail("add-node", exc)
    except KeyboardInterrupt:
        print("mqfed add-node: interrupted; the new node is stopped", file=sys.stderr)
        return 130
    entry = node.entry(state.layout.node_dir(node.id))
    if args.json:
        _print_json(entry)
    else:
        print(f"{node.id} joined: MQTT {entry['mqtt']}  gRPC {entry['grpc']}  "
              f"admin {entry['admin']}  metrics {entry['metrics']}", flush=True)
    return 0


def cmd_stop_node(args: argparse.Namespace) -> int:
    how = "kill" if args.kill else "sidecar" if args.sidecar_only else "term"
    try:
        ident = launcher.node_ident(args.node)
        node = launcher.stop_node(args.run_dir.resolve(), ident, how)
    except ClusterError as exc:
        return _fail("stop-node", exc)
    extra = f" (Mosquitto PID {node.mosquitto.pid} still runs)" if node.mosquitto else ""
    print(f"{ident} stopped{extra}", flush=True)
    return 0


def cmd_start_node(args: argparse.Namespace) -> int:
    make_private()  # the cluster's files (logs, configs, state) 0600
    run_dir = args.run_dir.resolve()
    try:
        ident = launcher.node_ident(args.node)
        with launcher.deferred_signals():
            state, node = launcher.start_node(run_dir, ident, args.timeout)
    except ClusterError as exc:
        return _fail("start-node", exc)
    except KeyboardInterrupt:
        print(f"mqfed start-node: interrupted; {args.node} is stopped", file=sys.stderr)
        return 130
    entry = node.entry(state.layout.node_dir(node.id))
    if args.json:
        _print_json(entry)
    else:
        print(f"{ident} started: MQTT {entry['mqtt']}", flush=True)
    return 0


def cmd_rolling_restart(args: argparse.Namespace) -> int:
    make_private()  # the restarted nodes' files 0600
    run_dir = args.run_dir.resolve()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:
        with launcher.deferred_signals():
            done = rolling.rolling_restart(run_dir, args.only or None, args.timeout, say)
    except ClusterError as exc:
        return _fail("rolling-restart", exc)
    except KeyboardInterrupt:
        print("mqfed rolling-restart: interrupted; the node being restarted may be drained "
              "or stopped (`mqfed start-node`, `mqfed ctl undrain`)", file=sys.stderr)
        return 130
    if args.json:
        _print_json([d.as_dict() for d in done])
    else:
        for d in done:
            print(f"{d.node}: drained {d.drain_s:.1f}s, restarted {d.restart_s:.1f}s, "
                  f"serving {d.serving_s:.1f}s later", flush=True)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        state = launcher.status(args.run_dir.resolve())
    except ClusterError as exc:
        return _fail("status", exc)
    if args.json:
        data = state.summary()
        data["pids"] = {"launcher": state.launcher.pid if state.launcher else None,
                        "etcd": state.etcd.pid if state.etcd else None,
                        "haproxy": state.haproxy.pid if state.haproxy else None}
        _print_json(data)
    else:
        print(_describe(state))
    return 0
