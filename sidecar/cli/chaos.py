"""`mqfed chaos SCENARIO|all --run-dir DIR`: faults under traced load, the audit as checker."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from sidecar.chaos import scenarios
from sidecar.chaos.runner import ChaosOptions, run
from sidecar.cli.progress import Progress, elapsed_since
from sidecar.devcluster.errors import ClusterError


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register `mqfed chaos` on the `mqfed` parser."""
    names = ", ".join(scenarios.ALL)
    p = sub.add_parser(
        "chaos", help="run a fault scenario under traced load and audit the deliveries",
        description="Run `mqfed load` (QoS 1, publishers on every node, traces and sidecar hop "
        "records on) against the cluster of --run-dir, inject the fault a third of the way "
        "in, heal it, then check with `mqfed audit` that no message at QoS >= 1 was lost and "
        "that the nodes converged (routes, retained). Prints a verdict and a table. "
        f"Scenarios: {names}; `all` runs each in turn. docs/reliability.md has each "
        "scenario's promise and measured results. Exit status: 0 every scenario passed (or "
        "was skipped), 1 one failed, 2 usage or no cluster.")
    p.add_argument("scenario", choices=[*scenarios.ALL, "all"], metavar="SCENARIO",
                   help=f"one of {names}, or all")
    p.add_argument("--run-dir", type=Path, required=True,
                   help="the cluster's folder (`mqfed up --run-dir`)")
    p.add_argument("--seconds", type=float, default=30.0,
                   help="seconds of load per scenario (default: 30; a soak: 3600)")
    p.add_argument("--rate", type=float, default=500.0,
                   help="messages per second over all publishers (default: 500)")
    p.add_argument("--fault-seconds", type=float,
                   help="how long a timed fault lasts (default: the scenario's, else a third "
                   "of --seconds)")
    p.add_argument("--k", type=int, default=1,
                   help="partition: the first K nodes against the others (default: 1)")
    p.add_argument("--traces", type=Path, metavar="DIR",
                   help="trace folder (one subfolder per scenario; default: "
                   "RUN_DIR/chaos)")
    p.add_argument("--checker", choices=("audit", "load"), default="audit",
                   help="audit: `mqfed audit` over the traces (PySpark; names the hop of "
                   "each loss); load: the load generator's own counts (no Spark)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_chaos)


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_chaos(args: argparse.Namespace) -> int:
    if args.seconds < 6:
        print("mqfed chaos: error: --seconds must be at least 6", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    opts = ChaosOptions(run_dir=args.run_dir.resolve(), seconds=args.seconds, rate=args.rate,
                        traces=args.traces.resolve() if args.traces else None,
                        checker=args.checker, fault_seconds=args.fault_seconds, k=args.k)
    names = scenarios.ALL if args.scenario == "all" else (args.scenario,)
    results = []
    # on a terminal: one bar per scenario, its load's seconds, and the step it is at
    progress = Progress.for_command(args.json)

    def say(text: str) -> None:
        progress.say(text)
        progress.note(text.partition(": ")[2][:60])

    try:
        with progress:
            for i, name in enumerate(names, 1):
                with progress.watch(f"chaos {i}/{len(names)} {name}", elapsed_since(),
                                    args.seconds, unit="s"):
                    row = run(name, opts, say)
                results.append(row)
                progress.say(f"{name}: {row['verdict']}"
                             + "".join(f"\n  {r}" for r in row["reasons"]))
    except (ClusterError, ValueError) as exc:
        print(f"mqfed chaos: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mqfed chaos: interrupted; the fault was undone", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(results), flush=True)
    else:
        print(scenarios.table(results), flush=True)
        for row in results:
            for where in row.get("lost_at", []):
                print(f"  {row['scenario']}: {where['lost']} lost at {where['lost_at']} "
                      f"({where['origin']} -> {where['dest']})")
    return 1 if any(r["verdict"] == "FAIL" for r in results) else 0
