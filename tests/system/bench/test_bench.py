"""Smoke test of `mqfed bench`: a tiny run prints all three cases and leaves nothing behind.

It checks the figures are sane (every message once, in order, latency > 0), never how fast
anything is.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from sidecar.devcluster.net import port_free
from sidecar.devcluster.procs import find
from sidecar.procinfo import pid_alive
from tests.system.cluster.conftest import PLUGIN, cleanup, logs_of, mqfed


def _base_port(nodes: int = 2) -> int:
    """A base port whose cluster (`nodes` nodes) and bridge ports are all free."""
    for _ in range(200):
        base = random.randrange(20000, 32000 - 404)
        ports = [base, base + 400, base + 401, base + 402, base + 403]
        ports += [base + off + i for off in (0, 100, 200, 300) for i in range(1, nodes + 1)]
        if all(port_free(p) for p in ports):
            return base
    raise RuntimeError("no free port range found")


@pytest.fixture
def bench_dir():
    path = Path(tempfile.mkdtemp(prefix="mqfed-bench-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    left = cleanup(path / "cluster") if (path / "cluster").exists() else []
    for ref in find(str(path)):
        ref.signal(signal.SIGKILL)
        left.append(ref.pid)
    if not left:
        shutil.rmtree(path, ignore_errors=True)
    assert not left, f"processes of {path} still running after the test: {left}"


def test_bench_runs_three_cases_and_stops_everything(bench_dir: Path) -> None:
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")
    try:
        result = mqfed("bench", "--messages", "2000", "--rate", "1000", "--json",
                       "--run-dir", str(bench_dir), "--base-port", str(_base_port()),
                       timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("mqfed bench did not finish within 240 s\n" + logs_of(bench_dir))
    assert result.returncode == 0, result.stderr + logs_of(bench_dir)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert [c["case"] for c in report["cases"]] == ["a", "b", "c"]
    for case in report["cases"]:
        name = case["case"]
        assert case["sent"] == 2000, (name, case)
        assert case["unique"] == 2000 and case["lost"] == 0, (name, case)  # QoS 1
        assert case["duplicates"] == 0 and case["out_of_order"] == 0, (name, case)
        assert 0 < case["p50_ms"] <= case["p99_ms"] <= case["max_ms"], (name, case)
        assert case["throughput"] > 0 and not case["publisher_errors"], (name, case)
    assert report["ratio_b_a"] > 0
    assert report["cases"][1]["routing"]["n2"]["reinjected"] >= 2000
    cpu_b = report["cases"][1]["cpu_percent"]
    assert cpu_b["n1 sidecar"] > 0 and cpu_b["n2 sidecar"] > 0 and "others" in cpu_b, cpu_b
    started = [*report["processes"].values(),
               *(pid for c in report["cases"] for pid in c["publisher_pids"])]
    assert not [pid for pid in started if pid_alive(pid)], "bench left processes running"
    assert not find(str(bench_dir)), "bench left processes of its run dir running"


def test_bench_with_mqtt311_publishers_at_qos2_loses_nothing(bench_dir: Path) -> None:
    """`--protocol 3.1.1`: the publishers speak MQTT 3.1.1 (they keep Mosquitto's in-flight
    limit, which a 3.1.1 client is not told: beyond it Mosquitto drops QoS 2 silently)."""
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")
    result = mqfed("bench", "--messages", "3000", "--qos", "2", "--protocol", "3.1.1",
                   "--cases", "ab", "--json", "--run-dir", str(bench_dir),
                   "--base-port", str(_base_port()), timeout=240)
    assert result.returncode == 0, result.stderr + logs_of(bench_dir)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for case in report["cases"]:
        assert (case["sent"], case["unique"], case["lost"], case["duplicates"]) == \
            (3000, 3000, 0, 0), case
    logs = (bench_dir / "cluster" / "nodes" / "n1" / "mosquitto.log").read_text()
    assert "as bench-pub-a-0 (p2, c0," in logs, "no MQTT 3.1.1 publisher (Mosquitto logs it as p2)"


def test_scale_bench_reports_every_phase_and_stops_everything(bench_dir: Path) -> None:
    """`--scale` with small numbers: every filter granted and routed, churn measured, a joining
    node routes everything; figures present, never judged for speed."""
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")
    result = mqfed("bench", "--scale", "--filters", "3000", "--churn-rate", "300",
                   "--churn-seconds", "2", "--clients", "50", "--fanout", "20",
                   "--fanout-publishes", "3", "--json", "--run-dir", str(bench_dir / "cluster"),
                   "--base-port", str(_base_port(nodes=4)), timeout=300)
    assert result.returncode == 0, result.stderr + logs_of(bench_dir / "cluster")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    bulk, churn, join = report["bulk"], report["churn"], report["join"]
    _assert_clients_reached(report["clients"], 50, ["n1", "n2", "n3"])
    _assert_fanout_reached(report["fanout"], 20, 3, ["n1", "n2", "n3"])
    assert bulk["filters"] == 3000 and bulk["refused"] == 0
    assert 0 < bulk["subacked_s"] <= bulk["routed_s"]
    assert set(bulk["per_10k_filters"]) == {f"n{i} {p}" for i in (1, 2, 3)
                                           for p in ("sidecar", "mosquitto")}
    assert churn["refused"] == 0 and churn["deltas_applied"] > 0
    assert 0 <= churn["lag_p50_ms"] <= churn["lag_p99_ms"]
    assert join["node"] == "n4" and join["forwarding_subscriptions"] >= 3000
    assert 0 <= join["known_after_ready_s"] <= join["routed_after_ready_s"]  # (then SUBACKed)
    assert not find(str(bench_dir)), "bench left processes of its run dir running"


def _assert_clients_reached(clients: dict, count: int, nodes: list[str]) -> None:
    assert clients["clients"] == count and clients["via_front"] == count, clients
    assert clients["connect_errors"] == 0, clients["errors_shown"]
    assert (clients["reached"], clients["missing"]) == (count, 0), clients["missing_shown"]
    assert sum(clients["on_node"].values()) == count and set(clients["on_node"]) == set(nodes)
    assert all(v > 0 for v in clients["on_node"].values()), clients["on_node"]  # spread
    assert 0 < clients["connacked_s"] <= clients["subacked_s"]
    assert clients["delivered_s"] > 0
    assert set(clients["bytes_per_client"]) == {f"{n} {p}" for n in nodes
                                                for p in ("sidecar", "mosquitto")}


def _assert_fanout_reached(fanout: dict, count: int, publishes: int, nodes: list[str]) -> None:
    assert (fanout["reached"], fanout["missing"]) == (count, 0), fanout["missing_shown"]
    assert fanout["connect_errors"] == 0 and fanout["publishes"] == publishes
    assert set(fanout["on_node"]) == set(nodes) and sum(fanout["on_node"].values()) == count
    assert 0 < fanout["p50_ms"] <= fanout["p99_ms"] <= fanout["max_ms"]
    # the message crosses to each other node once, not once per subscriber there (>= 4)
    assert fanout["n1_messages_per_publish_per_peer"] == {n: 1.0 for n in nodes[1:]}, fanout
    per_peer = fanout["n1_bytes_per_publish_per_peer"]
    assert all(v >= fanout["payload_bytes"] for v in per_peer.values()), per_peer


def test_scale_bench_series_runs_the_client_phases_per_cluster_size(bench_dir: Path) -> None:
    """`--scale --nodes 2,3 --phases clients,fanout`: a fresh cluster of each size, every
    client and subscriber reached on each, a table at the end."""
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")
    args = ["bench", "--scale", "--nodes", "2,3", "--phases", "clients,fanout", "--clients",
            "40", "--fanout", "12", "--fanout-publishes", "2", "--run-dir",
            str(bench_dir / "series"), "--base-port", str(_base_port(nodes=3))]
    result = mqfed(*args, "--json", timeout=180)
    assert result.returncode == 0, result.stderr + logs_of(bench_dir / "series" / "2-nodes")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["nodes"] for r in report["series"]] == [2, 3]
    for run in report["series"]:
        nodes = [f"n{i}" for i in range(1, run["nodes"] + 1)]
        assert set(run) == {"kind", "nodes", "clients", "fanout"}, run.keys()
        _assert_clients_reached(run["clients"], 40, nodes)
        _assert_fanout_reached(run["fanout"], 12, 2, nodes)
    assert not find(str(bench_dir)), "bench left processes of its run dir running"


def test_sessions_bench_reports_every_phase_and_stops_everything(bench_dir: Path) -> None:
    """`--sessions` with small numbers: every session held by every node, every move resumes
    with session present, a joining node serves them all; figures present, never judged."""
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")
    result = mqfed("bench", "--sessions", "60", "--moves", "9", "--messages", "500",
                   "--queue", "700", "--json",
                   "--run-dir",
                   str(bench_dir / "cluster"), "--base-port", str(_base_port(nodes=4)),
                   timeout=300)  # (3 nodes, then one added)
    assert result.returncode == 0, result.stderr + logs_of(bench_dir / "cluster")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    make, handover, join = report["make"], report["handover"], report["join"]
    assert make["sessions"] == 60 and make["known_everywhere_after_s"] >= 0
    assert set(make["bytes_per_session"]) == {f"n{i} {p}" for i in (1, 2, 3)
                                              for p in ("sidecar", "mosquitto")}
    assert handover["moves"] == 9 and handover["session_present"] == 9
    assert 0 < handover["p50_ms"] <= handover["p99_ms"]
    assert join["node"] == "n4" and join["serving_after_ready_s"] >= 0
    assert make["replicated_after_s"] >= 0  # a replica of each (sessions.replicas 2)
    for phase in ("traffic_before", "traffic_with"):
        assert report[phase]["received"] == 500 and report[phase]["msgs_per_s"] > 0
    queue = report["queue_move"]
    assert (queue["messages"], queue["received"], queue["session_present"], queue["in_order"]) \
        == (700, 700, True, True), queue
    assert not find(str(bench_dir)), "bench left processes of its run dir running"


def test_drain_bench_reports_every_phase_and_stops_everything(bench_dir: Path) -> None:
    """`--drain` with small numbers: every client reconnects elsewhere, every persistent
    session resumes with session present; times present, never judged."""
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")
    result = mqfed("bench", "--drain", "--drain-clients", "40", "--drain-persistent", "8",
                   "--json", "--run-dir", str(bench_dir / "cluster"), "--base-port",
                   str(_base_port(nodes=3)), timeout=300)
    assert result.returncode == 0, result.stderr + logs_of(bench_dir / "cluster")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["clients"], report["persistent"]) == (40, 8)
    assert report["reconnected"] == 40 and report["persistent_reconnected"] == 8
    assert report["session_present"] == 8
    assert 0 <= report["no_client_after_s"] <= report["drained_after_s"]
    assert not find(str(bench_dir)), "bench left processes of its run dir running"
