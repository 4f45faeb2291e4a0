"""A single-member etcd on loopback, data in the run dir (adapter)."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

from sidecar.devcluster.layout import HOST, Layout
from sidecar.devcluster.procs import ProcRef, spawn

ETCD_CANDIDATES = ("etcd", "/usr/bin/etcd", "/usr/local/bin/etcd")


def find_etcd() -> str | None:
    for name in ETCD_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def argv(binary: str, layout: Layout, cluster: str, also: str | None = None) -> list[str]:
    """etcd's command line: one member named after the cluster, loopback only (and `also`:
    the namespaces' bridge address of a `--netns` cluster)."""
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
    ]


def start(binary: str, layout: Layout, cluster: str, also: str | None = None) -> ProcRef:
    """Start etcd (ETCD_* variables of the caller are not passed on)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
    layout.etcd_dir.mkdir(parents=True, exist_ok=True)
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


def log_path(layout: Layout) -> Path:
    return layout.etcd_dir / "etcd.log"
