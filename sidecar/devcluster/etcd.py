"""A single-member etcd on loopback, data in the run dir, with authentication (adapter).

`enable_auth` turns etcd's authentication on once etcd is up: a `root` user and a user
`mqfed` whose role may read and write `/<cluster>/` only, each with a random password in the
run dir (0600). The nodes use `mqfed`; a client without credentials can read or write
nothing."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import urllib.request
from pathlib import Path

import grpc
from aetcd import rpc

from sidecar.devcluster.errors import ClusterError
from sidecar.devcluster.layout import HOST, Layout
from sidecar.devcluster.procs import ProcRef, spawn
from sidecar.tokens import read_token

ETCD_CANDIDATES = ("etcd", "/usr/bin/etcd", "/usr/local/bin/etcd")


def find_etcd() -> str | None:
    for name in ETCD_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def argv(binary: str, layout: Layout, cluster: str) -> list[str]:
    """etcd's command line: one member named after the cluster, loopback only."""
    client = f"http://{HOST}:{layout.etcd_client_port}"
    peer = f"http://{HOST}:{layout.etcd_peer_port}"
    name = f"{cluster}-etcd"
    return [
        binary, "--name", name, "--data-dir", str(layout.etcd_dir / "data"),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"{name}={peer}", "--initial-cluster-state", "new",
        "--initial-cluster-token", f"{cluster}-{layout.base_port}",
        "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
    ]


def start(binary: str, layout: Layout, cluster: str) -> ProcRef:
    """Start etcd (ETCD_* variables of the caller are not passed on)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
    layout.etcd_dir.mkdir(parents=True, exist_ok=True)
    _, ref = spawn(argv(binary, layout, cluster), layout.etcd_dir / "etcd.log",
                   markers=("etcd", str(layout.etcd_dir / "data")), env=env)
    return ref


def healthy(layout: Layout) -> bool:
    """True once etcd answers /health with health=true."""
    url = f"http://{HOST}:{layout.etcd_client_port}/health"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


USER = "mqfed"
"""The etcd user of a local cluster's nodes."""


def _password(path: Path) -> str:
    """The password in `path`, created (0600, random) on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return read_token(str(path), "etcd password")


def enable_auth(layout: Layout, cluster: str, timeout: float = 10.0) -> None:
    """Users `root` and `mqfed` (read and write on /<cluster>/ only), then authentication on
    (see the module docstring). Raises ClusterError if etcd refuses."""
    root, password = (_password(layout.etcd_root_password_path),
                      _password(layout.etcd_password_path))
    prefix = f"/{cluster}/".encode()
    permission = rpc.Permission(permType=rpc.Permission.READWRITE, key=prefix,
                                range_end=prefix[:-1] + b"0")  # "/" + 1: the whole prefix
    with grpc.insecure_channel(f"{HOST}:{layout.etcd_client_port}",
                               options=[("grpc.enable_http_proxy", 0)]) as channel:
        auth = rpc.AuthStub(channel)
        steps = [
            (auth.RoleAdd, rpc.AuthRoleAddRequest(name="root")),
            (auth.UserAdd, rpc.AuthUserAddRequest(name="root", password=root)),
            (auth.UserGrantRole, rpc.AuthUserGrantRoleRequest(user="root", role="root")),
            (auth.RoleAdd, rpc.AuthRoleAddRequest(name=USER)),
            (auth.RoleGrantPermission, rpc.AuthRoleGrantPermissionRequest(name=USER,
                                                                         perm=permission)),
            (auth.UserAdd, rpc.AuthUserAddRequest(name=USER, password=password)),
            (auth.UserGrantRole, rpc.AuthUserGrantRoleRequest(user=USER, role=USER)),
            (auth.AuthEnable, rpc.AuthEnableRequest()),
        ]
        for call, request in steps:
            try:
                call(request, timeout=timeout, wait_for_ready=True)
            except grpc.RpcError as exc:
                raise ClusterError(
                    f"enabling etcd authentication failed at {type(request).__name__}:"
                    f" {exc.code().name} {exc.details()}; see {log_path(layout)}") from None


def log_path(layout: Layout) -> Path:
    return layout.etcd_dir / "etcd.log"
