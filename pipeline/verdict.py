"""The audit's verdict from aggregated figures (pure Python over small collected rows)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def failures(per_subscriber: Iterable[Mapping[str, Any]]) -> list[str]:
    """What fails the audit: any loss or ordering violation at QoS >= 1."""
    out = []
    for r in per_subscriber:
        if (r["qos"] or 0) < 1:
            continue
        where = f"{r['sub']} on {r['node']} (run {r['run']}, QoS {r['qos']})"
        if r["lost"]:
            out.append(f"{where}: {r['lost']} of {r['expected']} messages lost")
        if r["out_of_order"]:
            out.append(f"{where}: {r['out_of_order']} messages out of order")
    return out


def warnings(per_subscriber: Iterable[Mapping[str, Any]], counts: Mapping[str, int]) -> list[str]:
    """Worth a look, but allowed: QoS 0 loss and reordering, duplicates, unexpected copies,
    records that were skipped."""
    out = []
    for r in per_subscriber:
        where = f"{r['sub']} on {r['node']} (run {r['run']}, QoS {r['qos']})"
        if (r["qos"] or 0) < 1 and r["lost"]:
            out.append(f"{where}: {r['lost']} of {r['expected']} messages lost (QoS 0)")
        if (r["qos"] or 0) < 1 and r["out_of_order"]:
            out.append(f"{where}: {r['out_of_order']} messages out of order (QoS 0)")
        if r["duplicates"]:
            out.append(f"{where}: {r['duplicates']} duplicate copies")
        if r["unexpected"]:
            out.append(f"{where}: {r['unexpected']} messages received but not expected")
    for key, text in (("unparsable", "unparsable lines"),
                      ("other_version", "records of another schema version"),
                      ("unknown_kind", "records of an unknown kind")):
        if counts.get(key):
            out.append(f"{counts[key]} {text} skipped")
    return out


def exit_code(summary: Mapping[str, Any]) -> int:
    """0 when the audit passed, 1 when it found loss or reordering at QoS >= 1."""
    return 0 if summary["ok"] else 1
