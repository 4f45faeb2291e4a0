"""Start, watch and stop one `mqfed node` of a local cluster (adapter).

The node reports itself in `<node dir>/state.json` (pid, mosquitto_pid, ready). Its Mosquitto
runs in its own session and outlives a SIGKILLed sidecar, so stopping a node also stops the
recorded Mosquitto, checked by argv (it runs with the node dir's mosquitto.conf).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from sidecar.config import render_toml
from sidecar.devcluster import etcd
from sidecar.devcluster.layout import Layout
from sidecar.devcluster.procs import ProcRef, find, identify, kill, spawn, stop
from sidecar.devcluster.state import ClusterState, NodeRecord
from sidecar.private_files import make_traversable
from sidecar.procinfo import cmdline


def values(state: ClusterState, node: NodeRecord) -> dict[str, dict[str, Any]]:
    """The node's config values (pure)."""
    lay, ports, host = state.layout, node.ports, node.host
    out: dict[str, dict[str, Any]] = {
        "node": {"id": node.id, "cluster": state.cluster,
                 "run_dir": str(lay.node_dir(node.id))},
        "mqtt": {"listen": f"{host}:{ports.mqtt}"},
        "grpc": {"listen": f"{host}:{ports.grpc}", "token": "",
                 "token_file": str(lay.peer_token_path)},
        "admin": {"listen": f"{host}:{ports.admin}", "metrics": f"{host}:{ports.metrics}",
                  "token": "", "token_file": str(lay.admin_token_path)},
        "membership": {"mode": "etcd", "etcd": [f"{state.etcd_host}:{lay.etcd_client_port}"]},
    }
    if state.netns is None:  # `mqfed up --netns` runs etcd without authentication
        out["membership"].update(etcd_user=etcd.USER, etcd_password="",
                                 etcd_password_file=str(lay.etcd_password_path))
    if state.log_level:
        out["log"] = {"level": state.log_level}
    return out


SOURCE_ROOT = Path(__file__).resolve().parents[2]
SIDECAR_STOP_TIMEOUT = 45.0
"""Seconds a SIGTERMed sidecar gets (its drain, `drain.on_stop` 20 s, then its leave) before
SIGKILL."""


def child_env(settings: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The caller's environment minus MQFED_* overrides of the keys the launcher sets; a
    launcher run from a source checkout puts it first on PYTHONPATH, so that nodes run the
    same code whatever their working folder."""
    env = dict(os.environ)
    for section, body in settings.items():
        for key in body:
            env.pop(f"MQFED_{section.upper()}_{key.upper()}", None)
    if (SOURCE_ROOT / "pyproject.toml").is_file():
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(SOURCE_ROOT), *rest])
    return env


def config_path(layout: Layout, ident: str) -> Path:
    return layout.node_dir(ident) / "node.toml"


def log_path(layout: Layout, ident: str) -> Path:
    return layout.node_dir(ident) / "node.log"


def ensure_token(layout: Layout, path: Path) -> Path:
    """A token file of the cluster, created (0600, random) on first use."""
    if not path.exists():
        layout.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path


def start(state: ClusterState, node: NodeRecord) -> ProcRef:
    """Write the node's config and start `mqfed node` in its own session."""
    ensure_token(state.layout, state.layout.admin_token_path)
    ensure_token(state.layout, state.layout.peer_token_path)
    settings = values(state, node)
    node_dir = state.layout.node_dir(node.id)
    make_traversable(node_dir)  # its Mosquitto's user reaches its socket below it
    path = config_path(state.layout, node.id)
    path.write_text(render_toml(settings))
    argv = [sys.executable, "-m", "sidecar.cli", "node", "--config", str(path)]
    if state.netns is not None:  # in its namespace (its Mosquitto follows it there)
        argv = [*state.netns.exec_prefix(node.index), *argv]
    _, ref = spawn(argv, log_path(state.layout, node.id), env=child_env(settings),
                   cwd=node_dir, markers=("sidecar.cli", "node", str(path)))
    return ref


def reported(layout: Layout, ident: str) -> dict[str, Any] | None:
    """The node's own state.json, or None while it has written none."""
    try:
        data = json.loads((layout.node_dir(ident) / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def ready(layout: Layout, node: NodeRecord) -> bool:
    """True once the node's current sidecar reports ready."""
    data = reported(layout, node.id)
    return bool(data and node.sidecar and data.get("pid") == node.sidecar.pid
                and data.get("node") == node.id and data.get("ready") is True)


def find_mosquitto(layout: Layout, node: NodeRecord) -> ProcRef | None:
    """The node's Mosquitto, from its state.json, if it runs with the node's config."""
    data = reported(layout, node.id) or {}
    pid = data.get("mosquitto_pid")
    return identify(pid if isinstance(pid, int) else None, "mosquitto",
                    f"{layout.node_dir(node.id)}/")


def mosquittos(layout: Layout, node: NodeRecord) -> list[ProcRef]:
    """Every running Mosquitto of the node: the recorded one, the reported one, and any
    running with a config from the node's folder (a sidecar killed before it reported)."""
    refs = [node.mosquitto, find_mosquitto(layout, node)]
    refs += find("mosquitto", f"{layout.node_dir(node.id)}/")
    return list({r.pid: r for r in refs if r and r.running() and _is_mosquitto(r)}.values())


def _is_mosquitto(ref: ProcRef) -> bool:
    argv = cmdline(ref.pid)
    return bool(argv) and Path(argv[0]).name == "mosquitto"


def stop_node(layout: Layout, node: NodeRecord, how: str = "term") -> None:
    """Stop the node: `term` (SIGTERM, the sidecar stops its Mosquitto; leftovers are
    stopped after it), `kill` (SIGKILL sidecar and Mosquitto) or `sidecar` (SIGKILL the
    sidecar only). Updates the record."""
    brokers = mosquittos(layout, node)
    sidecar = [node.sidecar] if node.sidecar else []
    if how == "term":
        stop(sidecar, timeout=SIDECAR_STOP_TIMEOUT)
        stop(brokers + mosquittos(layout, node), timeout=10.0)
    elif how == "kill":
        kill(sidecar + brokers)
    elif how == "sidecar":
        kill(sidecar)
    else:
        raise ValueError(f"unknown stop mode {how!r}")
    node.sidecar = None
    running = mosquittos(layout, node)
    node.mosquitto = running[0] if running else None
