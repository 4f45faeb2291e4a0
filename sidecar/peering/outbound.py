"""`OutboundQueue`: one peer's ordered queue of QoS >= 1 envelopes, in memory, then spilled.

Sans-IO: the spill store is injected (`SpillStore`; `sidecar.peering.spill.SqliteSpillStore` is the
real one). Every message gets a queue key that grows with every offer, so order is simply key
order. Keys of spilled messages are always below the keys of those still in memory (spilling takes
the oldest memory messages first), so "spilled first, then memory" is key order.

Lifecycle of a message: `offer` → (memory | store) → `next_batch` (in flight) → `on_acked`
(released; deleted from the store if it was there). `on_disconnected` rewinds: everything unacked
is sent again, in order, after the next connect.

Durability, for acking the local Mosquitto (architecture §3.5): a message is *durable* once it is
in the store. The origin may PUBACK its Mosquitto once every target peer has acked it or holds it
durably (`durable(seq)`), or refused it (`offer` returned a reason). While disconnected, offers go
straight to the store; while connected they stay in memory until `memory_*` limits are exceeded
or the caller calls `persist` (e.g. for messages the peer has not acked within a few tens of ms,
so a slow peer never holds Mosquitto's in-flight window). Past `total_*` limits new messages are
refused with a reason and counted in `dropped`; the caller logs them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

__all__ = ["OutboundQueue", "QueuedMessage", "SpillStore"]


class QueuedMessage(NamedTuple):
    """One queued envelope: its queue key, message id (incarnation, seq) and serialized bytes."""

    key: int
    incarnation: int
    seq: int
    data: bytes


class SpillStore(Protocol):
    """Ordered, durable storage of queued messages, keyed by increasing `QueuedMessage.key`."""

    def append(self, messages: Sequence[QueuedMessage]) -> None:
        """Store messages (keys above every stored key) durably, all or nothing."""

    def read_batch(self, after_key: int, n: int) -> list[QueuedMessage]:
        """Up to n stored messages with key > after_key, in key order."""

    def delete(self, keys: Iterable[int]) -> None:
        """Remove the messages with these keys (unknown keys are ignored)."""

    def count(self) -> int:
        """Number of stored messages."""

    def bytes(self) -> int:
        """Total size of the stored messages' data."""

    def last_key(self) -> int:
        """The largest stored key, 0 if empty."""


