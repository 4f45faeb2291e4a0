"""PNG charts from aggregated rows (adapter: writes files with matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Rows = Sequence[Mapping[str, Any]]


def draw(folder: Path, timeline: Rows, lat_time: Rows, cdf: Rows) -> dict[str, str]:
    """Writes the charts; returns {title: file name}."""
    out = {}
    if cdf:
        out["Latency CDF per node pair"] = _cdf(folder / "latency_cdf.png", cdf)
    if timeline:
        out["Throughput and loss over time"] = _timeline(folder / "timeline.png", timeline)
    if lat_time:
        out["Latency over time per node pair"] = _lat_time(folder / "latency_time.png",
                                                           lat_time)
    return out


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def _cdf(path: Path, rows: Rows) -> str:
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        values = r["cdf"] or []
        ys = [i / (len(values) - 1) for i in range(len(values))] if len(values) > 1 else [1]
        ax.plot(values, ys, label=f"{r['origin']} → {r['dest']}")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of messages")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


def _timeline(path: Path, rows: Rows) -> str:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    xs = [r["bucket_s"] for r in rows]
    top.plot(xs, [r["delivered_per_s"] for r in rows], label="delivered / s")
    top.set_ylabel("deliveries per second")
    top.grid(True, alpha=0.3)
    bottom.bar(xs, [r["lost"] for r in rows], width=(xs[1] - xs[0]) if len(xs) > 1 else 1,
               color="tab:red", label="lost")
    bottom.set_ylabel("lost (by publish time)")
    bottom.set_xlabel("seconds since the first publish")
    bottom.grid(True, alpha=0.3)
    return _save(fig, path)


def _lat_time(path: Path, rows: Rows) -> str:
    fig, ax = plt.subplots(figsize=(8, 5))
    pairs: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        pairs.setdefault((r["origin"], r["dest"]), []).append(r)
    for (origin, dest), rs in sorted(pairs.items()):
        ax.plot([r["bucket_s"] for r in rs], [r["p99_ms"] for r in rs],
                label=f"{origin} → {dest} p99")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("seconds since the first publish")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)
