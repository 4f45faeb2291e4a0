"""What sidecar hop records cost (not part of the default test run).

    .venv/bin/python -m tests.system.routing.bench_hops --rate 2000 --seconds 10 --runs 3

A 2-node cluster (`mqfed up`); `mqfed load` from n1 to a subscriber on n2 at QoS 1, with hop
records off and on (every node's `trace-hops` file) in alternating runs. Prints the CPU both
sidecars used per message (from /proc, so a busy machine blurs it less than latency), the
subscriber's p50/p99 latency, and the records written. Every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.system.routing.conftest import _finish, _new_run_dir, _start


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(cluster, rate: float, seconds: float, hops: bool) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="mqfed-bench-hops-"))
    nodes = ("n1", "n2")
    try:
        for node in nodes:
            path = cluster.run_dir / "nodes" / node / "trace-hops"
            if hops:
                path.write_text(f"{folder}\n")
            else:
                path.unlink(missing_ok=True)
        time.sleep(0.5)  # the sidecars look every 0.2 s
        pids = [cluster.sidecar_pid(n) for n in nodes]
        cpu0 = sum(_cpu(p) for p in pids)
        argv = [sys.executable, "-m", "sidecar.cli", "load", "--cluster", str(cluster.run_dir),
                "--publish-on", "n1", "--subscribe-on", "n2", "--rate", str(rate),
                "--seconds", str(seconds), "--json"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
        report = json.loads(out.stdout.strip().splitlines()[-1])
        cpu = sum(_cpu(p) for p in pids) - cpu0
        for node in nodes:
            (cluster.run_dir / "nodes" / node / "trace-hops").unlink(missing_ok=True)
        time.sleep(0.5)
        records = sum(1 for f in folder.glob("*.jsonl") for _ in f.open())
        sub = report["subscribers"]["sub-n2"]
        return {"hops": hops, "sent": report["sent"], "lost": sub["lost"],
                "sidecar_us_per_msg": cpu / max(1, report["sent"]) * 1e6,
                "p50_ms": sub["p50_ms"], "p99_ms": sub["p99_ms"], "records": records}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    path = _new_run_dir()
    failed = True
    try:
        cluster = _start(path, 2)
        for i in range(args.runs):
            for hops in (False, True):
                r = one(cluster, args.rate, args.seconds, hops)
                print(f"run {i + 1} hop records {'on ' if hops else 'off'}: {r['sent']} sent, "
                      f"{r['lost']} lost, sidecars {r['sidecar_us_per_msg']:.0f} µs CPU/msg, "
                      f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                      f"{r['records']} records", flush=True)
        failed = False
    finally:
        _finish(path, failed)


if __name__ == "__main__":
    main()
