"""The benchmark's own 2-node mqfed cluster, started with `mqfed up` and stopped with
`mqfed down` (both as subprocesses, so the cluster is exactly what a user runs)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

MQFED = [sys.executable, "-m", "sidecar.cli"]
ROUTING_COUNTERS = ("forwarded", "received", "reinjected", "duplicates", "qos0_dropped",
                    "queue_refused", "unroutable", "pending_local_acks")


class BenchCluster:
    """`mqfed up --nodes N --detach` in `run_dir` (N = 2 unless told); `down()` stops it by
    recorded PIDs."""

    def __init__(self, run_dir: Path, base_port: int, timeout: float = 60.0,
                 nodes: int = 2) -> None:
        self.run_dir = run_dir
        self.base_port = base_port
        self.timeout = timeout
        self.nodes = nodes
        self.info: dict[str, Any] = {}

    def up(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o755)  # Mosquitto's own user must reach the node folders
        argv = [*MQFED, "up", "--nodes", str(self.nodes), "--detach", "--json", "--base-port",
                str(self.base_port), "--run-dir", str(self.run_dir)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except BaseException:  # Ctrl-C or timeout: `mqfed up` stops what it started
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"mqfed up failed (exit {proc.returncode}): {err.strip()}")
        self.info = json.loads(out)

    def down(self) -> str:
        """Stop the cluster (if one was recorded); returns `mqfed down`'s complaint, if any."""
        if not (self.run_dir / "cluster.json").exists():
            return ""
        proc = subprocess.run([*MQFED, "down", "--run-dir", str(self.run_dir)],
                              capture_output=True, text=True, timeout=120)
        return proc.stderr.strip() if proc.returncode else ""

    def add_node(self) -> dict[str, Any]:
        """`mqfed add-node`: the new node's entry (it is also added to `info`)."""
        proc = subprocess.run([*MQFED, "add-node", "--json", "--run-dir", str(self.run_dir)],
                              capture_output=True, text=True, timeout=self.timeout + 30)
        if proc.returncode != 0:
            raise RuntimeError(f"mqfed add-node failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()}")
        entry = json.loads(proc.stdout)
        self.info.setdefault("nodes", []).append(entry)
        return entry

    def state(self, ident: str) -> dict[str, Any]:
        """The node's state.json ({} while unreadable)."""
        try:
            return json.loads((self.run_dir / "nodes" / ident / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def node(self, ident: str) -> dict[str, Any]:
        return next(n for n in self.info["nodes"] if n["id"] == ident)

    def port(self, ident: str) -> int:
        return int(self.node(ident)["mqtt"].rpartition(":")[2])

    def pids(self) -> dict[str, int]:
        """PIDs of each node's sidecar and Mosquitto, e.g. {"n1 sidecar": 123, ...}."""
        out = {}
        for node in self.info.get("nodes", []):
            out[f"{node['id']} sidecar"] = node["pid"]
            out[f"{node['id']} mosquitto"] = node["mosquitto_pid"]
        return out

    def logs(self) -> list[Path]:
        return [self.run_dir / "nodes" / n["id"] / name for n in self.info.get("nodes", [])
                for name in ("node.log", "mosquitto.log")]

    def routing(self, ident: str) -> dict[str, int]:
        """The node's routing counters from its state.json (written every 0.5 s), plus the
        gRPC frames it wrote on its outbound (messages) and inbound (acks) streams and its
        inject batches (`inject_batches`, `inject_waits`: times a batch waited for room in a
        subscriber's queue, `inject_lifted`, `inject_wakes`: idle Mosquittos woken for a reply)."""
        try:
            state = json.loads((self.run_dir / "nodes" / ident / "state.json").read_text())
        except (OSError, ValueError):
            return {}
        routing = state.get("routing") or {}
        out = {k: routing[k] for k in ROUTING_COUNTERS if k in routing}
        for peer in (routing.get("peers") or {}).values():  # gRPC frames this node wrote
            for side in ("outbound", "inbound"):
                key = f"frames_out_{side}"
                out[key] = out.get(key, 0) + (peer.get(side) or {}).get("frames_out", 0)
        inject = routing.get("inject") or {}   # batches (routing.inject_batches) and their waits
        for k in ("batches", "waits", "lifted", "wakes"):
            if isinstance(inject.get(k), int):
                out[f"inject_{k}"] = inject[k]
        return out
