"""The highest-HLC write wins on every node, also when older writes arrive after it.

Three static nodes whose six peer streams (one per ordered pair) each pass a proxy the test
holds, so the order in which every node hears the others' writes is the test's choice."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.harness.procs import wait_for
from tests.harness.proxy import CuttableProxy
from tests.system.node.conftest import RunningNode, node_config
from tests.system.node.mqtt import Client
from tests.system.retained.helpers import read_retained

NODES = ("n1", "n2", "n3")
TOPIC = "win/t"


def _start_mesh(nodes, tmp_path: Path) -> tuple[dict[str, RunningNode],
                                                 dict[tuple[str, str], CuttableProxy]]:
    """n1..n3 as static peers; `src` dials `dst` through proxies[(src, dst)]."""
    values = {n: node_config(tmp_path, n, admin={"dev_mode": True}) for n in NODES}
    proxies = {(src, dst): CuttableProxy(int(values[dst]["grpc"]["listen"].rpartition(":")[2]))
               for src in NODES for dst in NODES if src != dst}
    for src in NODES:
        values[src]["membership"] = {"mode": "static", "peers": [
            f"{dst}@{proxies[(src, dst)].address}" for dst in NODES if dst != src]}
    running = {n: nodes.start(values[n]) for n in NODES}
    for n, node in running.items():
        node.wait(lambda s, n=n: all(s.get("routing", {}).get("peers", {}).get(o, {}).get(
            "outbound", {}).get("state") == "up" for o in NODES if o != n),
            f"{n}'s streams up", timeout=30)
    return running, proxies


def _retained(node: RunningNode) -> dict:
    return (node.state().get("routing") or {}).get("retained") or {}


def _version(node: RunningNode) -> tuple[int, str, bytes] | None:
    """(hlc, origin, payload) of TOPIC in the node's durable index."""
    db = sqlite3.connect(f"file:{node.run_dir / 'retained.sqlite'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT hlc, origin, payload FROM retained WHERE topic = ?",
                         (TOPIC,)).fetchone()
    finally:
        db.close()
    return None if row is None else (row[0], row[1], bytes(row[2]))


def _write(node: RunningNode, payload: bytes) -> tuple[int, str, bytes]:
    """A retained write on `node`, stamped there; returns its version from the index."""
    before = _retained(node).get("local_accepted", 0)
    client = Client(node.port, f"writer-{payload.decode()}")
    assert client.wait_connected()
    client.publish(TOPIC, payload, qos=1, retain=True)
    client.close()
    wait_for(lambda: _retained(node).get("local_accepted", 0) > before
             and (_version(node) or (0, "", b""))[2] == payload, 10,
             f"{payload!r} accepted on its node")
    version = _version(node)
    assert version is not None
    return version


def test_newest_write_wins_everywhere_although_older_ones_arrive_after_it(nodes, tmp_path):
    """X on n1, then Y on n2, then W on n3, each stamped later than the one before, while
    every stream is held. W reaches n1 and n2 first; X and Y come after it. Last-arrival-wins
    would leave n1 with Y and n2 with X, and W nowhere once anti-entropy settles; the rule
    is the highest HLC, so every node holds W."""
    running, proxies = _start_mesh(nodes, tmp_path)
    try:
        for proxy in proxies.values():
            proxy.cut()
        x = _write(running["n1"], b"x")
        y = _write(running["n2"], b"y")
        w = _write(running["n3"], b"w")
        assert x[0] < y[0] < w[0], f"writes stamped in order: {x}, {y}, {w}"
        for src, dst in (("n3", "n1"), ("n3", "n2")):
            proxies[(src, dst)].restore()
        wait_for(lambda: all(_retained(running[n]).get("remote_applied", 0) >= 1
                             for n in ("n1", "n2")), 10, "W applied on n1 and n2")
        for proxy in proxies.values():
            proxy.restore()
        wait_for(lambda: all(_retained(running[n]).get("remote_stale", 0)
                             + _retained(running[n]).get("remote_applied", 0) >= 2
                             for n in NODES), 10, "every node heard both other writes")
        def settled() -> bool:
            states = [_retained(running[n]) for n in NODES]
            return (all(s.get("busy_topics") == 0 for s in states)
                    and len({s.get("digest") for s in states}) == 1)

        wait_for(settled, 40, "the nodes agree")
        for n in NODES:
            assert _version(running[n]) == w, f"{n} holds {_version(running[n])}, not W {w}"
            assert read_retained(running[n].port, "win/#") == {TOPIC: b"w"}, n
        assert [_retained(running[n])["remote_stale"] for n in NODES] == [1, 1, 2], (
            "the older writes that came after W were refused")
    finally:
        for proxy in proxies.values():
            proxy.close()
