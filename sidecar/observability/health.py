"""Liveness and readiness answers (sans-IO): what /healthz and /readyz return."""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["HealthFacts", "liveness", "readiness"]


@dataclass(frozen=True)
class HealthFacts:
    node_id: str
    ready: bool           # plugin event stream in sync, routing started
    stopping: bool
    loop_lag_s: float     # how late the node's periodic tick is
    fatal: str | None = None
    draining: bool = False  # `mqfed ctl drain`: the node refuses clients


LIVE_LAG_LIMIT = 10.0


def liveness(f: HealthFacts) -> tuple[int, bytes]:
    """200 unless the sidecar is wedged (its event loop stalled) or hit a fatal error."""
    problem = f.fatal or (f"event loop stalled for {f.loop_lag_s:.1f}s"
                          if f.loop_lag_s > LIVE_LAG_LIMIT else None)
    return _answer(problem is None, f.node_id, problem or "alive")


def readiness(f: HealthFacts) -> tuple[int, bytes]:
    """200 once the node serves clients and routes; 503 while starting, draining (so load
    balancers and Kubernetes take it out) or stopping."""
    if f.stopping:
        return _answer(False, f.node_id, "stopping")
    if f.draining:
        return _answer(False, f.node_id, "draining: clients are refused and sent elsewhere")
    if not f.ready:
        return _answer(False, f.node_id, "starting: the plugin's event stream is not in sync yet")
    return _answer(True, f.node_id, "ready")


def _answer(ok: bool, node: str, reason: str) -> tuple[int, bytes]:
    body = json.dumps({"node": node, "ok": ok, "reason": reason}).encode() + b"\n"
    return (200 if ok else 503), body
