"""The hot path's targets (issue 25), checked from one run's cases side by side (pure).

Case a is one mqfed node, b the cross-node hop, c two Mosquittos with a bridge. A target is
met or missed in this run only: the machine's other load moves every figure, so the report
says what each side measured, and `docs/performance.md` keeps every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FULL_SPEED_MESSAGES = 50_000
"""The full-speed targets count only for a run of at least this many messages."""


@dataclass(frozen=True)
class Check:
    """One target: what was measured, against what, and whether it holds."""

    name: str
    measured: float
    bound: float
    met: bool
    unit: str = ""


def broker_cpu_us(case: dict[str, Any]) -> float | None:
    """CPU of the brokers and sidecars (not the load generator, not other processes) per
    message received, in µs: sum of % of a core × 10^4 / msgs per second."""
    if not case.get("throughput"):
        return None
    pct = sum(v for k, v in case["cpu_percent"].items()
              if k.endswith((" sidecar", " mosquitto")) or k.startswith("bridge "))
    return round(pct * 1e4 / case["throughput"], 1)


def checks(options: dict[str, Any], cases: list[dict[str, Any]]) -> list[Check]:
    """The targets this run can speak to: at a set rate the hop's latency and CPU against the
    bridge's; flat out the throughput ratios, with nothing lost and no shedding."""
    by = {c["case"]: c for c in cases}
    if not {"a", "b", "c"} <= set(by):
        return []
    a, b, c = by["a"], by["b"], by["c"]
    out: list[Check] = []
    if options.get("rate"):
        for pct in ("p50", "p99"):
            hop = b[f"{pct}_ms"] - a[f"{pct}_ms"]
            bridge = max(c[f"{pct}_ms"] - a[f"{pct}_ms"], 0.0)
            out.append(Check(f"hop {pct} <= 2x the bridge's", round(hop, 3),
                             round(2 * bridge, 3), hop <= 2 * bridge, " ms"))
        ours, theirs = broker_cpu_us(b), broker_cpu_us(c)
        if ours is not None and theirs is not None:
            out.append(Check("CPU per message <= 2x the bridge's", ours, round(2 * theirs, 1),
                             ours <= 2 * theirs, " us"))
        return out
    if not (a["throughput"] and c["throughput"]):
        return out
    out.append(Check("throughput b/c >= 0.95", round(b["throughput"] / c["throughput"], 3),
                     0.95, b["throughput"] >= 0.95 * c["throughput"]))
    out.append(Check("throughput b/a >= 0.9", round(b["throughput"] / a["throughput"], 3),
                     0.9, b["throughput"] >= 0.9 * a["throughput"]))
    out.append(Check("b: lost + overload sheddings == 0",
                     b["lost"] + b.get("publisher_disconnects", 0), 0,
                     not b["lost"] and not b.get("publisher_disconnects")))
    messages = options.get("messages") or 0
    out.append(Check("messages per case >= 50,000", messages, FULL_SPEED_MESSAGES,
                     messages >= FULL_SPEED_MESSAGES))
    return out


def render(checks_: list[Check]) -> list[str]:
    """Report lines, one per target."""
    if not checks_:
        return []
    lines = ["", "issue 25 targets (this run only):"]
    for ch in checks_:
        lines.append(f"  {'met   ' if ch.met else 'MISSED'}  {ch.name}: "
                     f"{ch.measured:g}{ch.unit} (bound {ch.bound:g}{ch.unit})")
    return lines
