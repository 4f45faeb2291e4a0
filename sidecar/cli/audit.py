"""`mqfed audit`: the PySpark delivery audit over trace records (`pipeline/`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from sidecar.cli.progress import Progress, elapsed_since

INSTALL_HINT = "install the pipeline extra: pip install -e '.[pipeline]' (and Java 17)"


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register `mqfed audit` on the `mqfed` parser."""
    p = sub.add_parser(
        "audit", help="audit trace records: loss, duplicates, ordering, latency (PySpark)",
        description="Join published with received trace records (docs/traces.md) against "
        "the expected subscriber set and report, per subscriber and QoS, lost messages, "
        "duplicates and ordering violations per (publisher, topic); latency per node pair "
        "and over time; cross-node bytes. Runs on local[*] (loopback, UI off) unless "
        "--master is given. Exit status: 0 passed, 1 loss or an ordering violation at "
        "QoS >= 1, 2 the traces could not be audited.")
    p.add_argument("--traces", required=True, metavar="DIR",
                   help="folder (or any Spark path) of *.jsonl trace files, searched recursively")
    p.add_argument("--master", help="Spark master URL (default: local[*])")
    p.add_argument("--out", metavar="DIR",
                   help="write Parquet tables (DIR/parquet/*) and report.md with PNG charts")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_audit)


def render(summary: dict[str, Any]) -> str:
    """A few lines for the terminal (the full report is --out's report.md)."""
    lines = [f"mqfed audit: {'PASS' if summary['ok'] else 'FAIL'}, "
             f"{summary['records']['pub']} published, {summary['records']['recv']} received, "
             f"{summary['lost']} lost"]
    lines += [f"  FAIL {f}" for f in summary["failures"]]
    lines += [f"  lost at {r['lost_at']} ({r['origin']} -> {r['dest']}): {r['lost']}"
              for r in summary.get("lost_at", [])]
    lines += [f"  note {w}" for w in summary["warnings"]]
    for r in summary["latency"]:
        lines.append(f"  latency {r['origin']} -> {r['dest']}: p50 {r['p50_ms']} ms, "
                     f"p95 {r['p95_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms "
                     f"({r['count']} messages)")
    if summary.get("report"):
        lines.append(f"report: {summary['report']}")
    return "\n".join(lines)


def tasks_done(spark: Any) -> Callable[[], float]:
    """A progress poll: the Spark tasks completed so far, over every job of `spark`."""
    tracker = spark.sparkContext.statusTracker()

    def poll() -> float:
        done = 0
        for job_id in tracker.getJobIdsForGroup(None):
            info = tracker.getJobInfo(job_id)
            for stage_id in (info.stageIds if info else ()):
                stage = tracker.getStageInfo(stage_id)
                done += stage.numCompletedTasks if stage else 0
        return done
    return poll


def run(args: argparse.Namespace, spark: Any = None) -> int:
    """The command, on `spark` if given (tests share one session), else a new one. On a
    terminal (and without --json) a progress line shows Spark starting, then its tasks."""
    try:
        from pipeline import job, session, verdict
    except ImportError as exc:
        print(f"mqfed audit: error: {exc}; {INSTALL_HINT}", file=sys.stderr)
        return 2
    progress = Progress.for_command(args.json)
    own = spark is None
    if own:
        with progress.watch("audit: starting Spark", elapsed_since(), unit="s"):
            spark = session.build(args.master)
    try:
        with progress.watch("audit: Spark tasks", tasks_done(spark), unit=" tasks"):
            summary = job.audit(spark, args.traces, args.out)
    except job.TraceError as exc:
        print(f"mqfed audit: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if own:
            spark.stop()
    print(json.dumps(summary) if args.json else render(summary), flush=True)
    return verdict.exit_code(summary)


def cmd_audit(args: argparse.Namespace) -> int:
    return run(args)
