"""The human report: Markdown from the audit's summary (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str]) -> list[str]:
    if not rows:
        return ["(none)"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in cols) + " |")
    return out


def markdown(summary: Mapping[str, Any], timeline: Sequence[Mapping[str, Any]],
             charts: Mapping[str, str]) -> str:
    """The report: verdict, per-subscriber figures, losses, latency, bytes and charts."""
    rec = summary["records"]
    lines = ["# mqfed delivery audit", "",
             f"**{'PASS' if summary['ok'] else 'FAIL'}**: {summary['lost']} lost deliveries; "
             f"records: {rec['pub']} published, {rec['recv']} received, "
             f"{rec['sub']} subscriptions (schema v{summary['schema']}).", ""]
    lines += [f"- FAIL: {f}" for f in summary["failures"]]
    lines += [f"- note: {w}" for w in summary["warnings"]]
    lines += ["", "## Per subscriber and QoS", ""]
    lines += _table(summary["subscribers"], ["run", "sub", "node", "qos", "expected",
                                             "delivered", "lost", "duplicates", "out_of_order",
                                             "unexpected", "dup_flagged"])
    lines += ["", "## Lost messages (ranges of consecutive seqs)", ""]
    lines += _table(summary["lost_ranges"], ["run", "sub", "node", "origin", "pub", "topic",
                                             "qos", "first_seq", "last_seq", "count"])
    if summary.get("records", {}).get("hop"):
        lines += ["", "## Where deliveries were lost (sidecar hop records)", ""]
        lines += _table(summary.get("lost_at", []), ["origin", "dest", "lost_at", "lost"])
        lines += ["", "## Delay per hop (ms; each node's wall clock)", "",
                  "origin: publish to forwarded; link: forwarded to received; dest_sidecar: "
                  "received to re-injected; dest_broker: re-injected to the subscriber's copy.",
                  ""]
        lines += _table(summary.get("hop_latency", []), ["origin", "dest", "stage", "count",
                                                         "p50_ms", "p99_ms", "max_ms"])
    lines += ["", "## Ordering violations per (publisher, topic)", ""]
    lines += _table(summary["violations"], ["run", "sub", "node", "origin", "pub", "topic",
                                            "qos", "out_of_order"])
    lines += ["", "## End-to-end latency per node pair (ms)", ""]
    lines += _table(summary["latency"], ["origin", "dest", "count", "p50_ms", "p95_ms",
                                         "p99_ms", "max_ms"])
    lines += ["", "## Cross-node traffic", "",
              "Messages that had to reach another node (once per node) and their payload + "
              "topic bytes.", ""]
    lines += _table(summary["cross_node"], ["origin", "dest", "messages", "bytes"])
    lines += ["", f"## Over time ({summary['bucket_s']:g} s buckets, by publish time; "
              "delivered by receive time)", ""]
    lines += _table(timeline, ["bucket_s", "published", "expected", "delivered", "lost"])
    for title, name in charts.items():
        lines += ["", f"## {title}", "", f"![{title}]({name})"]
    return "\n".join(lines) + "\n"
