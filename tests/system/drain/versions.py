"""A mixed-version cluster for the upgrade tests: nodes of an earlier commit of this project
(built by the test: `git archive`, its plugin, its generated protobuf code) beside nodes of
the working tree, with etcd and an HAProxy front, all on loopback.

The earlier version's processes run with PYTHONPATH pointing at its tree (the dependencies are
the same, so no virtualenv of its own is needed). No peer token: a 1.1 node and a 1.2+ node
with a token refuse each other by design (docs/security.md, the upgrade path); admin calls in
the loopback development mode (1.1 admin calls carried the token itself).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sidecar.config import render_toml
from sidecar.devcluster import etcd, haproxy
from sidecar.devcluster.layout import Layout
from sidecar.devcluster.procs import ProcRef
from sidecar.procinfo import pid_alive, runs
from tests.harness.procs import ManagedProcess, ProcessGroup, wait_for
from tests.system.cluster.conftest import REPO, base_port
from tests.system.routing.conftest import _need_plugin

OLD_COMMIT = os.environ.get("MQFED_OLD_COMMIT", "81d7d08")
"""The earlier version: the last commit with peer protocol 1.1 (no wills, no replicas, no
capability flags for retained messages and sessions, no drain)."""


def build_old_tree(dest: Path, commit: str = OLD_COMMIT) -> Path:
    """`commit`'s files in `dest`, with its plugin built and its protobuf code generated."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                             capture_output=True, timeout=120)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {commit} failed: {archive.stderr.decode()[-500:]}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    build = subprocess.run(["make", "-s", "-C", str(dest / "deploy" / "mosquitto-plugin")],
                           capture_output=True, text=True, timeout=600)
    if build.returncode != 0:
        raise RuntimeError(f"building {commit}'s plugin failed: {build.stderr[-2000:]}")
    proto = subprocess.run([sys.executable, "-m", "sidecar.protogen"], cwd=dest,
                           env={**os.environ, "PYTHONPATH": str(dest)}, capture_output=True,
                           text=True, timeout=120)
    if proto.returncode != 0:
        raise RuntimeError(f"protogen of {commit} failed: {proto.stderr[-2000:]}")
    return dest


@contextmanager
def old_tree(commit: str) -> Iterator[Path]:
    """`commit` built in a folder of its own (Mosquitto's user can read it), removed after."""
    _need_plugin()
    root = Path(tempfile.mkdtemp(prefix="mqfed-old-", dir="/tmp"))
    root.chmod(0o755)  # Mosquitto's own user loads the plugin below
    try:
        yield build_old_tree(root / commit, commit)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def mixed_cluster(request: pytest.FixtureRequest) -> Iterator[MixedCluster]:
    """A `MixedCluster` in a folder of its own, closed after the test (its logs printed and
    its folder kept if the test failed)."""
    root = Path(tempfile.mkdtemp(prefix="mqfed-mixed-", dir="/tmp"))
    root.chmod(0o755)
    procs = ProcessGroup(root / "procs")
    cluster = MixedCluster(root, procs)
    failed_before = request.session.testsfailed
    try:
        yield cluster
    finally:
        cluster.close()
        if request.session.testsfailed > failed_before:
            print(procs.dump_logs())
        else:
            shutil.rmtree(root, ignore_errors=True)


