"""The forwarding connections as one forwarding client (adapter).

`routing.forward_shards` = K connections hold the forwarding subscriptions, each filter on
the shard `shard_of(filter, K)` (sidecar.local.shards): Mosquitto 2.0.11's cost of a SUBSCRIBE
grows with the subscriptions its client already holds, so K clients holding N/K each cost it
about K times less than one holding N (docs/architecture.md "Interest at scale"). Shard 0 is
`<sidecar_id>.fwd`, which alone re-injects peers' messages (publish, barrier); the plugin keeps
those re-injections from the other shards (No Local covers only `.fwd`'s own subscriptions;
origin.c denies the READ). Every shard is a `ForwardClient` of its own: its session, its
packet ids (copies are handed over with `shard << 16 | packet id`, and `ack` routes by it), its
gap tracker and probes. K = 1 is the single `.fwd` connection as before.

The layout is kept in `<run_dir>/forward-shards`: when K changed since the last run, every
shard starts a clean session (else the old sessions would keep filters on shards that no longer
hold them, and a message would come twice).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sidecar.journal.confirmations import Confirmations
from sidecar.local.forward_client import ForwardClient
from sidecar.local.shards import client_ids, global_mid, shard_of, split_mid
from sidecar.message import MessageProperties
from sidecar.routing.forwarder import CutMarker, LocalCopy


def _ignore(_tickets: list[int]) -> None:
    """Shards other than 0 never publish."""


def layout_changed(path: Path, shards: int) -> bool:
    """Whether the forwarding sessions were made with another number of shards (no file: the
    one `.fwd` connection of earlier versions)."""
    try:
        before = int(path.read_text().strip() or "1")
    except FileNotFoundError:
        before = 1
    except ValueError:
        return True
    return before != shards


class ForwardShards:
    """K forwarding connections behind the surface routing uses of one."""

    def __init__(self, socket_path: Path, secret: str, sidecar_id: str, shards: int, *,
                 on_copies: Callable[[list[LocalCopy | CutMarker]], None],
                 on_published: Callable[[list[int]], None],
                 on_connected: Callable[..., None], receive_maximum: int = 20,
                 max_queued: int = 0, layout_file: Path | None = None) -> None:
        """`on_connected(session_present, shard)` for each connection's CONNACK."""
        self.layout_file = layout_file
        clean = layout_file is not None and layout_changed(layout_file, shards)
        self.on_connected = on_connected
        self.shards = [
            ForwardClient(socket_path, secret, cid, on_copies=on_copies,
                          on_published=on_published if k == 0 else _ignore,
                          on_connected=self._connected_handler(k),
                          receive_maximum=receive_maximum, max_queued=max_queued,
                          mid_base=global_mid(k, 0), clean_start=clean)
            for k, cid in enumerate(client_ids(sidecar_id, shards))]
        self.main = self.shards[0]
        self.receive_maximum = self.main.receive_maximum
        self.max_queued = self.main.max_queued

    def _connected_handler(self, shard: int) -> Callable[[bool], None]:
        return lambda present: self.on_connected(present, shard)

    @property
    def client_ids(self) -> list[str]:
        return [c.client_id for c in self.shards]

    @property
    def confirmations(self) -> Confirmations | None:
        return self.main.confirmations

    @confirmations.setter
    def confirmations(self, value: Confirmations | None) -> None:
        for c in self.shards:
            c.confirmations = value

    @property
    def connected(self) -> bool:
        return all(c.connected for c in self.shards)

    @property
    def subscribing(self) -> int:
        """SUBSCRIBE packets sent and not answered yet, on every shard."""
        return sum(c.subscribing for c in self.shards)

    @property
    def received(self) -> int:
        return sum(c.received for c in self.shards)

    async def connect(self, timeout: float = 10.0) -> None:
        await asyncio.gather(*(c.connect(timeout) for c in self.shards))
        if self.layout_file is not None:
            self.layout_file.write_text(f"{len(self.shards)}\n")

    def close(self) -> None:
        for c in self.shards:
            c.close()

    # ---- forwarding subscriptions ------------------------------------------------------
    def _split(self, items: Sequence[Any], key: Callable[[Any], str]) -> list[list[Any]]:
        out: list[list[Any]] = [[] for _ in self.shards]
        k = len(self.shards)
        for item in items:
            out[shard_of(key(item), k)].append(item)
        return out

    def subscribe_many(self, subs: list[tuple[str, int, bool]],
                       shard: int | None = None) -> None:
        """Subscribe (filter, identifier, no local) triples, each on its shard, in order per
        shard (`shard`: only the triples of that one)."""
        if len(self.shards) == 1:
            self.main.subscribe_many(subs)
            return
        for k, part in enumerate(self._split(subs, lambda t: t[0])):
            if part and (shard is None or shard == k):
                self.shards[k].subscribe_many(part)

    def subscribe(self, filter: str, subscription_id: int, no_local: bool) -> None:
        self.subscribe_many([(filter, subscription_id, no_local)])

    def unsubscribe_many(self, filters: list[str]) -> None:
        if len(self.shards) == 1:
            self.main.unsubscribe_many(filters)
            return
        for k, part in enumerate(self._split(filters, lambda f: f)):
            if part:
                self.shards[k].unsubscribe_many(part)

    def unsubscribe(self, filter: str) -> None:
        self.unsubscribe_many([filter])

    def when_subscribed(self, callback: Callable[[], None]) -> None:
        """`callback` once every shard answered every SUBSCRIBE sent so far."""
        if len(self.shards) == 1:
            self.main.when_subscribed(callback)
            return
        left = [len(self.shards)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                callback()

        for c in self.shards:
            c.when_subscribed(one_done)

    # ---- copies --------------------------------------------------------------------------
    def ack(self, mid: int, qos: int) -> None:
        """Accept a copy on the connection that delivered it (its shard is in `mid`)."""
        shard, _ = split_mid(mid)
        if shard < len(self.shards):
            self.shards[shard].ack(mid, qos)

    def due_probes(self) -> list[str]:
        """The client ids of the shards that should be probed now (sidecar.local.midgaps)."""
        return [c.client_id for c in self.shards if c.wants_probe()]

    def expect_probe(self, token: bytes) -> asyncio.Future:
        """Resolved once the probe `token` reached every shard, after the copies routed to it
        before (see `ForwardClient.expect_probe`); a probe goes to each of `client_ids`."""
        if len(self.shards) == 1:
            return self.main.expect_probe(token)
        futures = [c.expect_probe(token) for c in self.shards]
        combined = asyncio.gather(*futures)

        def cancel_all(f: asyncio.Future) -> None:
            if f.cancelled():
                for part in futures:
                    part.cancel()
            else:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    f.exception()

        combined.add_done_callback(cancel_all)
        return combined

    def backlog(self) -> tuple[int, int]:
        """Copies taken and not acknowledged, and QoS > 0 copies taken, over every shard."""
        unacked = taken = 0
        for c in self.shards:
            u, t = c.backlog()
            unacked += u
            taken += t
        return unacked, taken

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.main.stats())
        for c in self.shards[1:]:
            for key, value in c.stats().items():
                if isinstance(value, int):
                    out[key] += value
        out["shards"] = len(self.shards)
        return out

    def refused_by_reason(self) -> dict[str, int]:
        return self.main.refused_by_reason()

    # ---- re-injection (shard 0, `.fwd`) ------------------------------------------------
    def publish(self, topic: str, payload: bytes, qos: int,
                properties: MessageProperties, retain: bool = False) -> int:
        return self.main.publish(topic, payload, qos, properties, retain)

    def inject(self, batch_id: int, batch: bytes) -> asyncio.Future:
        return self.main.inject(batch_id, batch)

    def forget_injection(self, batch_id: int) -> None:
        self.main.forget_injection(batch_id)

    def wake(self) -> None:
        self.main.wake()

    def barrier(self) -> int:
        return self.main.barrier()
