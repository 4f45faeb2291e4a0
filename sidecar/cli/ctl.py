"""`mqfed ctl`: ask any node's admin API about the whole cluster.

Exit codes: 0 ok, 1 refused or failed (e.g. no or wrong token), 2 usage, 3 the node is
unreachable, 4 partial answer (the nodes that did not answer are named on stderr and in
`missing` of the JSON), 5 `drain --wait`: the drain did not finish in time (it goes on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from sidecar._proto import admin_pb2
from sidecar.admin.auth import AuthError, read_token
from sidecar.admin.client import AdminCallError, AdminClient
from sidecar.admin.render import drain_line, missing_line, render
from sidecar.devcluster.state import ClusterError

__all__ = ["NOT_DONE", "OK", "PARTIAL", "REFUSED", "UNREACHABLE", "USAGE", "add_command"]

OK, REFUSED, USAGE, UNREACHABLE, PARTIAL, NOT_DONE = 0, 1, 2, 3, 4, 5
POLL = 1.0  # seconds between progress reads of `drain --wait`
DEFAULT_NODE = "127.0.0.1:7101"

_QUERIES = {  # command -> (method, Query fields taken from the arguments)
    "status": ("Status", ()),
    "nodes": ("Nodes", ()),
    "routes": ("Routes", ("topic",)),
    "subscriptions": ("Subscriptions", ("client",)),
    "clients": ("Clients", ("client",)),
    "sessions": ("Sessions", ("client",)),
    "retained": ("Retained", ("prefix",)),
}


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ctl", help="ask a node's admin API about the cluster",
        description="Ask any node; it answers for the whole cluster by asking the others. "
        "Exit codes: 0 ok, 1 refused/failed, 2 usage, 3 unreachable, 4 partial answer, "
        "5 drain --wait timed out.")
    p.add_argument("--node", dest="address",
                   default=os.environ.get("MQFED_CTL_NODE", DEFAULT_NODE),
                   help="HOST:PORT of a node's admin listener (default: $MQFED_CTL_NODE or "
                   f"{DEFAULT_NODE})")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="a local cluster (`mqfed up --run-dir DIR`): ask its first running "
                   "node, with the cluster's admin token (instead of --node and --token-file)")
    p.add_argument("--token-file", help="file holding the admin token (default: "
                   "$MQFED_ADMIN_TOKEN_FILE, else $MQFED_ADMIN_TOKEN)")
    p.add_argument("--token", help="the admin token itself (discouraged: other local users "
                   "can read a command line; prefer --token-file or the environment)")
    p.add_argument("--tls-ca", default=os.environ.get("MQFED_ADMIN_TLS_CA", ""),
                   help="call over TLS, verifying the node against this CA (PEM; for nodes "
                   "with admin.tls; default: $MQFED_ADMIN_TLS_CA)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds (default: 10)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    cmds = p.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    c = cmds.add_parser("status", help="nodes, peer streams, etcd, plugin sync")
    c.add_argument("--node", dest="only", action="append", default=[],
                   help="only this node (id); repeatable")
    cmds.add_parser("nodes", help="the membership view")
    c = cmds.add_parser("routes", help="which nodes a topic goes to, and which filter caused it")
    c.add_argument("--node", dest="only", action="append", default=[],
                   help="only routes as this node (id) sees them; repeatable")
    c.add_argument("--topic", default="", help="a topic name (default: every filter)")
    c = cmds.add_parser("subscriptions", help="subscriptions of every node's clients")
    c.add_argument("--client", default="", help="one client id")
    c.add_argument("--node", dest="only", action="append", default=[], help="node id")
    c = cmds.add_parser("clients", help="client sessions on every node")
    c.add_argument("--node", dest="only", action="append", default=[], help="node id")
    c.add_argument("--client", default="", help="one client id")
    c = cmds.add_parser("sessions", help="the cluster's sessions: owner, online, expiry, and "
                        "which nodes hold a copy")
    c.add_argument("--client", default="", help="one client id")
    c.add_argument("--node", dest="only", action="append", default=[],
                   help="ask only this node (id); repeatable")
    c = cmds.add_parser("retained", help="retained messages (the replicated index)")
    c.add_argument("--prefix", default="", help="topic prefix")
    c.add_argument("--node", dest="only", action="append", default=[], help="node id")
    c = cmds.add_parser(
        "drain", help="drain a node: refuse clients, move them and their sessions elsewhere",
        description="The node stops admitting clients (its /readyz fails, so load balancers "
        "and Kubernetes take it out; connects are closed without a CONNACK, so clients retry "
        "elsewhere), disconnects its clients (MQTT 5: DISCONNECT 0x98), lets their persistent "
        "sessions move with what they queued, hands the sessions of clients that do not come "
        "back to other nodes, and waits until nothing is queued there. It stays drained until "
        "`undrain` or a restart. Any node passes the call on to the node named.")
    c.add_argument("drain_node", metavar="NODE", help="the node id to drain")
    c.add_argument("--wait", action="store_true",
                   help="print the progress every second until it is drained")
    c.add_argument("--wait-timeout", type=float, default=120.0,
                   help="with --wait: give up waiting after this many seconds, exit 5 "
                   "(default: 120)")
    c.add_argument("--status", action="store_true",
                   help="only show the progress of the node's drain")
    c = cmds.add_parser("undrain", help="admit clients on a drained node again")
    c.add_argument("drain_node", metavar="NODE", help="the node id")
    c = cmds.add_parser("trace", help="follow one test message through its hops")
    c.add_argument("--topic", required=True, help="topic to publish the test message on")
    c.add_argument("--qos", type=int, choices=(0, 1), default=1)
    c.add_argument("--payload", default="", help="payload (default: 'mqfed trace <id>')")
    c.add_argument("--wait", type=int, default=1000, help="ms to collect hops (default 1000)")
    p.set_defaults(func=run)


def _local_cluster(run_dir: Path) -> tuple[str, Path]:
    """The admin address of the first running node of `mqfed up`'s cluster in `run_dir`, and
    its admin token file."""
    from sidecar.devcluster.state import load

    state = load(run_dir)
    if state is None:
        raise ValueError(f"no cluster in {run_dir} (start one with `mqfed up --run-dir "
                         f"{run_dir}`)")
    for node in sorted(state.nodes.values(), key=lambda n: n.index):
        if node.sidecar is not None and node.sidecar.running():
            return f"{node.host}:{node.ports.admin}", state.layout.admin_token_path
    raise ValueError(f"no node of the cluster in {run_dir} is running (mqfed start-node)")


def _token(args: argparse.Namespace) -> str | None:
    """--token-file, else --token (with a warning), else the environment."""
    if args.token_file:
        return read_token(args.token_file)
    if args.token:
        print("mqfed ctl: warning: --token puts the admin token on the command line, where "
              "other users of this host can read it (ps, /proc); use --token-file FILE or "
              "MQFED_ADMIN_TOKEN_FILE", file=sys.stderr, flush=True)
        return args.token
    path = os.environ.get("MQFED_ADMIN_TOKEN_FILE")
    if path:
        return read_token(path)
    return os.environ.get("MQFED_ADMIN_TOKEN") or None


def _request(args: argparse.Namespace) -> tuple[str, Any]:
    if args.ctl_command in ("drain", "undrain"):
        return "Drain", admin_pb2.DrainRequest(node_id=args.drain_node,
                                               undrain=args.ctl_command == "undrain",
                                               status_only=getattr(args, "status", False))
    if args.ctl_command == "trace":
        return "Trace", admin_pb2.TraceRequest(topic=args.topic, qos=args.qos,
                                               payload=args.payload.encode(), wait_ms=args.wait)
    method, fields = _QUERIES[args.ctl_command]
    query = admin_pb2.Query(nodes=getattr(args, "only", []))
    for name in fields:
        setattr(query, name, getattr(args, name))
    return method, query


def _credentials(ca_path: str) -> grpc.ChannelCredentials | None:
    if not ca_path:
        return None
    try:
        return grpc.ssl_channel_credentials(root_certificates=Path(ca_path).read_bytes())
    except OSError as exc:
        raise AuthError(f"cannot read the CA file {ca_path}: {exc.strerror}") from None


async def _call(address: str, token: str | None, method: str, request: Any,
                timeout: float, credentials: grpc.ChannelCredentials | None = None) -> Any:
    client = AdminClient(address, token, credentials)
    try:
        return await client.call(method, request, timeout)
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    def fail(code: int, message: str) -> int:
        print(f"mqfed ctl: {message}", file=sys.stderr, flush=True)
        return code

    if args.run_dir is not None:
        try:
            args.address, token_file = _local_cluster(args.run_dir)
        except (ClusterError, ValueError) as exc:
            return fail(USAGE, str(exc))
        args.token_file = args.token_file or str(token_file)
    try:
        token = _token(args)
        credentials = _credentials(args.tls_ca)
    except AuthError as exc:
        return fail(USAGE, str(exc))
    method, request = _request(args)
    timeout = args.timeout + (args.wait / 1000 if method == "Trace" else 0)
    try:
        if method == "Drain" and getattr(args, "wait", False) and not request.status_only:
            return _drain_and_wait(args, token, request, credentials)
        reply = asyncio.run(_call(args.address, token, method, request, timeout, credentials))
    except AdminCallError as exc:
        if exc.unreachable:
            return fail(UNREACHABLE, f"node {args.address}: {exc}")
        if exc.code == "INVALID_ARGUMENT":
            return fail(USAGE, str(exc))
        return fail(REFUSED, str(exc))
    if args.json:
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True),
                         indent=1, sort_keys=True), flush=True)
    else:
        print(render(reply), flush=True)
    missing = list(getattr(reply, "missing", []))
    if missing:
        return fail(PARTIAL, missing_line(missing))
    return OK


def _drain_and_wait(args: argparse.Namespace, token: str | None,
                    request: admin_pb2.DrainRequest,
                    credentials: grpc.ChannelCredentials | None) -> int:
    """Start the drain, then read its progress every POLL seconds until it is drained (a
    line on stderr each time), or `--wait-timeout` passes (exit NOT_DONE)."""
    async def run() -> tuple[int, admin_pb2.DrainReply]:
        client = AdminClient(args.address, token, credentials)
        try:
            reply = await client.call("Drain", request, args.timeout)
            status = admin_pb2.DrainRequest(node_id=request.node_id, status_only=True)
            deadline = time.monotonic() + args.wait_timeout
            while reply.progress.state != "drained":
                print(drain_line(reply.progress), file=sys.stderr, flush=True)
                if reply.progress.state == "serving":
                    return REFUSED, reply  # undrained meanwhile
                if time.monotonic() > deadline:
                    return NOT_DONE, reply
                await asyncio.sleep(POLL)
                reply = await client.call("Drain", status, args.timeout)
            return OK, reply
        finally:
            await client.close()

    code, reply = asyncio.run(run())
    if args.json:
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True),
                         indent=1, sort_keys=True), flush=True)
    else:
        print(render(reply), flush=True)
    if code == NOT_DONE:
        print(f"mqfed ctl: {request.node_id} is not drained after {args.wait_timeout:g}s; "
              "the drain goes on (`mqfed ctl drain --status NODE`)", file=sys.stderr, flush=True)
    elif code == REFUSED:
        print(f"mqfed ctl: {request.node_id} was undrained during the wait", file=sys.stderr,
              flush=True)
    return code
