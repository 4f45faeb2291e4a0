"""The launcher's record of a cluster (`<run dir>/cluster.json`) and its lock (adapter)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.devcluster.errors import ClusterError
from sidecar.devcluster.layout import HOST, Layout, NodePorts, addr
from sidecar.devcluster.netns import Topology
from sidecar.devcluster.procs import ProcRef
from sidecar.private_files import make_traversable

__all__ = ["ClusterError", "ClusterState", "NodeRecord", "load", "locked", "remove", "save"]
VERSION = 1


@dataclass
class NodeRecord:
    """One node: its ports and the processes it runs (None = not running)."""

    id: str
    index: int
    ports: NodePorts
    sidecar: ProcRef | None = None
    mosquitto: ProcRef | None = None
    host: str = HOST  # its address: loopback, or its namespace's (`mqfed up --netns`)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "index": self.index, "ports": vars(self.ports), "host": self.host,
            "sidecar": self.sidecar.to_json() if self.sidecar else None,
            "mosquitto": self.mosquitto.to_json() if self.mosquitto else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeRecord:
        return cls(data["id"], int(data["index"]), NodePorts(**data["ports"]),
                   ProcRef.from_json(data.get("sidecar")), ProcRef.from_json(data.get("mosquitto")),
                   data.get("host", HOST))

    def entry(self, node_dir: Path) -> dict[str, Any]:
        """The node as `mqfed up --json` shows it."""
        return {
            "id": self.id, "mqtt": f"{self.host}:{self.ports.mqtt}",
            "grpc": f"{self.host}:{self.ports.grpc}", "admin": f"{self.host}:{self.ports.admin}",
            "metrics": f"{self.host}:{self.ports.metrics}",
            "pid": self.sidecar.pid if self.sidecar else None,
            "mosquitto_pid": self.mosquitto.pid if self.mosquitto else None,
            "run_dir": str(node_dir), "log": str(node_dir / "node.log"),
        }


@dataclass
class ClusterState:
    """Everything the launcher started for one cluster."""

    cluster: str
    layout: Layout
    log_level: str | None = None
    launcher: ProcRef | None = None
    etcd: ProcRef | None = None
    haproxy: ProcRef | None = None
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    netns: Topology | None = None  # `mqfed up --netns`: each node in its own namespace

    def node_host(self, ident: str) -> str:
        return self.nodes[ident].host

    @property
    def etcd_host(self) -> str:
        """Where the nodes reach etcd: loopback, or the namespaces' bridge."""
        return self.netns.gateway if self.netns else HOST

    def refs(self) -> list[ProcRef]:
        """Every recorded process."""
        out = [r for r in (self.launcher, self.etcd, self.haproxy) if r]
        for node in self.nodes.values():
            out += [r for r in (node.sidecar, node.mosquitto) if r]
        return out

    def summary(self) -> dict[str, Any]:
        """The cluster as `mqfed up --json` prints it."""
        lay = self.layout
        return {
            "cluster": self.cluster, "front": addr(lay.front_port),
            "etcd": [addr(lay.etcd_client_port)], "run_dir": str(lay.run_dir),
            "admin_token_file": str(lay.admin_token_path),
            **({} if self.netns is not None else {
                "etcd_user": "mqfed", "etcd_password_file": str(lay.etcd_password_path)}),
            "nodes": [n.entry(lay.node_dir(n.id))
                      for n in sorted(self.nodes.values(), key=lambda n: n.index)],
        }

    def to_json(self) -> dict[str, Any]:
        def ref(r: ProcRef | None) -> dict[str, Any] | None:
            return r.to_json() if r else None

        return {
            "version": VERSION, "cluster": self.cluster, "base_port": self.layout.base_port,
            "run_dir": str(self.layout.run_dir), "log_level": self.log_level,
            "launcher": ref(self.launcher), "etcd": ref(self.etcd), "haproxy": ref(self.haproxy),
            "nodes": [n.to_json() for n in sorted(self.nodes.values(), key=lambda n: n.index)],
            "netns": self.netns.to_json() if self.netns else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], run_dir: Path) -> ClusterState:
        nodes = [NodeRecord.from_json(n) for n in data.get("nodes", [])]
        return cls(
            cluster=data["cluster"], layout=Layout(int(data["base_port"]), run_dir),
            log_level=data.get("log_level"), launcher=ProcRef.from_json(data.get("launcher")),
            etcd=ProcRef.from_json(data.get("etcd")),
            haproxy=ProcRef.from_json(data.get("haproxy")),
            nodes={n.id: n for n in nodes}, netns=Topology.from_json(data.get("netns")),
        )


def load(run_dir: Path) -> ClusterState | None:
    """The recorded cluster in `run_dir`, or None if there is none."""
    path = run_dir / "cluster.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot read {path}: {exc}; remove it if no cluster runs there") \
            from None
    if data.get("version") != VERSION:
        raise ClusterError(f"{path} was written by another mqfed version; stop that cluster "
                           "with the mqfed that started it")
    try:
        return ClusterState.from_json(data, run_dir)
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterError(f"{path} is damaged ({exc!r}); remove it if no cluster runs there") \
            from None


def save(state: ClusterState) -> None:
    """Write the record atomically."""
    path = state.layout.state_path
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=1) + "\n")
    os.replace(tmp, path)


def remove(state: ClusterState) -> None:
    state.layout.state_path.unlink(missing_ok=True)


@contextmanager
def locked(run_dir: Path, timeout: float = 120.0) -> Iterator[None]:
    """Hold the run dir's lock: one cluster command at a time."""
    try:
        make_traversable(run_dir)  # the nodes' Mosquittos reach their sockets below it
        f = open(run_dir / "lock", "a")
    except OSError as exc:
        raise ClusterError(f"cannot use run dir {run_dir}: {exc.strerror}; choose a folder "
                           "you can write with --run-dir") from None
    with f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ClusterError(f"another mqfed command holds {run_dir}/lock for over "
                                       f"{timeout:.0f}s; wait for it to finish") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
