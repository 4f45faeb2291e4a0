"""The audit job: traces in; Parquet, a Markdown report with charts and a summary out.

Only aggregates reach the driver (per subscriber, per node pair, per time bucket, and at most
`SAMPLE` lost ranges and ordering violations); record-level results go to Parquet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline import metrics, source, verdict
from pipeline.schema import SCHEMA_VERSION

SAMPLE = 100  # lost ranges and violations listed in the summary (all are in the Parquet)


class TraceError(Exception):
    """The traces cannot be audited (none found, or only of a newer schema)."""


def _rows(df: DataFrame, order: list[str], limit: int | None = None) -> list[dict[str, Any]]:
    df = df.orderBy(*order)
    rows = df.limit(limit).collect() if limit else df.collect()
    return [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.asDict().items()}
            for r in rows]


def audit(spark: SparkSession, traces: str, out: str | None = None) -> dict[str, Any]:
    """Audit the traces under `traces`; with `out`, write Parquet tables and the report."""
    try:
        data, counts = source.load(spark, traces)
    except AnalysisException as exc:  # e.g. the path does not exist
        raise TraceError(str(exc).splitlines()[0]) from None
    try:
        return _audit(spark, data, counts, traces, out)
    finally:
        data.raw.unpersist()


def _audit(spark: SparkSession, data: source.Traces, counts: dict[str, int], traces: str,
           out: str | None) -> dict[str, Any]:
    if counts["pub"] + counts["recv"] == 0:
        if counts.get("max_version", 0) > SCHEMA_VERSION:
            raise TraceError(f"traces in {traces} are schema version {counts['max_version']}; "
                             f"this audit reads version {SCHEMA_VERSION}")
        raise TraceError(f"no trace records (pub/recv) found in {traces}")
    subs = metrics.subscriptions(data.sub, data.unsub)
    exp = metrics.expected(data.pub, subs)
    d = metrics.deliveries(data.pub, exp, metrics.first_copies(data.recv))
    d = d.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return {**_summarize(data, counts, d, out), "master": spark.sparkContext.master}
    finally:
        d.unpersist()


def _summarize(data: source.Traces, counts: dict[str, int],
               d: DataFrame, out: str | None) -> dict[str, Any]:
    span = d.agg(F.min("t_pub").alias("t0"),
                 F.max(F.greatest("t_pub", "t_recv")).alias("t1")).first()
    t0 = int(span["t0"] or 0)
    width = metrics.bucket_width_ns(int(span["t1"] or t0) - t0)
    lost_rows = metrics.lost(d)
    ranges = metrics.lost_ranges(lost_rows).persist(StorageLevel.MEMORY_AND_DISK)
    small = {  # aggregates: bounded by subscribers, node pairs and time buckets
        "per_subscriber": (metrics.per_subscriber(d), ["run", "sub", "qos"]),
        "violations": (metrics.violations(d), ["run", "sub", "pub", "topic"]),
        "latency_pairs": (metrics.latency_by_pair(d), ["origin", "dest"]),
        "latency_timeline": (metrics.latency_timeline(d, t0, width),
                             ["origin", "dest", "bucket_s"]),
        "timeline": (metrics.timeline(data.pub, d, t0, width), ["bucket_s"]),
        "cross_node_bytes": (metrics.cross_node_bytes(d), ["origin", "dest"]),
    }
    times = None
    if counts.get("hop"):  # sidecar hop records: where losses happened, delay per hop
        times = metrics.hop_times(data.hop).persist(StorageLevel.MEMORY_AND_DISK)
        located = metrics.lost_at(lost_rows, times)
        small["lost_at"] = (metrics.lost_by_hop(located), ["origin", "dest", "lost_at"])
        small["hop_latency"] = (metrics.hop_latency(d, times), ["origin", "dest", "stage"])
    rows: dict[str, list[dict[str, Any]]] = {}
    cached = []
    try:
        for name, (df, order) in small.items():
            df = df.coalesce(1).persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(df)
            if out:
                df.write.mode("overwrite").parquet(f"{out.rstrip('/')}/parquet/{name}")
            rows[name] = _rows(df, order, SAMPLE if name == "violations" else None)
        if out and times is not None:
            located.write.mode("overwrite").parquet(f"{out.rstrip('/')}/parquet/lost")
        elif out:
            lost_rows.write.mode("overwrite").parquet(f"{out.rstrip('/')}/parquet/lost")
            ranges.write.mode("overwrite").parquet(f"{out.rstrip('/')}/parquet/lost_ranges")
        sample = _rows(ranges, ["run", "sub", "pub", "first_seq"], SAMPLE)
    finally:
        for df in [*cached, ranges, *([times] if times is not None else [])]:
            df.unpersist()
    subscribers = rows["per_subscriber"]
    latency = [{k: v for k, v in r.items() if k != "cdf"} for r in rows["latency_pairs"]]
    summary: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "records": counts,
        "subscribers": subscribers,
        "lost": sum(r["lost"] for r in subscribers),
        "lost_ranges": sample,
        "violations": rows["violations"],
        "latency": latency,
        "cross_node": rows["cross_node_bytes"],
        "bucket_s": width / 1e9,
        "lost_at": rows.get("lost_at", []),
        "hop_latency": rows.get("hop_latency", []),
        "failures": verdict.failures(subscribers),
        "warnings": verdict.warnings(subscribers, counts),
    }
    summary["ok"] = not summary["failures"]
    if out:
        summary["out"] = out
        _write_report(summary, rows["timeline"], rows["latency_timeline"],
                      rows["latency_pairs"], out)
    return summary


def _write_report(summary: dict[str, Any], timeline: list[dict[str, Any]],
                  lat_time: list[dict[str, Any]], cdf: list[dict[str, Any]], out: str) -> None:
    """The Markdown report and its charts (the driver writes them to a local folder)."""
    from pipeline import charts, report  # matplotlib only when a report is written

    folder = Path(out.removeprefix("file://"))
    if "://" in str(folder):  # a cluster file system: the report stays local
        folder = Path("mqfed-audit-report")
    folder.mkdir(parents=True, exist_ok=True)
    pngs = charts.draw(folder, timeline, lat_time, cdf)
    (folder / "report.md").write_text(report.markdown(summary, timeline, pngs))
    summary["report"] = str(folder / "report.md")
