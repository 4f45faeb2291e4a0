"""The node's status file, `<run_dir>/state.json` (read-only over `NodeView`)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.node.facts import NodeView

log = logging.getLogger("mqfed.node")

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
    _write_text(path, json.dumps(status, indent=1, sort_keys=True))


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class StatusWriter:
    """Writes the status file on a worker thread, one write at a time, the newest text next
    (writes that came meanwhile are skipped). The text is made on the loop, so it is one
    moment's status; the file system calls (open, write, rename: every 0.2-0.5 s), tens of ms
    each on a loaded disk, were 6-12 % of a busy sidecar's loop under the scale benchmark's
    churn and delayed every frame behind them (docs/performance.md "Per-delta cost")."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="status-file")
        self._running = False
        self._next: str | None = None
        self.written = 0  # writes started
        self.skipped = 0  # texts replaced by a newer one before their write started

    def submit(self, status: dict[str, Any]) -> None:
        """Write `status` soon (on the loop; the write itself on the worker)."""
        text = json.dumps(status, indent=1, sort_keys=True)
        if self._running:
            if self._next is not None:
                self.skipped += 1
            self._next = text
            return
        self._start(text)

    def _start(self, text: str) -> None:
        self._running = True
        self.written += 1
        fut = asyncio.get_running_loop().run_in_executor(self._pool, _write_text, self.path, text)
        fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future) -> None:
        self._running = False
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("status file not written: %s", fut.exception(),
                        extra={"path": str(self.path)})
        if self._next is not None:
            text, self._next = self._next, None
            self._start(text)

    def close(self, status: dict[str, Any]) -> None:
        """The last status: written at once, after any write still running."""
        self._pool.shutdown(wait=True)
        self._next = None
        write_status(self.path, status)
