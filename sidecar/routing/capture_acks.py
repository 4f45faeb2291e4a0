"""`CaptureAcks`: which captured records the sidecar holds and which it settled (sans-IO;
issue 25, slice 2).

The plugin numbers its records 1, 2, 3, ... per epoch (one per Mosquitto start) and keeps each
until the sidecar acknowledges it (docs/plugin-protocol.md, "Capture socket"). A record is
*settled* once every peer it goes to has it or holds it in that peer's spill (the moment the
forwarder releases its local ack, as for a copy Mosquitto queued), or at once when it goes
nowhere. Only then is it acknowledged, so a killed sidecar loses nothing: its successor answers
the plugin's hello with resume 0 and gets every unacknowledged record again.

Each record handed to the forwarder gets a local id (`mid`) in its own range
(`CAPTURE_MID_BASE` and up: never a packet id of a forwarding connection), which the forwarder
names in its `AckLocal` when the record is settled.

Within one sidecar run the plugin may reconnect (its socket broke): the resume says every
record up to the contiguous settled seq; the plugin sends the others again, and those already
here are not forwarded twice (`on_record` returns None): those still pending are acknowledged
when they settle, those settled are acknowledged again (the ack may have been lost).
"""

from __future__ import annotations

CAPTURE_MID_BASE = 1 << 40
"""Local ids of captured records start here (forwarding copies' ids are below 2**22)."""
MAX_LISTED = 65535
"""Seqs one ack may list (sidecar.local.capture_wire)."""


class CaptureAcks:
    """Record seqs of the current plugin epoch: handed over, pending, settled, acknowledged."""

    def __init__(self) -> None:
        self.epoch = 0
        self._acked = 0              # every seq <= this is settled
        self._settled: set[int] = set()  # settled seqs above _acked
        self._received = 0           # the highest seq handed over in this epoch
        self._last = 0               # the last seq this connection brought (or its resume)
        self._pending: dict[int, int] = {}  # mid -> seq, handed over and not settled
        self._pending_seqs: set[int] = set()
        self._next_mid = CAPTURE_MID_BASE
        self._unsent: list[int] = []  # settled above what the plugin was last told
        self._told = 0               # the cumulative seq of the last ack taken
        self.duplicates = 0          # records received again (a reconnect's resend)

    def is_capture_mid(self, mid: int) -> bool:
        return mid >= CAPTURE_MID_BASE

    def on_hello(self, epoch: int) -> tuple[int, range | None]:
        """The plugin (re)connected: (the resume seq, the ids of another epoch's records still
        pending: void now, None if none). A new epoch (Mosquitto restarted, or the first one
        this run sees) starts from nothing."""
        if epoch == self.epoch:
            self._told = self._last = self._acked
            self._unsent = []
            return self._acked, None
        forgotten = (range(CAPTURE_MID_BASE, self._next_mid) if self._pending else None)
        self.epoch = epoch
        self._acked = self._received = self._told = self._last = 0
        self._settled.clear()
        self._pending.clear()
        self._pending_seqs.clear()
        self._unsent = []
        return 0, forgotten

    def on_record(self, seq: int) -> int | None:
        """A record arrived: its local id to hand it over with, or None when it is here
        already (a resend; if it was settled its ack is due again). The plugin sends every
        record it holds after the resume, in order: seqs it skipped were settled (acked by a
        sidecar before this one)."""
        if seq > self._last + 1:
            self._skipped(self._last + 1, seq)
        self._last = max(self._last, seq)
        if seq <= self._acked or seq in self._settled:
            self.duplicates += 1
            self._unsent.append(seq)
            return None
        if seq in self._pending_seqs:
            self.duplicates += 1
            return None
        self._received = max(self._received, seq)
        mid = self._next_mid
        self._next_mid += 1
        self._pending[mid] = seq
        self._pending_seqs.add(seq)
        return mid

    def on_settled(self, mid: int) -> bool:
        """The forwarder settled the record `mid` (False: unknown, e.g. of a past epoch)."""
        seq = self._pending.pop(mid, None)
        if seq is None:
            return False
        self._pending_seqs.discard(seq)
        self._settle(seq)
        return True

    def _skipped(self, first: int, end: int) -> None:
        """Seqs first .. end - 1 are settled in the plugin already (nothing to ack)."""
        if first <= self._acked + 1:
            self._acked = max(self._acked, end - 1)
        else:
            self._settled.update(s for s in range(first, end) if s not in self._pending_seqs)
        self._compact()

    def _compact(self) -> None:
        settled = self._settled
        while self._acked + 1 in settled:
            self._acked += 1
            settled.discard(self._acked)
        if settled and min(settled) <= self._acked:
            self._settled = {s for s in settled if s > self._acked}

    def _settle(self, seq: int) -> None:
        if seq == self._acked + 1:
            self._acked = seq
            self._compact()
        elif seq > self._acked:
            self._settled.add(seq)
        self._unsent.append(seq)

    def take_ack(self) -> tuple[int, list[int]] | None:
        """The ack to send now (cumulative seq, settled seqs above it listed once), or None
        when nothing changed since the last one. Call again while it returns one: at most
        MAX_LISTED seqs are listed per ack."""
        if not self._unsent and self._acked == self._told:
            return None
        above = sorted({s for s in self._unsent if s > self._acked})
        listed, rest = above[:MAX_LISTED], above[MAX_LISTED:]
        self._unsent = rest
        self._told = self._acked
        return self._acked, listed

    @property
    def pending(self) -> int:
        """Records handed over and not settled yet."""
        return len(self._pending)

    def status(self) -> dict[str, int]:
        return {"epoch": self.epoch, "acked": self._acked, "received": self._received,
                "pending": len(self._pending), "settled_above": len(self._settled),
                "duplicates": self.duplicates}
