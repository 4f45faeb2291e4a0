"""Measure how a 4th node bootstraps N retained topics (not part of the default test run).

    .venv/bin/python -m tests.system.retained.bench_bootstrap --topics 10000

Starts a 3-node cluster (`mqfed up`), publishes N retained messages on n1, waits until every
node holds them, then `mqfed add-node` and times until the new node's index equals the others'
and its Mosquitto serves all N; bytes are what the new node received on its peer streams.
Every process is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import time

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.node.mqtt import Client
from tests.system.retained.helpers import read_retained, retained_status, wait_converged
from tests.system.routing.conftest import _finish, _new_run_dir, _start


def _received(cluster, node: str) -> int:
    peers = cluster.routing(node).get("peers", {})
    return sum(p[d]["bytes_in"] for p in peers.values() for d in ("outbound", "inbound"))


def run(topics: int, payload_size: int) -> dict:
    path = _new_run_dir()
    failed = True
    try:
        cluster = _start(path, 3)
        pub = Client(cluster.ports["n1"], "bench-retained-pub")
        assert pub.wait_connected()
        payload = b"x" * payload_size
        started = time.monotonic()
        for i in range(topics):
            pub.publish(f"bench/{i // 100}/{i}", payload, qos=1, retain=True, wait=False)
            if i % 1000 == 999:
                time.sleep(0.05)
        pub.publish("bench/last", payload, qos=1, retain=True)
        digest = wait_converged(cluster, ["n1", "n2", "n3"], topics + 1, timeout=300)
        replicated = time.monotonic() - started
        t0 = time.monotonic()
        result = mqfed("add-node", "--run-dir", str(path), "--json", timeout=120)
        assert result.returncode == 0, result.stderr
        started_node = time.monotonic() - t0
        entry = json.loads(result.stdout)
        node = entry["id"]
        cluster.ports[node] = int(entry["mqtt"].rpartition(":")[2])
        assert wait_converged(cluster, ["n1", node], topics + 1, timeout=300) == digest
        converged = time.monotonic() - t0
        wait_for(lambda: len(read_retained(cluster.ports[node], "bench/#", quiet=1.0))
                 == topics + 1, 120, "the new node's Mosquitto serves every topic")
        served = time.monotonic() - t0
        status = retained_status(cluster, node)
        out = {"topics": topics + 1, "payload_bytes": payload_size,
               "replicated_to_3_nodes_s": round(replicated, 2),
               "add_node_returned_s": round(started_node, 2),
               "index_converged_s": round(converged, 2),
               "mosquitto_serves_all_s (incl. a 1 s quiet read)": round(served, 2),
               "bytes_received_by_new_node": _received(cluster, node),
               "entries_received_by_anti_entropy": status["ae_received"],
               "anti_entropy": status["anti_entropy"], "reinjected": status["reinjected"]}
        pub.close()
        failed = False
        return out
    finally:
        _finish(path, failed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes per message")
    args = parser.parse_args()
    print(json.dumps(run(args.topics, args.payload), indent=1))


if __name__ == "__main__":
    main()
