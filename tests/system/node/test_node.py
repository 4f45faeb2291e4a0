"""`mqfed node` against real Mosquitto + plugin: lifecycle, subscription tracking, faults."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from sidecar.devcluster.procs import find
from sidecar.node.layout import NodeLayout
from sidecar.procinfo import pid_alive
from sidecar.routing.links_wiring import link_secret
from tests.harness.procs import free_port, wait_for
from tests.system.node.conftest import REPO, node_config
from tests.system.node.mqtt import Client


def _has(node, *keys):
    return lambda state: all(k in {(g, f) for g, f, _ in state.get("interest", [])} for k in keys)


def _lacks(node, *keys):
    return lambda state: not any(
        k in {(g, f) for g, f, _ in state.get("interest", [])} for k in keys)


def test_node_tracks_subscriptions_from_plugin_events(nodes, tmp_path):
    node = nodes.start(node_config(tmp_path))
    state = node.state()
    assert state["ready"] and pid_alive(state["mosquitto_pid"]) and state["pid"] == node.proc.pid
    a = Client(node.port, "alice")
    assert a.wait_connected()
    a.subscribe("sensors/+/temp")
    a.subscribe("$share/g1/jobs/#")
    node.wait(_has(node, (None, "sensors/+/temp"), ("g1", "jobs/#")), "interest from alice")
    b = Client(node.port, "bob")
    assert b.wait_connected()
    b.subscribe("sensors/+/temp")
    state = node.wait(lambda s: [None, "sensors/+/temp", 2] in s["interest"], "refcount 2")
    a.unsubscribe("sensors/+/temp")
    node.wait(lambda s: [None, "sensors/+/temp", 1] in s["interest"], "refcount back to 1")
    # a clean session's subscriptions end with its connection
    a.close()
    node.wait(_lacks(node, ("g1", "jobs/#")), "alice's shared filter dropped")
    # a persistent session's subscriptions outlive the connection
    p = Client(node.port, "pers", clean=False, session_expiry=300)
    assert p.wait_connected()
    p.subscribe("keep/#")
    p.close()
    state = node.wait(lambda s: s.get("sessions", {}).get("pers", {}).get("online") is False,
                      "persistent session offline")
    assert (None, "keep/#") in node.interest()
    b.close()


def test_sigterm_stops_node_and_its_mosquitto(nodes, tmp_path):
    node = nodes.start(node_config(tmp_path))
    broker_pid = node.state()["mosquitto_pid"]
    assert node.proc.stop(timeout=15) == 0
    wait_for(lambda: not pid_alive(broker_pid), 5, "mosquitto stopped")
    assert node.state()["ready"] is False


def test_sidecar_crash_keeps_mosquitto_and_restart_resyncs(nodes, tmp_path):
    values = node_config(tmp_path)
    node = nodes.start(values, name="n1-first")
    broker_pid = node.state()["mosquitto_pid"]
    c = Client(node.port, "steady", clean=False, session_expiry=300)
    assert c.wait_connected()
    c.subscribe("before/#")
    node.wait(_has(node, (None, "before/#")), "first subscription")
    node.proc.send_signal(signal.SIGKILL)
    node.proc.popen.wait(5)
    assert pid_alive(broker_pid), "Mosquitto must outlive a crashed sidecar"
    # clients keep working while the sidecar is away; these events must not be lost
    c.subscribe("during/#")
    c.unsubscribe("before/#")
    d = Client(node.port, "late")
    assert d.wait_connected()
    d.subscribe("late/+")
    again = nodes.start(values, name="n1-second")
    state = again.wait(_has(again, (None, "during/#"), (None, "late/+")), "re-synced interest")
    assert state["mosquitto_pid"] == broker_pid, "the restarted sidecar adopts Mosquitto"
    assert (None, "before/#") not in again.interest()
    c.close()
    d.close()


def test_mosquitto_crash_is_restarted_and_tracked_again(nodes, tmp_path):
    node = nodes.start(node_config(tmp_path))
    old_pid = node.state()["mosquitto_pid"]
    a = Client(node.port, "a1")
    assert a.wait_connected()
    a.subscribe("x/#")
    node.wait(_has(node, (None, "x/#")), "subscription")
    a.close()
    os.kill(old_pid, signal.SIGKILL)
    state = node.wait(lambda s: s["mosquitto_pid"] != old_pid and s["broker_restarts"] == 1,
                      "mosquitto restarted", timeout=15)
    assert pid_alive(state["mosquitto_pid"])
    b = Client(node.port, "b1")
    assert b.wait_connected(timeout=10)
    b.subscribe("y/#")
    node.wait(_has(node, (None, "y/#")), "tracking after restart")
    assert (None, "x/#") not in node.interest()
    b.close()


def _run_node_cli(config_path, timeout=30):
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config",
                           str(config_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_bad_config_is_refused_with_the_key_named(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[node]\nid = "n1"\n[mqtt]\nlisten = "127.0.0.1:1883"\nlistne = "x"\n')
    result = _run_node_cli(path)
    assert result.returncode == 2
    assert "unknown key mqtt.listne" in result.stderr


def test_conflicting_user_setting_is_refused(tmp_path):
    user = tmp_path / "user.conf"
    user.write_text("persistence true\n")
    path = tmp_path / "n.toml"
    path.write_text(f'[node]\nid = "n1"\nrun_dir = "{tmp_path}/n1"\n'
                    f'[mqtt]\ninclude = "{user}"\n[membership]\nmode = "static"\n')
    result = _run_node_cli(path)
    assert result.returncode == 2 and "persistence false" in result.stderr


def test_plugin_not_loaded_fails_loudly(procs, tmp_path):
    """Attach mode against a Mosquitto without the plugin: a clear error, not a hang."""
    run_dir = tmp_path / "n1"
    layout = NodeLayout(run_dir)
    layout.prepare()
    layout.prepare_socket_dir()
    try:
        conf = tmp_path / "plain.conf"
        conf.write_text(f"allow_anonymous true\nlistener 0 {layout.socket_path}\n")
        procs.start("plain-mosquitto", ["/usr/sbin/mosquitto", "-c", str(conf)])
        wait_for(lambda: layout.socket_path.exists(), 5, "plain mosquitto socket")
        path = tmp_path / "n.toml"
        path.write_text(f'[node]\nid = "n1"\nrun_dir = "{run_dir}"\n'
                        '[mqtt]\nmanage = false\nlink_timeout = 2.0\n'
                        '[membership]\nmode = "static"\n')
        result = _run_node_cli(path)
        assert result.returncode == 2
        assert "mqfed plugin did not answer" in result.stderr
    finally:
        procs.stop_all()
        layout.remove_fallback_socket_dir()


def test_taken_peer_port_fails_cleanly_and_stops_its_mosquitto(nodes, tmp_path):
    """The gRPC listen address is only tried after Mosquitto started: a taken one exits 2
    with what to do, and the Mosquitto this start spawned does not outlive it."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        node = nodes.start(node_config(tmp_path, grpc={"listen": f"127.0.0.1:{taken}"}),
                           wait_ready=False)
        wait_for(lambda: not node.proc.alive(), 30, "the node to give up")
    out = node.proc.log_text()
    assert node.proc.popen.returncode == 2, out
    assert f"cannot listen for peers on 127.0.0.1:{taken}" in out and "Traceback" not in out
    assert (node.run_dir / "mosquitto.pid").exists() or "mosquitto" in (
        node.run_dir / "mosquitto.log").read_text(), "Mosquitto was never started"
    assert not find(str(node.run_dir / "mosquitto.conf")), "its Mosquitto still runs"


