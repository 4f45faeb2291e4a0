"""`SqliteSpillStore`: the `SpillStore` of one peer's outbound queue, in its own SQLite file.

An adapter (does file I/O). WAL journal with ``synchronous=NORMAL``: a committed append survives a
crash of the sidecar process (not necessarily a power loss), which is the failure the outbound
queue's durability promise covers. Each `append`/`delete` is one transaction. Not thread-safe: use
one store from one thread at a time (it may be a worker thread other than the creator's).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from sidecar.peering.outbound import QueuedMessage
from sidecar.sqlite_db import open_db

__all__ = ["SqliteSpillStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spill (
    key INTEGER PRIMARY KEY,
    incarnation INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL
)
"""
_CHUNK = 500  # keys per DELETE statement (well under SQLite's variable limit)


class SqliteSpillStore:
    """Queued messages in ``path`` (created if missing); reopening it finds them again."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = open_db(self.path, _SCHEMA, any_thread=True)
        count, size, last = self._db.execute(
            "SELECT count(*), coalesce(sum(length(data)), 0), coalesce(max(key), 0) FROM spill"
        ).fetchone()
        self._count: int = count
        self._bytes: int = size
        self._last: int = last

    def append(self, messages: Sequence[QueuedMessage]) -> None:
        if not messages:
            return
        with self._transaction():
            self._db.executemany(
                "INSERT INTO spill (key, incarnation, seq, data) VALUES (?, ?, ?, ?)", messages
            )
        self._count += len(messages)
        self._bytes += sum(len(m.data) for m in messages)
        self._last = max(self._last, messages[-1].key)

    def read_batch(self, after_key: int, n: int) -> list[QueuedMessage]:
        rows = self._db.execute(
            "SELECT key, incarnation, seq, data FROM spill WHERE key > ? ORDER BY key LIMIT ?",
            (after_key, n),
        ).fetchall()
        return [QueuedMessage(k, i, s, bytes(d)) for k, i, s, d in rows]

    def delete(self, keys: Iterable[int]) -> None:
        keys = list(keys)
        if not keys:
            return
        removed = removed_bytes = 0
        with self._transaction():
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"DELETE FROM spill WHERE key IN ({marks}) RETURNING length(data)", chunk
                ).fetchall()
                removed += len(rows)
                removed_bytes += sum(r[0] for r in rows)
        self._count -= removed
        self._bytes -= removed_bytes
        if not self._count:
            self._last = 0

    def count(self) -> int:
        return self._count

    def bytes(self) -> int:
        return self._bytes

    def last_key(self) -> int:
        return self._last

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SqliteSpillStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")
