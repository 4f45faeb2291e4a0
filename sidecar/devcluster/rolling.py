"""`mqfed rolling-restart`: restart a local cluster's nodes one at a time, losing nothing.

For each node: drain it through its admin API (clients go to the other nodes through the
front, their sessions move with what they queued), stop it gracefully, start it again, and
wait until it serves: ready, every peer stream between it and the others up both ways, its
drain cleared and HAProxy sending it clients again. Only then the next node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar._proto import admin_pb2
from sidecar.admin.auth import AuthError, read_token
from sidecar.admin.client import AdminCallError, AdminClient
from sidecar.admin.render import drain_line
from sidecar.devcluster import haproxy, launcher
from sidecar.devcluster.layout import addr
from sidecar.devcluster.state import ClusterError, ClusterState

__all__ = ["NodeRestart", "rolling_restart"]

POLL = 0.5
CALL_TIMEOUT = 5.0


@dataclass(frozen=True)
class NodeRestart:
    """How long each step took for one node (seconds)."""

    node: str
    drain_s: float
    restart_s: float
    serving_s: float
    drain: dict[str, Any]  # the drain's last progress

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "drain_s": round(self.drain_s, 2),
                "restart_s": round(self.restart_s, 2), "serving_s": round(self.serving_s, 2),
                "drain": self.drain}


def rolling_restart(run_dir: Path, only: list[str] | None = None, timeout: float = 120.0,
                    say: Callable[[str], None] = print) -> list[NodeRestart]:
    """Restart the nodes of the cluster in `run_dir` (all, by index, or `only`) one by one."""
    state = launcher.status(run_dir)
    order = only or [n.id for n in sorted(state.nodes.values(), key=lambda n: n.index)]
    unknown = [n for n in order if n not in state.nodes]
    if unknown:
        raise ClusterError(f"no node {', '.join(unknown)} in {run_dir} "
                           f"(nodes: {', '.join(state.nodes)})")
    stopped = [n for n in order if state.nodes[n].sidecar is None]
    if stopped:
        raise ClusterError(f"node(s) {', '.join(stopped)} are not running; start them first "
                           "(`mqfed start-node`)")
    try:
        token = read_token(str(state.layout.admin_token_path))
    except AuthError as exc:
        raise ClusterError(str(exc)) from None
    done = []
    for ident in order:
        done.append(_restart_one(run_dir, state, ident, token, timeout, say))
    return done


def _restart_one(run_dir: Path, state: ClusterState, ident: str, token: str, timeout: float,
                 say: Callable[[str], None]) -> NodeRestart:
    admin = addr(state.nodes[ident].ports.admin)
    say(f"{ident}: draining ...")
    start = time.monotonic()
    progress = asyncio.run(_drain(admin, ident, token, timeout, say))
    drained = time.monotonic()
    say(f"{ident}: drained in {drained - start:.1f}s; restarting ...")
    launcher.stop_node(run_dir, ident, "term")
    launcher.start_node(run_dir, ident, timeout)
    restarted = time.monotonic()
    say(f"{ident}: ready in {restarted - drained:.1f}s; waiting until it serves ...")
    _wait_serving(state, ident, token, timeout)
    serving = time.monotonic()
    say(f"{ident}: serving {serving - restarted:.1f}s later")
    return NodeRestart(ident, drained - start, restarted - drained, serving - restarted,
                       progress)


async def _drain(admin: str, ident: str, token: str, timeout: float,
                 say: Callable[[str], None]) -> dict[str, Any]:
    client = AdminClient(admin, token)
    try:
        request = admin_pb2.DrainRequest(node_id=ident)
        reply = await client.call("Drain", request, CALL_TIMEOUT)
        deadline = time.monotonic() + timeout
        last = 0.0
        while reply.progress.state != "drained":
            if reply.progress.state == "serving":
                raise ClusterError(f"{ident} was undrained while it drained")
            if time.monotonic() > deadline:
                raise ClusterError(f"{ident} did not drain within {timeout:.0f}s: "
                                   + drain_line(reply.progress))
            if time.monotonic() - last >= 2.0:
                last = time.monotonic()
                say("  " + drain_line(reply.progress))
            await asyncio.sleep(POLL)
            reply = await client.call("Drain", admin_pb2.DrainRequest(
                node_id=ident, status_only=True), CALL_TIMEOUT)
        p = reply.progress
        return {"seconds": p.seconds, "kicks": p.kicks, "hand_offs": p.hand_offs,
                "messages_queued_down": p.messages_queued_down}
    except AdminCallError as exc:
        raise ClusterError(f"draining {ident} through {admin} failed: {exc}") from None
    finally:
        await client.close()


def _wait_serving(state: ClusterState, ident: str, token: str, timeout: float) -> None:
    """Every node answers, every stream between `ident` and the others is up both ways, it
    does not drain, and HAProxy marks it UP."""
    admin = addr(state.nodes[ident].ports.admin)
    others = {n for n in state.nodes if n != ident and state.nodes[n].sidecar is not None}
    deadline = time.monotonic() + timeout
    why = "no answer yet"
    while time.monotonic() < deadline:
        try:
            reply = asyncio.run(_status(admin, token))
        except AdminCallError as exc:
            why = str(exc)
        else:
            why = _not_serving(reply, ident, others)
            if not why:
                up = haproxy.servers_state(state.layout).get(ident, "")
                if up.startswith("UP"):
                    return
                why = f"HAProxy has it {up or 'unknown'}"
        time.sleep(POLL)
    raise ClusterError(f"{ident} does not serve {timeout:.0f}s after its restart: {why}")


async def _status(admin: str, token: str) -> admin_pb2.StatusReply:
    client = AdminClient(admin, token)
    try:
        return await client.call("Status", admin_pb2.Query(), CALL_TIMEOUT)
    finally:
        await client.close()


def _not_serving(reply: admin_pb2.StatusReply, ident: str, others: set[str]) -> str:
    """Why the restarted node does not serve yet ("" when it does)."""
    statuses = {s.node_id: s for s in reply.statuses}
    missing = sorted(({ident} | others) - set(statuses))
    if missing:
        return f"no status from {', '.join(missing)}"
    if not statuses[ident].ready or statuses[ident].drain not in ("", "serving"):
        return f"{ident} is not ready"
    for node in {ident} | others:
        links = {p.peer: p for p in statuses[node].peers}
        for peer in ({ident} | others) - {node}:
            link = links.get(peer)
            if link is None or link.outbound != "up" or link.inbound != "up":
                return f"stream {node} <-> {peer} is not up"
    return ""
