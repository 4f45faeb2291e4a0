"""Which copies the forwarding client settled (sidecar.journal.confirmations)."""

from __future__ import annotations

from sidecar.journal.confirmations import Confirmations
from sidecar.journal.record import fingerprint


def test_acked_copies_are_confirmed_once():
    c = Confirmations()
    c.on_copy(1, "t/a", b"x")
    c.on_copy(2, "t/b", b"y")
    c.on_ack(2)
    c.on_ack(2)  # a second ack of the same packet id confirms nothing more
    c.on_ack(9)  # never taken (a QoS 0 copy, a probe)
    assert c.take() == [fingerprint("t/b", b"y")] and c.take() == []
    assert c.waiting == 1 and c.confirmed == 1


def test_a_new_session_forgets_what_was_taken():
    c = Confirmations()
    c.on_copy(1, "t/a", b"x")
    c.on_ack(1)
    c.on_copy(2, "t/a", b"z")
    c.reset()
    c.on_ack(2)
    assert c.take() == [] and c.waiting == 0


def test_a_shard_s_new_session_forgets_only_its_copies():
    c = Confirmations()
    c.on_copy(5, "t/a", b"x")  # shard 0
    c.on_copy(65536 + 5, "t/b", b"y")  # shard 1, the same packet id
    c.reset(range(65536, 2 * 65536))
    c.on_ack(65536 + 5)
    c.on_ack(5)
    assert c.take() == [fingerprint("t/a", b"x")] and c.waiting == 0
