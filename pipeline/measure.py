"""Time and peak memory of one `mqfed audit` run (the figures in docs/performance.md).

    python -m pipeline.measure -- --traces DIR --out DIR --json

Runs `mqfed audit` with the given arguments as a child process and samples the resident
memory of it and all its descendants (the JVM included) every 0.2 s from /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _tree(pid: int) -> set[int]:
    pids, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in pids:
            pids.add(p)
            todo += _children(p)
    return pids


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def main(argv: list[str]) -> int:
    args = argv[1:] if argv and argv[0] == "--" else argv
    start = time.monotonic()
    sink = tempfile.TemporaryFile("w+")  # not a pipe: a long summary cannot block the child
    proc = subprocess.Popen([sys.executable, "-m", "sidecar.cli", "audit", *args],
                            stdout=sink, text=True)
    peak_total = peak_jvm = 0
    while proc.poll() is None:
        pids = _tree(proc.pid)
        sizes = {p: _rss(p) for p in pids}
        peak_total = max(peak_total, sum(sizes.values()))
        peak_jvm = max([peak_jvm, *(s for p, s in sizes.items() if p != proc.pid)])
        time.sleep(0.2)
    sink.seek(0)
    print(sink.read(), end="")
    print(json.dumps({"exit": proc.returncode, "seconds": round(time.monotonic() - start, 1),
                      "peak_rss_mb": round(peak_total / 2**20),
                      "peak_child_rss_mb": round(peak_jvm / 2**20)}), file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
