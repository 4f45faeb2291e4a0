"""A real local cluster (`mqfed up --detach`) per test, always brought down."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.metrics import parse_metrics
from tests.harness.procs import wait_for
from tests.system.cluster.conftest import PLUGIN, base_port, cleanup, logs_of, mqfed


class Cluster:
    def __init__(self, run_dir: Path, info: dict) -> None:
        self.run_dir = run_dir
        self.info = info
        self.front = int(info["front"].rpartition(":")[2])
        self.ports = {n["id"]: int(n["mqtt"].rpartition(":")[2]) for n in info["nodes"]}

    def state(self, node: str) -> dict:
        path = self.run_dir / "nodes" / node / "state.json"
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def routing(self, node: str) -> dict:
        return self.state(node).get("routing") or {}

    def metrics(self, node: str) -> dict[tuple[str, tuple], float]:
        """The node's /metrics: (name, sorted labels) -> value."""
        address = next(n["metrics"] for n in self.info["nodes"] if n["id"] == node)
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
            return parse_metrics(resp.read().decode())

    def wait_meshed(self, timeout: float = 20.0) -> None:
        """Every node's outbound stream to every other node is up."""
        ids = list(self.ports)

        def missing() -> list[str]:
            out = []
            for node in ids:
                peers = self.routing(node).get("peers", {})
                for other in ids:
                    peer = peers.get(other, {})
                    state = peer.get("outbound", {}).get("state")
                    if other != node and state != "up":
                        out.append(f"{node}->{other} {state or 'unknown to the transport'}"
                                   f" ({peer.get('last_error')})")
            return out

        try:
            wait_for(lambda: not missing(), timeout, "all peer streams up")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; not up: {'; '.join(missing())}") from None

    def sidecar_pid(self, node: str) -> int:
        return int(self.state(node)["pid"])

    def grpc_port(self, node: str) -> int:
        return int(next(n["grpc"] for n in self.info["nodes"]
                        if n["id"] == node).rpartition(":")[2])

    def advertise_via(self, node: str, address: str) -> None:
        """Restart `node`'s sidecar (its Mosquitto stays) advertising `address` (a proxy of
        its gRPC port) to its peers, so that every stream to it passes there."""
        result = mqfed("stop-node", "--run-dir", str(self.run_dir), node, "--sidecar-only")
        assert result.returncode == 0, result.stderr
        result = mqfed("start-node", "--run-dir", str(self.run_dir), node,
                       env={"MQFED_GRPC_ADVERTISE": address})
        assert result.returncode == 0, result.stderr
        others = [o for o in self.ports if o != node]
        wait_for(lambda: all(self.routing(o).get("peers", {}).get(node, {}).get("address")
                             == address for o in others), 20, f"peers dial {node} at {address}")
        self.wait_meshed()

    def wait_interest(self, node: str, filt: str, timeout: float = 10.0) -> None:
        """Every other node subscribes `filt` on its Mosquitto for `node`'s clients."""
        def seen() -> bool:
            return all(self.routing(o).get("forwarding_subscriptions", 0) > 0
                       and [None, filt] in [r[:2] for r in self.state(node).get("interest", [])]
                       for o in self.ports if o != node)
        wait_for(seen, timeout, f"interest in {filt} from {node}")


def _need_plugin() -> None:
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")


def _new_run_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="mqfed-routing-", dir="/tmp"))
    path.chmod(0o755)
    return path


def _start(path: Path, nodes: int, env: dict[str, str] | None = None) -> Cluster:
    """`mqfed up` in `path` (nodes get `env`: MQFED_* settings), then wait until every peer
    stream is up."""
    result = mqfed("up", "--nodes", str(nodes), "--detach", "--json", "--base-port",
                   str(base_port(nodes)), "--run-dir", str(path), timeout=120, env=env)
    assert result.returncode == 0, result.stderr + logs_of(path)
    cluster = Cluster(path, json.loads(result.stdout))
    cluster.wait_meshed()
    return cluster


def _finish(path: Path, failed: bool) -> None:
    """Bring the cluster down by PID; keep its folder (and print its logs) if anything failed."""
    if failed:
        print(logs_of(path))
    left = cleanup(path)
    if left and not failed:
        print(logs_of(path))
    if not failed and not left:
        shutil.rmtree(path, ignore_errors=True)
    assert not left, f"processes of {path} still running: {left}"


def module_cluster(env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A 3-node cluster (nodes get `env`), brought down after the module."""
    _need_plugin()
    path = _new_run_dir()
    try:
        yield _start(path, 3, env)
    finally:
        _finish(path, failed=False)


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[Cluster]:
    """One 3-node cluster for a whole test module (for many small independent checks)."""
    yield from module_cluster()


@pytest.fixture
def cluster_factory(request: pytest.FixtureRequest) -> Iterator:
    _need_plugin()
    dirs: list[Path] = []

    def start(nodes: int = 3, env: dict[str, str] | None = None) -> Cluster:
        dirs.append(_new_run_dir())
        return _start(dirs[-1], nodes, env)

    try:
        yield start
    finally:
        failed = any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False)
                     for when in ("setup", "call"))
        for path in dirs:
            _finish(path, failed)
