"""`SqliteWillStore`: the node's durable copy of the will table (adapter).

One row per client id (the record as its `peer.proto` bytes), written when it changes."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from sidecar._proto import peer_pb2
from sidecar.sqlite_db import open_db
from sidecar.wills.record import WillRecord
from sidecar.wills.wire import record_from_proto, record_to_proto

log = logging.getLogger("mqfed.wills")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS wills (
    client TEXT PRIMARY KEY,
    record BLOB NOT NULL
)
"""


class SqliteWillStore:
    """Records by client id."""

    def __init__(self, path: Path) -> None:
        self._db = open_db(path, _SCHEMA)

    def load(self) -> list[WillRecord]:
        out = []
        for client, blob in self._db.execute("SELECT client, record FROM wills"):
            try:
                out.append(record_from_proto(peer_pb2.WillRecord.FromString(blob)))
            except ValueError as exc:  # DecodeError is a ValueError too
                log.warning("skipping an unreadable stored will record: %s", exc,
                            extra={"client": client})
        return out

    def save(self, records: Iterable[WillRecord]) -> None:
        rows = [(r.client, record_to_proto(r).SerializeToString()) for r in records]
        if rows:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO wills VALUES (?, ?)", rows)
            self._db.execute("COMMIT")

    def forget(self, clients: Iterable[str]) -> None:
        rows = [(c,) for c in clients]
        if rows:
            self._db.execute("BEGIN")
            self._db.executemany("DELETE FROM wills WHERE client = ?", rows)
            self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
