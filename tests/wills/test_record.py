"""Will records: order of versions (done sticks), due times, validation."""

from __future__ import annotations

import pytest

from sidecar.wills.record import (
    ARMED,
    DELAYED,
    DONE,
    LEAVING,
    WillMessage,
    WillRecord,
    delay_s,
    newer,
)

WILL = WillMessage("w/t", b"x", 1, False, delay=30)


def rec(**kw) -> WillRecord:
    base = {"client": "c", "owner": "n1", "epoch": "e", "connect_hlc": 10, "change_hlc": 10,
            "writer": "n1", "state": ARMED, "will": WILL}
    base.update(kw)
    return WillRecord(**base)


def test_a_newer_connection_wins_over_any_state_of_an_older_one():
    done_old = rec(state=DONE, will=None, change_hlc=99)
    assert newer(rec(connect_hlc=11), done_old)


def test_done_wins_over_a_later_change_of_the_same_connection():
    done = rec(state=DONE, will=None, change_hlc=20, writer="n2")
    later_owner_change = rec(state=DELAYED, change_hlc=30)
    assert newer(done, later_owner_change)
    assert not newer(later_owner_change, done)


def test_a_handed_over_will_wins_over_the_same_state_not_handed_over():
    assert newer(rec(state=DELAYED, orphaned=LEAVING, change_hlc=20),
                 rec(state=DELAYED, change_hlc=25))
    assert newer(rec(change_hlc=11), rec()) and not newer(rec(), rec())


def test_delay_is_capped_by_the_session_expiry():
    assert delay_s(rec(expiry=None)) == 30
    assert delay_s(rec(expiry=5)) == 5
    assert delay_s(rec(expiry=0)) == 0  # MQTT 5: the session ends at once
    assert delay_s(rec(expiry=0), spec=False) == 30  # what Mosquitto 2.0.11 does
    assert delay_s(rec(expiry=100)) == 30


def test_invalid_records_are_refused():
    with pytest.raises(ValueError, match="needs its will"):
        rec(will=None)
    with pytest.raises(ValueError, match="state"):
        rec(state="gone")
    with pytest.raises(ValueError, match="orphan"):
        rec(orphaned="maybe")
