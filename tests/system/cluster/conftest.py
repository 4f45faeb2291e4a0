"""Run `mqfed up/down/...` as subprocesses against a throw-away run dir; always clean up.

Every cluster test gets its own run dir under /tmp (world-traversable, so Mosquitto's own
user and `nobody` can reach it). Afterwards `mqfed down` runs, and any process still running
with the run dir in its argv (etcd, HAProxy, sidecars, Mosquittos all have it) is killed by
PID, also when the test failed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from sidecar.devcluster.net import port_free
from sidecar.devcluster.procs import ProcRef, find, identify

MQFED = [sys.executable, "-m", "sidecar.cli"]
REPO = Path(__file__).resolve().parents[3]
PLUGIN = REPO / "deploy" / "mosquitto-plugin" / "build" / "mqfed_plugin.so"


def mqfed(*args: str, timeout: float = 90.0, prefix: tuple[str, ...] = (),
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one mqfed command to completion."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([*prefix, *MQFED, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=REPO)


def base_port(nodes: int = 4) -> int:
    """A base port whose front, etcd and first `nodes` node ports are free (below the
    ephemeral range, so client sockets do not take them meanwhile)."""
    for _ in range(200):
        base = random.randrange(20000, 32000 - 402)
        ports = [base, base + 400, base + 401]
        for i in range(1, nodes + 1):
            ports += [base + i, base + 100 + i, base + 200 + i, base + 300 + i]
        if all(port_free(p) for p in ports):
            return base
    raise RuntimeError("no free port range found")


def etcd_membership(info: dict) -> dict[str, object]:
    """`[membership]` settings that reach the etcd of a `mqfed up` cluster (`info`: its
    `--json`): it requires authentication (user `mqfed`, the run dir's password file)."""
    return {"mode": "etcd", "etcd": info["etcd"], "etcd_user": info["etcd_user"],
            "etcd_password_file": info["etcd_password_file"]}


def etcdctl_env(info: dict) -> dict[str, str]:
    """The environment of an `etcdctl` run against that etcd (v3 API, as user `mqfed`)."""
    password = Path(info["etcd_password_file"]).read_text().strip()
    return {"ETCDCTL_API": "3", "ETCDCTL_USER": f"{info['etcd_user']}:{password}",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def processes_of(run_dir: Path) -> list[ProcRef]:
    """Every live process whose argv mentions `run_dir`."""
    return find(str(run_dir))


def recorded_pids(run_dir: Path) -> list[int]:
    """Every PID cluster.json records, plus the Mosquitto PIDs the nodes report."""
    pids: list[int] = []
    try:
        data = json.loads((run_dir / "cluster.json").read_text())
    except FileNotFoundError:
        return pids
    for key in ("launcher", "etcd", "haproxy"):
        if data.get(key):
            pids.append(data[key]["pid"])
    for node in data["nodes"]:
        pids += [node[k]["pid"] for k in ("sidecar", "mosquitto") if node.get(k)]
        try:
            state = json.loads((run_dir / "nodes" / node["id"] / "state.json").read_text())
            if state.get("mosquitto_pid"):
                pids.append(state["mosquitto_pid"])
        except (FileNotFoundError, ValueError):
            pass
    return sorted(set(pids))


def recorded_refs(run_dir: Path) -> list[ProcRef]:
    """The recorded processes still running (PID + start time + argv checked)."""
    try:
        data = json.loads((run_dir / "cluster.json").read_text())
    except (FileNotFoundError, ValueError):
        return []
    refs = [ProcRef.from_json(data.get(key)) for key in ("launcher", "etcd", "haproxy")]
    for node in data.get("nodes", []):
        refs += [ProcRef.from_json(node.get(k)) for k in ("sidecar", "mosquitto")]
    refs += [identify(pid, "mosquitto", str(run_dir)) for pid in recorded_pids(run_dir)]
    return list({r.pid: r for r in refs if r and r.running()}.values())


def logs_of(run_dir: Path) -> str:
    out = []
    for path in sorted(run_dir.rglob("*.log")):
        lines = path.read_text(errors="replace").splitlines()[-30:]
        out.append(f"----- {path}\n" + "\n".join(lines))
    return "\n".join(out)


def cleanup(run_dir: Path) -> list[int]:
    """`mqfed down`, then SIGKILL whatever still runs from `run_dir`; returns those PIDs."""
    recorded = recorded_refs(run_dir)
    if (run_dir / "cluster.json").exists():
        try:
            mqfed("down", "--run-dir", str(run_dir), timeout=120)
        except subprocess.TimeoutExpired:
            pass
    refs = {r.pid: r for r in [*recorded, *processes_of(run_dir)] if r.running()}
    for ref in refs.values():
        ref.signal(signal.SIGKILL)
    return sorted(refs)


@contextmanager
def detached_cluster(prefix: str, nodes: int = 3,
                     env: dict[str, str] | None = None) -> Iterator[tuple[Path, dict]]:
    """`mqfed up --detach --json` in a fresh run dir: (run dir, its JSON); stopped by PID
    after (logs printed if the body failed; the dir kept if something survived)."""
    if not PLUGIN.exists():
        pytest.skip(f"the mqfed plugin is not built ({PLUGIN}); run `make install`")
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    ok = False
    try:
        result = mqfed("up", "--nodes", str(nodes), "--detach", "--json", "--base-port",
                       str(base_port(nodes)), "--run-dir", str(path), timeout=120, env=env)
        assert result.returncode == 0, result.stderr + logs_of(path)
        yield path, json.loads(result.stdout)
        ok = True
    finally:
        if not ok:
            print(logs_of(path))
        left = cleanup(path)
        if ok and not left:
            shutil.rmtree(path, ignore_errors=True)
        assert not left, f"processes of {path} still running: {left}"


@pytest.fixture
def run_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh run dir; the cluster in it is always stopped afterwards."""
    path = Path(tempfile.mkdtemp(prefix="mqfed-cluster-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        failed = any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False)
                     for when in ("setup", "call"))
        if failed:
            print(logs_of(path))
        left = cleanup(path)
        if not failed and not left:
            shutil.rmtree(path, ignore_errors=True)
        assert not left, f"processes of {path} were still running after the test: {left}"


@pytest.fixture
def needs_nodes() -> None:
    """Skip (with the reason) when `mqfed node` cannot run: the plugin is not built."""
    if not PLUGIN.exists():
        pytest.skip(f"the mqfed plugin is not built ({PLUGIN}); run `make install`")


# ---- MQTT --------------------------------------------------------------------------------
@dataclass
class Probe:
    """A connected paho client that keeps what it receives."""

    client: mqtt.Client
    messages: list[tuple[str, bytes]]

    def subscribe(self, topic: str) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *a: done.set()
        self.client.subscribe(topic, 1)
        assert done.wait(5), f"no SUBACK for {topic}"

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(5)

    def received(self, topic: str, payload: bytes) -> bool:
        return (topic, payload) in self.messages

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def connect(port: int, timeout: float = 5.0) -> Probe:
    """Connect a clean MQTT v5 client to 127.0.0.1:`port` or fail the test."""
    messages: list[tuple[str, bytes]] = []
    ok = threading.Event()
    client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                         client_id=f"cluster-test-{uuid.uuid4().hex[:8]}",
                         protocol=mqtt.MQTTv5)
    client.on_connect = lambda c, u, f, rc, p: ok.set() if not rc.is_failure else None
    client.on_message = lambda c, u, m: messages.append((m.topic, m.payload))
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    if not ok.wait(timeout):
        client.loop_stop()
        raise AssertionError(f"no successful CONNACK from 127.0.0.1:{port}")
    return Probe(client, messages)
