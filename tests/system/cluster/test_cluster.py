"""`mqfed up/down/add-node/stop-node/start-node` with real etcd, HAProxy and nodes."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sidecar.devcluster import launcher
from sidecar.devcluster.net import port_open
from sidecar.devcluster.procs import ProcRef
from sidecar.procinfo import cmdline, pid_alive
from tests.harness.procs import wait_for
from tests.system.cluster.conftest import (
    MQFED,
    REPO,
    base_port,
    connect,
    mqfed,
    processes_of,
    recorded_refs,
)


def up(run_dir: Path, base: int, nodes: int, prefix: tuple[str, ...] = ()) -> dict:
    result = mqfed("up", "--nodes", str(nodes), "--detach", "--json", "--base-port", str(base),
                   "--run-dir", str(run_dir), prefix=prefix)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def all_ports(base: int, nodes: int) -> list[int]:
    ports = [base, base + 400, base + 401]
    for i in range(1, nodes + 1):
        ports += [base + i, base + 100 + i, base + 200 + i, base + 300 + i]
    return ports


def assert_gone(run_dir: Path, refs: list[ProcRef], ports: list[int]) -> None:
    """Every process has exited, nothing runs from the run dir, every port is closed."""
    assert refs
    wait_for(lambda: not any(r.running() for r in refs), 5,
             f"PIDs {[r.pid for r in refs]} to exit")
    assert processes_of(run_dir) == []
    assert [p for p in ports if port_open(p)] == []
    assert not (run_dir / "cluster.json").exists()


def node_refs(run_dir: Path, ident: str) -> tuple[ProcRef | None, ProcRef | None]:
    """The node's running sidecar and Mosquitto (PID + start time), None when not running."""
    node = launcher.status(run_dir).nodes[ident]
    return node.sidecar, node.mosquitto


def same_node_roundtrip(port: int, topic: str) -> None:
    """Publish and receive through one node's own port."""
    probe = connect(port)
    try:
        probe.subscribe(topic)
        probe.publish(topic, b"hello")
        wait_for(lambda: probe.received(topic, b"hello"), 5, f"{topic} back on {port}")
    finally:
        probe.close()


def front_reaches(front: int, node_ports: dict[str, int], attempts: int = 8) -> set[str]:
    """Which nodes the front hands new connections to: a subscriber sits on each node's
    own port; each front connection publishes once and the node that got it sees it."""
    subs = {ident: connect(port) for ident, port in node_ports.items()}
    try:
        for sub in subs.values():
            sub.subscribe("probe/#")
        for i in range(attempts):
            pub = connect(front)
            pub.publish(f"probe/{i}", b"x")
            pub.close()
        reached: set[str] = set()

        def all_reached() -> bool:
            reached.update(i for i, s in subs.items() if s.messages)
            return reached == set(subs)

        try:
            wait_for(all_reached, 3, "every node to get a probe")
        except TimeoutError:
            pass
        return reached
    finally:
        for sub in subs.values():
            sub.close()


