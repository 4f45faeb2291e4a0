"""The node's status file, `<run_dir>/state.json` (read-only over `NodeView`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.node.facts import NodeView

DETAIL_LIMIT = 1000
"""Filters or sessions above which the per-filter and per-session detail is left out."""


def node_status(node: NodeView, socket_path: Path, limit: int = DETAIL_LIMIT) -> dict[str, Any]:
    """What `state.json` holds: PIDs, addresses, readiness, peers, counters and (for small
    nodes) the interest and sessions."""
    cfg = node.config
    return {
        "node": cfg.node_id,
        "cluster": cfg.cluster,
        "pid": os.getpid(),
        "mosquitto_pid": node.broker.pid if node.broker else None,
        "ready": node.ready,
        "started_at": node.started_at,
        "mqtt": cfg["mqtt"]["listen"],
        "grpc": cfg["grpc"]["listen"],
        "admin": cfg["admin"]["listen"],
        "metrics": cfg["admin"]["metrics"],
        "peers": dict(node.peers),
        "socket": str(socket_path),
        "stream": node.stream.stats(),
        "broker_restarts": node.broker.restarts if node.broker else 0,
        "session_counts": node.table.sessions_status(),
        "routing": node.routing.status() if node.routing else None,
        "cluster_sessions": node.sessions.status() if node.sessions else None,
        "wills": node.wills.status() if node.wills else None,
        "drain": node.drainer.progress().as_dict() if node.drainer else None,
        "journal": node.journal.status() if node.journal else None,
        **_detail(node, limit),
    }


def _detail(node: NodeView, limit: int) -> dict[str, Any]:
    """Per-filter and per-session detail for small nodes (debugging and tests)."""
    table = node.table
    if table.interest_count() > limit or len(table) > limit:  # O(1): written every 0.2 s
        return {"detail": f"omitted: more than {limit} filters or sessions"}
    interest = table.interest()
    sessions = table.sessions()
    return {
        "interest": sorted(([k.group, k.filter, n] for k, n in interest.items()),
                           key=lambda row: (row[0] or "", row[1])),
        "sessions": {client: {"online": info.online, "persistent": info.persistent,
                              "subscriptions": table.subscriptions(client)}
                     for client, info in sessions.items()},
    }


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Write `status` atomically (readers never see half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(status, indent=1, sort_keys=True))
    tmp.replace(path)
