"""Will records through peer.proto frames and the SQLite store, and back."""

from __future__ import annotations

import pytest

from sidecar._proto import peer_pb2
from sidecar.message import MessageProperties
from sidecar.wills import wire
from sidecar.wills.record import DELAYED, DONE, LEAVING, WillMessage, WillRecord
from sidecar.wills.sqlite import SqliteWillStore

PROPS = MessageProperties(user=(("k", "v"), ("k", "w")), content_type="t", payload_format=1,
                          correlation_data=b"\x00c", response_topic="r", message_expiry=90)
FULL = WillRecord("c1", "n1", "ab12", 123 << 16, (123 << 16) + 4, "n1", DELAYED, LEAVING, 99,
                  None, WillMessage("w/t", b"\x00\xff", 2, True, 30, PROPS))
BARE = WillRecord("c2", "n1", "ab12", 5, 6, "n3", DONE, since_ms=7, expiry=0,
                  outcome="published")


def test_records_round_trip_through_frames():
    frames = list(wire.records_frames([FULL, BARE], snapshot=True))
    assert len(frames) == 1
    msg = peer_pb2.Frame.FromString(frames[0]).will_records
    assert msg.snapshot and msg.exchange == 0
    assert [wire.record_from_proto(m) for m in msg.records] == [FULL, BARE]


def test_an_exchange_asks_for_an_ack_on_the_last_frame_only():
    many = [WillRecord(f"c{i}", "n1", "e", 1, 1, "n1", DONE) for i in range(450)]
    frames = [peer_pb2.Frame.FromString(f).will_records
              for f in wire.records_frames(many, exchange=7)]
    assert [len(f.records) for f in frames] == [200, 200, 50]
    assert [f.exchange for f in frames] == [0, 0, 7]
    assert [peer_pb2.Frame.FromString(f).will_records.exchange
            for f in wire.records_frames([], exchange=3)] == [3]  # even for nothing
    assert peer_pb2.Frame.FromString(wire.ack_frame(7)).will_records_ack.exchange == 7


def test_a_bad_record_from_a_peer_is_refused():
    m = wire.record_to_proto(FULL)
    m.state = peer_pb2.WillRecord.STATE_UNSPECIFIED
    with pytest.raises(ValueError, match="state"):
        wire.record_from_proto(m)
    m = wire.record_to_proto(FULL)
    m.qos = 3
    with pytest.raises(ValueError, match="QoS"):
        wire.record_from_proto(m)


def test_the_store_keeps_one_row_per_client(tmp_path):
    store = SqliteWillStore(tmp_path / "wills.sqlite")
    store.save([FULL, BARE])
    store.save([WillRecord("c2", "n1", "ab12", 8, 9, "n1", DONE, outcome="cleared")])
    store.forget(["nobody"])
    store.close()
    again = SqliteWillStore(tmp_path / "wills.sqlite")
    loaded = {r.client: r for r in again.load()}
    assert loaded["c1"] == FULL and loaded["c2"].outcome == "cleared"
    again.forget(["c1"])
    assert [r.client for r in again.load()] == ["c2"]
    again.close()
