"""The human-readable report of a benchmark run (pure)."""

from __future__ import annotations

from typing import Any

from sidecar.bench.targets import Check
from sidecar.bench.targets import render as render_targets

COLUMNS = (("sent", 7, "d"), ("unique", 7, "d"), ("lost", 6, "d"), ("duplicates", 5, "d"),
           ("out_of_order", 5, "d"), ("throughput", 9, ".0f"), ("p50_ms", 8, ".3f"),
           ("p99_ms", 8, ".3f"), ("max_ms", 8, ".3f"))
HEADS = ("sent", "recv", "lost", "dup", "ooo", "msgs/s", "p50 ms", "p99 ms", "max ms")


def describe(options: dict[str, Any]) -> str:
    amount = (f"{options['messages']} messages" if options.get("messages")
              else f"{options['seconds']:g} s")
    rate = f"{options['rate']:g} msgs/s" if options["rate"] else "flat out"
    return (f"{amount}, {rate}, QoS {options['qos']}, {options['size']} B payload, "
            f"{options['publishers']} publisher(s), window {options['window']}")


def render(report: dict[str, Any]) -> str:
    """Figures per case, the comparisons, CPU use per process and any log warnings."""
    lines = [f"mqfed bench: {describe(report['options'])}", ""]
    head = f"{'case':<34}" + "".join(f"{h:>{w + 1}}" for h, (_, w, _) in zip(HEADS, COLUMNS,
                                                                              strict=True))
    lines.append(head)
    for case in report["cases"]:
        row = f"{case['case']}  {case['title']:<31}"
        row += "".join(f" {case[k]:>{w}{fmt}}" for k, w, fmt in COLUMNS)
        lines.append(row)
    qos = report["options"]["qos"]
    for case in report["cases"]:
        if (case["lost"] and qos) or case["duplicates"] or case["out_of_order"]:
            lines.append(f"!  case {case['case']}: {case['lost']} lost at QoS {qos}, "
                         f"{case['duplicates']} duplicates, {case['out_of_order']} out of order "
                         "(see the log lines below)")
    if "ratio_b_a" in report:
        lines += ["", f"b/a throughput: {report['ratio_b_a']}"
                  + (f"   b/c: {report['ratio_b_c']}" if "ratio_b_c" in report else ""),
                  f"cross-node hop (b - a): p50 {report['hop_p50_ms']:+.3f} ms, "
                  f"p99 {report['hop_p99_ms']:+.3f} ms"]
    lines += ["", "CPU during each case (% of one core; 'others' = every other process):"]
    for case in report["cases"]:
        cpu = dict(case["cpu_percent"])
        others = cpu.pop("others", None)
        text = ", ".join(f"{name} {pct:g}" for name, pct in cpu.items())
        if others is not None:
            busiest = [f"{o['process']} {o['percent']:g}" for o in case.get("cpu_others", ())]
            text += f", others {others:g}" + (f" ({', '.join(busiest)})" if busiest else "")
        lines.append(f"  {case['case']}: {text}")
    lines += _per_message(report)
    for case in report["cases"]:
        if "routing" in case:
            for node, counters in case["routing"].items():
                text = ", ".join(f"{k} {v}" for k, v in counters.items() if v)
                lines.append(f"  {case['case']}: {node} routing: {text or 'nothing'}")
        if case.get("publisher_disconnects"):
            lines.append(f"  {case['case']}: publishers disconnected by the broker "
                         f"{case['publisher_disconnects']} times (overload shedding); each "
                         "reconnected and resent what was not acknowledged")
        for err in case["publisher_errors"]:
            lines.append(f"  {case['case']}: publisher error: {err}")
        for warning in case["log_warnings"]:
            lines.append(f"  {case['case']}: log: {warning}")
    lines += render_targets([Check(**ch) for ch in report.get("targets", ())])
    return "\n".join(lines)


def _per_message(report: dict[str, Any]) -> list[str]:
    """Brokers' and sidecars' CPU per message, and each case's share of the whole machine."""
    cpus = report.get("cpus")
    lines = []
    for case in report["cases"]:
        parts = []
        if case.get("broker_cpu_us") is not None:
            parts.append(f"brokers and sidecars {case['broker_cpu_us']:g} us of CPU per message")
        if cpus:
            cpu = case["cpu_percent"]
            ours = sum(v for k, v in cpu.items() if k not in ("publishers", "others"))
            parts.append(f"of the machine's {cpus} cores: brokers, sidecars and subscriber "
                         f"{ours / cpus:.0f} %, publishers {cpu.get('publishers', 0) / cpus:.0f}"
                         f" %, others {cpu.get('others', 0) / cpus:.0f} %")
        if parts:
            lines.append(f"  {case['case']}: " + "; ".join(parts))
    return lines
