"""`EventStream`: sans-IO ordering of the plugin's event stream (docs/plugin-protocol.md).

Fed events, snapshots and link changes; returns actions for the caller to carry out, in order.
Guarantees to the consumer of `Apply`/`LoadSnapshot`: after a `LoadSnapshot` of epoch E with cut
C, exactly the events C+1, C+2, … of E are applied, each once, until the next `LoadSnapshot`.

Epochs are random, so their age is learnt from arrival order: once something of a new epoch was
seen, the previous epoch is *retired*, and anything of a retired epoch (a late event, a snapshot
answered by the old plugin) is stale and ignored; a stale snapshot leads to a new request.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sidecar.local.events import Event, Snapshot

__all__ = [
    "Action",
    "Apply",
    "EventStream",
    "LoadSnapshot",
    "RequestResume",
    "RequestSnapshot",
    "SendAck",
]


@dataclass(frozen=True)
class RequestSnapshot:
    """Ask the plugin for a snapshot and pass the answer to `EventStream.on_snapshot`."""


@dataclass(frozen=True)
class RequestResume:
    """Send ``resume`` from `from_seq`; report a refusal with `EventStream.on_resume_failed`."""

    from_seq: int


@dataclass(frozen=True)
class Apply:
    """Apply this event to the node's state (events come in seq order, each once)."""

    event: Event


@dataclass(frozen=True)
class LoadSnapshot:
    """Replace the node's state with this snapshot."""

    snapshot: Snapshot


@dataclass(frozen=True)
class SendAck:
    """Send ``{"cmd": "ack", "seq": seq}`` to the plugin."""

    seq: int


Action = RequestSnapshot | RequestResume | Apply | LoadSnapshot | SendAck


