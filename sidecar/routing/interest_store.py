"""`SqliteInterestStore`: peers' interest and the forwarding subscription identifiers, as rows
(adapter).

A restarted sidecar's MQTT session still holds its forwarding subscriptions, and copies tagged
with their identifiers: this store lets it restore what they mean (`RemoteInterest.restore`).
It is written incrementally from `RemoteInterest.take_journal()`: a change of k keys writes k
rows (plus one per released identifier), whatever the interest held, never a whole-state dump.

`InterestPersister` commits a small batch (a churn delta: tens of rows, ~0.3 ms) on the loop
when nothing else is being written, and larger ones on one worker thread, so the event loop never
waits for a large write: journal batches are written in order, and each batch's follow-up
(subscribing Mosquitto to what it persisted) runs on the loop once the batch is committed. While
a batch is written, the next ones accumulate and go in one transaction. The write-ahead log is
checkpointed (the one step that syncs to disk) on the worker, every `CHECKPOINT_OPS` rows, not by
SQLite inside whichever commit crosses its threshold.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import groupby
from operator import itemgetter
from pathlib import Path

from sidecar.routing.interest import JOURNAL_ADD, JOURNAL_FREE, JOURNAL_REMOVE, JournalOp
from sidecar.sqlite_db import open_db

__all__ = ["InterestPersister", "SqliteInterestStore"]

log = logging.getLogger("mqfed.routing")

INLINE_OPS = 256
"""A batch of at most this many journal ops, with nothing being written, is committed on the loop
(~0.3 ms for a churn delta's ~30): a worker thread's round trip cost each delta two thread
wake-ups and two hand-overs of the GIL, 2 ms at the median and 40 ms at p99 on an idle 2-core
machine, 30-50 ms and hundreds at load 8-11 (docs/performance.md "Per-delta cost")."""

CHECKPOINT_OPS = 20_000
"""Journal ops written between write-ahead-log checkpoints (run on the worker thread)."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS interest (peer TEXT NOT NULL, filter TEXT NOT NULL,"
    " PRIMARY KEY (peer, filter)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS sids (filter TEXT PRIMARY KEY, sid INTEGER NOT NULL)"
    " WITHOUT ROWID",
)


class SqliteInterestStore:
    """Rows ``interest(peer, filter)`` and ``sids(filter, sid)``. Use it from one thread at a
    time (the persister's worker, or the loop before the persister starts)."""

    def __init__(self, path: Path) -> None:
        self._db = open_db(path, *_SCHEMA, any_thread=True)
        self._db.execute("PRAGMA wal_autocheckpoint=0")  # InterestPersister checkpoints
        self.rows_written = 0  # rows inserted, replaced or deleted since opened

    def load(self) -> dict[str, dict]:
        """Everything stored, in `RemoteInterest.export()` form."""
        peers: dict[str, list[str]] = {}
        for peer, filter in self._db.execute("SELECT peer, filter FROM interest"):
            peers.setdefault(peer, []).append(filter)
        sids = dict(self._db.execute("SELECT filter, sid FROM sids"))
        return {"peers": peers, "sids": sids}

    def empty(self) -> bool:
        return self._db.execute("SELECT 1 FROM sids LIMIT 1").fetchone() is None

    def write(self, ops: list[JournalOp]) -> int:
        """Apply journal ops in one transaction, in order (so the last op on a row wins), as
        runs of one kind: a snapshot's 100,000 additions are two statements' worth of rows,
        with no per-row bookkeeping in Python (this thread holds the GIL the loop needs).
        Returns the rows they changed."""
        db = self._db
        before = db.total_changes
        db.execute("BEGIN")
        try:
            for kind, run in groupby(ops, key=itemgetter(0)):
                if kind == JOURNAL_ADD:
                    rows = list(run)
                    db.executemany("INSERT OR IGNORE INTO interest VALUES (?, ?)",
                                   [(peer, filter) for _, peer, filter, _ in rows])
                    db.executemany("INSERT OR REPLACE INTO sids VALUES (?, ?)",
                                   [(filter, sid) for _, _, filter, sid in rows])
                elif kind == JOURNAL_REMOVE:
                    db.executemany("DELETE FROM interest WHERE peer = ? AND filter = ?",
                                   [(peer, filter) for _, peer, filter, _ in run])
                elif kind == JOURNAL_FREE:
                    db.executemany("DELETE FROM sids WHERE filter = ?",
                                   [(filter,) for _, _, filter, _ in run])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        changed = db.total_changes - before
        self.rows_written += changed
        return changed

    def checkpoint(self) -> None:
        """Move the write-ahead log into the database file (and sync it)."""
        self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def replace(self, state: dict[str, dict]) -> None:
        """Store `state` (export() form) instead of what is there (a migration)."""
        db = self._db
        db.execute("BEGIN")
        db.execute("DELETE FROM interest")
        db.execute("DELETE FROM sids")
        db.executemany("INSERT INTO interest VALUES (?, ?)",
                       [(p, f) for p, fs in state.get("peers", {}).items() for f in fs])
        db.executemany("INSERT INTO sids VALUES (?, ?)", list(state.get("sids", {}).items()))
        db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()


