"""One `mqfed chaos` scenario, start to verdict (adapter).

1. The fault's preparation (a restart with a proxy or a skewed clock, for some).
2. Hop records on (every node's `trace-hops`), then `mqfed load` with traces: publishers on
   every node, QoS 1, at `rate` for `seconds`; subscribers on every node (not on a node that
   is killed; with sessions when nodes restart).
3. At a third of the load the fault, healed after the fault time (a kill or a restart heals
   at once); the heal time is until every peer stream is up again.
4. After the load: hop records off, the fault's cleanup, the nodes' convergence (interest,
   retained digests), then the checker: `mqfed audit` over the traces (PySpark), or the load
   generator's own counts (`checker="load"`, no Spark).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.chaos import faults
from sidecar.chaos.cluster import ChaosCluster
from sidecar.chaos.scenarios import SCENARIOS, fault_seconds, layout, verdict

SESSION_EXPIRY = 300


@dataclass(frozen=True)
class ChaosOptions:
    run_dir: Path
    seconds: float = 30.0
    rate: float = 500.0
    traces: Path | None = None  # default: <run dir>/chaos/<scenario>-<time>
    checker: str = "audit"  # or "load"
    fault_seconds: float | None = None
    k: int = 1


def _load_argv(cluster: ChaosCluster, scenario: str, opts: ChaosOptions, traces: Path,
               run: str) -> list[str]:
    sc = SCENARIOS[scenario]
    lay = layout(sc, cluster.nodes, opts.k)
    argv = [sys.executable, "-m", "sidecar.cli", "load", "--json", "--run", run,
            "--traces", str(traces), "--rate", str(opts.rate), "--seconds", str(opts.seconds),
            "--publish-on", ",".join(lay.publish_on), "--subscribe-on", ",".join(lay.subscribe_on)]
    for node in cluster.nodes:
        host, port = cluster.mqtt(node)
        argv += ["--node", f"{node}={host}:{port}"]
    if sc.persistent:  # drained clients come back through the front, to another node
        argv += ["--session-expiry", str(SESSION_EXPIRY), "--subscribe-via",
                 f"127.0.0.1:{cluster.state.layout.front_port}"]
    return argv


class _Load:
    """`mqfed load` as a child process (stopped by PID if anything goes wrong)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.started = threading.Event()
        self.err: list[str] = []
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line.rstrip())
            if ": publishing from " in line:
                self.started.set()
        self.started.set()

    def result(self, timeout: float) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=timeout)
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError("mqfed load gave no result: " + " | ".join(self.err[-5:])) \
                from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def audit(traces: Path) -> dict[str, Any]:
    """`mqfed audit --traces DIR --json` in a child process (its own JVM)."""
    result = subprocess.run([sys.executable, "-m", "sidecar.cli", "audit", "--traces",
                             str(traces), "--json"], capture_output=True, text=True,
                            timeout=1800)
    if result.returncode not in (0, 1):
        raise RuntimeError(f"mqfed audit failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(scenario: str, opts: ChaosOptions, say: Callable[[str], None]) -> dict[str, Any]:
    """Run one scenario; the result row (with `verdict` and `reasons`)."""
    sc = SCENARIOS[scenario]
    cluster = ChaosCluster(opts.run_dir)
    lay = layout(sc, cluster.nodes, opts.k)
    hold = fault_seconds(sc, opts.seconds, opts.fault_seconds)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    traces = (opts.traces or opts.run_dir / "chaos") / f"{scenario}-{stamp}"
    run_id = f"{scenario}-{uuid.uuid4().hex[:6]}"
    row: dict[str, Any] = {"scenario": scenario, "fault": sc.fault, "promise": sc.promise,
                           "target": lay.target, "traces": str(traces), "run": run_id}
    fault = faults.make(sc, cluster, lay)
    load: _Load | None = None
    try:
        say(f"{scenario}: preparing")
        fault.prepare()
        if cluster.wait_meshed() is None:
            raise RuntimeError("the cluster's peer streams are not all up: "
                               + "; ".join(cluster.unmeshed()))
        cluster.hop_records(traces / "hops")
        load = _Load(_load_argv(cluster, scenario, opts, traces, run_id))
        if not load.started.wait(120) or load.proc.poll() is not None:
            raise RuntimeError("mqfed load did not start: " + " | ".join(load.err[-5:]))
        time.sleep(opts.seconds / 3)
        say(f"{scenario}: {sc.fault}")
        t0 = time.monotonic()
        fault.inject()
        if scenario not in faults.INSTANT | faults.WHOLE_LOAD:
            time.sleep(max(0.0, hold - (time.monotonic() - t0)))
        row["fault_s"] = (opts.seconds if scenario in faults.WHOLE_LOAD
                          else round(time.monotonic() - t0, 1))
        healed_at = time.monotonic()
        fault.heal()
        meshed = cluster.wait_meshed(120)
        row["heal_s"] = None if meshed is None else round(time.monotonic() - healed_at, 1)
        report = load.result(opts.seconds + 300)
        row["publisher_errors"] = report.get("publisher_errors", [])
    except faults.NeedsNetns as exc:
        row.update(verdict="SKIP", reasons=[str(exc)])
        return row
    except Exception as exc:  # the row says what went wrong; cleanup still runs
        row["error"] = f"{type(exc).__name__}: {exc}"
        report = None
    finally:
        if load is not None:
            load.stop()
        cluster.hop_records(None)
        try:
            fault.cleanup()
        except Exception as exc:
            row.setdefault("error", f"cleanup: {exc}")
    if report is not None:
        _counts(row, report, traces, opts.checker)
        row["converged"], row["divergence"] = cluster.wait_converged()
    ok, reasons = verdict(row)
    row.update(verdict="PASS" if ok else "FAIL", reasons=reasons)
    return row


def _counts(row: dict[str, Any], report: dict[str, Any], traces: Path, checker: str) -> None:
    subs = report.get("subscribers", {}).values()
    row["published"] = report.get("sent")
    if checker == "load":
        row["lost"] = sum(s["lost"] for s in subs)
        row["duplicates"] = sum(s["duplicates"] for s in subs)
        row["out_of_order"] = sum(s["out_of_order"] for s in subs)
        row["p99_ms"] = max((s["p99_ms"] for s in subs), default=None)
        return
    time.sleep(0.5)  # the sidecars close their hop files (0.2 s loop)
    summary = audit(traces)
    per = summary.get("subscribers", [])
    row["lost"] = sum(r["lost"] for r in per if (r["qos"] or 0) >= 1)
    row["duplicates"] = sum(r["duplicates"] for r in per)
    row["out_of_order"] = sum(r["out_of_order"] for r in per)
    row["p99_ms"] = max((r["p99_ms"] for r in summary.get("latency", [])), default=None)
    row["lost_at"] = summary.get("lost_at", [])
    row["hop_latency"] = summary.get("hop_latency", [])
    row["audit_failures"] = summary.get("failures", [])
