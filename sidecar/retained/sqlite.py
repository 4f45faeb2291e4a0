"""`SqliteRetainedStore`: the node's durable retained index (adapter)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sidecar.local.events import properties_from_json, properties_to_json
from sidecar.retained.entry import RetainedEntry
from sidecar.sqlite_db import open_db

_SCHEMA = """
CREATE TABLE IF NOT EXISTS retained (
    topic TEXT PRIMARY KEY,
    hlc INTEGER NOT NULL,
    origin TEXT NOT NULL,
    deleted INTEGER NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    properties TEXT NOT NULL,
    expires_at_ms INTEGER
)
"""


class SqliteRetainedStore:
    """One row per topic: the newest entry (tombstones included)."""

    def __init__(self, path: Path) -> None:
        self._db = open_db(path, _SCHEMA)

    def load(self) -> list[RetainedEntry]:
        rows = self._db.execute("SELECT topic, hlc, origin, deleted, payload, qos, properties, "
                                "expires_at_ms FROM retained")
        return [RetainedEntry(t, h, o, bytes(p), q, properties_from_json(json.loads(pr)),
                              bool(d), e) for t, h, o, d, p, q, pr, e in rows]

    def save(self, entries: Iterable[RetainedEntry]) -> None:
        rows = [(e.topic, e.hlc, e.origin, int(e.deleted), e.payload, e.qos,
                 json.dumps(properties_to_json(e.properties)), e.expires_at_ms) for e in entries]
        if not rows:
            return
        self._db.execute("BEGIN")
        self._db.executemany(
            "INSERT INTO retained VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(topic) DO UPDATE "
            "SET hlc=excluded.hlc, origin=excluded.origin, deleted=excluded.deleted, "
            "payload=excluded.payload, qos=excluded.qos, properties=excluded.properties, "
            "expires_at_ms=excluded.expires_at_ms WHERE excluded.hlc > retained.hlc OR "
            "(excluded.hlc = retained.hlc AND excluded.origin > retained.origin)", rows)
        self._db.execute("COMMIT")

    def forget(self, entries: Iterable[RetainedEntry]) -> None:
        """Delete these entries' rows (only if the row still holds that version)."""
        rows = [(e.topic, e.hlc, e.origin) for e in entries]
        if rows:
            self._db.execute("BEGIN")
            self._db.executemany("DELETE FROM retained WHERE topic = ? AND hlc = ? AND origin = ?",
                                 rows)
            self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
