"""Ports and paths of a local cluster (pure).

Port layout for base port P: front (HAProxy) P; node i (1..99): MQTT P+i, gRPC P+100+i,
admin P+200+i, metrics P+300+i; etcd client P+400, etcd peer P+401.
Run-dir layout: `cluster.json` (launcher state), `lock`, `admin-token`, `peer-token`,
`etcd-password`, `etcd-root-password`,
`etcd/` (data + log), `haproxy/` (config, admin socket, log), `nodes/<id>/` (node.toml,
node.log, the node's files).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_BASE_PORT = 1883
DEFAULT_RUN_DIR = Path("run/cluster")
DEFAULT_CLUSTER = "mqfed"
MAX_NODES = 99
PORT_SPAN = 402  # ports P .. P+401

_NODE_ID = re.compile(r"^n([1-9][0-9]?)$")


def node_id(index: int) -> str:
    """The id of node number `index` (1-based): n1, n2, ..."""
    return f"n{index}"


def node_index(ident: str) -> int | None:
    """The number of node `ident`, or None if it is not of the form n<1..99>."""
    match = _NODE_ID.match(ident)
    return int(match.group(1)) if match else None


def addr(port: int) -> str:
    return f"{HOST}:{port}"


@dataclass(frozen=True)
class NodePorts:
    mqtt: int
    grpc: int
    admin: int
    metrics: int

    def named(self, ident: str) -> list[tuple[int, str]]:
        return [(self.mqtt, f"MQTT of {ident}"), (self.grpc, f"gRPC of {ident}"),
                (self.admin, f"admin of {ident}"), (self.metrics, f"metrics of {ident}")]


@dataclass(frozen=True)
class Layout:
    """Where everything of one cluster lives."""

    base_port: int
    run_dir: Path

    @staticmethod
    def check_base_port(base_port: int) -> None:
        if not 1 <= base_port <= 65535 - PORT_SPAN + 1:
            raise ValueError(f"--base-port must be between 1 and {65535 - PORT_SPAN + 1} "
                             f"(the cluster uses ports P to P+{PORT_SPAN - 1}), got {base_port}")

    @property
    def front_port(self) -> int:
        return self.base_port

    @property
    def etcd_client_port(self) -> int:
        return self.base_port + 400

    @property
    def etcd_peer_port(self) -> int:
        return self.base_port + 401

    def node_ports(self, index: int) -> NodePorts:
        if not 1 <= index <= MAX_NODES:
            raise ValueError(f"node number {index} is outside 1..{MAX_NODES}")
        p = self.base_port
        return NodePorts(p + index, p + 100 + index, p + 200 + index, p + 300 + index)

    def shared_ports(self) -> list[tuple[int, str]]:
        return [(self.front_port, "HAProxy front"), (self.etcd_client_port, "etcd client"),
                (self.etcd_peer_port, "etcd peer")]

    # ---- paths ---------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.run_dir / "cluster.json"

    @property
    def lock_path(self) -> Path:
        return self.run_dir / "lock"

    @property
    def etcd_dir(self) -> Path:
        return self.run_dir / "etcd"

    @property
    def haproxy_dir(self) -> Path:
        return self.run_dir / "haproxy"

    @property
    def nodes_dir(self) -> Path:
        return self.run_dir / "nodes"

    @property
    def admin_token_path(self) -> Path:
        """The cluster's admin token (0600), shared by its nodes and `mqfed ctl`."""
        return self.run_dir / "admin-token"

    @property
    def peer_token_path(self) -> Path:
        """The cluster's peer token (0600): every node presents and requires it on peer
        streams."""
        return self.run_dir / "peer-token"

    @property
    def etcd_password_path(self) -> Path:
        """The password (0600) of etcd user `mqfed`, which the nodes use (read and write on
        /<cluster>/ only)."""
        return self.run_dir / "etcd-password"

    @property
    def etcd_root_password_path(self) -> Path:
        """The password (0600) of etcd's `root` user (administration of the dev etcd)."""
        return self.run_dir / "etcd-root-password"

    def node_dir(self, ident: str) -> Path:
        return self.nodes_dir / ident
