"""A moving session's cut mode, the sidecar's part (docs/architecture.md §5, "Exactly once
across a move under traffic"; the plugin's part is `hold.c` and `cut.c`).

While a client moves from an old node to a new one under traffic, messages are routed to both
of its copies. The old copy records the identity of each peer's message it queued and, once
the new node's cut came in that node's stream, refuses the new node's later messages; the new
copy keeps what reaches its client and, released after the old queue came, leaves out what
the old copy had (those identities, and the old node's own messages below the old node's
cut). Each node's cut is a marker its plugin puts among the forwarding connection's copies
(`CutMarker`), which the forwarder numbers in order with them:

- the new node's goes to the old node in its stream (`target`), at once;
- the old node's comes to its drain here (`own_cut`), which sends it with the identities in
  the hand-over's last frame; the new node releases its live hold with them (`release`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from sidecar._proto import peer_pb2

OWN_CUT_TIMEOUT = 5.0
"""Seconds the old node's drain waits for its own cut (the plugin's marker at its next tick,
read back from the forwarding connection); without it the new copy skips only identities."""


class MoveCuts:
    """Who a cut goes to, the old node's own cut, and what a new copy leaves out."""

    def __init__(self) -> None:
        self.arriving: dict[str, str] = {}  # new node: client -> old node (where its cut goes)
        self._own: dict[str, asyncio.Future[int]] = {}  # old node: client -> its cut
        self._skips: dict[str, dict[str, Any]] = {}  # new node: client -> release fields
        self.counters = {"cuts_sent": 0, "own_cuts": 0, "own_cut_timeouts": 0,
                         "releases_skipping": 0}

    def target(self, client: str) -> str | None:
        """The peer this node's cut for `client` goes to (RoutingService.cut_target)."""
        if client in self._own:
            return None  # the old node's: it goes with the hand-over
        peer = self.arriving.get(client)
        if peer is not None:
            self.counters["cuts_sent"] += 1
        return peer

    def on_cut(self, client: str, seq: int) -> None:
        """This node's cut for `client` was made at `seq` (RoutingService.on_cut)."""
        fut = self._own.get(client)
        if fut is not None and not fut.done():
            fut.set_result(seq)

    async def own_cut(self, client: str, hold: Callable[[], Awaitable[None]]) -> int | None:
        """Hold the old copy in cut mode (`hold`: the plugin command) and wait for the cut it
        makes at its next tick; None if it did not come in time."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._own[client] = fut
        try:
            await hold()
            seq = await asyncio.wait_for(fut, OWN_CUT_TIMEOUT)
            self.counters["own_cuts"] += 1
            return seq
        except TimeoutError:
            self.counters["own_cut_timeouts"] += 1
            return None
        finally:
            self._own.pop(client, None)

    def on_last_backlog(self, msg: peer_pb2.SessionBacklog) -> None:
        """The old node's last frame of a hand-over: what the live hold here leaves out when
        it is released (its identities, and the old node's own messages below its cut)."""
        if not msg.cut_seq and not msg.granted_seqs:
            return
        fields: dict[str, Any] = {"granted": [[o, s] for o, s in zip(
            msg.granted_origins, msg.granted_seqs, strict=False)]}
        if msg.cut_seq and msg.cut_origin:
            fields["cuts"] = [[msg.cut_origin, msg.cut_seq]]
        self._skips[msg.client] = fields

    def release(self, client: str) -> dict[str, Any]:
        """The `hold` fields that release `client`'s live hold here (the move is over)."""
        self.arriving.pop(client, None)
        fields = self._skips.pop(client, {})
        if fields:
            self.counters["releases_skipping"] += 1
        return fields

