"""`SqliteSessionStore`: the node's durable copy of the session registry (adapter).

One row per client id, written when its record changes (O(1) per change)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sidecar.sessions.record import SessionRecord
from sidecar.sqlite_db import open_db

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    client TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    connect_hlc INTEGER NOT NULL,
    change_hlc INTEGER NOT NULL,
    protocol TEXT NOT NULL,
    expiry INTEGER,
    fresh INTEGER NOT NULL,
    online INTEGER NOT NULL,
    since_ms INTEGER NOT NULL,
    deleted INTEGER NOT NULL,
    subscriptions TEXT NOT NULL,
    client_connect_hlc INTEGER NOT NULL DEFAULT 0
)
"""
_COLUMNS = ("client, owner, connect_hlc, change_hlc, protocol, expiry, fresh, online, since_ms, "
            "deleted, subscriptions, client_connect_hlc")


class SqliteSessionStore:
    """Records by client id."""

    def __init__(self, path: Path) -> None:
        self._db = open_db(path, _SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(sessions)")}
        if "client_connect_hlc" not in columns:  # a store written before session 10
            self._db.execute("ALTER TABLE sessions ADD COLUMN client_connect_hlc INTEGER "
                             "NOT NULL DEFAULT 0")

    def load(self) -> list[SessionRecord]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM sessions")
        return [SessionRecord(c, o, ch, vh, p, e, bool(f), bool(on), s, bool(d),
                              dict(json.loads(subs)), cc)
                for c, o, ch, vh, p, e, f, on, s, d, subs, cc in rows]

    def save(self, records: Iterable[SessionRecord]) -> None:
        rows = [(r.client, r.owner, r.connect_hlc, r.change_hlc, r.protocol, r.expiry,
                 int(r.fresh), int(r.online), r.since_ms, int(r.deleted),
                 json.dumps(r.subscriptions), r.client_connect_hlc) for r in records]
        if rows:
            self._db.execute("BEGIN")
            self._db.executemany(f"INSERT OR REPLACE INTO sessions ({_COLUMNS}) VALUES "
                                 "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("COMMIT")

    def forget(self, clients: Iterable[str]) -> None:
        rows = [(c,) for c in clients]
        if rows:
            self._db.execute("BEGIN")
            self._db.executemany("DELETE FROM sessions WHERE client = ?", rows)
            self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
