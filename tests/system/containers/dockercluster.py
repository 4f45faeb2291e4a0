"""A 3-node mqfed cluster in containers, started with testcontainers (test harness).

Topology (the same as compose/docker-compose.yml):
  - network `front` (a normal bridge): HAProxy and the nodes' MQTT listeners; the only
    network with published ports, all on 127.0.0.1 (random host ports);
  - network `cluster` (internal, a fixed subnet so that a node reconnected after a partition
    gets its address back): etcd and the nodes' peer gRPC (alias `nX-peer`).
A partition is `docker network disconnect cluster nX`: the node loses its peers and etcd but
keeps its clients, which reach it through `front`.

Tests talk to containers only through the published ports; `docker exec` (engine API) is
used to read a node's health and status file.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import json
import os
import random
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
from testcontainers.core.container import DockerContainer

ROOT = Path(__file__).resolve().parents[3]
TAG = os.environ.get("MQFED_IMAGE_TAG", "dev")
NODE_IMAGE = f"mqfed/node:{TAG}"
ETCD_IMAGE = f"mqfed/etcd:{TAG}"
HAPROXY_IMAGE = f"mqfed/haproxy:{TAG}"
PROMETHEUS_IMAGE = f"mqfed/prometheus:{TAG}"  # compose only
IMAGES = (NODE_IMAGE, ETCD_IMAGE, HAPROXY_IMAGE, PROMETHEUS_IMAGE)
LABEL = "mqfed.test"
# every container and network of this run carries it (with-engine.sh passes its own, to clean
# up after a test process that died without its teardown)
SESSION = os.environ.get("MQFED_TEST_SESSION") or uuid.uuid4().hex[:8]
LOOPBACK = "127.0.0.1"

STARTED: list[str] = []  # what this session started, for the run's summary ("image name")
COMPOSE_PROJECTS: list[str] = []

# testcontainers' reaper (Ryuk) is an image from a registry; we stop what we start ourselves
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")


def engine() -> docker.DockerClient:
    """A client for the local engine; raises docker.errors.DockerException if there is none."""
    client = docker.from_env(timeout=120)
    client.ping()
    return client


def build_images() -> None:
    """Build the images with deploy/docker/build.sh (cached layers make a rebuild quick)."""
    subprocess.run([str(ROOT / "deploy" / "docker" / "build.sh")], check=True, cwd=ROOT)


def missing_images(client: docker.DockerClient) -> list[str]:
    missing = []
    for image in IMAGES:
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            missing.append(image)
    return missing


def _used_networks(client: docker.DockerClient) -> list[ipaddress.IPv4Network]:
    nets = []
    for net in client.networks.list():
        for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
            try:
                nets.append(ipaddress.ip_network(cfg.get("Subnet", ""), strict=False))
            except ValueError:
                pass
    try:  # the host's own routes (other bridges, VPNs) must not be shadowed either
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    except OSError:
        routes = ""
    for line in routes.splitlines():
        try:
            nets.append(ipaddress.ip_network(line.split()[0], strict=False))
        except (ValueError, IndexError):
            pass
    return nets


class _Recorded(DockerContainer):
    def start(self):
        super().start()
        STARTED.append(f"{self.image} {self._name}")
        return self


@dataclass
class Node:
    name: str  # n1, n2, n3
    container: DockerContainer
    cluster_ip: str
    mqtt_port: int = 0
    admin_port: int = 0

    @property
    def id(self) -> str:
        return self.container.get_wrapped_container().id

    def exec(self, *argv: str) -> tuple[int, str]:
        result = self.container.get_wrapped_container().exec_run(list(argv))
        return result.exit_code, result.output.decode(errors="replace")

    def ready(self) -> bool:
        try:
            code, _ = self.exec("mqfed-health", "ready")
        except docker.errors.APIError:
            return False
        return code == 0

    def state(self) -> dict:
        code, out = self.exec("cat", "/var/lib/mqfed/state.json")
        return json.loads(out) if code == 0 else {}


@dataclass
class Cluster:
    client: docker.DockerClient
    prefix: str = field(default_factory=lambda: f"mqfed-t{SESSION}-{uuid.uuid4().hex[:4]}")
    nodes: dict[str, Node] = field(default_factory=dict)
    containers: list[DockerContainer] = field(default_factory=list)
    networks: list = field(default_factory=list)
    front_port: int = 0
    admin_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    peer_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    subnet: ipaddress.IPv4Network | None = None

    # ---- start -----------------------------------------------------------------------------
    def _network(self, suffix: str, **kwargs):
        net = self.client.networks.create(f"{self.prefix}-{suffix}", driver="bridge",
                                          labels={LABEL: SESSION}, **kwargs)
        self.networks.append(net)
        return net

    def _cluster_network(self):
        for _ in range(20):
            used = _used_networks(self.client)
            candidate = ipaddress.ip_network(
                f"10.{random.randint(128, 250)}.{random.randint(0, 255)}.0/24")
            if any(candidate.overlaps(n) for n in used):
                continue
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(
                subnet=str(candidate), gateway=str(candidate.network_address + 1))])
            try:
                net = self._network("cluster", internal=True, ipam=ipam)
            except docker.errors.APIError as exc:
                if "overlap" in str(exc).lower():
                    continue
                raise
            self.subnet = candidate
            return net
        raise RuntimeError("no free private /24 for the cluster network")

    def _container(self, image: str, name: str) -> DockerContainer:
        c = _Recorded(image).with_name(f"{self.prefix}-{name}")
        c.with_kwargs(labels={LABEL: SESSION}, detach=True)
        self.containers.append(c)
        return c

    def _publish(self, c: DockerContainer, port: int) -> None:
        c.ports[f"{port}/tcp"] = (LOOPBACK,)  # docker-py: host IP only, random host port

    def host_port(self, c: DockerContainer, port: int) -> int:
        c.get_wrapped_container().reload()
        bindings = c.get_wrapped_container().attrs["NetworkSettings"]["Ports"][f"{port}/tcp"]
        assert bindings and all(b["HostIp"] == LOOPBACK for b in bindings), bindings
        return int(bindings[0]["HostPort"])

    def start(self, nodes: int = 3, timeout: float = 90.0) -> Cluster:
        self.front = self._network("front")
        self.cluster = self._cluster_network()
        hosts = list(self.subnet.hosts())
        etcd = self._container(ETCD_IMAGE, "etcd")
        etcd.with_kwargs(labels={LABEL: SESSION}, network=self.cluster.name,
                         networking_config={self.cluster.name: self.client.api
                                            .create_endpoint_config(aliases=["etcd"],
                                                                    ipv4_address=str(hosts[1]))})
        etcd.start()
        for i in range(1, nodes + 1):
            name = f"n{i}"
            c = self._container(NODE_IMAGE, name)
            c.with_env("MQFED_NODE_ID", name).with_env("MQFED_GRPC_LISTEN", f"{name}-peer:7001")
            c.with_env("MQFED_ADMIN_LISTEN", f"{name}-front:7101")
            c.with_env("MQFED_ADMIN_TOKEN", self.admin_token)
            c.with_env("MQFED_GRPC_TOKEN", self.peer_token)
            c.with_env("MQFED_MEMBERSHIP_ETCD", "etcd:2379")
            c.with_env("MQFED_LOG_LEVEL", os.environ.get("MQFED_TEST_LOG_LEVEL", "info"))
            c.with_kwargs(labels={LABEL: SESSION}, hostname=name, network=self.front.name,
                          networking_config={self.front.name: self.client.api
                                             .create_endpoint_config(
                                                 aliases=[name, f"{name}-front"])})
            self._publish(c, 1883)
            self._publish(c, 7101)
            c.start()
            # the second network can only be attached after creation (API 1.41); the
            # entrypoint waits until its peer name resolves
            ip = str(hosts[9 + i])
            self.cluster.connect(c.get_wrapped_container().id, aliases=[f"{name}-peer"],
                                 ipv4_address=ip)
            self.nodes[name] = Node(name, c, ip)
        front = self._container(HAPROXY_IMAGE, "front")
        front.with_kwargs(labels={LABEL: SESSION}, network=self.front.name)
        self._publish(front, 1883)
        self._publish(front, 8404)
        front.start()
        for node in self.nodes.values():
            node.mqtt_port = self.host_port(node.container, 1883)
            node.admin_port = self.host_port(node.container, 7101)
        self.front_port = self.host_port(front, 1883)
        self.stats_port = self.host_port(front, 8404)
        self.wait_ready(timeout)
        self.wait_front(list(self.nodes))
        return self

    def front_status(self) -> dict[str, str]:
        """HAProxy's view of the nodes: server name -> UP/DOWN/..."""
        url = f"http://{LOOPBACK}:{self.stats_port}/stats;csv"
        with urllib.request.urlopen(url, timeout=5) as reply:
            rows = csv.DictReader(io.StringIO(reply.read().decode().lstrip("# ")))
            return {r["svname"]: r["status"] for r in rows
                    if r["pxname"] == "nodes" and r["svname"] not in ("FRONTEND", "BACKEND")}

    def wait_front(self, names: list[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        status: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                status = self.front_status()
            except OSError:
                status = {}
            if all(status.get(n) == "UP" for n in names):
                return
            time.sleep(0.3)
        raise TimeoutError(f"HAProxy does not see {names} up: {status}")

    def wait_ready(self, timeout: float = 90.0, nodes: list[str] | None = None) -> None:
        deadline = time.monotonic() + timeout
        pending = set(nodes or self.nodes)
        while pending:
            for name in sorted(pending):
                if self.nodes[name].ready():
                    pending.discard(name)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not ready after {timeout:.0f}s: {sorted(pending)}")
            time.sleep(0.3)

    # ---- faults ----------------------------------------------------------------------------
    def kill(self, name: str) -> None:
        self.client.api.kill(self.nodes[name].id)

    def restart(self, name: str) -> None:
        """`docker start` a killed node's container; its published port may change."""
        node = self.nodes[name]
        node.container.get_wrapped_container().start()
        node.mqtt_port = self.host_port(node.container, 1883)

    def partition(self, name: str) -> None:
        self.cluster.disconnect(self.nodes[name].id)

    def heal(self, name: str) -> None:
        node = self.nodes[name]
        self.cluster.connect(node.id, aliases=[f"{name}-peer"], ipv4_address=node.cluster_ip)

    # ---- stop ------------------------------------------------------------------------------
    def logs(self) -> str:
        out = []
        for c in self.containers:
            try:
                wrapped = c.get_wrapped_container()
                if wrapped is None:
                    continue
                logs = wrapped.logs(tail=80).decode(errors="replace")
                out.append(f"===== {wrapped.name} (docker logs, last 80 lines)\n{logs}")
            except docker.errors.APIError as exc:
                out.append(f"===== {c.image}: no logs ({exc})")
        for node in self.nodes.values():
            try:
                _, text = node.exec("tail", "-n", "40", "/var/lib/mqfed/mosquitto.log")
                out.append(f"===== {node.name} mosquitto.log\n{text}")
            except docker.errors.APIError:
                pass
        return "\n".join(out)

    def stop(self) -> None:
        """Remove every container and network this cluster created (by id)."""
        for c in reversed(self.containers):
            try:
                if c.get_wrapped_container() is not None:
                    c.stop()  # remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                print(f"could not remove container {c.image}: {exc}")
        for net in reversed(self.networks):
            try:
                net.remove()
            except docker.errors.NotFound:
                pass


def sweep(client: docker.DockerClient) -> list[str]:
    """Remove whatever this test session left behind (its own label value only)."""
    left = []
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}={SESSION}"}):
        left.append(c.name)
        c.remove(force=True, v=True)
    for net in client.networks.list(filters={"label": f"{LABEL}={SESSION}"}):
        left.append(net.name)
        net.remove()
    return left
