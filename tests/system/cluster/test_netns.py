"""`mqfed up --netns` (root): each node in its own network namespace on a bridge; real packet
faults between them (`mqfed chaos` partition, one-way, lossy-link); `mqfed down` removes every
namespace, veth pair and the bridge (issue 21)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sidecar.chaos.runner import ChaosOptions, run
from sidecar.devcluster import netns
from tests.harness.procs import wait_for
from tests.system.cluster.conftest import base_port, connect, mqfed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def _in_namespace(pid: int) -> str:
    """The network namespace `pid` lives in (its inode, as /proc shows it)."""
    return os.readlink(f"/proc/{pid}/ns/net")


def test_namespaced_cluster_with_real_partitions_then_nothing_left(run_dir: Path,
                                                                   needs_nodes: None) -> None:
    topo = netns.Topology.for_run_dir(run_dir)
    try:
        result = mqfed("up", "--nodes", "3", "--detach", "--json", "--netns", "--base-port",
                       str(base_port(3)), "--run-dir", str(run_dir), timeout=180)
        assert result.returncode == 0, result.stderr
        info = json.loads(result.stdout)
        topo = netns.Topology.from_json(json.loads((run_dir / "cluster.json").read_text())
                                        ["netns"])
        hosts = {n["id"]: n["mqtt"].rpartition(":")[0] for n in info["nodes"]}
        assert hosts == {f"n{i}": topo.ip(i) for i in (1, 2, 3)}
        spaces = {_in_namespace(n["pid"]) for n in info["nodes"]}
        assert len(spaces) == 3 and _in_namespace(os.getpid()) not in spaces
        for node in info["nodes"]:  # its Mosquitto runs in its namespace too
            assert _in_namespace(node["mosquitto_pid"]) == _in_namespace(node["pid"])

        def meshed() -> bool:
            for n in ("n1", "n2", "n3"):
                st = json.loads((run_dir / "nodes" / n / "state.json").read_text())
                peers = st["routing"]["peers"]
                if any(peers.get(o, {}).get("outbound", {}).get("state") != "up"
                       for o in ("n1", "n2", "n3") if o != n):
                    return False
            return True
        wait_for(meshed, 30, "every stream up across the namespaces")

        front = connect(int(info["front"].rpartition(":")[2]))  # the front on loopback
        front.subscribe("ns/#")
        front.publish("ns/hello", b"through the bridge")
        wait_for(lambda: front.received("ns/hello", b"through the bridge"), 10, "a round trip")
        front.close()

        opts = ChaosOptions(run_dir=run_dir, seconds=8, rate=300, checker="load",
                            fault_seconds=3)
        for name in ("partition", "one-way", "lossy-link", "isolate-etcd"):
            row = run(name, opts, print)
            assert row["verdict"] == "PASS", row
            assert row["lost"] == 0 and row["converged"] is True
        rules = subprocess.run([*topo.exec_prefix(1), "iptables", "-S"], capture_output=True,
                               text=True, timeout=30).stdout
        assert "DROP" not in rules, "every fault rule was removed"

        result = mqfed("down", "--run-dir", str(run_dir), timeout=120)
        assert result.returncode == 0, result.stderr
        assert netns.leftovers(topo) == []
    finally:
        mqfed("down", "--run-dir", str(run_dir), timeout=120)
        netns.destroy(topo, range(1, 4))  # also after a failure
    assert netns.leftovers(topo) == []