@dataclass
class Node:
    ident: str
    index: int
    tree: Path
    config: Path
    run_dir: Path
    ports: object
    proc: ManagedProcess | None = None

    def state(self) -> dict:
        try:
            return json.loads((self.run_dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}


@dataclass
class MixedCluster:
    """etcd, nodes started from the tree each one is given, and an HAProxy front."""

    root: Path
    procs: ProcessGroup
    layout: Layout = field(init=False)
    nodes: dict[str, Node] = field(default_factory=dict)
    refs: list[ProcRef] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.layout = Layout(base_port(3), self.root)

    @property
    def front(self) -> int:
        return self.layout.front_port

    def port(self, ident: str) -> int:
        return self.nodes[ident].ports.mqtt

    def admin(self, ident: str) -> str:
        return f"127.0.0.1:{self.nodes[ident].ports.admin}"

    def start_etcd(self) -> None:
        binary = etcd.find_etcd()
        assert binary, "etcd is not installed"
        self.refs.append(etcd.start(binary, self.layout, "mixed"))
        wait_for(lambda: etcd.healthy(self.layout), 30, "etcd healthy")

    def start_front(self) -> None:
        binary = haproxy.find_haproxy()
        assert binary, "haproxy is not installed"
        servers = [(n.ident, n.ports.mqtt, n.ports.metrics) for n in self.nodes.values()]
        self.refs.append(haproxy.start(binary, self.layout, servers))
        wait_for(lambda: all(s.startswith("UP") for s in self._front_states()), 30,
                 "HAProxy sees every node up")

    def _front_states(self) -> list[str]:
        try:
            states = haproxy.servers_state(self.layout)
        except OSError:
            return ["?"]
        return [states.get(n, "?") for n in self.nodes]

    def start_node(self, ident: str, tree: Path) -> Node:
        """Start (or start again, on its run dir) node `ident` from `tree`."""
        index = int(ident[1:])
        old = self.nodes.get(ident)
        ports = old.ports if old else self.layout.node_ports(index)
        run_dir = self.root / "nodes" / ident
        run_dir.mkdir(parents=True, exist_ok=True)
        run_dir.chmod(0o755)
        config = self.root / f"{ident}-{tree.name}.toml"
        config.write_text(render_toml({
            "node": {"id": ident, "cluster": "mixed", "run_dir": str(run_dir)},
            "mqtt": {"listen": f"127.0.0.1:{ports.mqtt}"},
            "grpc": {"listen": f"127.0.0.1:{ports.grpc}"},
            "admin": {"listen": f"127.0.0.1:{ports.admin}",
                      "metrics": f"127.0.0.1:{ports.metrics}", "dev_mode": True},
            "membership": {"mode": "etcd",
                           "etcd": [f"127.0.0.1:{self.layout.etcd_client_port}"]},
            "log": {"level": "info"},
        }))
        node = Node(ident, index, tree, config, run_dir, ports)
        node.proc = self.procs.start(f"{ident}-{tree.name}", [
            sys.executable, "-m", "sidecar.cli", "node", "--config", str(config)],
            env={"PYTHONPATH": str(tree)}, cwd=tree)
        self.nodes[ident] = node
        return node

    def wait_ready(self, ident: str, timeout: float = 40.0) -> None:
        node = self.nodes[ident]
        wait_for(lambda: node.proc is not None and node.proc.alive()
                 and node.state().get("ready") is True
                 and node.state().get("pid") == node.proc.pid, timeout, f"{ident} ready")

    def wait_meshed(self, timeout: float = 30.0) -> None:
        """Every node's outbound stream to every other node is up (as its state.json says)."""
        def meshed() -> bool:
            for node in self.nodes.values():
                peers = (node.state().get("routing") or {}).get("peers", {})
                for other in self.nodes:
                    if other != node.ident and \
                            peers.get(other, {}).get("outbound", {}).get("state") != "up":
                        return False
            return True
        wait_for(meshed, timeout, "every peer stream up")

    def stop_node(self, ident: str) -> None:
        """SIGTERM (the node's graceful leave), and its Mosquitto stopped with it."""
        node = self.nodes[ident]
        assert node.proc is not None
        code = node.proc.stop(timeout=30)
        assert code == 0, f"{ident} exited with {code}"
        self._kill_mosquitto(node)

    @staticmethod
    def _kill_mosquitto(node: Node) -> None:
        """The node's Mosquitto, if it outlived its sidecar (checked by its command line)."""
        try:
            pid = int((node.run_dir / "mosquitto.pid").read_text())
        except (OSError, ValueError):
            return
        if runs(pid, "mosquitto", str(node.run_dir)):
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not pid_alive(pid), 5, f"mosquitto {pid} gone")

    def close(self) -> None:
        self.procs.stop_all()
        for node in self.nodes.values():
            self._kill_mosquitto(node)
        for ref in self.refs:
            if ref.running():
                ref.signal(signal.SIGKILL)
