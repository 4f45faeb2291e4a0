"""Re-injection of a peer's frame as one batch (issue 25, slice 1; an adapter).

With `routing.inject_batches` the receiving sidecar hands the plain messages of each frame to
the plugin as one MQFB batch (`sidecar.local.batch`), published at QoS 0 to
`$CONTROL/mqfed/inject` on the forwarding connection, instead of one PUBLISH per message. The
plugin re-injects them inside Mosquitto and answers once they are all in their subscribers'
queues: then the QoS > 0 ones are confirmed (acknowledged to their origin). A batch refused
or unanswered within `REPLY_TIMEOUT` goes again message by message through the forwarding
connection (duplicates are possible if the plugin had injected it after all; order is not
kept across that fallback).

Batches are sized to the room the plugin's replies report in the fullest subscriber's queue
(`sidecar.routing.inject_room`); what does not fit waits here, in order.

The plugin answers at the end of the Mosquitto loop iteration that routed the batch, and that
iteration ends only once Mosquitto's `epoll_wait` returns: at its next socket event, or after
100 ms on an idle Mosquitto (a batch whose subscribers send nothing back: none live, QoS 0,
a slow link). A batch unanswered after WAKE_AFTER gets a wake (`Injector.wake`, one tiny QoS 0
publish) that ends that wait; one wake covers every batch sent before it, so a batch is woken
at most once, and prompt replies (traffic keeps Mosquitto awake) cost none.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from sidecar.local.batch import BatchError, encode_batch, encode_record
from sidecar.routing.forwarder import Envelope
from sidecar.routing.inject_room import GIVE_UP_AFTER, PROBE_AFTER, QueueRoom
from sidecar.routing.records import WireRecord, record_of

log = logging.getLogger("mqfed.routing")

REPLY_TIMEOUT = 10.0
WAKE_AFTER = 0.005          # seconds a batch waits for its reply before Mosquitto is woken
MAX_BATCH_BYTES = 4 << 20   # well under Mosquitto's max_packet_size (16 MiB limit: ~28 MiB)
MAX_BATCH_RECORDS = 10_000
UNENCODABLE_LOG_EVERY = 10.0  # seconds between warnings about messages no batch can carry


class Injector(Protocol):
    """What the forwarding connection provides (`sidecar.local.forward_shards`)."""

    def inject(self, batch_id: int, batch: bytes) -> asyncio.Future: ...

    def forget_injection(self, batch_id: int) -> None: ...

    def wake(self) -> None: ...


Item = tuple[int, Envelope | WireRecord]   # (ticket, message; a record as a peer sent it)


class BatchInjection:
    """Sends batches and reports which tickets Mosquitto holds or which items failed."""

    def __init__(self, injector: Injector, on_held: Callable[[list[int]], None],
                 on_failed: Callable[[list[Item]], None], max_queued: int = 0) -> None:
        """`max_queued`: Mosquitto's `max_queued_messages` (0: unlimited, batches unbounded)."""
        self.injector = injector
        self.on_held = on_held
        self.on_failed = on_failed
        self.room = QueueRoom(max_queued)
        self._pending: deque[Item] = deque()
        self._probe: asyncio.TimerHandle | None = None
        # unanswered batches sent since the last wake: id -> sent at (loop time), oldest first
        self._unwoken: dict[int, float] = {}
        self._wake: asyncio.TimerHandle | None = None   # when the oldest is due a wake
        self._ids = itertools.count(1)
        self._tickets = itertools.count(-1, -1)   # apart from the forwarding client's (> 0)
        self.counters = {"batches": 0, "messages": 0, "refused": 0, "timeouts": 0,
                         "waits": 0, "probes": 0, "lifted": 0, "unencodable": 0,
                         "wakes": 0}
        self._unencodable_logged = float("-inf")

    def ticket(self) -> int:
        """A ticket for one message of a batch."""
        return next(self._tickets)

    def status(self) -> dict[str, int | bool]:
        return {**self.counters, "pending": len(self._pending), "queued": self.room.queued,
                "unanswered": self.room.in_flight, "bound_lifted": self.room.lifted}

    def send(self, items: Sequence[Item]) -> None:
        """Hand `items` (in order) to the plugin, in batches that fit the room left."""
        was_waiting = bool(self._pending)
        self._pending.extend(items)
        if not was_waiting:
            self._pump()

    def _pump(self, probe: bool = False) -> None:
        pending = self._pending
        carried: bytes | None = None  # pending[0]'s record, made for a batch it did not fit
        while pending:
            room = 1 if probe else self.room.room()
            if room < 1:
                if self.room.in_flight == 0 and self._probe is None:
                    self.counters["waits"] += 1
                    self._probe = asyncio.get_running_loop().call_later(
                        PROBE_AFTER, self._probe_now)
                return
            probe = False
            chunk: list[Item] = []
            records: list[bytes] = []
            size = 0
            limit = min(room, MAX_BATCH_RECORDS)
            while pending and len(chunk) < limit:
                env = pending[0][1]
                try:
                    rec = carried or (env.data if isinstance(env, WireRecord)
                                      else encode_record(record_of(env)))
                except BatchError as exc:
                    self._drop(pending.popleft(), exc)
                    continue
                carried = None
                if chunk and size + len(rec) > MAX_BATCH_BYTES:
                    carried = rec
                    break
                chunk.append(pending.popleft())
                records.append(rec)
                size += len(rec)
            self._send(chunk, records)

    def _drop(self, item: Item, exc: BatchError) -> None:
        """A message no batch can carry (a peer's that passed the receiver's checks but not
        the record format's): dropped and acknowledged, so it neither stalls every message
        after it (it did: the pump raised and never ran again) nor comes back forever."""
        self.counters["unencodable"] += 1
        now = time.monotonic()
        if now - self._unencodable_logged >= UNENCODABLE_LOG_EVERY:
            self._unencodable_logged = now
            log.warning("dropped a peer's message that cannot be injected: %s", exc,
                        extra={"unencodable": self.counters["unencodable"]})
        if item[1].qos:
            self.on_held([item[0]])

    def _probe_now(self) -> None:
        """No room and nothing unanswered: one message, to measure the queue again."""
        self._probe = None
        if self._pending and self.room.in_flight == 0:
            self.counters["probes"] += 1
            self._pump(probe=True)

    def _send(self, chunk: list[Item], records: list[bytes]) -> None:
        batch_id = next(self._ids)
        self.room.sent(len(chunk))
        future = self.injector.inject(batch_id, encode_batch(batch_id, records))
        loop = asyncio.get_running_loop()
        timer = loop.call_later(REPLY_TIMEOUT, self._timed_out, batch_id, future, chunk)
        future.add_done_callback(lambda f: self._answered(f, timer, chunk, batch_id))
        self._unwoken[batch_id] = loop.time()
        if self._wake is None:
            self._wake = loop.call_later(WAKE_AFTER, self._wake_if_waiting)

    def _wake_if_waiting(self) -> None:
        """The oldest batch sent since the last wake is still unanswered after WAKE_AFTER:
        wake Mosquitto (for it and every later one); else wait for that batch's turn."""
        self._wake = None
        if not self._unwoken:
            return
        loop = asyncio.get_running_loop()
        due = next(iter(self._unwoken.values())) + WAKE_AFTER
        if loop.time() < due:
            self._wake = loop.call_at(due, self._wake_if_waiting)
            return
        self._unwoken.clear()
        self.counters["wakes"] += 1
        self.injector.wake()

    def _timed_out(self, batch_id: int, future: asyncio.Future, chunk: list[Item]) -> None:
        self._unwoken.pop(batch_id, None)
        self.injector.forget_injection(batch_id)
        future.cancel()
        self.counters["timeouts"] += 1
        self.room.answered(len(chunk), None, time.monotonic())
        log.warning("the plugin did not answer an inject batch: sending it message by message",
                    extra={"messages": len(chunk)})
        self.on_failed(chunk)
        self._pump()

    def _answered(self, future: asyncio.Future, timer: asyncio.TimerHandle,
                  chunk: list[Item], batch_id: int) -> None:
        if future.cancelled():
            return
        self._unwoken.pop(batch_id, None)
        timer.cancel()
        reply = future.result()
        if not reply.get("ok"):
            self.counters["refused"] += 1
            self.room.answered(len(chunk), None, time.monotonic())
            log.error("the plugin refused an inject batch: sending it message by message",
                      extra={"error": reply.get("error"), "at": reply.get("at"),
                             "messages": len(chunk)})
            self.on_failed(chunk)
            self._pump()
            return
        self.counters["batches"] += 1
        self.counters["messages"] += len(chunk)
        queued = reply.get("queued")
        if self.room.answered(len(chunk), queued if isinstance(queued, int) else None,
                              time.monotonic()):
            self.counters["lifted"] += 1
            log.warning("a subscriber's queue stayed %d messages full for %.0f s: injecting "
                        "without waiting for it (it may lose messages past "
                        "max_queued_messages)", queued, GIVE_UP_AFTER)
        self.on_held([ticket for ticket, env in chunk if env.qos])
        self._pump()
