"""What the admin API reads retained messages from (the replicated retained index fills it).

`RetainedSource` is the whole contract: anything with these two members can be handed to the
admin service (`AdminService.retained = ...`). Without one, the service looks for the retained
replication's index (`node.routing.retained.index`, `sidecar/retained/`) and reads it through
`IndexSource`; where that does not exist `NoRetainedIndex` answers with no entries and says why,
so `mqfed ctl retained` works and reports the gap instead of failing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["IndexSource", "NoRetainedIndex", "RetainedItem", "RetainedSource"]


@dataclass(frozen=True)
class RetainedItem:
    """One retained message as the index holds it (the payload itself is not shown)."""

    topic: str
    payload_bytes: int
    qos: int = 0
    origin_node: str = ""
    hlc: int = 0


class RetainedSource(Protocol):
    """A node's view of the cluster's retained messages."""

    source: str
    """A short description for the operator, e.g. "replicated index (1234 topics)"."""

    def retained(self, prefix: str, limit: int) -> list[RetainedItem]:
        """Up to `limit` retained messages whose topic starts with `prefix`, by topic."""


class NoRetainedIndex:
    """Stand-in until the replicated retained index exists: nothing to list."""

    source = "none: the replicated retained index is not built yet (issue 5)"

    def retained(self, prefix: str, limit: int) -> list[RetainedItem]:
        return []


class IndexSource:
    """Reads an index of retained entries (`topic`, `payload`, `qos`, `origin`, `hlc`,
    `live(now_ms)`; tombstones and expired entries are not listed)."""

    def __init__(self, index: Any) -> None:
        self.index = index

    @property
    def source(self) -> str:
        return f"replicated retained index ({len(self.index)} entries incl. tombstones)"

    def retained(self, prefix: str, limit: int) -> list[RetainedItem]:
        now_ms = int(time.time() * 1000)
        items = [RetainedItem(e.topic, len(e.payload), e.qos, e.origin, e.hlc)
                 for e in self.index if e.topic.startswith(prefix) and e.live(now_ms)]
        return sorted(items, key=lambda i: i.topic)[:limit]
