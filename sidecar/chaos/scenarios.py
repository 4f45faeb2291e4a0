"""The fault scenarios of `mqfed chaos` and their verdicts (pure: names, promises, plans).

Every scenario runs `mqfed load` (QoS 1, publishers on every node) with a fault in the middle
of it and then checks, with `mqfed audit` (or the load generator's own counts), that no
message at QoS >= 1 was lost, and that the nodes converged again (routes, retained messages).
Duplicates and reordering are allowed under faults (counted and shown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """One fault: what is done, what it promises, and how the load is laid out around it."""

    name: str
    fault: str  # what is done to the cluster
    promise: str  # what must hold
    spare_target_subscriber: bool = False  # the target's own subscriber is left out (it dies)
    persistent: bool = False  # subscribers keep a session and connect through the front
    needs_netns: bool = False  # real network rules: only on a cluster from `mqfed up --netns`
    fault_seconds: float | None = None  # how long the fault lasts (None: S / 3)
    min_nodes: int = 2


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("kill-node", "kill -9 of the target node's sidecar and Mosquitto, then "
             "`mqfed start-node`", "0 lost at QoS >= 1 of what the target's publishers were "
             "acknowledged (replayed from its journal); subscribers elsewhere",
             spare_target_subscriber=True),
    Scenario("kill-sidecar", "kill -9 of the target node's sidecar (its Mosquitto and clients "
             "stay), then `mqfed start-node`", "0 lost at QoS >= 1"),
    Scenario("stop-node", "SIGSTOP of the target node's sidecar and Mosquitto, SIGCONT after "
             "the fault time (default 20 s)", "0 lost at QoS >= 1", fault_seconds=20.0),
    Scenario("partition", "the first k nodes cut off from the others (both directions), "
             "healed after the fault time", "0 lost at QoS >= 1: each side serves its clients, "
             "the other side's messages wait in queues and drain after healing", min_nodes=2),
    Scenario("one-way", "the target's streams TO the next node cut (packets dropped), the "
             "other direction working, healed after the fault time", "0 lost at QoS >= 1",
             needs_netns=True),
    Scenario("isolate-etcd", "etcd unreachable for every node (frozen, or with --netns its "
             "traffic dropped), back after the fault time", "0 lost at QoS >= 1: etcd is not "
             "on the message path"),
    Scenario("slow-link", "every peer stream into the next node delayed 100 ms +- 20 ms "
             "(a delaying proxy it advertises)", "0 lost at QoS >= 1; the hop latency shows "
             "the delay"),
    Scenario("lossy-link", "5 % of the packets between the target and the next node dropped "
             "(both directions)", "0 lost at QoS >= 1 (TCP resends; latency grows)",
             needs_netns=True),
    Scenario("rolling-restart", "each node in turn stopped gracefully and started again "
             "(`mqfed stop-node` / `start-node`); subscribers with sessions, through the "
             "front", "0 lost at QoS >= 1 for subscribers with sessions (a drained client "
             "resumes its session on another node)", persistent=True),
    Scenario("clock-skew", "the next node's sidecar clock 2.5 s ahead (half the HLC "
             "tolerance of 5 s)", "0 lost at QoS >= 1; routes and retained messages converge"),
)}
ALL = tuple(SCENARIOS)
"""`mqfed chaos all` runs them in this order."""


@dataclass(frozen=True)
class Layout:
    """Who publishes and subscribes where, who the fault hits."""

    target: str
    other: str  # the node a link fault pairs with the target
    group: tuple[str, ...]  # partition: the side cut off (the first k nodes)
    publish_on: tuple[str, ...]
    subscribe_on: tuple[str, ...]


def layout(scenario: Scenario, nodes: Sequence[str], k: int = 1) -> Layout:
    """Publishers on every node; subscribers on every node but a dying target's."""
    if len(nodes) < scenario.min_nodes:
        raise ValueError(f"{scenario.name} needs at least {scenario.min_nodes} nodes, the "
                         f"cluster has {len(nodes)}")
    if not 1 <= k < len(nodes):
        raise ValueError(f"--k must be between 1 and {len(nodes) - 1}")
    target, other = nodes[0], nodes[1]
    subs = tuple(n for n in nodes if not (scenario.spare_target_subscriber and n == target))
    return Layout(target, other, tuple(nodes[:k]), tuple(nodes), subs)


def fault_seconds(scenario: Scenario, seconds: float, override: float | None) -> float:
    if override is not None:
        return override
    return scenario.fault_seconds if scenario.fault_seconds is not None else seconds / 3


def verdict(result: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """PASS when nothing at QoS >= 1 was lost, the load ran clean and the nodes converged;
    with the reasons it failed."""
    why = []
    if result.get("error"):
        why.append(str(result["error"]))
    if result.get("lost"):
        why.append(f"{result['lost']} messages lost at QoS >= 1")
    why += [f"publisher: {e}" for e in result.get("publisher_errors", [])]
    if result.get("converged") is False:
        why.append(f"not converged: {result.get('divergence')}")
    return not why, why


COLUMNS = ("scenario", "published", "lost", "duplicates", "out_of_order", "p99_ms",
           "fault_s", "heal_s", "converged", "verdict")


def table(results: Sequence[Mapping[str, Any]]) -> str:
    """The results as a fixed-width table."""
    rows = [[_cell(r.get(c)) for c in COLUMNS] for r in results]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)
