"""The HAProxy TCP front: round robin over the nodes' MQTT ports, health-checked by each node's
`/readyz` (adapter): a node starting, draining (`mqfed ctl drain`) or stopping gets no new
clients."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from sidecar.devcluster.layout import HOST, Layout
from sidecar.devcluster.procs import ProcRef, spawn

BACKEND = "nodes"
CHECK = "check inter 1s fall 2 rise 1"  # on each server: dynamic servers ignore default-server
Server = tuple[str, int, int] | tuple[str, int, int, str]  # name, MQTT port, metrics port (its
# /readyz)[, host (default loopback)]


def find_haproxy() -> str | None:
    return shutil.which("haproxy") or shutil.which("/usr/sbin/haproxy")


def config_path(layout: Layout) -> Path:
    return layout.haproxy_dir / "haproxy.cfg"


def socket_path(layout: Layout) -> Path:
    return layout.haproxy_dir / "admin.sock"


def log_path(layout: Layout) -> Path:
    return layout.haproxy_dir / "haproxy.log"


def server_line(name: str, port: int, check_port: int, host: str = HOST) -> str:
    return f"    server {name} {host}:{port} {_check(check_port)}"


def _check(check_port: int) -> str:
    return f"{CHECK} port {check_port}"


def render(front_port: int, admin_socket: Path, servers: Sequence[Server]) -> str:
    """haproxy.cfg text (pure). Long client/server timeouts: MQTT connections live long."""
    lines = [
        "# written by mqfed up; servers added later come through the admin socket",
        "global",
        f"    stats socket {admin_socket} mode 600 level admin",
        "defaults",
        "    mode tcp",
        "    timeout connect 5s",
        "    timeout client 1h",
        "    timeout server 1h",
        "    retries 2",
        "    option redispatch  # a refused connect goes to another node",
        "frontend mqtt",
        f"    bind {HOST}:{front_port}",
        f"    default_backend {BACKEND}",
        f"backend {BACKEND}",
        "    balance roundrobin",
        "    option httpchk GET /readyz  # on the node's metrics port: 503 unless it serves",
    ]
    lines += [server_line(*server) for server in servers]
    return "\n".join(lines) + "\n"


def write_config(layout: Layout, servers: Sequence[Server]) -> Path:
    layout.haproxy_dir.mkdir(parents=True, exist_ok=True)
    path = config_path(layout)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(layout.front_port, socket_path(layout), servers))
    tmp.replace(path)
    return path


def start(binary: str, layout: Layout, servers: Sequence[Server]) -> ProcRef:
    """Write the config and start HAProxy in the foreground (-db), logging to a file."""
    path = write_config(layout, servers)
    _, ref = spawn([binary, "-db", "-f", str(path)], log_path(layout),
                   markers=("haproxy", str(path)))
    return ref


def command(layout: Layout, line: str, timeout: float = 5.0) -> str:
    """Send one command on HAProxy's admin socket; return its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(socket_path(layout)))
        s.sendall(line.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace").strip()


def info(layout: Layout, timeout: float = 5.0) -> dict[str, str]:
    """HAProxy's `show info` (Maxconn, Ulimit-n, CurrConns, ...) as a dict."""
    out = {}
    for line in command(layout, "show info", timeout).splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def connection_limit(layout: Layout) -> int | None:
    """How many connections the front accepts (HAProxy derives its maxconn from its
    open-files limit when its config sets none, as ours does); None if it cannot be asked."""
    try:
        value = info(layout, timeout=1.0).get("Maxconn", "")
    except OSError:
        return None
    return int(value) if value.isdigit() else None


def add_server(layout: Layout, name: str, port: int, check_port: int, host: str = HOST) -> None:
    """Add a node to the running HAProxy (dynamic server, health check on) and to its config."""
    answer = command(layout, f"add server {BACKEND}/{name} {host}:{port} {_check(check_port)}")
    if "New server registered" not in answer and "Already exists" not in answer:
        raise RuntimeError(f"HAProxy refused server {name}: {answer}")
    for line in (f"enable health {BACKEND}/{name}", f"enable server {BACKEND}/{name}"):
        answer = command(layout, line)
        if answer:
            raise RuntimeError(f"HAProxy: '{line}' failed: {answer}")


def servers_state(layout: Layout) -> dict[str, str]:
    """Server name → status (UP, DOWN, MAINT, ...) from `show stat`."""
    out: dict[str, str] = {}
    for row in command(layout, "show stat").splitlines():
        cols = row.split(",")
        if len(cols) > 17 and cols[0] == BACKEND and cols[1] not in ("BACKEND", "FRONTEND"):
            out[cols[1]] = cols[17]
    return out
