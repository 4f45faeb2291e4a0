"""What the processes did during a case: CPU time per PID and new warning lines in logs."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
WARNING_WORDS = ("dropped", "error", "warning", "exceeded")


def process_cpu_seconds() -> dict[int, tuple[str, float]]:
    """Every process's name and own user + system CPU seconds so far, by PID."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = entry.joinpath("stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of /proc/PID/stat
        out[int(entry.name)] = (name, (utime + stime) / TICKS)
    return out


class CpuMeter:
    """CPU use of named PIDs between `start()` and `stop()`, as % of one core, and under
    "others" the sum over every other process except those in `exclude`.

    Every figure is per process (/proc/PID/stat, which the kernel scales to the exact run
    time). The machine-wide counters of /proc/stat are not used: this kernel only samples
    them at each 4 ms tick, and over four identical 2,000 msgs/s runs they read 14 %, 15 %,
    33 % and 116 % of a core while the processes' own figures agreed with each other. A
    process that both starts and ends inside the window is not seen."""

    def __init__(self, pids: Mapping[str, int], exclude: Collection[int] = ()) -> None:
        self.pids = dict(pids)
        self.exclude = set(exclude) | set(self.pids.values())
        self._start: dict[int, tuple[str, float]] = {}
        self._t0 = 0.0
        self._others: list[tuple[str, int, float]] = []

    @property
    def started(self) -> float:
        return self._t0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._start = process_cpu_seconds()

    def stop(self, until: float | None = None) -> dict[str, float]:
        """CPU % per name, and "others", over [start, `until` (time.monotonic, default now)];
        work done after `until` still counts, so pass the end of the busy period when the
        rest is idle."""
        wall = max((until or time.monotonic()) - self._t0, 1e-3)
        now = process_cpu_seconds()
        out = {}
        for name, pid in self.pids.items():
            if pid in now and pid in self._start:
                out[name] = round(100 * (now[pid][1] - self._start[pid][1]) / wall, 1)
        others = []
        for pid, (name, end) in now.items():
            if pid not in self.exclude:
                used = end - self._start.get(pid, (name, 0.0))[1]
                if used > 0:
                    others.append((name, pid, round(100 * used / wall, 1)))
        self._others = sorted(others, key=lambda o: -o[2])
        out["others"] = round(sum(o[2] for o in others), 1)
        return out

    def busiest_others(self, top: int = 3, at_least: float = 1.0) -> list[tuple[str, int, float]]:
        """After `stop()`: the busiest of the "others" as (name, pid, %), each ≥ `at_least` %."""
        return [o for o in self._others[:top] if o[2] >= at_least]


class LogWatch:
    """Lines added to some log files since `mark()` that look like trouble."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self._sizes: dict[Path, int] = {}

    def mark(self) -> None:
        self._sizes = {p: p.stat().st_size if p.exists() else 0 for p in self.paths}

    def new_warnings(self, limit: int = 20) -> list[str]:
        out: list[str] = []
        for path in self.paths:
            try:
                with open(path, "rb") as f:
                    f.seek(self._sizes.get(path, 0))
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if any(w in line.lower() for w in WARNING_WORDS):
                    out.append(f"{path.parent.name}/{path.name}: {line.strip()}"[:300])
        return out[:limit]
