"""Sidecar hop records (adapter): what this node did with each message, for `mqfed audit`.

Off unless `<run_dir>/trace-hops` names a folder (a switch for drills and `mqfed chaos`, read
every 0.2 s like `blocked-peers`; removing the file stops recording). Then each message this
sidecar handles adds one record per hop, kind `hop` of trace schema 1 (docs/traces.md):

- `forwarded` (the origin queued or sent it to `peer`),
- `received` (a peer's first copy of it arrived here; `peer` is the sender),
- `reinjected` (published on this node's Mosquitto),
- `acked` (this node's Mosquitto accepted the re-injection).

Each carries the node, the origin's message id, the node's HLC reading and wall clock at the
event, the topic and, for the load generator's payloads, (pub, seq) from the payload header,
which is how the audit joins them to `pub`/`recv` records. The hot path only appends a tuple;
lines are formatted and written at each `flush` (every 0.2 s).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sidecar.bench import payload
from sidecar.bench.traces import TraceWriter

_Q = json.dumps
ACK_MEMORY = 100_000
"""Re-injections remembered until their acknowledgement at most (oldest forgotten)."""


class HopRecorder:
    """Hop records of one sidecar run into `directory` (files `hop-<node>-<incarnation>-*`)."""

    def __init__(self, node_id: str, incarnation: int, directory: Path) -> None:
        self.node_id = node_id
        self.directory = directory
        self.writer = TraceWriter(directory, f"hop-{node_id}-{incarnation}")
        self._pending: list[tuple] = []
        self._tickets: dict[int, tuple] = {}  # re-injection ticket -> its record fields
        self.recorded = 0

    def record(self, event: str, topic: str, data: bytes, qos: int, peer: str, mid: str,
               hlc: int) -> tuple:
        """One hop; returns its fields (for `expect_ack`)."""
        fields = (topic, data[:payload.HEADER_SIZE], qos, peer, mid)
        self._pending.append((event, *fields, hlc, time.time_ns()))
        return fields

    def expect_ack(self, ticket: int, fields: tuple) -> None:
        """A re-injection under `ticket`: `on_acked` records its acknowledgement."""
        if len(self._tickets) >= ACK_MEMORY:
            self._tickets.pop(next(iter(self._tickets)))
        self._tickets[ticket] = fields

    def on_acked(self, tickets: list[int], hlc: int) -> None:
        now = time.time_ns()
        for ticket in tickets:
            fields = self._tickets.pop(ticket, None)
            if fields is not None:
                self._pending.append(("acked", *fields, hlc, now))

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        node = _Q(self.node_id)
        for event, topic, header, qos, peer, mid, hlc, t in pending:
            stamp = payload.decode(header)
            key = (f'"pub":{stamp.publisher},"seq":{stamp.seq},' if stamp is not None else "")
            self.writer.write(f'{{"v":1,"kind":"hop","event":"{event}","node":{node},'
                              f'"peer":{_Q(peer)},"topic":{_Q(topic)},{key}"qos":{qos},'
                              f'"id":{_Q(mid)},"hlc":{hlc},"t":{t}}}\n')
        self.recorded += len(pending)
        if pending:
            self.writer.flush()

    def close(self) -> None:
        self.flush()
        self.writer.close()


def hops_folder(run_dir: Path) -> Path | None:
    """The folder `<run_dir>/trace-hops` names, or None (no file, or empty)."""
    try:
        text = (run_dir / "trace-hops").read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None
