"""`docker-compose up` of compose/docker-compose.yml, as a user runs it (on free loopback
ports), then MQTT through its front across the three nodes, and its Prometheus scraping them;
`down -v` after, also on failure."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest
import yaml

from tests.system.containers.dockercluster import COMPOSE_PROJECTS, ROOT, SESSION, TAG
from tests.system.drain.traffic import under_traffic
from tests.system.node.mqtt import Client

COMPOSE = ROOT / "compose" / "docker-compose.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _front_status(port: int) -> dict[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats;csv", timeout=5) as reply:
        rows = csv.DictReader(io.StringIO(reply.read().decode().lstrip("# ")))
        return {r["svname"]: r["status"] for r in rows if r["pxname"] == "nodes"}


@pytest.fixture
def compose_project(engine, images, request):
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed (`make install` installs Debian's)"
    ports = _free_ports(9)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MQFED_IMAGE_TAG": TAG,
           "MQFED_FRONT_PORT": str(ports[0]), "MQFED_FRONT_STATS_PORT": str(ports[1]),
           "MQFED_PROMETHEUS_PORT": str(ports[8]),
           # the compose file's example tokens, accepted explicitly (nodes refuse them else)
           "MQFED_ALLOW_DEFAULT_TOKENS": "1"}
    for i in (1, 2, 3):
        env[f"MQFED_N{i}_ADMIN_PORT"] = str(ports[2 * i])
        env[f"MQFED_N{i}_METRICS_PORT"] = str(ports[2 * i + 1])
    for key in ("DOCKER_HOST", "HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
    project = f"mqfed-t{SESSION}-{uuid.uuid4().hex[:4]}"
    base = [binary, "-f", str(COMPOSE), "-p", project]

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([*base, *args], env=env, capture_output=True, text=True,
                                timeout=180)
        if check:
            assert result.returncode == 0, f"docker-compose {args}:\n{result.stderr}"
        return result

    failed_before = request.session.testsfailed
    try:
        COMPOSE_PROJECTS.append(project)
        run("up", "-d")
        yield {"front": ports[0], "stats": ports[1],
               "metrics": [ports[3], ports[5], ports[7]], "prometheus": ports[8], "run": run}
        if request.session.testsfailed > failed_before:  # what the nodes said, to diagnose
            print(run("logs", "--no-color", "--tail", "400", check=False).stdout)
    except BaseException:
        print(run("logs", "--no-color", "--tail", "60", check=False).stdout)
        raise
    finally:
        down = run("down", "-v", "--remove-orphans", "-t", "10", check=False)
        if down.returncode:
            print(f"docker-compose down failed:\n{down.stderr}")


def _wait_serving(ports: dict, timeout: float = 90.0) -> None:
    """Every node answers /readyz with 200 and the front sends clients to each."""
    deadline = time.monotonic() + timeout
    status: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            ready = all(urllib.request.urlopen(f"http://127.0.0.1:{p}/readyz", timeout=2)
                        .status == 200 for p in ports["metrics"])
            status = _front_status(ports["stats"])
        except OSError:
            ready = False
        if ready and all(status.get(n) == "UP" for n in ("n1", "n2", "n3")):
            return
        time.sleep(0.5)
    raise AssertionError(f"compose cluster not serving in {timeout:.0f}s; front sees {status}")


def test_compose_up_serves_mqtt_through_the_front(compose_project):
    ports = compose_project
    _wait_serving(ports)

    topic = f"compose/{uuid.uuid4().hex[:6]}"
    subs = [Client(ports["front"], f"csub{i}-{uuid.uuid4().hex[:4]}") for i in range(3)]
    pub = Client(ports["front"], f"cpub-{uuid.uuid4().hex[:4]}")
    try:
        for c in [*subs, pub]:
            assert c.wait_connected(10)
        for s in subs:
            s.subscribe(topic, 1)
        # round robin put the three subscribers on three nodes: every message crosses nodes
        deadline = time.monotonic() + 45
        n = 0
        while time.monotonic() < deadline:
            pub.publish(topic, f"probe-{n}".encode(), qos=1)
            n += 1
            time.sleep(0.2)
            if all(s.messages for s in subs):
                break
        assert all(s.messages for s in subs), "a subscriber behind the front got nothing"
        for i in range(50):
            pub.publish(topic, f"m{i}".encode(), qos=1, wait=False)
        want = {f"m{i}".encode() for i in range(50)}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
                want <= {m.payload for m in s.messages} for s in subs):
            time.sleep(0.05)
        for s in subs:
            assert want <= {m.payload for m in s.messages}
    finally:
        for c in [*subs, pub]:
            c.close()


def test_compose_rolling_restart_under_qos1_traffic_loses_nothing(compose_project, tmp_path):
    """Issue 20 on compose, with the procedure of compose/docker-compose.yml and
    docs/operations.md: for each node, `mqfed ctl drain NODE --wait` inside its container,
    `docker-compose restart NODE`, then wait until it serves again. Under continuous QoS 1
    traffic with 100 persistent-session subscribers through the front: nothing lost (mqfed
    audit over the traces), every session resumes with session present, duplicates printed."""
    ports = compose_project
    run = ports["run"]
    _wait_serving(ports)

    def restart() -> None:
        for node in ("n1", "n2", "n3"):
            drained = run("exec", "-T", node, "mqfed", "ctl", "--node", f"{node}-front:7101",
                          "drain", node, "--wait", "--wait-timeout", "90", check=False)
            assert drained.returncode == 0, drained.stderr
            run("restart", "-t", "30", node)
            _wait_serving(ports)

    outcome = under_traffic(ports["front"], restart, tmp_path / "traces")
    print(f"compose rolling restart of 3 nodes: {outcome.line()}")
    assert outcome.summary["lost"] == 0, outcome.summary["lost_ranges"][:5]
    assert all(outcome.reconnects), "every subscriber was moved at least once"
    assert all(all(r) for r in outcome.reconnects), "a session did not resume"


def _prometheus(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=5) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    return body["data"]


def test_compose_prometheus_scrapes_every_node_with_the_alert_rules(compose_project):
    """Issue 22: compose's Prometheus (published on loopback only) has every node as a
    healthy target, under its `node` label, and the alert groups of deploy/prometheus
    loaded with every rule of alerts.yml."""
    ports = compose_project
    published = ports["run"]("port", "prometheus", "9090").stdout.strip()
    assert published == f"127.0.0.1:{ports['prometheus']}", published
    health: dict[str, str] = {}
    deadline = time.monotonic() + 150  # the nodes start, then one 15 s scrape interval
    while time.monotonic() < deadline:
        try:
            targets = _prometheus(ports["prometheus"], "targets")["activeTargets"]
            health = {t["labels"].get("node", "?"): t["health"] for t in targets}
        except OSError:
            health = {}
        if health == {"n1": "up", "n2": "up", "n3": "up"}:
            break
        time.sleep(1)
    assert health == {"n1": "up", "n2": "up", "n3": "up"}, f"Prometheus targets: {health}"
    assert {t["scrapeUrl"] for t in targets} == {
        f"http://{n}-front:9101/metrics" for n in ("n1", "n2", "n3")}

    want = {g["name"]: {r["alert"] for r in g["rules"]}
            for g in yaml.safe_load(ALERTS.read_text())["groups"]}
    groups = _prometheus(ports["prometheus"], "rules?type=alert")["groups"]
    loaded = {g["name"]: {r["name"] for r in g["rules"]} for g in groups}
    assert loaded == want
    assert all(g["file"].endswith("/alerts.yml") for g in groups)
