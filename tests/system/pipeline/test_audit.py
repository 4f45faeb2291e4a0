"""Trace files in, verdict out: the writer, the reader, the job and `mqfed audit`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipeline import source, verdict
from sidecar.bench.traces import TraceWriter, pub_line
from sidecar.cli import audit
from tests.system.pipeline.handmade import Trace

TOPIC = "load/r/n1/0"


def _trace(sub_qos: int, missing: tuple[int, ...]) -> Trace:
    tr = Trace().subscribe("s1", "n2", "load/#", sub_qos).subscribe("s2", "n1", "load/#", 1)
    for seq in range(20):
        tr.publish(0, seq, TOPIC, "n1", at=seq * 100)
        tr.receive("s2", "n1", 0, seq, TOPIC, at=seq * 100 + 1)
        if seq not in missing:
            tr.receive("s1", "n2", 0, seq, TOPIC, at=seq * 100 + 3, qos=sub_qos)
    return tr


def _audit(spark: SparkSession, traces: Path, out: Path | None,
           capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    args = argparse.Namespace(traces=str(traces), master=None,
                              out=str(out) if out else None, json=True)
    code = audit.run(args, spark)
    captured = capsys.readouterr()
    text = captured.out.strip()
    return code, json.loads(text) if text.startswith("{") else {}, captured.err


def test_writer_rotates_files(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, "pub-x", max_records=3)
    for seq in range(7):
        w.write(pub_line("x", 0, seq, "t", 1, "n1", seq, 10))
    w.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["pub-x-0000.jsonl", "pub-x-0001.jsonl", "pub-x-0002.jsonl"]
    lines = [json.loads(x) for n in names for x in (tmp_path / n).read_text().splitlines()]
    assert [r["seq"] for r in lines] == list(range(7)) and lines[0]["v"] == 1


def test_reader_counts_kinds_and_skips_bad_records(spark: SparkSession, tmp_path: Path) -> None:
    tr = _trace(1, missing=(3,))
    tr.write(tmp_path / "nested", max_records=10)  # rotated, in a subfolder
    (tmp_path / "bad.jsonl").write_text(
        '{"v":1,"kind":"pub","run":"r","pub":0,"seq":\n'  # truncated line
        '{"v":2,"kind":"pub","run":"r","pub":0,"seq":99}\n'  # a newer schema
        '{"v":1,"kind":"hop","event":"forwarded","node":"n1"}\n'  # a sidecar hop record
        '{"v":1,"kind":"span","run":"r"}\n')  # unknown kind
    (tmp_path / "notes.txt").write_text("not a trace\n")  # not *.jsonl: ignored
    data, counts = source.load(spark, str(tmp_path))
    assert {k: counts[k] for k in ("pub", "recv", "sub", "unsub", "hop", "unparsable",
                                   "other_version", "unknown_kind")} == {
        "pub": 20, "recv": 39, "sub": 2, "unsub": 0, "hop": 1, "unparsable": 1,
        "other_version": 1, "unknown_kind": 1}
    got = {(r["pub"], r["seq"], r["t"]) for r in data.pub.collect()}
    data.raw.unpersist()
    assert got == {(r["pub"], r["seq"], r["t"]) for r in tr.rows if r["kind"] == "pub"}


def test_audit_fails_on_qos1_loss_and_writes_report(spark: SparkSession, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _trace(1, missing=(4, 5, 11)).write(tmp_path / "t")
    code, summary, _ = _audit(spark, tmp_path / "t", tmp_path / "out", capsys)
    assert code == 1 and summary["ok"] is False and summary["lost"] == 3
    assert summary["failures"] == ["s1 on n2 (run r, QoS 1): 3 of 20 messages lost"]
    assert [(r["first_seq"], r["last_seq"]) for r in summary["lost_ranges"]] == [(4, 5),
                                                                                 (11, 11)]
    assert {(r["origin"], r["dest"]) for r in summary["latency"]} == {("n1", "n1"),
                                                                      ("n1", "n2")}
    out = tmp_path / "out"
    report = (out / "report.md").read_text()
    assert "**FAIL**" in report and "3 of 20 messages lost" in report
    for png in ("latency_cdf.png", "timeline.png", "latency_time.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG", png
        assert f"]({png})" in report
    lost = spark.read.parquet(str(out / "parquet" / "lost")).collect()
    assert sorted(r["seq"] for r in lost) == [4, 5, 11]
    per = spark.read.parquet(str(out / "parquet" / "per_subscriber")).count()
    assert per == 2


def test_audit_passes_with_qos0_loss_only(spark: SparkSession, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _trace(0, missing=(7,)).write(tmp_path)
    code, summary, _ = _audit(spark, tmp_path, None, capsys)
    assert code == 0 and summary["ok"] is True and summary["lost"] == 1
    assert summary["warnings"] == ["s1 on n2 (run r, QoS 0): 1 of 20 messages lost (QoS 0)"]


def test_audit_refuses_folders_without_traces(spark: SparkSession, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "new.jsonl").write_text('{"v":2,"kind":"pub","run":"r","pub":0,"seq":1}\n')
    code, summary, err = _audit(spark, tmp_path, None, capsys)
    assert (code, summary) == (2, {}) and "schema version 2" in err
    (tmp_path / "new.jsonl").unlink()
    (tmp_path / "other.jsonl").write_text('{"v":1,"kind":"sub","run":"r"}\n')
    code, summary, err = _audit(spark, tmp_path, None, capsys)
    assert (code, summary) == (2, {}) and "no trace records" in err
    code, summary, err = _audit(spark, tmp_path / "missing", None, capsys)
    assert (code, summary) == (2, {}) and "missing" in err


def test_verdict_fails_on_qos1_loss_or_reordering_only() -> None:
    base = {"run": "r", "sub": "s", "node": "n1", "expected": 10, "lost": 0,
            "out_of_order": 0, "duplicates": 0, "unexpected": 0}
    assert verdict.failures([{**base, "qos": 0, "lost": 3, "out_of_order": 2}]) == []
    assert verdict.failures([{**base, "qos": 1, "lost": 3}]) == [
        "s on n1 (run r, QoS 1): 3 of 10 messages lost"]
    assert verdict.failures([{**base, "qos": 2, "out_of_order": 1}]) == [
        "s on n1 (run r, QoS 2): 1 messages out of order"]
    assert verdict.exit_code({"ok": False}) == 1 and verdict.exit_code({"ok": True}) == 0
    assert verdict.warnings([{**base, "qos": 1, "duplicates": 2}], {"unparsable": 1}) == [
        "s on n1 (run r, QoS 1): 2 duplicate copies", "1 unparsable lines skipped"]
