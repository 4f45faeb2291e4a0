"""A skewed wall clock for fault drills (`mqfed chaos clock-skew`): with
`MQFED_DRILL_CLOCK_SKEW_MS` set, `time.time()` and `time.time_ns()` of this sidecar process
run that many milliseconds ahead (or behind, negative). Monotonic clocks, Mosquitto and the
other nodes are untouched. Never set it outside a drill."""

from __future__ import annotations

import time

ENV = "MQFED_DRILL_CLOCK_SKEW_MS"


def apply(value: str) -> int:
    """Skew this process's wall clock by `value` ms (an integer); returns the skew."""
    skew_ms = int(value)
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + skew_ms / 1000  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + skew_ms * 1_000_000  # type: ignore[assignment]
    return skew_ms
