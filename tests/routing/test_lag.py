"""Interest lag per peer: the age of the oldest change a peer has not applied."""

from __future__ import annotations

from sidecar.routing.lag import InterestLag


def test_lag_and_pending_follow_the_acks():
    lag = InterestLag()
    lag.track("n2")
    lag.track("n3")
    lag.on_sent(1, now=10.0)
    lag.on_sent(2, now=10.5)
    assert lag.lag("n2", 11.0) == 1.0 and lag.pending("n2") == 2
    lag.on_applied("n2", 1, now=11.0)
    assert lag.lag("n2", 11.0) == 0.5 and lag.pending("n2") == 1
    lag.on_applied("n2", 2, now=11.2)
    assert lag.lag("n2", 12.0) == 0.0 and lag.pending("n2") == 0
    assert lag.lag("n3", 12.0) == 2.0 and lag.pending("n3") == 2
    q = lag.quantiles()
    assert q["samples"] == 2 and q["p50_ms"] in (700.0, 1000.0)
    lag.forget("n3")  # n3 left: nothing else trails, old versions are dropped
    assert lag.lag("n3", 12.0) == 0.0


def test_a_late_or_repeated_ack_counts_once():
    lag = InterestLag()
    lag.track("n2")
    lag.on_sent(1, now=0.0)
    lag.on_applied("n2", 1, now=0.1)
    lag.on_applied("n2", 1, now=5.0)
    assert lag.histogram.count == 1
