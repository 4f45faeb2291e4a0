"""What the processes did during a case: CPU time per PID and new warning lines in logs."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
WARNING_WORDS = ("dropped", "error", "warning", "exceeded")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of `pid` so far, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15)


def machine_busy_seconds() -> float:
    """CPU seconds all processes of this machine used so far (every core, from /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(f) for f in fields[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS  # minus idle and iowait


class CpuMeter:
    """CPU use of named PIDs between `start()` and `stop()`, as % of one core; the key
    "machine" is every process on the machine (others' load shows as the difference)."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._start: dict[str, float | None] = {}
        self._t0 = 0.0

    @property
    def started(self) -> float:
        return self._t0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._start["machine"] = machine_busy_seconds()

    def stop(self, until: float | None = None) -> dict[str, float]:
        """CPU % per name over [start, `until` (time.monotonic, default now)]; work done after
        `until` still counts, so pass the end of the busy period when the rest is idle."""
        wall = max((until or time.monotonic()) - self._t0, 1e-3)
        out = {}
        for name, pid in self.pids.items():
            end, begin = cpu_seconds(pid), self._start.get(name)
            if end is not None and begin is not None:
                out[name] = round(100 * (end - begin) / wall, 1)
        out["machine"] = round(100 * (machine_busy_seconds() - self._start["machine"]) / wall, 1)
        return out


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
