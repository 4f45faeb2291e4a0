"""Opening the node's SQLite files the one way they are all used (adapter helper)."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def open_db(path: str | Path, *schema: str, any_thread: bool = False) -> sqlite3.Connection:
    """`path` (its folder created if missing) in autocommit mode, write-ahead log, `synchronous
    NORMAL` (a commit survives a crashed process, and a power loss only loses the last ones);
    the `schema` statements run. `any_thread`: usable from a thread other than the opener's
    (one at a time)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=not any_thread)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    for statement in schema:
        db.execute(statement)
    return db
