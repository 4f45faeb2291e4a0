"""End to end on a real 3-node cluster: `mqfed load --traces` then the audit.

The drop is real: the subscriber on n3 keeps its session (and so its subscription) but loses
its connection for 1.5 s at QoS 0, so n3's Mosquitto drops what the cluster forwarded for it
meanwhile. The audit must name exactly the messages that subscriber never got, which the test
works out on its own from the trace files and checks against the load generator's count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sidecar.cli import audit
from tests.system.bench.test_bench import _base_port as bench_base_port
from tests.system.bench.test_bench import bench_dir  # noqa: F401
from tests.system.cluster.conftest import (  # noqa: F401
    PLUGIN,
    base_port,
    logs_of,
    mqfed,
    needs_nodes,
    run_dir,
)

RATE, PAUSE_AT, PAUSE_FOR = 400, 1.0, 1.5


def _load(cluster: Path, traces: Path, run: str, qos: int, messages: int,
          *extra: str) -> dict:
    result = mqfed("load", "--cluster", str(cluster), "--publish-on", "n1,n2",
                   "--rate", str(RATE), "--messages", str(messages), "--qos", str(qos),
                   "--traces", str(traces), "--run", run, "--json", *extra, timeout=120)
    assert result.returncode == 0, result.stderr + logs_of(cluster)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _records(traces: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(traces.glob("*.jsonl"))
            for line in path.read_text().splitlines()]


@pytest.mark.usefixtures("needs_nodes")
def test_audit_of_a_real_cluster_names_exactly_the_dropped_messages(
        run_dir: Path, spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    cluster = run_dir  # the fixture stops the cluster recorded here, also on failure
    up = mqfed("up", "--nodes", "3", "--detach", "--json", "--base-port", str(base_port(3)),
               "--run-dir", str(cluster), timeout=120)
    assert up.returncode == 0, up.stderr

    # 1. a clean QoS 1 run: the audit finds every message at every subscriber
    clean = _load(cluster, run_dir / "traces-clean", "clean", 1, 1200)
    assert not clean["publisher_errors"]
    args = argparse.Namespace(traces=str(run_dir / "traces-clean"), master=None, out=None,
                              json=True)
    assert audit.run(args, spark) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] and summary["lost"] == 0 and summary["records"]["pub"] == 1200
    assert [(r["sub"], r["qos"], r["expected"], r["delivered"], r["out_of_order"])
            for r in summary["subscribers"]] == [(f"sub-n{i}", 1, 1200, 1200, 0)
                                                 for i in (1, 2, 3)]
    assert {(r["origin"], r["dest"]) for r in summary["latency"]} == {
        (o, d) for o in ("n1", "n2") for d in ("n1", "n2", "n3")}
    assert all(0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] for r in summary["latency"])

    # 2. the same load at QoS 0 with the subscriber on n3 cut off for a while
    drop = _load(cluster, run_dir / "traces-drop", "drop", 0, 1600,
                 "--pause", f"n3:{PAUSE_AT}:{PAUSE_FOR}")
    got_by_load = {s: r["lost"] for s, r in drop["subscribers"].items()}
    assert got_by_load["sub-n1"] == got_by_load["sub-n2"] == 0 and got_by_load["sub-n3"] > 0
    records = _records(run_dir / "traces-drop")
    published = {(r["pub"], r["seq"]): r["t"] for r in records if r["kind"] == "pub"}
    at_n3 = {(r["pub"], r["seq"]) for r in records
             if r["kind"] == "recv" and r["sub"] == "sub-n3"}
    missing = set(published) - at_n3
    assert len(missing) == got_by_load["sub-n3"]

    out = run_dir / "audit-drop"
    result = mqfed("audit", "--traces", str(run_dir / "traces-drop"), "--out", str(out), "--json",
                   timeout=240)
    assert result.returncode == 0, result.stderr  # QoS 0 loss is reported, not a failure
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["master"] == "local[*]"  # the default: in-process, on loopback
    assert {r["sub"]: r["lost"] for r in summary["subscribers"]} == got_by_load
    assert summary["lost"] == len(missing) and not summary["violations"]
    assert {r["node"] for r in summary["lost_ranges"]} == {"n3"}
    lost = spark.read.parquet(str(out / "parquet" / "lost")).collect()
    assert {(r["pub"], r["seq"]) for r in lost} == missing
    assert {(r["sub"], r["node"], r["qos"]) for r in lost} == {("sub-n3", "n3", 0)}
    times = [published[k] for k in missing]  # all published while n3 was cut off
    assert (max(times) - min(times)) / 1e9 < PAUSE_FOR + 1.5  # slack: reconnecting under load
    assert (out / "report.md").exists() and (out / "latency_cdf.png").exists()


def test_bench_traces_are_audited_clean(bench_dir: Path, spark: SparkSession,  # noqa: F811
                                        capsys: pytest.CaptureFixture[str]) -> None:
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")
    traces = bench_dir / "traces"
    result = mqfed("bench", "--cases", "bc", "--messages", "600", "--rate", "600", "--json",
                   "--run-dir", str(bench_dir), "--base-port", str(bench_base_port()),
                   "--traces", str(traces), timeout=240)
    assert result.returncode == 0, result.stderr + logs_of(bench_dir)
    args = argparse.Namespace(traces=str(traces), master=None, out=None, json=True)
    assert audit.run(args, spark) == 0
    summary = json.loads(capsys.readouterr().out)
    # each case is its own run, ordered by its (random) run id: compare as sets
    assert sorted((r["sub"], r["node"], r["expected"], r["delivered"], r["duplicates"])
                  for r in summary["subscribers"]) == [("sub-b", "n2", 600, 600, 0),
                                                       ("sub-c", "bridge-b", 600, 600, 0)]
    assert sorted((r["origin"], r["dest"], r["count"]) for r in summary["latency"]) == [
        ("bridge-a", "bridge-b", 600), ("n1", "n2", 600)]
    assert sorted((r["origin"], r["dest"], r["messages"]) for r in summary["cross_node"]) == [
        ("bridge-a", "bridge-b", 600), ("n1", "n2", 600)]
