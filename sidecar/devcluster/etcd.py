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
import subprocess
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


def argv(binary: str, layout: Layout, cluster: str, also: str | None = None) -> list[str]:
    """etcd's command line: one member named after the cluster, loopback only (and `also`:
    the namespaces' bridge address of a `--netns` cluster); its session tokens are JWTs signed
    with the key pair in its folder when there is one (`jwt_keys`), else etcd's simple
    tokens."""
    client = f"http://{HOST}:{layout.etcd_client_port}"
    listen = client + (f",http://{also}:{layout.etcd_client_port}" if also else "")
    peer = f"http://{HOST}:{layout.etcd_peer_port}"
    name = f"{cluster}-etcd"
    return [
        binary, "--name", name, "--data-dir", str(layout.etcd_dir / "data"),
        "--listen-client-urls", listen, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"{name}={peer}", "--initial-cluster-state", "new",
        "--initial-cluster-token", f"{cluster}-{layout.base_port}",
        "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
        *_token_args(layout),
    ]


def _jwt_paths(layout: Layout) -> tuple[Path, Path]:
    return layout.etcd_dir / "jwt.key", layout.etcd_dir / "jwt.pub"


def jwt_keys(layout: Layout) -> bool:
    """An RSA key pair for etcd's JWT session tokens, made by `openssl` (False without it).

    A restarted etcd forgets its simple tokens (their default), and holds a call that carries
    one until its raft index passes the one the token names: its clients' calls then time
    out instead of failing as unauthenticated, and a node does not renew its session. A JWT
    stays valid across a restart (for its TTL)."""
    key, pub = _jwt_paths(layout)
    if key.exists() and pub.exists():
        return True
    openssl = shutil.which("openssl")
    if openssl is None:
        return False
    layout.etcd_dir.mkdir(parents=True, exist_ok=True)
    for args in (["genrsa", "-out", str(key), "2048"],
                 ["rsa", "-in", str(key), "-pubout", "-out", str(pub)]):
        done = subprocess.run([openssl, *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise ClusterError(f"openssl {args[0]} failed: {done.stderr.strip()}")
    return True


def _token_args(layout: Layout) -> list[str]:
    key, pub = _jwt_paths(layout)
    if not (key.exists() and pub.exists()):
        return []
    return ["--auth-token", f"jwt,pub-key={pub},priv-key={key},sign-method=RS256,ttl=1h"]


def start(binary: str, layout: Layout, cluster: str, also: str | None = None) -> ProcRef:
    """Start etcd (ETCD_* variables of the caller are not passed on)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
    layout.etcd_dir.mkdir(parents=True, exist_ok=True)
    jwt_keys(layout)
    _, ref = spawn(argv(binary, layout, cluster, also), layout.etcd_dir / "etcd.log",
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
