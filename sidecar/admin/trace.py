"""Message traces (sans-IO): a user property marks a test message; each sidecar on its path
records hop timestamps in a small ring buffer that the admin API reads.

Cost for untraced messages: the hot path calls in only for messages that carry user
properties, and `trace_id` is one scan of those.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["TRACE_PROPERTY", "Hop", "TraceRecorder", "new_trace_id", "trace_id"]

TRACE_PROPERTY = "mqfed-trace"
"""MQTT v5 user property whose value is the trace id."""


def new_trace_id() -> str:
    return secrets.token_hex(8)


def trace_id(user_properties: Iterable[tuple[str, str]]) -> str | None:
    """The trace id among (key, value) user properties, or None."""
    for key, value in user_properties:
        if key == TRACE_PROPERTY:
            return value
    return None


@dataclass(frozen=True)
class Hop:
    """One thing that happened to a traced message on one node."""

    trace_id: str
    node_id: str
    event: str
    at_ms: float
    peer: str = ""
    detail: str = ""


class TraceRecorder:
    """The last `size` hops of traced messages on this node."""

    def __init__(self, node_id: str, size: int = 1000) -> None:
        self.node_id = node_id
        self.recorded = 0
        self._hops: deque[Hop] = deque(maxlen=size)
        self._published: dict[int, str] = {}  # local publish mid -> trace id (broker acks)

    def record(self, trace: str, event: str, at_ms: float, peer: str = "",
               detail: str = "") -> None:
        self.recorded += 1
        self._hops.append(Hop(trace, self.node_id, event, at_ms, peer, detail))

    def expect_ack(self, mid: int, trace: str) -> None:
        """A traced re-injection was published as `mid`; `on_acked` records its broker ack."""
        if len(self._published) > 1000:
            self._published.clear()
        self._published[mid] = trace

    @property
    def waiting(self) -> bool:
        """True while a traced publish awaits its broker ack (the hot path checks this)."""
        return bool(self._published)

    def on_acked(self, mids: Iterable[int], at_ms: float) -> None:
        for mid in mids:
            trace = self._published.pop(mid, None)
            if trace is not None:
                self.record(trace, "broker_acked", at_ms, detail="the node's Mosquitto took it")

    def hops(self, trace: str) -> list[Hop]:
        return [h for h in self._hops if h.trace_id == trace]