def open_store(path: Path, legacy_json: Path) -> tuple[SqliteInterestStore, dict[str, dict]]:
    """Open the store and load it; a `routing-state.json` left by an older version is moved in
    (and removed) when the store is still empty."""
    store = SqliteInterestStore(path)
    if store.empty() and legacy_json.exists():
        try:
            store.replace(json.loads(legacy_json.read_text()))
        except (OSError, ValueError) as exc:
            log.warning("old routing state unreadable, ignored", extra={"error": str(exc)})
        legacy_json.unlink(missing_ok=True)
    return store, store.load()


class InterestPersister:
    """Writes journal batches in order: a small one with nothing before it at once on the loop,
    others on a worker thread; runs each batch's `then` callback on the loop after its rows are
    committed. `pending` counts ops not yet committed."""

    def __init__(self, store: SqliteInterestStore, *, inline_ops: int = INLINE_OPS,
                 checkpoint_ops: int = CHECKPOINT_OPS) -> None:
        self.store = store
        self.inline_ops = inline_ops
        self.checkpoint_ops = checkpoint_ops
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="interest-store")
        self._queue: list[tuple[list[JournalOp], Callable[[], None]]] = []
        self._running: asyncio.Future | None = None
        self._since_checkpoint = 0  # ops written since the last checkpoint was started
        self.pending = 0
        self.batches = 0  # transactions committed
        self.inline = 0  # of which on the loop
        self.handoffs = 0  # jobs given to the worker thread (writes and checkpoints)

    def submit(self, ops: list[JournalOp], then: Callable[[], None]) -> None:
        """Persist `ops`, then call `then` on the loop (in submission order: at once when
        there is nothing before it and `ops` is empty or small)."""
        if self._running is None and not self._queue and len(ops) <= self.inline_ops:
            if ops:
                self._write_inline(ops)
            then()
            return
        self._queue.append((ops, then))
        self.pending += len(ops)
        if self._running is None:
            self._start()

    def _write_inline(self, ops: list[JournalOp]) -> None:
        try:
            self.store.write(ops)
        except Exception as exc:  # as on the worker: logged, the follow-up still runs
            _write_failed(exc)
        self.batches += 1
        self.inline += 1
        self._since_checkpoint += len(ops)
        if self._since_checkpoint >= self.checkpoint_ops:
            self._start()  # a checkpoint alone, on the worker

    def _start(self) -> None:
        batch, self._queue = self._queue, []
        ops = [op for part, _ in batch for op in part]
        self._since_checkpoint += len(ops)
        checkpoint = self._since_checkpoint >= self.checkpoint_ops
        if checkpoint:
            self._since_checkpoint = 0
        loop = asyncio.get_running_loop()
        self.handoffs += 1
        self._running = loop.run_in_executor(self._pool, self._work, ops, checkpoint)
        self._running.add_done_callback(lambda fut: self._done(fut, batch, len(ops)))

    def _work(self, ops: list[JournalOp], checkpoint: bool) -> None:
        """On the worker thread."""
        try:
            if ops:
                self.store.write(ops)
        finally:
            if checkpoint:
                self.store.checkpoint()

    def _done(self, fut: asyncio.Future, batch: list, count: int) -> None:
        self._running = None
        self.pending -= count
        if batch:
            self.batches += 1
        if not fut.cancelled() and fut.exception() is not None:
            _write_failed(fut.exception())
        for _, then in batch:
            then()
        if self._queue:
            self._start()

    async def flush(self) -> None:
        """Wait until everything submitted is committed and followed up."""
        while self._running is not None:
            await asyncio.shield(self._running)
            await asyncio.sleep(0)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.store.close()


def _write_failed(exc: BaseException | None) -> None:
    log.error("persisting forwarding state failed: %s (a restart may forward fewer of the "
              "copies Mosquitto still holds)", exc)