def test_up_json_connect_and_down(run_dir: Path, needs_nodes: None) -> None:
    """Three nodes + etcd + front come up; JSON tells where; each node serves MQTT; the
    front round-robins over all nodes; `down` stops every recorded PID and closes ports."""
    base = base_port(3)
    info = up(run_dir, base, 3)
    assert info["cluster"] == "mqfed"
    assert info["front"] == f"127.0.0.1:{base}"
    assert info["etcd"] == [f"127.0.0.1:{base + 400}"]
    assert [n["id"] for n in info["nodes"]] == ["n1", "n2", "n3"]
    for i, node in enumerate(info["nodes"], start=1):
        assert {k: node[k] for k in ("mqtt", "grpc", "admin", "metrics")} == {
            "mqtt": f"127.0.0.1:{base + i}", "grpc": f"127.0.0.1:{base + 100 + i}",
            "admin": f"127.0.0.1:{base + 200 + i}", "metrics": f"127.0.0.1:{base + 300 + i}"}
        assert "node" in cmdline(node["pid"]) and pid_alive(node["mosquitto_pid"])
        assert "mosquitto" in cmdline(node["mosquitto_pid"])[0]
    refs = recorded_refs(run_dir)
    assert len({r.pid for r in refs}) == 8  # etcd, haproxy, 3 × (sidecar, mosquitto)

    for node in info["nodes"]:
        same_node_roundtrip(int(node["mqtt"].rsplit(":", 1)[1]), f"t/{node['id']}")
    same_node_roundtrip(base, "t/front")
    reached = front_reaches(base, {n["id"]: base + i for i, n in enumerate(info["nodes"], 1)})
    assert reached == {"n1", "n2", "n3"}

    result = mqfed("down", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert_gone(run_dir, refs, all_ports(base, 3))
    again = mqfed("down", "--run-dir", str(run_dir))
    assert again.returncode != 0 and "no cluster" in again.stderr


def test_add_stop_start_nodes(run_dir: Path, needs_nodes: None) -> None:
    """add-node joins n2 (own ports, behind the front); stop-node plain / --kill /
    --sidecar-only stop exactly the right processes; start-node brings n2 back (adopting its
    Mosquitto after a sidecar-only crash); bad requests fail clearly."""
    base = base_port(3)
    up(run_dir, base, 1)
    second = mqfed("up", "--nodes", "1", "--detach", "--base-port", str(base),
                   "--run-dir", str(run_dir))
    assert second.returncode != 0 and "already runs" in second.stderr
    n1 = node_refs(run_dir, "n1")
    seen = recorded_refs(run_dir)

    added = mqfed("add-node", "--json", "--run-dir", str(run_dir))
    assert added.returncode == 0, added.stderr
    entry = json.loads(added.stdout)
    assert entry["id"] == "n2" and entry["mqtt"] == f"127.0.0.1:{base + 2}"
    assert entry["grpc"] == f"127.0.0.1:{base + 102}"
    sidecar, broker = node_refs(run_dir, "n2")
    assert sidecar and broker and (sidecar.pid, broker.pid) == (entry["pid"],
                                                                entry["mosquitto_pid"])
    same_node_roundtrip(base + 2, "t/n2")
    assert "n2" in front_reaches(base, {"n2": base + 2})
    seen += [sidecar, broker]

    # plain stop: SIGTERM; the sidecar and its Mosquitto are gone, n1 untouched
    assert mqfed("stop-node", "--run-dir", str(run_dir), "n2").returncode == 0
    assert not sidecar.running() and not broker.running() and not port_open(base + 2)
    assert node_refs(run_dir, "n2") == (None, None) and node_refs(run_dir, "n1") == n1
    again = mqfed("stop-node", "--run-dir", str(run_dir), "n2")
    assert again.returncode != 0 and "not running" in again.stderr
    assert all(_front_connects(base) for _ in range(3))  # redispatched to n1 meanwhile

    # start again, then --kill: SIGKILL both (a crash)
    started = mqfed("start-node", "--json", "--run-dir", str(run_dir), "n2")
    assert started.returncode == 0, started.stderr
    sidecar, broker = node_refs(run_dir, "n2")
    assert sidecar and broker and port_open(base + 2)
    assert json.loads(started.stdout)["pid"] == sidecar.pid
    seen += [sidecar, broker]
    assert mqfed("stop-node", "--kill", "--run-dir", str(run_dir), "n2").returncode == 0
    assert not sidecar.running() and not broker.running() and not port_open(base + 2)
    assert node_refs(run_dir, "n1") == n1

    # start-node after a crash is not fooled by the stale state.json saying ready
    assert mqfed("start-node", "--run-dir", str(run_dir), "n2").returncode == 0
    sidecar, broker = node_refs(run_dir, "n2")
    assert sidecar and broker and sidecar not in seen and broker not in seen
    seen += [sidecar, broker]

    # --sidecar-only: Mosquitto and its clients stay; start-node adopts that Mosquitto
    client = connect(base + 2)
    try:
        client.subscribe("kept/#")
        result = mqfed("stop-node", "--sidecar-only", "--run-dir", str(run_dir), "n2")
        assert result.returncode == 0 and str(broker.pid) in result.stdout
        assert not sidecar.running() and broker.running() and port_open(base + 2)
        assert node_refs(run_dir, "n2") == (None, broker)
        client.publish("kept/1", b"a")
        wait_for(lambda: client.received("kept/1", b"a"), 5, "Mosquitto to keep serving")
        result = mqfed("start-node", "--run-dir", str(run_dir), "n2")
        assert result.returncode == 0, result.stderr
        new_sidecar, new_broker = node_refs(run_dir, "n2")
        assert new_sidecar and new_sidecar not in seen
        assert new_broker == broker, "the new sidecar should adopt the running Mosquitto"
        assert client.client.is_connected()
        seen.append(new_sidecar)
    finally:
        client.close()

    # bad requests: unknown node, start of a running node, a taken port for the next node
    bad = mqfed("stop-node", "--run-dir", str(run_dir), "n9")
    assert bad.returncode != 0 and "n1, n2" in bad.stderr
    bad = mqfed("start-node", "--run-dir", str(run_dir), "n2")
    assert bad.returncode != 0 and "already running" in bad.stderr
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", base + 103))
        blocker.listen()
        bad = mqfed("add-node", "--run-dir", str(run_dir))
    assert bad.returncode != 0 and f"{base + 103} (gRPC of n3)" in bad.stderr
    assert list(launcher.status(run_dir).nodes) == ["n1", "n2"]

    assert mqfed("down", "--run-dir", str(run_dir)).returncode == 0
    assert_gone(run_dir, seen, all_ports(base, 3))


def _front_connects(front: int) -> bool:
    try:
        connect(front, timeout=2).close()
        return True
    except (AssertionError, OSError):
        return False


def _wait_for_hint(proc, base: int) -> None:
    hint = f"mosquitto_sub -h 127.0.0.1 -p {base}"
    wait_for(lambda: hint in proc.log_text() or not proc.alive(), 60, "the connect hint")
    assert proc.alive(), proc.log_text()


def test_foreground_up_stops_on_sigint(run_dir: Path, procs, needs_nodes: None) -> None:
    """`mqfed up` in the foreground prints where to connect; Ctrl-C stops everything."""
    base = base_port(1)
    proc = procs.start("up", [*MQFED, "up", "--nodes", "1", "--base-port", str(base),
                              "--run-dir", str(run_dir)])
    _wait_for_hint(proc, base)
    assert f"127.0.0.1:{base + 1}" in proc.log_text()  # the node's own MQTT address
    assert re.search(r"front .*at most [\d,]+ connections", proc.log_text()), \
        "the front's connection limit"  # (HAProxy's maxconn: ~half the open-files limit)
    assert f"status page (live, the whole cluster): http://127.0.0.1:{base + 301}/" \
        in proc.log_text()  # what `make demo` prints (issue 22)
    refs = recorded_refs(run_dir)
    pids = {r.pid for r in refs}
    assert proc.pid in pids and len(pids) == 5  # launcher, etcd, haproxy, sidecar, mosquitto
    same_node_roundtrip(base, "t/fg")
    proc.popen.send_signal(signal.SIGINT)
    assert proc.popen.wait(60) == 0, proc.log_text()
    assert_gone(run_dir, refs, all_ports(base, 1))


def test_down_stops_a_foreground_cluster(run_dir: Path, procs, needs_nodes: None) -> None:
    """`mqfed down` from elsewhere ends a foreground `mqfed up` cleanly."""
    base = base_port(1)
    proc = procs.start("up", [*MQFED, "up", "--nodes", "1", "--base-port", str(base),
                              "--run-dir", str(run_dir)])
    _wait_for_hint(proc, base)
    refs = recorded_refs(run_dir)
    result = mqfed("down", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert proc.popen.wait(30) == 0, proc.log_text()
    assert_gone(run_dir, refs, all_ports(base, 1))


def test_sigterm_during_start_up_stops_what_started(run_dir: Path, procs,
                                                    needs_nodes: None) -> None:
    """A launcher stopped before the cluster is ready leaves nothing running."""
    base = base_port(2)
    proc = procs.start("up", [*MQFED, "up", "--nodes", "2", "--base-port", str(base),
                              "--run-dir", str(run_dir)])

    def sidecars_started() -> bool:
        try:
            data = json.loads((run_dir / "cluster.json").read_text())
        except (FileNotFoundError, ValueError):
            return False
        return sum(1 for n in data["nodes"] if n["sidecar"]) == 2

    wait_for(sidecars_started, 30, "the launcher to start the sidecars")
    refs = recorded_refs(run_dir)
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(60) == 130, proc.log_text()
    assert_gone(run_dir, refs, all_ports(base, 2))


def _interpreter_for(prefix: tuple[str, ...]) -> tuple[list[str], dict[str, str]] | str:
    """A Python command line the switched user can run, whose children can run it again
    (the launcher starts nodes with sys.executable); or why there is none. A venv made from
    a Python under /root is not executable by others: then Debian's python3.11 with this
    venv's packages on PYTHONPATH is tried."""
    site = sysconfig.get_paths()["purelib"]
    candidates = [(sys.executable, {})]
    system = shutil.which("python3.11", path="/usr/bin:/usr/local/bin")
    if system:
        candidates.append((system, {"PYTHONPATH": f"{REPO}:{site}"}))
    check = ("import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', "
             "'import sidecar.cli, paho.mqtt, grpc']).returncode)")
    errors = []
    for python, extra in candidates:
        env = {**os.environ, **extra, "HOME": "/tmp"}
        probe = subprocess.run([*prefix, python, "-c", check], capture_output=True, text=True,
                               cwd="/tmp", env=env)
        if probe.returncode == 0:
            return [python, "-m", "sidecar.cli"], {**extra, "HOME": "/tmp"}
        errors.append(f"{python}: {probe.stderr.strip()[-200:]}")
    return "; ".join(errors)


def test_up_and_down_as_a_normal_user(run_dir: Path, needs_nodes: None) -> None:
    """The launcher needs no root: one detached cycle as `nobody` when run as root."""
    if os.geteuid() != 0:
        prefix: tuple[str, ...] = ()
        command, env = list(MQFED), {}
    else:
        setpriv = shutil.which("setpriv")
        try:
            nobody = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("running as root and there is no user 'nobody' to switch to")
        if setpriv is None:
            pytest.skip("running as root and setpriv (util-linux) is missing")
        prefix = (setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                  "--clear-groups")
        found = _interpreter_for(prefix)
        if isinstance(found, str):
            pytest.skip(f"user nobody cannot run this checkout's Python: {found}")
        command, env = found
        os.chown(run_dir, nobody.pw_uid, nobody.pw_gid)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, *command, *args], capture_output=True, text=True,
                              timeout=90, cwd="/tmp", env={**os.environ, **env})

    base = base_port(1)
    result = run("up", "--nodes", "1", "--detach", "--json", "--base-port", str(base),
                 "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    refs = recorded_refs(run_dir)
    assert len(refs) == 4
    uid = os.geteuid() if not prefix else pwd.getpwnam("nobody").pw_uid
    for pid in (r.pid for r in refs):
        status = Path(f"/proc/{pid}/status").read_text()
        real_uid = int(next(line for line in status.splitlines()
                            if line.startswith("Uid:")).split()[1])
        assert real_uid == uid, f"PID {pid} ({cmdline(pid)}) runs as uid {real_uid}"
    same_node_roundtrip(base + 1, "t/user")
    result = run("down", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert_gone(run_dir, refs, all_ports(base, 1))


def test_taken_port_is_refused_and_nothing_starts(run_dir: Path) -> None:
    base = base_port(2)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", base + 2))
        blocker.listen()
        result = mqfed("up", "--nodes", "2", "--detach", "--base-port", str(base),
                       "--run-dir", str(run_dir))
    assert result.returncode == 1
    assert f"{base + 2} (MQTT of n2): in use" in result.stderr
    assert "--base-port" in result.stderr
    assert processes_of(run_dir) == [] and not (run_dir / "cluster.json").exists()


def test_commands_without_a_cluster_fail_clearly(run_dir: Path) -> None:
    for args in (["down"], ["add-node"], ["stop-node", "n1"], ["start-node", "n1"],
                 ["status"]):
        result = mqfed(*args, "--run-dir", str(run_dir))
        assert result.returncode == 1, args
        assert f"no cluster in {run_dir}" in result.stderr, result.stderr
    bad = mqfed("up", "--nodes", "0", "--run-dir", str(run_dir))
    assert bad.returncode == 1 and "--nodes" in bad.stderr


def test_node_that_cannot_start_is_reported_with_its_log(run_dir: Path) -> None:
    """A node that fails during start-up: non-zero exit, the node's log tail in the error,
    and the etcd and other processes already started are stopped again."""
    base = base_port(1)
    result = mqfed("up", "--nodes", "1", "--detach", "--base-port", str(base), "--run-dir",
                   str(run_dir), "--timeout", "20",
                   env={"MQFED_MQTT_MOSQUITTO": "/nonexistent/mosquitto"})
    assert result.returncode == 1
    log = (run_dir / "nodes" / "n1" / "node.log").read_text().strip().splitlines()
    assert "node n1" in result.stderr and log and log[-1].strip() in result.stderr
    assert processes_of(run_dir) == [] and not (run_dir / "cluster.json").exists()
    assert [p for p in all_ports(base, 1) if port_open(p)] == []
