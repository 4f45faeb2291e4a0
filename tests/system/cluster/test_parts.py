"""The launcher's parts without a cluster: layout, configs, PID identity, state file."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sidecar.config import build_config
from sidecar.devcluster import haproxy, nodes
from sidecar.devcluster.layout import Layout, node_index
from sidecar.devcluster.net import port_free, taken
from sidecar.devcluster.procs import ProcRef, identify, spawn
from sidecar.devcluster.state import ClusterError, ClusterState, NodeRecord, load, save
from sidecar.procinfo import pid_alive


def test_port_layout() -> None:
    lay = Layout(20000, Path("/x"))
    assert (lay.front_port, lay.etcd_client_port, lay.etcd_peer_port) == (20000, 20400, 20401)
    p = lay.node_ports(7)
    assert (p.mqtt, p.grpc, p.admin, p.metrics) == (20007, 20107, 20207, 20307)
    with pytest.raises(ValueError):
        lay.node_ports(100)
    with pytest.raises(ValueError, match="base-port"):
        Layout.check_base_port(65400)
    assert [node_index(s) for s in ("n1", "n42", "n0", "n100", "x1")] == [1, 42, None, None, None]


def _state(tmp_path: Path, log_level: str | None = "info") -> ClusterState:
    state = ClusterState("demo", Layout(20000, tmp_path), log_level)
    state.nodes["n2"] = NodeRecord("n2", 2, state.layout.node_ports(2))
    return state


def test_node_config_is_valid_for_the_node(tmp_path: Path) -> None:
    """What the launcher writes passes the node's own strict config validation."""
    state = _state(tmp_path)
    values = nodes.values(state, state.nodes["n2"])
    cfg = build_config(values, env={})
    assert cfg.node_id == "n2" and cfg.cluster == "demo"
    assert cfg["mqtt"]["listen"] == "127.0.0.1:20002"
    assert cfg["grpc"]["listen"] == "127.0.0.1:20102"
    assert cfg["admin"]["metrics"] == "127.0.0.1:20302"
    assert cfg["membership"] == {**cfg["membership"], "mode": "etcd",
                                 "etcd": ["127.0.0.1:20400"]}
    assert cfg.run_dir == tmp_path / "nodes" / "n2"
    assert cfg["log"]["level"] == "info"


def test_launcher_settings_beat_environment_overrides(monkeypatch) -> None:
    monkeypatch.setenv("MQFED_NODE_ID", "oops")
    monkeypatch.setenv("MQFED_MQTT_LISTEN", "127.0.0.1:1")
    monkeypatch.setenv("MQFED_MQTT_MOSQUITTO", "/opt/mosquitto")
    env = nodes.child_env({"node": {"id": "n1"}, "mqtt": {"listen": "x"}})
    assert "MQFED_NODE_ID" not in env and "MQFED_MQTT_LISTEN" not in env
    assert env["MQFED_MQTT_MOSQUITTO"] == "/opt/mosquitto"  # not set by the launcher: kept


def test_haproxy_config_is_valid_tcp_round_robin(tmp_path: Path) -> None:
    text = haproxy.render(20000, tmp_path / "admin.sock",
                          [("n1", 20001, 20301), ("n2", 20002, 20302)])
    assert "mode tcp" in text and "balance roundrobin" in text
    assert "bind 127.0.0.1:20000" in text
    assert "server n2 127.0.0.1:20002 check" in text and "port 20302" in text
    assert "option httpchk GET /readyz" in text  # a draining node gets no new clients
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    binary = haproxy.find_haproxy()
    if binary is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    check = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_state_round_trip(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.etcd = ProcRef(123, 456, ("etcd", "/x"))
    state.nodes["n2"].sidecar = ProcRef(7, 8, ("node",))
    save(state)
    again = load(tmp_path)
    assert again is not None and again.to_json() == state.to_json()
    assert again.summary()["nodes"][0]["pid"] == 7
    (tmp_path / "cluster.json").write_text("{not json")
    with pytest.raises(ClusterError, match="cluster.json"):
        load(tmp_path)
    assert load(tmp_path / "nothing") is None


def test_proc_ref_signals_only_its_own_process(tmp_path: Path) -> None:
    popen, ref = spawn(["sleep", "30"], tmp_path / "sleep.log", markers=("sleep", "30"))
    try:
        assert ref.running()
        assert identify(ref.pid, "sleep") == ProcRef(ref.pid, ref.start, ("sleep",))
        assert identify(ref.pid, "etcd") is None
        recycled = ProcRef(ref.pid, ref.start + 1, ref.markers)  # same PID, other process
        other = ProcRef(ref.pid, ref.start, ("haproxy",))
        assert not recycled.running() and not recycled.signal(signal.SIGKILL)
        assert not other.running() and not other.signal(signal.SIGKILL)
        assert pid_alive(ref.pid)
        assert ref.signal(signal.SIGTERM)
        popen.wait(5)
        assert not ref.running() and ref.exited() and not ref.signal(signal.SIGTERM)
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()


def test_taken_ports_are_found() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_free(port)
        assert taken([(port, "front")]) == [(port, "front", "in use")]
    deadline = time.monotonic() + 2
    while not port_free(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert port_free(port)
