"""`wait_complete`: how long a load run waits for a subscriber's last messages."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from sidecar.bench.measure import wait_complete


def _sub(ready: bool) -> SimpleNamespace:
    event = threading.Event()
    if ready:
        event.set()
    return SimpleNamespace(records=[], ready=event)


def test_a_connected_subscriber_that_gets_nothing_more_is_given_up_after_idle():
    sub = _sub(ready=True)
    sub.records.append((b"a", 0, False))
    start = time.monotonic()
    wait_complete(sub, expected=5, idle=0.3, limit=10)
    assert time.monotonic() - start < 2


def test_a_subscriber_still_reconnecting_is_waited_for_and_its_queue_counted():
    """A drained node's client is offline a few seconds; what its session holds arrives
    once it is back (the chaos rolling restart once counted 21 such messages as lost)."""
    sub = _sub(ready=False)
    sub.records.append((b"a", 0, False))

    def comes_back() -> None:
        time.sleep(0.8)  # longer than `idle`
        sub.ready.set()
        sub.records.extend([(b"b", 0, False), (b"c", 0, False)])

    threading.Thread(target=comes_back, daemon=True).start()
    wait_complete(sub, expected=3, idle=0.3, limit=10)
    assert [r[0] for r in sub.records] == [b"a", b"b", b"c"]


def test_the_limit_ends_the_wait_for_a_subscriber_that_never_comes_back():
    sub = _sub(ready=False)
    start = time.monotonic()
    wait_complete(sub, expected=1, idle=0.1, limit=0.5)
    assert 0.4 < time.monotonic() - start < 3
