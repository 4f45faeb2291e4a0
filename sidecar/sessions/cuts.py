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

In a chain of quick moves (the client left the new node before the old queue came there), the
middle node's live hold is never released: its drain holds it in cut mode with what its own
old copy had (`upstream`), and its last frame carries those too, since that old queue is in
the queue it hands on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sidecar._proto import peer_pb2

OWN_CUT_TIMEOUT = 5.0
"""Seconds the old node's drain waits for its own cut (the plugin's marker at its next tick,
read back from the forwarding connection); without it the new copy skips only identities."""


@dataclass(frozen=True)
class OldCopyCuts:
    """What an old copy's last hand-over frame tells the new copy to leave out of what it
    kept: its node's own cut (origin, seq), the identities of the peers' messages it queued,
    and the cuts of the old copies before it in a chain of moves (their queues are in it)."""

    cut: tuple[str, int] | None = None
    granted: tuple[tuple[str, int], ...] = ()
    upstream: tuple[tuple[str, int], ...] = ()

    def hold_fields(self) -> dict[str, Any]:
        """As the plugin's `hold` command takes them (`granted`, `cuts`: every cut); none
        when there is nothing to leave out."""
        cuts = ([list(self.cut)] if self.cut else []) + [list(c) for c in self.upstream]
        if not self.granted and not cuts:
            return {}
        return {"granted": [list(g) for g in self.granted], **({"cuts": cuts} if cuts else {})}


class MoveCuts:
    """Who a cut goes to, the old node's own cut, and what a new copy leaves out."""

    def __init__(self) -> None:
        self.arriving: dict[str, str] = {}  # new node: client -> old node (where its cut goes)
        self._own: dict[str, asyncio.Future[int]] = {}  # old node: client -> its cut
        # new node: client -> what the old copy had (its last frame's cuts, all as upstream)
        self._skips: dict[str, OldCopyCuts] = {}
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
        if not msg.cut_seq and not msg.granted_seqs and not msg.upstream_cut_seqs:
            return
        cuts = [(msg.cut_origin, msg.cut_seq)] if msg.cut_seq and msg.cut_origin else []
        cuts += [(o, s) for o, s in zip(msg.upstream_cut_origins, msg.upstream_cut_seqs,
                                        strict=False) if o and s]
        self._skips[msg.client] = OldCopyCuts(
            granted=tuple(zip(msg.granted_origins, msg.granted_seqs, strict=False)),
            upstream=tuple(cuts))

    def upstream(self, client: str) -> OldCopyCuts:
        """What the old copy of `client`'s copy here had, when its live hold was not released
        (the client moved on before that queue came: a chain): the drain's hold leaves it out
        of the live ring, and the onward copy out of what it kept. Kept until the drain went
        (`forget_upstream`): a failed one is tried again."""
        return self._skips.get(client, OldCopyCuts())

    def forget_upstream(self, client: str) -> None:
        """`client`'s drain onwards went: what its old copy had is in the onward copy."""
        self._skips.pop(client, None)

    def release(self, client: str) -> dict[str, Any]:
        """The `hold` fields that release `client`'s live hold here (the move is over)."""
        self.arriving.pop(client, None)
        fields = self._skips.pop(client, OldCopyCuts()).hold_fields()
        if fields:
            self.counters["releases_skipping"] += 1
        return fields

