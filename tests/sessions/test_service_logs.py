"""The session service's debug lines (`log.debug = ["mqfed.sessions"]`): every action type and
a peer's record can be described, with JSON-friendly fields (a failure here once dropped every
session frame while debug logging was on)."""

from __future__ import annotations

import json

from sidecar.sessions.record import SessionRecord
from sidecar.sessions.registry import (
    Admit,
    Deny,
    Discard,
    Drain,
    Forget,
    Hold,
    Kick,
    Materialize,
    Publish,
    Resubscribe,
)
from sidecar.sessions.service import _described, _record_fields

RECORD = SessionRecord(client="c1", owner="n2", connect_hlc=5, change_hlc=6, online=False,
                       subscriptions={"a/#": 1})


def test_every_action_is_described_by_client_and_plain_fields():
    actions = [Publish(RECORD), Kick("c1", True), Deny("c1"), Admit("c1"),
               Hold("c1", True, ring=True, since_ms=7), Materialize(RECORD, replica=True),
               Resubscribe("c1", {"a/#": 1}, ("b",)), Drain("c1", "n2", ("a/#",)),
               Discard("c1", urgent=True), Forget(("c1", "c2"))]
    lines = [_described(a) for a in actions]
    assert [line["action"] for line in lines] == [type(a).__name__ for a in actions]
    assert all(line.get("client") == "c1" for line in lines[:-1])
    assert lines[5] == {"action": "Materialize", "client": "c1", "owner": "n2", "online": False,
                        "replica": True}
    assert lines[6]["add"] == 1 and lines[6]["remove"] == 1 and lines[-1]["clients"] == 2
    json.dumps(lines)


def test_a_peer_record_is_described():
    fields = _record_fields("n3", RECORD)
    assert fields == {"peer": "n3", "client": "c1", "owner": "n2", "online": False,
                      "deleted": False, "connect_hlc": 5}


def test_a_moving_queue_goes_to_the_plugin_in_batches_in_order():
    from sidecar.routing.forwarder import Envelope
    from sidecar.sessions.service import DELIVER_BATCH, DELIVER_BATCH_BYTES, _batches

    def env(i: int, size: int = 10) -> Envelope:
        return Envelope("n1", 1, i, 1, f"t/{i}", b"x" * size, 1)

    small = [env(i) for i in range(2 * DELIVER_BATCH + 3)]
    batches = list(_batches(small))
    assert [len(b) for b in batches] == [DELIVER_BATCH, DELIVER_BATCH, 3]
    assert [e.origin_seq for b in batches for e in b] == list(range(len(small)))
    big = [env(i, DELIVER_BATCH_BYTES // 2 - 100) for i in range(5)]
    assert [len(b) for b in _batches(big)] == [2, 2, 1]
    assert list(_batches([])) == []


def test_a_moving_queue_goes_to_the_peer_in_frames_of_bounded_size():
    from sidecar.routing.forwarder import Envelope
    from sidecar.sessions.service import _batches

    envs = [Envelope("n1", 1, i, 1, "t", b"x" * 300, 1) for i in range(10)]
    assert [len(b) for b in _batches(envs, 4, 10**9)] == [4, 4, 2]
    assert [len(b) for b in _batches(envs, 100, 1000)] == [3, 3, 3, 1]
    assert [len(b) for b in _batches(envs, 100, 10)] == [1] * 10  # one above the size: alone
