"""Fixtures that run real `mqfed node` processes (Mosquitto + plugin + sidecar)."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.config import render_toml
from sidecar.node.layout import NodeLayout
from sidecar.procinfo import pid_alive, runs
from tests.harness.procs import ManagedProcess, ProcessGroup, free_port, wait_for

REPO = Path(__file__).resolve().parents[3]
PLUGIN = REPO / "deploy" / "mosquitto-plugin" / "build" / "mqfed_plugin.so"


@dataclass
class RunningNode:
    proc: ManagedProcess
    config_path: Path
    run_dir: Path
    port: int

    def state(self) -> dict:
        try:
            return json.loads((self.run_dir / "state.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait(self, predicate, what: str, timeout: float = 10.0) -> dict:
        wait_for(lambda: self.proc.alive() and predicate(self.state()), timeout, what)
        return self.state()

    def interest(self) -> set[tuple]:
        return {(group, filt) for group, filt, _ in self.state().get("interest", [])}


def node_config(tmp_path: Path, node_id: str = "n1", **sections) -> dict:
    values = {
        "node": {"id": node_id, "run_dir": str(tmp_path / node_id)},
        "mqtt": {"listen": f"127.0.0.1:{free_port()}", "link_timeout": 5.0},
        "grpc": {"listen": f"127.0.0.1:{free_port()}"},
        "admin": {"listen": f"127.0.0.1:{free_port()}", "metrics": f"127.0.0.1:{free_port()}"},
        "log": {"level": "info"},
        "membership": {"mode": "static"},  # a single node: no etcd needed
    }
    for section, body in sections.items():
        values.setdefault(section, {}).update(body)
    return values


def pair_static(values: dict[str, dict]) -> None:
    """Make the nodes of `values` (node id -> config values) static peers of one another,
    each dialling the others' advertised (else listen) gRPC address."""
    for node, body in values.items():
        body["membership"] = {"mode": "static", "peers": [
            f"{other}@{v['grpc'].get('advertise') or v['grpc']['listen']}"
            for other, v in values.items() if other != node]}


class NodeStarter:
    """Starts nodes for one test; at the end stops every sidecar and Mosquitto by PID."""

    def __init__(self, procs: ProcessGroup, tmp_path: Path) -> None:
        self.procs = procs
        self.tmp_path = tmp_path
        self.run_dirs: list[Path] = []

    def start(self, values: dict, name: str | None = None, wait_ready: bool = True) -> RunningNode:
        assert PLUGIN.exists(), f"plugin not built at {PLUGIN}: run `make install`"
        node_id = values["node"]["id"]
        config_path = self.tmp_path / f"{node_id}.toml"
        config_path.write_text(render_toml(values))
        run_dir = Path(values["node"]["run_dir"])
        self.run_dirs.append(run_dir)
        proc = self.procs.start(name or node_id, [sys.executable, "-m", "sidecar.cli", "node",
                                                  "--config", str(config_path)], cwd=REPO)
        port = int(values["mqtt"]["listen"].rpartition(":")[2])
        node = RunningNode(proc, config_path, run_dir, port)
        if wait_ready:
            node.wait(lambda s: s.get("ready"), f"node {node_id} ready", timeout=20)
        return node

    def cleanup(self) -> None:
        for run_dir in self.run_dirs:
            try:
                pid = int((run_dir / "mosquitto.pid").read_text())
            except (OSError, ValueError):
                pid = 0
            if runs(pid, "mosquitto", str(run_dir)):
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda p=pid: not pid_alive(p), 5, f"mosquitto {pid} killed")
            NodeLayout(run_dir).remove_fallback_socket_dir()


@pytest.fixture
def nodes(procs, tmp_path):
    starter = NodeStarter(procs, tmp_path)
    try:
        yield starter
    finally:
        procs.stop_all()
        starter.cleanup()
