"""`JournalService`: the plugin's journal kept short, and what a killed Mosquitto left in its
journal replayed (adapter).

- **Confirmations.** The forwarding client records which copies it settled
  (`Confirmations`); every tick (50 ms) their fingerprints go to the plugin in one `confirm`
  command (fire and forget), and the plugin trims the entries they settle.
- **Replay.** The plugin holds its journal file locked (flock) while its Mosquitto runs; a
  file nobody holds belongs to a run that died. Whenever the forwarding client connects (a
  start, a restarted Mosquitto) and its forwarding subscriptions are in place, every such file
  is replayed: each entry is published again on the local Mosquitto through the control link,
  at its QoS, so that it is routed, journaled and forwarded like any publish, and the file is
  removed once Mosquitto acknowledged them all. A replay cut short is replayed again in full
  later: duplicates are possible, loss is not. Replayed messages carry their MQTT v5
  properties except the Message Expiry Interval (the plugin never sees it), without the retain
  flag (the retained store of a killed node is rebuilt from its peers), and local subscribers
  of this node get them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import Any

from sidecar.journal.confirmations import Confirmations
from sidecar.journal.record import FILE_PREFIX, FILE_SUFFIX, JournalEntry, pack_fingerprints, parse
from sidecar.local.forward_client import to_paho_properties
from sidecar.local.forward_shards import ForwardShards
from sidecar.local.link import LocalLink

log = logging.getLogger("mqfed.journal")

CONFIRM_CHUNK = 8192
"""Fingerprints per `confirm` command at most (64 KiB)."""
REPLAY_WINDOW = 100
"""Replayed publishes awaiting Mosquitto's acknowledgement at most."""
ACK_TIMEOUT = 10.0
"""Seconds a replayed publish may wait for its acknowledgement before the replay stops (the
file stays and is replayed again at the next connect)."""
SUBSCRIBED_TIMEOUT = 30.0
"""Seconds to wait for the forwarding subscriptions before replaying anyway."""


