"""A running local cluster as a fault drill sees it (adapter): its nodes and addresses, their
status files, the `mqfed` cluster commands, the fault-injection files, convergence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sidecar.devcluster import launcher
from sidecar.devcluster.netns import NetnsControl
from sidecar.devcluster.state import ClusterState


class ChaosCluster:
    """The cluster recorded in `run_dir` (`mqfed up`)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir.resolve()
        self.refresh()

    def refresh(self) -> ClusterState:
        self.state = launcher.status(self.run_dir)  # ClusterError if there is none
        return self.state

    @property
    def nodes(self) -> list[str]:
        return [n.id for n in sorted(self.state.nodes.values(), key=lambda n: n.index)]

    @property
    def netns(self) -> NetnsControl | None:
        """Packet rules between the nodes of a `mqfed up --netns` cluster, else None."""
        topo = self.state.netns
        if topo is None:
            return None
        return NetnsControl(topo, {n.id: n.index for n in self.state.nodes.values()},
                            self.state.layout.etcd_client_port)

    def host(self, node: str) -> str:
        return self.state.node_host(node)

    def mqtt(self, node: str) -> tuple[str, int]:
        return self.host(node), self.state.nodes[node].ports.mqtt

    def grpc(self, node: str) -> tuple[str, int]:
        return self.host(node), self.state.nodes[node].ports.grpc

    def node_dir(self, node: str) -> Path:
        return self.state.layout.node_dir(node)

    def status(self, node: str) -> dict[str, Any]:
        """The node's state.json ({} while there is none)."""
        try:
            return json.loads((self.node_dir(node) / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    # ---- the cluster commands (as a user would run them) ---------------------------------
    def mqfed(self, *args: str, env: dict[str, str] | None = None,
              timeout: float = 120.0) -> None:
        """Run `mqfed ARGS --run-dir RUN_DIR`; raise with its output if it fails."""
        argv = [sys.executable, "-m", "sidecar.cli", args[0], "--run-dir", str(self.run_dir),
                *args[1:]]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, **(env or {})})
        if result.returncode != 0:
            raise RuntimeError(f"mqfed {' '.join(args)} failed: {result.stderr.strip()}")
        self.refresh()

    def pids(self, node: str) -> list[int]:
        """The node's sidecar and Mosquitto PIDs (those running)."""
        self.refresh()
        rec = self.state.nodes[node]
        return [r.pid for r in (rec.sidecar, rec.mosquitto) if r is not None]

    def etcd_pid(self) -> int | None:
        self.refresh()
        return self.state.etcd.pid if self.state.etcd else None

    def restart_sidecar(self, node: str, env: dict[str, str] | None = None) -> None:
        """Kill the node's sidecar (its Mosquitto stays) and start it with `env`."""
        self.mqfed("stop-node", node, "--sidecar-only")
        self.mqfed("start-node", node, env=env)

    # ---- fault-injection files (read by each sidecar every 0.2 s) ------------------------
    def block(self, node: str, peers: list[str]) -> None:
        path = self.node_dir(node) / "blocked-peers"
        if peers:
            path.write_text("\n".join(peers) + "\n")
        else:
            path.unlink(missing_ok=True)

    def hop_records(self, folder: Path | None) -> None:
        """Every node writes hop records into `folder` (None: stop)."""
        for node in self.nodes:
            path = self.node_dir(node) / "trace-hops"
            if folder is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(f"{folder}\n")

    # ---- health and convergence ----------------------------------------------------------
    def unmeshed(self) -> list[str]:
        """Node pairs whose stream is not up (from each node's state.json)."""
        out = []
        for node in self.nodes:
            peers = (self.status(node).get("routing") or {}).get("peers", {})
            for other in self.nodes:
                state = peers.get(other, {}).get("outbound", {}).get("state")
                if other != node and state != "up":
                    out.append(f"{node}->{other} {state or 'unknown'}")
        return out

    def wait_meshed(self, timeout: float = 60.0) -> float | None:
        """Seconds until every stream is up (None: not within `timeout`)."""
        start = time.monotonic()
        while self.unmeshed():
            if time.monotonic() - start > timeout:
                return None
            time.sleep(0.1)
        return time.monotonic() - start

    def divergence(self) -> list[str]:
        """What the nodes disagree on: interest a peer holds vs what its owner has, retained
        digests. Empty when converged."""
        out = []
        status = {n: self.status(n) for n in self.nodes}
        for node, st in status.items():
            interest = (st.get("routing") or {}).get("interest") or {}
            for peer, info in (interest.get("peers") or {}).items():
                have = ((status.get(peer, {}).get("routing") or {}).get("interest")
                        or {}).get("keys")
                if have is not None and info.get("keys_held") != have:
                    out.append(f"{node} holds {info.get('keys_held')} interest keys of "
                               f"{peer}, which has {have}")
        digests = {n: ((st.get("routing") or {}).get("retained") or {}).get("digest")
                   for n, st in status.items()}
        if len({json.dumps(d, sort_keys=True) for d in digests.values()}) > 1:
            out.append("retained indexes differ: " + ", ".join(
                f"{n} {((status[n].get('routing') or {}).get('retained') or {}).get('entries')}"
                " entries" for n in digests))
        return out

    def wait_converged(self, timeout: float = 30.0) -> tuple[bool, list[str]]:
        deadline = time.monotonic() + timeout
        while True:
            diff = self.divergence()
            if not diff or time.monotonic() > deadline:
                return not diff, diff
            time.sleep(0.5)
