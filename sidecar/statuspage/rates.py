"""Rates of counters sampled at irregular times (sans-IO): messages per second per node and
per node pair, for the status page.

Each poll of the page feeds the counters it read with the time it read them; the rate of a
counter is its increase since the oldest sample of the last `window` seconds that is at
least `min_span` older than the newest (or since the sample before the newest, when polls are
further apart than `window`). A counter that goes down (its node
restarted) starts over. Counters not seen for `window` seconds are forgotten.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping

__all__ = ["RateMeter"]

WINDOW = 5.0
MIN_SPAN = 0.5


class RateMeter:
    """Per-key rates (units per second) of monotonic counters."""

    def __init__(self, window: float = WINDOW, min_span: float = MIN_SPAN) -> None:
        if not 0 < min_span < window:
            raise ValueError(f"need 0 < min_span ({min_span}) < window ({window})")
        self.window = window
        self.min_span = min_span
        self._samples: dict[Hashable, deque[tuple[float, float]]] = {}

    def observe(self, now: float,
                counters: Mapping[Hashable, float]) -> dict[Hashable, float | None]:
        """Record `counters` read at `now` (monotonic seconds); the rate of each (None until
        two samples `min_span` apart exist)."""
        rates: dict[Hashable, float | None] = {}
        for key, value in counters.items():
            samples = self._samples.setdefault(key, deque())
            if samples and (value < samples[-1][1] or now < samples[-1][0]):
                samples.clear()  # counter reset (a restarted node) or a clock that went back
            if samples and now == samples[-1][0]:
                samples.pop()
            samples.append((now, value))
            while len(samples) > 2 and now - samples[1][0] >= self.window:
                samples.popleft()
            rates[key] = self._rate(samples)
        for key in [k for k, s in self._samples.items()
                    if k not in counters and now - s[-1][0] > self.window]:
            del self._samples[key]
        return rates

    def _rate(self, samples: deque[tuple[float, float]]) -> float | None:
        t1, v1 = samples[-1]
        usable = [(t, v) for t, v in list(samples)[:-1] if t1 - t >= self.min_span]
        if not usable:
            return None
        within = [s for s in usable if t1 - s[0] <= self.window]
        t0, v0 = within[0] if within else usable[-1]
        return (v1 - v0) / (t1 - t0)
