"""`RateMeter`: rates of counters polled at irregular times."""

from __future__ import annotations

import pytest

from sidecar.statuspage.rates import RateMeter


def test_no_rate_until_two_samples_min_span_apart() -> None:
    meter = RateMeter(window=5.0, min_span=0.5)
    assert meter.observe(10.0, {"a": 100}) == {"a": None}
    assert meter.observe(10.2, {"a": 120}) == {"a": None}  # too close to tell
    assert meter.observe(11.0, {"a": 200}) == {"a": pytest.approx(100.0)}


def test_rate_over_the_window_and_repeated_polls_agree() -> None:
    meter = RateMeter(window=5.0, min_span=0.5)
    for t in range(0, 20):  # a steady 50/s, polled every second
        rates = meter.observe(float(t), {"a": 50 * t})
    assert rates["a"] == pytest.approx(50.0)
    # a second viewer polling at the same time sees the same rate
    assert meter.observe(19.0, {"a": 50 * 19})["a"] == pytest.approx(50.0)
    # the rate follows a change within the window
    for t in range(20, 26):
        rates = meter.observe(float(t), {"a": 950 + 10 * (t - 19)})
    assert rates["a"] == pytest.approx(10.0)


def test_a_counter_that_goes_down_starts_over() -> None:
    meter = RateMeter(window=5.0, min_span=0.5)
    meter.observe(0.0, {"a": 1000})
    meter.observe(1.0, {"a": 1100})
    assert meter.observe(2.0, {"a": 5}) == {"a": None}  # its node restarted
    assert meter.observe(3.0, {"a": 25})["a"] == pytest.approx(20.0)


def test_polls_further_apart_than_the_window_use_the_previous_sample() -> None:
    meter = RateMeter(window=5.0, min_span=0.5)
    meter.observe(0.0, {"a": 0})
    assert meter.observe(20.0, {"a": 400})["a"] == pytest.approx(20.0)


def test_keys_gone_for_a_window_are_forgotten() -> None:
    meter = RateMeter(window=5.0, min_span=0.5)
    meter.observe(0.0, {("sent", "n1", "n2"): 10, ("out", "n1"): 1})
    meter.observe(10.0, {("out", "n1"): 2})
    assert set(meter._samples) == {("out", "n1")}
    assert meter.observe(11.0, {("sent", "n1", "n2"): 30}) == {("sent", "n1", "n2"): None}


def test_bad_window() -> None:
    with pytest.raises(ValueError, match="min_span"):
        RateMeter(window=1.0, min_span=2.0)
