"""gRPC core settings that must be in place before gRPC is first loaded.

gRPC 1.85 reads peer sockets on its EventEngine threads by default: each frame that arrives
wakes an EventEngine thread, which hands the completion to the asyncio poller thread, which
wakes the event loop. With the two experiments below turned off, the poller thread reads the
socket itself, one thread hop fewer per frame. At 2,000 msgs/s that took the receiving
sidecar from 38-42 % to 30-34 % of a core and the cross-node hop from +0.42-0.54 ms to
+0.34-0.41 ms at p50 (docs/performance.md section 10). gRPC is pinned exactly, so the
experiment names cannot change under us; a user's own ``GRPC_EXPERIMENTS`` is left alone.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["GRPC_EXPERIMENTS", "apply"]

GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def apply(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set ``GRPC_EXPERIMENTS`` unless the user set it; True when this call set it."""
    if environ.get("GRPC_EXPERIMENTS"):
        return False
    environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS
    return True
