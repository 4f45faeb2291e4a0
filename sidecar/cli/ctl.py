"""`mqfed ctl`: ask any node's admin API about the whole cluster.

Exit codes: 0 ok, 1 refused or failed (e.g. no or wrong token), 2 usage, 3 the node is
unreachable, 4 partial answer (the nodes that did not answer are named on stderr and in
`missing` of the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from sidecar._proto import admin_pb2
from sidecar.admin.auth import AuthError, read_token
from sidecar.admin.client import AdminCallError, AdminClient
from sidecar.admin.render import missing_line, render

__all__ = ["OK", "PARTIAL", "REFUSED", "UNREACHABLE", "USAGE", "add_command"]

OK, REFUSED, USAGE, UNREACHABLE, PARTIAL = 0, 1, 2, 3, 4
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
        "Exit codes: 0 ok, 1 refused/failed, 2 usage, 3 unreachable, 4 partial answer.")
    p.add_argument("--node", dest="address",
                   default=os.environ.get("MQFED_CTL_NODE", DEFAULT_NODE),
                   help="HOST:PORT of a node's admin listener (default: $MQFED_CTL_NODE or "
                   f"{DEFAULT_NODE})")
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
    c = cmds.add_parser("trace", help="follow one test message through its hops")
    c.add_argument("--topic", required=True, help="topic to publish the test message on")
    c.add_argument("--qos", type=int, choices=(0, 1), default=1)
    c.add_argument("--payload", default="", help="payload (default: 'mqfed trace <id>')")
    c.add_argument("--wait", type=int, default=1000, help="ms to collect hops (default 1000)")
    p.set_defaults(func=run)


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

    try:
        token = _token(args)
        credentials = _credentials(args.tls_ca)
    except AuthError as exc:
        return fail(USAGE, str(exc))
    method, request = _request(args)
    timeout = args.timeout + (args.wait / 1000 if method == "Trace" else 0)
    try:
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
