"""Merging per-node answers into one cluster-wide answer (sans-IO)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sidecar._proto import admin_pb2
from sidecar.admin.wire import Method

__all__ = ["merge"]


def merge(method: Method, answered_by: str, answers: Iterable[Any],
          missing: Mapping[str, tuple[str, str]]) -> Any:
    """One reply of `method`'s type: the rows of every answer in order, `answered_by`, and
    `missing` (node id -> (admin address, error)), sorted by node id."""
    reply = method.reply()
    if hasattr(reply, "answered_by"):
        reply.answered_by = answered_by
    for answer in answers:
        if method.rows:
            getattr(reply, method.rows).extend(getattr(answer, method.rows))
        if isinstance(answer, admin_pb2.RetainedReply):
            reply.sources.update(answer.sources)
    if hasattr(reply, "missing"):
        reply.missing.extend(admin_pb2.Missing(node_id=node, address=addr, error=error)
                             for node, (addr, error) in sorted(missing.items()))
    return reply