class OutboundQueue:
    """Ordered queue of one peer's QoS >= 1 envelopes (see the module docstring).

    `incarnation` is this node's current incarnation: `offer` seqs belong to it and must increase.
    Messages left in the store by earlier incarnations are sent first, in order.
    `max_in_flight` caps sent-but-unacked messages (keep the receiver's dedup window above it).
    """

    def __init__(
        self,
        store: SpillStore,
        incarnation: int,
        *,
        memory_messages: int = 10_000,
        memory_bytes: int = 16 << 20,
        total_messages: int = 1_000_000,
        total_bytes: int = 1 << 30,
        max_in_flight: int = 10_000,
    ) -> None:
        self.store = store
        self.incarnation = incarnation
        self.memory_messages = memory_messages
        self.memory_bytes = memory_bytes
        self.total_messages = total_messages
        self.total_bytes = total_bytes
        self.max_in_flight = max_in_flight
        self.connected = False
        self.dropped: dict[str, int] = {}
        self._sent: dict[int, QueuedMessage] = {}  # in memory, sent, unacked; key order
        self._unsent: deque[QueuedMessage] = deque()  # in memory, not sent; key order
        self._mem_bytes = 0
        self._in_flight: dict[tuple[int, int], int] = {}  # (incarnation, seq) -> key
        self._spill_last = store.last_key()  # every stored key is <= this
        self._next_key = self._spill_last + 1
        self._cursor = 0  # every unacked message with key <= cursor has been sent
        self._last_seq = 0
        self._durable_through = 0

    # ---- producer side ---------------------------------------------------------------------

    def offer(self, seq: int, data: bytes) -> str | None:
        """Queue one envelope; return None, or the reason it was refused (counted in `dropped`)."""
        dropped = self.offer_many([(seq, data)])
        return dropped[0][1] if dropped else None

    def offer_many(self, items: Iterable[tuple[int, bytes]]) -> list[tuple[int, str]]:
        """Queue envelopes (seq, data) in order; return the refused ones as (seq, reason)."""
        refused: list[tuple[int, str]] = []
        to_store: list[QueuedMessage] = []
        count = self.count()
        size = self.bytes()
        for seq, data in items:
            if seq <= self._last_seq:
                raise ValueError(f"seq {seq} offered after seq {self._last_seq}")
            self._last_seq = seq
            reason = None
            if count + 1 > self.total_messages:
                reason = f"queue full: {count} messages (limit {self.total_messages})"
                kind = "total_messages"
            elif size + len(data) > self.total_bytes:
                reason = f"queue full: {size} + {len(data)} bytes (limit {self.total_bytes})"
                kind = "total_bytes"
            if reason is not None:
                self.dropped[kind] = self.dropped.get(kind, 0) + 1
                refused.append((seq, reason))
                continue
            message = QueuedMessage(self._next_key, self.incarnation, seq, data)
            self._next_key += 1
            count += 1
            size += len(data)
            if self.connected:
                self._unsent.append(message)
                self._mem_bytes += len(data)
            else:
                to_store.append(message)
        if to_store:
            self._store(to_store)
        if self.memory_count() > self.memory_messages or self._mem_bytes > self.memory_bytes:
            self._spill(self.memory_messages // 2, self.memory_bytes // 2, None)
        return refused

    def persist(self, through_seq: int | None = None) -> int:
        """Move memory messages (all, or those with seq <= through_seq) to the store, making
        them durable; return how many moved."""
        return self._spill(0, 0, through_seq)

    # ---- link side ---------------------------------------------------------------------------

    def next_batch(self, max_n: int, max_bytes: int) -> list[QueuedMessage]:
        """The next messages to send, in order, and mark them in flight. At most max_n (and
        `max_in_flight` in total) and max_bytes of data (but at least one message)."""
        n = min(max_n, self.max_in_flight - len(self._in_flight))
        out: list[QueuedMessage] = []
        size = 0
        full = False
        if n > 0 and self._cursor < self._spill_last:
            stored = self.store.read_batch(self._cursor, n)
            for message in stored:
                if out and size + len(message.data) > max_bytes:
                    full = True
                    break
                out.append(message)
                size += len(message.data)
            if out:
                self._cursor = out[-1].key
            if not full and len(stored) < n:
                self._cursor = max(self._cursor, self._spill_last)
        unsent = self._unsent
        while not full and unsent and len(out) < n:
            message = unsent[0]
            if out and size + len(message.data) > max_bytes:
                break
            unsent.popleft()
            self._sent[message.key] = message
            out.append(message)
            size += len(message.data)
            self._cursor = message.key
        in_flight = self._in_flight
        for message in out:
            in_flight[(message.incarnation, message.seq)] = message.key
        return out

    def on_acked(self, seqs: Iterable[int], incarnation: int | None = None) -> int:
        """Release acked messages (any ack status) of `incarnation` (default: ours); return how
        many were released. Acks for messages not in flight are ignored."""
        inc = self.incarnation if incarnation is None else incarnation
        stored: list[int] = []
        released = 0
        for seq in seqs:
            key = self._in_flight.pop((inc, seq), None)
            if key is None:
                continue
            released += 1
            message = self._sent.pop(key, None)
            if message is None:
                stored.append(key)
            else:
                self._mem_bytes -= len(message.data)
        if stored:
            self.store.delete(stored)
        return released

    def on_connected(self) -> None:
        """The peer's stream is up: new messages stay in memory again."""
        self.connected = True

    def on_disconnected(self) -> None:
        """The stream is gone: unacked messages will be re-sent in order; everything in memory
        is moved to the store (durable) and new messages go to the store until `on_connected`."""
        self.connected = False
        self._in_flight.clear()
        self._cursor = 0
        if self._sent:
            self._unsent.extendleft(reversed(self._sent.values()))
            self._sent.clear()
        self.persist()

    # ---- queries -----------------------------------------------------------------------------

    def durable(self, seq: int) -> bool:
        """Whether message `seq` of our incarnation has reached the store (or was released after
        getting there). Seqs never offered to this queue give meaningless answers."""
        return seq <= self._durable_through

    @property
    def durable_through(self) -> int:
        """Every message of our incarnation with seq <= this reached the store or was acked."""
        return self._durable_through

    @property
    def last_key(self) -> int:
        """The key of the newest message ever queued (0: none)."""
        return self._next_key - 1

    def oldest_key(self) -> int | None:
        """The key of the oldest message still queued (unsent or unacked; None: empty)."""
        keys = [next(iter(self._sent))] if self._sent else []
        if self._unsent:
            keys.append(self._unsent[0].key)
        if self.store.count():
            stored = self.store.read_batch(0, 1)
            if stored:
                keys.append(stored[0].key)
        return min(keys) if keys else None

    def count(self) -> int:
        """Messages queued (memory and store), in flight included."""
        return self.store.count() + self.memory_count()

    def bytes(self) -> int:
        """Data bytes queued (memory and store)."""
        return self.store.bytes() + self._mem_bytes

    def spilled(self) -> int:
        """Messages in the store (spilled: the peer was down or slow to ack)."""
        return self.store.count()

    def spilled_bytes(self) -> int:
        """Data bytes in the store."""
        return self.store.bytes()

    def unsent_in_memory(self) -> int:
        """Messages in memory not sent yet."""
        return len(self._unsent)

    def memory_count(self) -> int:
        return len(self._sent) + len(self._unsent)

    @property
    def in_flight(self) -> int:
        """Messages sent and not yet acked."""
        return len(self._in_flight)

    # ---- internals -----------------------------------------------------------------------------

    def _spill(self, keep_messages: int, keep_bytes: int, through_seq: int | None) -> int:
        """Move the oldest memory messages to the store until at most keep_* remain (and, with
        through_seq, only those with seq <= through_seq)."""
        moved: list[QueuedMessage] = []
        remaining = self.memory_count()
        mem_bytes = self._mem_bytes

        def take(message: QueuedMessage) -> bool:
            nonlocal remaining, mem_bytes
            if remaining <= keep_messages and mem_bytes <= keep_bytes:
                return False
            if through_seq is not None and message.seq > through_seq:
                return False
            moved.append(message)
            remaining -= 1
            mem_bytes -= len(message.data)
            return True

        for message in self._sent.values():
            if not take(message):
                break
        else:
            for message in self._unsent:
                if not take(message):
                    break
        if not moved:
            return 0
        self._store(moved)  # first: if the store fails, memory is unchanged
        sent_moved = min(len(moved), len(self._sent))
        for message in moved[:sent_moved]:
            del self._sent[message.key]
        for _ in range(len(moved) - sent_moved):
            self._unsent.popleft()
        self._mem_bytes = mem_bytes
        return len(moved)

    def _store(self, messages: list[QueuedMessage]) -> None:
        self.store.append(messages)
        self._spill_last = messages[-1].key
        for message in reversed(messages):
            if message.incarnation == self.incarnation:
                self._durable_through = max(self._durable_through, message.seq)
                break
