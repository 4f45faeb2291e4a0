"""The sidecar's modules import each other without a cycle (TYPE_CHECKING imports count too):
data flows one way, from plugin events through cores to adapters."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sidecar"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "_proto" not in p.parts}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The sidecar modules `name` imports (a name imported from a package counts as its
    submodule when one exists by that name)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_the_sidecar():
    mods = modules()
    known = set(mods)
    graph = {name: imports_of(name, path, known) for name, path in mods.items()}
    # a package's __init__ importing its own submodules is how packages re-export; the
    # submodules importing the package back would be the cycle, and that is still reported
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


CORES = {
    "sidecar.routing.table", "sidecar.routing.interest", "sidecar.routing.forwarder",
    "sidecar.retained.entry", "sidecar.retained.index", "sidecar.retained.replicator",
    "sidecar.retained.antientropy", "sidecar.local.reinjection", "sidecar.local.midgaps",
    "sidecar.local.pressure", "sidecar.local.mqtt_codec", "sidecar.local.event_stream",
    "sidecar.peering.dedup", "sidecar.peering.outbound", "sidecar.peering.handshake",
    "sidecar.routing.shared", "sidecar.routing.pacing", "sidecar.routing.receiver",
    "sidecar.membership.routed", "sidecar.routing.acks", "sidecar.routing.local_interest",
    "sidecar.routing.lag", "sidecar.routing.catchup", "sidecar.observability.latency",
    "sidecar.hlc", "sidecar.topics", "sidecar.message", "sidecar.challenge",
    "sidecar.sessions.record", "sidecar.sessions.registry", "sidecar.sessions.claims",
    "sidecar.rendezvous",
    "sidecar.wills.record", "sidecar.wills.table", "sidecar.wills.liveness",
    "sidecar.drain.progress", "sidecar.peering.capabilities",
    "sidecar.journal.record", "sidecar.journal.confirmations",
    "sidecar.routing.records", "sidecar.local.batch",
}
"""Sans-IO cores: fed events, returning actions; no sockets, threads, files or sleeping."""
VOCABULARY = {"sidecar.local.events", "sidecar.local.protocol", "sidecar.membership.view"}
"""Plain values the cores take as input (the plugin's decoded events)."""
IO = {"asyncio", "socket", "grpc", "paho", "sqlite3", "aetcd", "subprocess", "threading",
      "time", "os", "logging"}


def test_cores_import_only_cores_and_no_io():
    mods = modules()
    known = set(mods)
    problems = []
    for name in sorted(CORES):
        tree = ast.parse(mods[name].read_text())
        top = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names}
        top |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and not n.level}
        problems += [f"{name} imports {m}" for m in sorted(top & IO)]
        problems += [f"{name} imports the adapter {m}"
                     for m in sorted(imports_of(name, mods[name], known) - CORES - VOCABULARY)]
    assert not problems, "\n".join(problems)