class JournalService:
    """Confirmations to the plugin, replays of dead runs' journals."""

    def __init__(self, directory: Path, link: LocalLink, fwd: ForwardShards) -> None:
        self.directory = directory
        self.link = link
        self.fwd = fwd
        self.confirmations = Confirmations()
        fwd.confirmations = self.confirmations
        routing_connected = fwd.on_connected

        def on_connected(session_present: bool, shard: int = 0) -> None:
            routing_connected(session_present, shard)  # first: it issues the subscriptions
            self.replay_soon()

        fwd.on_connected = on_connected
        self._task: asyncio.Task | None = None
        self._again = False
        self.sent = 0
        self.commands = 0
        self.replayed = 0
        self.replayed_files = 0
        self.replay_failures = 0
        self.last_replay: dict[str, Any] | None = None

    # ---- confirmations ---------------------------------------------------------------------
    def tick(self) -> None:
        """Send the plugin the copies settled since the last tick."""
        fps = self.confirmations.take()
        if not fps or not self.link.connected:
            return
        for i in range(0, len(fps), CONFIRM_CHUNK):
            self.link.send("confirm", fps=pack_fingerprints(fps[i:i + CONFIRM_CHUNK]))
            self.commands += 1
        self.sent += len(fps)

    # ---- replay ------------------------------------------------------------------------------
    def replay_soon(self) -> None:
        """Replay dead runs' journals once the forwarding subscriptions are in place."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._replay_all())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _replay_all(self) -> None:
        while True:
            self._again = False
            try:
                await self._replay_dead_files()
            except (OSError, RuntimeError) as exc:
                self.replay_failures += 1
                log.error("journal replay failed, tried again at the next connect: %s", exc)
            if not self._again:
                return

    def _dead_files(self) -> list[tuple[Path, int]]:
        """Journal files no running Mosquitto holds, each opened and locked (path, fd)."""
        out = []
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return out
        for name in names:
            if not name.startswith(FILE_PREFIX):
                continue
            path = self.directory / name
            if name.endswith(FILE_SUFFIX + ".tmp"):  # a compaction cut short by the kill
                if not (self.directory / name[:-4]).exists() or self._unlocked(
                        self.directory / name[:-4]):
                    with contextlib.suppress(OSError):
                        path.unlink()
                continue
            if not name.endswith(FILE_SUFFIX):
                continue
            fd = self._lock(path)
            if fd is not None:
                out.append((path, fd))
        return out

    @staticmethod
    def _lock(path: Path) -> int | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its Mosquitto runs
            os.close(fd)
            return None
        return fd

    def _unlocked(self, path: Path) -> bool:
        fd = self._lock(path)
        if fd is None:
            return False
        os.close(fd)
        return True

    async def _replay_dead_files(self) -> None:
        files = self._dead_files()
        if not files:
            return
        try:
            await self._wait_subscribed()
            for path, fd in files:
                await self._replay_file(path, fd)
        finally:
            for _, fd in files:
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def _wait_subscribed(self) -> None:
        """Until the forwarding client is connected and Mosquitto answered its SUBSCRIBEs."""
        deadline = time.monotonic() + SUBSCRIBED_TIMEOUT
        while not (self.fwd.connected and self.fwd.subscribing == 0 and self.link.connected):
            if time.monotonic() > deadline:
                log.warning("replaying the journal before the forwarding subscriptions are "
                            "confirmed (%d unanswered)", self.fwd.subscribing)
                return
            await asyncio.sleep(0.02)

    async def _replay_file(self, path: Path, fd: int) -> None:
        with os.fdopen(os.dup(fd), "rb") as f:
            contents = parse(f.read())
        if contents.problem:
            log.warning("journal %s: %s; replaying what came before it", path,
                        contents.problem)
        started = time.monotonic()
        entries = contents.entries
        if entries:
            log.warning("replaying %d acknowledged messages a stopped or killed Mosquitto had "
                        "not forwarded (journal %s; duplicates are possible)", len(entries),
                        path.name, extra={"messages": len(entries)})
        await self._publish_all(entries)
        path.unlink()
        self.replayed += len(entries)
        self.replayed_files += 1
        self.last_replay = {"file": path.name, "messages": len(entries),
                            "written": contents.written, "trimmed": contents.trimmed,
                            "problem": contents.problem,
                            "seconds": round(time.monotonic() - started, 3)}
        log.info("journal replayed", extra=self.last_replay)

    async def _publish_all(self, entries: list[JournalEntry]) -> None:
        outstanding: list[tuple[Any, float]] = []
        for entry in entries:
            while len(outstanding) >= REPLAY_WINDOW:
                outstanding = await self._prune(outstanding)
            info = self.link.publish(entry.topic, entry.payload, qos=entry.qos,
                                     properties=to_paho_properties(entry.properties))
            if info.rc not in (0, 4):  # 4: not connected now, sent after reconnecting
                raise RuntimeError(f"publishing on the control link failed (paho rc {info.rc})")
            outstanding.append((info, time.monotonic() + ACK_TIMEOUT))
        while outstanding:
            outstanding = await self._prune(outstanding)

    @staticmethod
    async def _prune(outstanding: list[tuple[Any, float]]) -> list[tuple[Any, float]]:
        await asyncio.sleep(0.005)
        now = time.monotonic()
        left = []
        for info, deadline in outstanding:
            if info.is_published():
                continue
            if now > deadline:
                raise RuntimeError(f"Mosquitto did not acknowledge a replayed message within "
                                   f"{ACK_TIMEOUT:.0f}s")
            left.append((info, deadline))
        return left

    def status(self) -> dict[str, Any]:
        return {"confirmed": self.sent, "confirm_commands": self.commands,
                "awaiting_ack": self.confirmations.waiting, "replayed": self.replayed,
                "replayed_files": self.replayed_files, "replay_failures": self.replay_failures,
                "last_replay": self.last_replay}
