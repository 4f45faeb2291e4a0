"""`SqliteSessionStore` and the record's wire form keep every field, and a store written by an
earlier version (no `client_connect_hlc` column) is upgraded in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sidecar.sessions import wire
from sidecar.sessions.record import SessionRecord
from sidecar.sessions.sqlite import SqliteSessionStore

HANDED = SessionRecord("dev", "n2", 900, 901, "mqtt311", 60, False, False, 1234, False,
                       {"a/#": 1}, client_connect_hlc=500)


def test_records_round_trip_through_the_store_and_the_wire(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "sessions.sqlite")
    plain = SessionRecord("other", "n1", 7, 8)
    store.save([HANDED, plain])
    store.close()
    again = SqliteSessionStore(tmp_path / "sessions.sqlite")
    assert sorted(again.load(), key=lambda r: r.client) == [HANDED, plain]
    again.close()
    assert wire.record_from_proto(wire.record_to_proto(HANDED)) == HANDED
    assert (HANDED.client_connect, plain.client_connect) == (500, 7)


def test_a_store_of_an_earlier_version_gets_the_new_column(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE sessions (client TEXT PRIMARY KEY, owner TEXT NOT NULL, "
               "connect_hlc INTEGER NOT NULL, change_hlc INTEGER NOT NULL, protocol TEXT NOT "
               "NULL, expiry INTEGER, fresh INTEGER NOT NULL, online INTEGER NOT NULL, "
               "since_ms INTEGER NOT NULL, deleted INTEGER NOT NULL, subscriptions TEXT NOT "
               "NULL)")
    db.execute("INSERT INTO sessions VALUES ('dev', 'n1', 5, 6, 'mqtt5', 60, 1, 0, 10, 0, "
               "'{\"x\": 1}')")
    db.commit()
    db.close()
    store = SqliteSessionStore(path)
    assert store.load() == [SessionRecord("dev", "n1", 5, 6, "mqtt5", 60, True, False, 10,
                                          False, {"x": 1})]
    store.save([HANDED])
    assert {r.client: r for r in store.load()}["dev"] == HANDED
    store.close()
