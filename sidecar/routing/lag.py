"""Interest lag: how far each peer's routing trails this node's interest (sans-IO core).

Every delta this node sends carries a version; a peer answers `InterestApplied(version)` once
it has issued the forwarding subscriptions for everything up to it. A peer's lag is the age of
the oldest change it has not applied yet (0 when it is current), its pending deltas the versions
it trails by. Each applied delta also becomes a sample (change → applied), kept in a histogram
and a bounded window for quantiles. Clocks are passed in (monotonic seconds).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

from sidecar.observability.latency import LatencyHistogram

__all__ = ["InterestLag"]

MAX_TRACKED = 100_000
"""Delta timestamps kept for peers that trail (beyond, the oldest are dropped: a long outage
then shows the age of the oldest kept change)."""

WINDOW = 20_000
"""Recent lag samples kept for quantiles."""


class InterestLag:
    """Delta versions sent, their times, and each peer's applied version."""

    def __init__(self) -> None:
        self._versions: list[int] = []  # versions sent and not applied by every peer, ascending
        self._times: list[float] = []  # when each changed
        self._base = 0  # entries before it are trimmed
        self._applied: dict[str, int] = {}
        self.version = 0  # the newest version sent
        self.histogram = LatencyHistogram()
        self._window: deque[float] = deque(maxlen=WINDOW)  # ms

    def on_sent(self, version: int, now: float) -> None:
        """This node's interest reached `version` (a delta went out) at `now`."""
        self.version = version
        self._versions.append(version)
        self._times.append(now)
        if len(self._versions) - self._base > MAX_TRACKED:
            self._base += 1
            self._compact()

    def on_applied(self, peer: str, version: int, now: float) -> None:
        """`peer` applied everything up to `version`."""
        before = self._applied.get(peer, 0)
        if version <= before:
            return
        self._applied[peer] = version
        first = bisect_right(self._versions, before, lo=self._base)
        last = bisect_right(self._versions, version, lo=first)
        for t in self._times[first:last]:  # only the deltas this ack covers
            ms = (now - t) * 1000
            self.histogram.observe(ms)
            self._window.append(ms)
        self._trim()

    def track(self, peer: str) -> None:
        """A new peer: it gets a snapshot of the current version, then the deltas after."""
        self._applied.setdefault(peer, self.version)

    def forget(self, peer: str) -> None:
        """`peer` left the membership."""
        self._applied.pop(peer, None)
        self._trim()

    def lag(self, peer: str, now: float) -> float:
        """Seconds since the oldest change `peer` has not applied (0: it is current)."""
        i = bisect_right(self._versions, self._applied.get(peer, 0), lo=self._base)
        return max(0.0, now - self._times[i]) if i < len(self._versions) else 0.0

    def pending(self, peer: str) -> int:
        """Deltas `peer` has not applied yet."""
        return max(0, self.version - self._applied.get(peer, 0))

    def quantiles(self) -> dict[str, float]:
        """p50/p99/max of the recent samples, in ms (0 without samples)."""
        samples = sorted(self._window)
        if not samples:
            return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "samples": 0}
        pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
        return {"p50_ms": round(pick(0.5), 2), "p99_ms": round(pick(0.99), 2),
                "max_ms": round(samples[-1], 2), "samples": len(samples)}

    def _trim(self) -> None:
        floor = min(self._applied.values(), default=self.version)
        self._base = bisect_right(self._versions, floor, lo=self._base)
        self._compact()

    def _compact(self) -> None:
        if self._base > 1024 and self._base * 2 > len(self._versions):
            del self._versions[:self._base]
            del self._times[:self._base]
            self._base = 0
