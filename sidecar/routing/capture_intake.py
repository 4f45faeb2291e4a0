"""`CaptureIntake`: the plugin's captured records fed to the forwarder (adapter; issue 25,
slice 2, `routing.capture`).

With `plugin_opt_capture_socket` the plugin hands the sidecar, over a unix socket, one record
per local message that `.fwd`'s plain subscriptions match, instead of Mosquitto queueing
`.fwd` a copy of it (sidecar.local.capture_link, docs/plugin-protocol.md "Capture socket").
Each record becomes ONE `LocalCopy` (captured, naming its publisher) for the forwarder, which
routes it to every peer with matching plain interest; markers in the stream keep their place
among the records:

- kind 2, a moving session's cut (`client`; a new copy's names its client's connect time,
  decimal ms, as its payload): a `CutMarker`, as `cut:<client>` NUL ms on MQTT;
- kind 4, a barrier (its token the payload): resolves `expect_barrier(token)` once every
  record before it was handed to the forwarder.

Records are acknowledged to the plugin once settled (`CaptureAcks`); QoS > 0 ones are counted
for the plugin's journal (`Confirmations`, by fingerprint, as `.fwd`'s copies are).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.journal.confirmations import Confirmations
from sidecar.local.batch import KIND_CUT, KIND_MESSAGE
from sidecar.local.capture_link import CaptureLink
from sidecar.local.capture_wire import CapturedBatch, Hello
from sidecar.routing.capture_acks import CaptureAcks
from sidecar.routing.forwarder import CutMarker, LocalCopy

log = logging.getLogger("mqfed.capture")

KIND_BARRIER = 4
"""A barrier marker in the capture stream (the plugin's `deliver` of a probe token to .fwd)."""


class CaptureIntake:
    """Listens for the plugin's records and hands them to `on_copies` in order."""

    def __init__(self, path: Path, on_copies: Callable[[list[LocalCopy | CutMarker]], None],
                 forget: Callable[[range], None],
                 confirmations: Callable[[], Confirmations | None]) -> None:
        """`forget(mids)`: a new plugin epoch voids these pending records' local ids (the
        forwarder drops their acks); `confirmations`: the journal's, if any (read at each
        record: the journal is wired after routing)."""
        self.acks = CaptureAcks()
        self.link = CaptureLink(path, self._on_hello, self._on_batch)
        self._on_copies = on_copies
        self._forget = forget
        self._confirmations = confirmations
        self._barriers: dict[bytes, asyncio.Future] = {}
        self._ack_due = False
        self.records = 0
        self.markers = 0

    async def start(self) -> None:
        await self.link.start()

    async def close(self) -> None:
        await self.link.close()

    def _on_hello(self, hello: Hello) -> int:
        resume, forgotten = self.acks.on_hello(hello.epoch)
        if forgotten is not None:
            log.warning("capture: a new plugin epoch (Mosquitto restarted): the records of "
                        "the last one still pending are no longer acknowledged")
            self._forget(forgotten)
            confirmations = self._confirmations()
            if confirmations is not None:
                confirmations.reset(forgotten)
        return resume

    def _on_batch(self, hello: Hello, batch: CapturedBatch) -> None:
        copies: list[LocalCopy | CutMarker] = []
        tokens: list[bytes] = []
        acks = self.acks
        confirmations = self._confirmations()
        for r, raw in zip(batch.records, batch.record_bytes(), strict=True):
            mid = acks.on_record(r.seq)
            if mid is None:
                continue
            if r.kind == KIND_MESSAGE:
                self.records += 1
                if r.qos and confirmations is not None:
                    confirmations.on_copy(mid, r.topic, r.payload)
                copies.append(LocalCopy(mid, r.topic, r.payload, r.qos, r.retain, r.properties,
                                        publisher=r.client, captured=True, record=raw))
                continue
            self.markers += 1
            acks.on_settled(mid)
            if r.kind == KIND_CUT:
                copies.append(CutMarker(r.client, CutMarker.connect_ms_of(r.payload)))
            elif r.kind == KIND_BARRIER:
                tokens.append(r.payload)
            else:
                log.warning("capture: a record of unknown kind %d ignored", r.kind)
        if copies:
            self._on_copies(copies)
        for token in tokens:
            future = self._barriers.pop(token, None)
            if future is not None and not future.done():
                future.set_result(None)
        self._schedule_ack()

    def on_settled(self, mid: int) -> None:
        """The forwarder released record `mid` (every target peer has it or spilled it)."""
        if self.acks.on_settled(mid):
            confirmations = self._confirmations()
            if confirmations is not None:
                confirmations.on_ack(mid)
            self._schedule_ack()

    def _schedule_ack(self) -> None:
        if not self._ack_due:
            self._ack_due = True
            asyncio.get_running_loop().call_soon(self._send_acks)

    def _send_acks(self) -> None:
        self._ack_due = False
        if not self.link.connected:
            return  # the next hello's resume says it
        while (ack := self.acks.take_ack()) is not None:
            self.link.ack(*ack)

    def expect_barrier(self, token: bytes) -> asyncio.Future:
        """A future resolved when the plugin's barrier marker `token` has arrived and every
        record captured before it has been handed to the forwarder."""
        future = asyncio.get_running_loop().create_future()
        self._barriers[token] = future
        future.add_done_callback(lambda f: self._barriers.pop(token, None))
        return future

    def is_capture_mid(self, mid: int) -> bool:
        return self.acks.is_capture_mid(mid)

    def status(self) -> dict[str, Any]:
        return {"connected": self.link.connected, "connections": self.link.connections,
                "records": self.records, "markers": self.markers,
                "link_errors": self.link.errors, **self.acks.status()}
