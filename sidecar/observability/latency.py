"""A cheap fixed-bucket latency histogram for the hot path (sans-IO; exported at scrape time)."""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["BOUNDS_MS", "LatencyHistogram"]

BOUNDS_MS: tuple[float, ...] = (0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class LatencyHistogram:
    """Counts per bucket (upper bounds in ms, plus +Inf), the sum and the count."""

    __slots__ = ("bounds", "counts", "sum_ms", "count")

    def __init__(self, bounds: tuple[float, ...] = BOUNDS_MS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum_ms = 0.0
        self.count = 0

    def observe(self, ms: float) -> None:
        """One observation; negative values (clock skew between nodes) count as 0."""
        if ms < 0:
            ms = 0.0
        self.counts[bisect_left(self.bounds, ms)] += 1
        self.sum_ms += ms
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in ms, observations <= it) per bucket, ending with (inf, count)."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out