class EventStream:
    """Puts plugin events in order, detects duplicates, gaps and restarts, and paces acks.

    Public state: `epoch` and `last_seq` (of the applied state), `in_sync`, and the counters
    `applied`, `duplicates` (events dropped as already applied or buffered), `gaps` (seq jumps
    seen), `resyncs` (snapshots requested), `stale` (events or snapshots of a retired epoch, or
    snapshots older than the applied state).
    """

    RETIRED_KEPT = 64

    def __init__(self, *, ack_every: int = 100, ack_interval: float = 0.05) -> None:
        self.ack_every = ack_every
        self.ack_interval = ack_interval
        self.epoch: str | None = None
        self.last_seq = 0
        self.in_sync = False
        self.applied = 0
        self.duplicates = 0
        self.gaps = 0
        self.resyncs = 0
        self.stale = 0
        self._live: str | None = None  # newest epoch seen
        self._retired: OrderedDict[str, None] = OrderedDict()
        self._buffer: dict[int, Event] = {}  # events of the live epoch held while not in sync
        self._snapshot_pending = False
        self._acked = 0
        self._unacked = 0
        self._ack_due: float | None = None  # when the oldest unacked applied event arrived

    # ---- inputs --------------------------------------------------------------------------

    def start(self) -> list[Action]:
        """Begin: a fresh sidecar knows nothing, so it asks for a snapshot."""
        self.in_sync = False
        return self._request_snapshot()

    def on_event(self, event: Event, now: float) -> list[Action]:
        """One decoded event from the plugin; `now` is a monotonic time in seconds."""
        if event.epoch in self._retired:
            self.stale += 1
            return []
        if event.epoch != self._live:
            self._switch_epoch(event.epoch)
        seq = event.seq
        if self.in_sync:
            if seq <= self.last_seq:
                self.duplicates += 1
                return []
            if seq == self.last_seq + 1:
                return self._apply(event, now)
            self.gaps += 1
            self.in_sync = False
        elif (event.epoch == self.epoch and seq <= self.last_seq) or seq in self._buffer:
            self.duplicates += 1
            return []
        self._buffer[seq] = event
        return self._request_snapshot()

    def on_snapshot(self, snapshot: Snapshot) -> list[Action]:
        """A complete snapshot answer (requested or not)."""
        self._snapshot_pending = False
        if snapshot.epoch in self._retired:
            self.stale += 1
            return self._request_snapshot()
        if self.in_sync and snapshot.epoch == self.epoch and snapshot.seq <= self.last_seq:
            self.stale += 1  # the stream already went past this cut
            return []
        if snapshot.epoch != self._live:
            self._switch_epoch(snapshot.epoch)
        self.epoch = snapshot.epoch
        self.last_seq = snapshot.seq
        self.in_sync = True
        actions: list[Action] = [LoadSnapshot(snapshot)]
        for seq in sorted(self._buffer):
            if seq > self.last_seq + 1:
                self.gaps += 1
                self.in_sync = False
                break
            event = self._buffer.pop(seq)
            if seq == self.last_seq + 1:
                self.last_seq = seq
                self.applied += 1
                actions.append(Apply(event))
        actions.append(self._ack())
        if not self.in_sync:
            actions += self._request_snapshot()
        return actions

    def on_tick(self, now: float) -> list[Action]:
        """Time passes: send an ack that has waited `ack_interval`."""
        if self._ack_due is not None and now - self._ack_due >= self.ack_interval:
            return [self._ack()]
        return []

    def on_link_reconnected(self) -> list[Action]:
        """The link to Mosquitto came back: resume where we were, or re-sync.

        In sync: resume from `last_seq` + 1 and ack `last_seq` again (the previous ack may
        have been lost, and the plugin publishes only `event_window` events beyond it).
        Otherwise a snapshot is requested even if one was in flight (it may be lost).
        """
        if self.in_sync:
            actions: list[Action] = [RequestResume(self.last_seq + 1)]
            if self.last_seq > 0:
                actions.append(self._ack())
            return actions
        self._snapshot_pending = False
        return self._request_snapshot()

    def on_resumed(self, epoch: str) -> list[Action]:
        """The plugin accepted ``resume``; its reply names its epoch (a new one: re-sync)."""
        if epoch == self.epoch:
            return []
        return self.on_resume_failed()

    def on_resume_failed(self) -> list[Action]:
        """``resume`` was refused (``gap``), failed, or answered for another epoch: re-sync."""
        self.in_sync = False
        return self._request_snapshot()

    def on_snapshot_failed(self) -> list[Action]:
        """A requested snapshot will not come (error or timeout): ask again."""
        self._snapshot_pending = False
        return self._request_snapshot()

    # ---- queries -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and position, for status and metrics."""
        return {
            "epoch": self.epoch,
            "seq": self.last_seq,
            "acked": self._acked,
            "in_sync": self.in_sync,
            "snapshot_pending": self._snapshot_pending,
            "buffered": len(self._buffer),
            "applied": self.applied,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "resyncs": self.resyncs,
            "stale": self.stale,
        }

    # ---- internals -----------------------------------------------------------------------

    def _request_snapshot(self) -> list[Action]:
        if self._snapshot_pending:
            return []
        self._snapshot_pending = True
        self.resyncs += 1
        return [RequestSnapshot()]

    def _switch_epoch(self, epoch: str) -> None:
        """A new plugin epoch appeared: retire the previous one and leave sync if needed."""
        if self._live is not None:
            self._retired[self._live] = None
            while len(self._retired) > self.RETIRED_KEPT:
                self._retired.popitem(last=False)
        self._live = epoch
        self._buffer.clear()
        if epoch != self.epoch:
            self.in_sync = False
            # acks carry no epoch: never send one of the old epoch to the new plugin
            self._acked = 0
            self._unacked = 0
            self._ack_due = None

    def _apply(self, event: Event, now: float) -> list[Action]:
        self.last_seq = event.seq
        self.applied += 1
        self._unacked += 1
        actions: list[Action] = [Apply(event)]
        if self._unacked >= self.ack_every:
            actions.append(self._ack())
        elif self._ack_due is None:
            self._ack_due = now
        return actions

    def _ack(self) -> SendAck:
        self._acked = self.last_seq
        self._unacked = 0
        self._ack_due = None
        return SendAck(self.last_seq)
