"""The admin listeners of one real `mqfed node` (static membership): development mode, the
start-up refusals, a static peer whose admin address is unknown, and static peers that learn it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from sidecar.config import render_toml
from tests.harness.procs import free_port
from tests.system.node.conftest import REPO, node_config, pair_static


def _ctl(admin: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "MQFED_ADMIN_TOKEN": "", "MQFED_ADMIN_TOKEN_FILE": ""}
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "ctl", "--node", admin, *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env)


def test_dev_mode_accepts_calls_without_a_token(nodes, tmp_path) -> None:
    peer_grpc = f"127.0.0.1:{free_port()}"  # a static peer that never runs
    values = node_config(tmp_path, "d1", admin={"dev_mode": True},
                         membership={"mode": "static", "peers": [f"d2@{peer_grpc}"]})
    node = nodes.start(values)
    admin, metrics = values["admin"]["listen"], values["admin"]["metrics"]
    r = _ctl(admin, "--json", "nodes")
    assert r.returncode == 0, r.stderr
    assert [(n["node_id"], n["state"], n["admin"]) for n in json.loads(r.stdout)["nodes"]] == [
        ("d1", "up", admin), ("d2", "up", "")]
    # static membership: the peer's admin address is unknown, so the answer is partial
    r = _ctl(admin, "--json", "clients")
    assert r.returncode == 4 and "d2" in r.stderr and "admin address is unknown" in r.stderr
    r = _ctl(admin, "--json", "clients", "--node", "d1")
    assert r.returncode == 0 and json.loads(r.stdout)["missing"] == []
    status = json.loads(_ctl(admin, "--json", "status", "--node", "d1").stdout)
    assert status["statuses"][0]["membership"] == "static"
    with urllib.request.urlopen(f"http://{metrics}/readyz", timeout=5) as resp:
        assert resp.status == 200
    assert node.proc.alive()


def test_bad_admin_settings_start_nothing(tmp_path) -> None:
    values = node_config(tmp_path, "e1", admin={"listen": f"0.0.0.0:{free_port()}",
                                                "dev_mode": True})
    path = tmp_path / "e1.toml"
    path.write_text(render_toml(values))
    r = subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "admin.dev_mode" in r.stderr and "loopback" in r.stderr
    values = node_config(tmp_path, "e2", admin={"token_file": str(tmp_path / "missing")})
    path.write_text(render_toml(values))
    r = subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "admin token file" in r.stderr, r.stderr
    assert not (tmp_path / "e2" / "mosquitto.pid").exists()
    values = node_config(tmp_path, "e3", admin={"dev_mode": True},
                         grpc={"token_file": str(tmp_path / "no-peer-token")})
    path.write_text(render_toml(values))
    r = subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "cannot read the peer token file" in r.stderr, r.stderr
    assert not (tmp_path / "e3" / "mosquitto.pid").exists()


def test_example_tokens_start_nothing_unless_allowed(nodes, tmp_path, monkeypatch) -> None:
    """The tokens the compose file ships are public: a node refuses them, before Mosquitto,
    unless MQFED_ALLOW_DEFAULT_TOKENS=1 says this is a throw-away cluster."""
    for section, token in (("grpc", "change-me-too"), ("admin", "change-me")):
        values = node_config(tmp_path, f"x{section}", **{section: {"token": token}})
        path = tmp_path / f"x{section}.toml"
        path.write_text(render_toml(values))
        r = subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config", str(path)],
                           capture_output=True, text=True, timeout=60, cwd=REPO,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
        assert r.returncode == 2 and "example token" in r.stderr, r.stderr
        assert "MQFED_ALLOW_DEFAULT_TOKENS=1" in r.stderr
        assert not (tmp_path / f"x{section}" / "mosquitto.pid").exists()
    values = node_config(tmp_path, "allowed", admin={"token": "change-me"},
                         grpc={"token": "change-me-too"})
    monkeypatch.setenv("MQFED_ALLOW_DEFAULT_TOKENS", "1")  # inherited by the node
    node = nodes.start(values)
    assert node.proc.alive()


def test_static_peers_learn_each_others_admin_address_from_the_handshake(nodes, tmp_path):
    """Static membership has no registry of admin addresses: the peer handshake carries them,
    so a cluster-wide call on a static cluster gets every node's answer."""
    first = node_config(tmp_path, "s1", admin={"dev_mode": True})
    second = node_config(tmp_path, "s2", admin={"dev_mode": True})
    pair_static({"s1": first, "s2": second})
    nodes.start(first)
    two = nodes.start(second)
    two.wait(lambda s: (s.get("routing") or {}).get("peers", {}).get("s1", {}).get(
        "outbound", {}).get("state") == "up", "s2's stream to s1 up", timeout=20)
    admin = first["admin"]["listen"]
    r = _ctl(admin, "--json", "nodes")
    assert r.returncode == 0, r.stderr
    assert {n["node_id"]: n["admin"] for n in json.loads(r.stdout)["nodes"]} == {
        "s1": admin, "s2": second["admin"]["listen"]}
    r = _ctl(admin, "--json", "clients")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["missing"] == []


def test_wildcard_listeners_register_their_advertised_addresses(nodes, tmp_path):
    """gRPC and admin bound to 0.0.0.0: peers dial, and the fan-out reaches, the advertised
    addresses (what a node in a container or VM with several interfaces needs)."""
    values = {}
    for node in ("w1", "w2"):
        grpc, admin = free_port(), free_port()
        values[node] = node_config(
            tmp_path, node,
            grpc={"listen": f"0.0.0.0:{grpc}", "advertise": f"127.0.0.1:{grpc}"},
            admin={"listen": f"0.0.0.0:{admin}", "advertise": f"127.0.0.1:{admin}",
                   "token": "t0ken"})
    pair_static(values)
    nodes.start(values["w1"])
    two = nodes.start(values["w2"])
    two.wait(lambda s: (s.get("routing") or {}).get("peers", {}).get("w1", {}).get(
        "outbound", {}).get("state") == "up", "w2's stream to w1 up", timeout=20)
    env = {"PATH": "/usr/bin:/bin", "MQFED_ADMIN_TOKEN": "t0ken", "MQFED_ADMIN_TOKEN_FILE": ""}
    r = subprocess.run([sys.executable, "-m", "sidecar.cli", "ctl", "--node",
                        values["w1"]["admin"]["advertise"], "--json", "nodes"],
                       capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    assert {n["node_id"]: n["admin"] for n in json.loads(r.stdout)["nodes"]} == {
        n: values[n]["admin"]["advertise"] for n in ("w1", "w2")}