def test_user_settings_are_included_and_preserved(nodes, tmp_path, readable_dir):
    """The user's password file and extra listener keep working under mqfed."""
    pwfile = readable_dir / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(pwfile), "carol", "s3cret"], check=True)
    os.chmod(pwfile, 0o644)
    extra = free_port()
    user = readable_dir / "user.conf"
    user.write_text(f"password_file {pwfile}\nallow_anonymous false\n"
                    f"listener {extra} 127.0.0.1\n")
    node = nodes.start(node_config(tmp_path, mqtt={"include": str(user)}))
    conf = (node.run_dir / "mosquitto.conf").read_text()
    assert "plugin_opt_auth defer" in conf
    anon = Client(extra, "anon")
    assert not anon.wait_connected(), "the user's allow_anonymous false must hold"
    anon.close()
    wrong = Client(node.port, "w", username="carol", password="nope")
    assert not wrong.wait_connected()
    wrong.close()
    good = Client(extra, "good", username="carol", password="s3cret")
    assert good.wait_connected(), "the user's own listener and password file must work"
    good.subscribe("carol/#")
    node.wait(_has(node, (None, "carol/#")), "carol's subscription tracked")
    good.close()


def test_print_mosquitto_conf(tmp_path):
    path = tmp_path / "n.toml"

    def printed(extra: str = "") -> str:
        path.write_text(f'[node]\nid = "n1"\nrun_dir = "{tmp_path}/n1"\n{extra}')
        try:
            result = subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config",
                                     str(path), "--print-mosquitto-conf"], cwd=REPO,
                                    capture_output=True, text=True)
        finally:
            NodeLayout(tmp_path / "n1").remove_fallback_socket_dir()
        assert result.returncode == 0, result.stderr
        return result.stdout

    out = printed()
    assert "plugin_opt_sidecar_secret" in out
    assert "listener 0 /" in out and "mosquitto.sock" in out
    assert "plugin_opt_link_secret" not in out
    # routing.links: the password peers' links give, derived from the peer token
    out = printed(f'[grpc]\ntoken = "{"k" * 32}"\n[routing]\nlinks = true\n')
    assert f"plugin_opt_link_secret {link_secret('k' * 32)}" in out.splitlines()
