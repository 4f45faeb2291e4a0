"""One real 3-node cluster (`mqfed up --detach`) shared by the admin tests of a module, and
helpers to run `mqfed ctl` against it and scrape its metrics. Always brought down by PID."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.metrics import parse_metrics
from tests.system.cluster.conftest import detached_cluster, mqfed


@dataclass
class Ctl:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


class AdminCluster:
    def __init__(self, run_dir: Path, info: dict) -> None:
        self.run_dir = run_dir
        self.info = info
        self.token_file = info["admin_token_file"]
        self.nodes = {n["id"]: n for n in info["nodes"]}

    def port(self, node: str, what: str = "mqtt") -> int:
        return int(self.nodes[node][what].rpartition(":")[2])

    def admin(self, node: str) -> str:
        return self.nodes[node]["admin"]

    def ctl(self, *args: str, node: str = "n1", token: bool | str = True) -> Ctl:
        """`mqfed ctl --node <node's admin>`, with the cluster's token file (True), no token
        (False) or `--token <token>`."""
        auth: tuple[str, ...] = ()
        if token is True:
            auth = ("--token-file", self.token_file)
        elif token:
            auth = ("--token", token)
        r = mqfed("ctl", "--node", self.admin(node), *auth, *args, timeout=60,
                  env={"MQFED_ADMIN_TOKEN": "", "MQFED_ADMIN_TOKEN_FILE": ""})
        return Ctl(r.returncode, r.stdout, r.stderr)

    def http(self, node: str, path: str) -> tuple[int, str]:
        url = f"http://{self.nodes[node]['metrics']}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self, node: str) -> dict[tuple[str, tuple], float]:
        """Every sample of the node's /metrics: (name, sorted labels) -> value."""
        status, text = self.http(node, "/metrics")
        assert status == 200, text
        return parse_metrics(text)


@pytest.fixture(scope="module")
def cluster() -> Iterator[AdminCluster]:
    # no session replicas: the routes and traces checked here are those of the clients'
    # own nodes (a replica elsewhere adds its routes and hops: tests/system/sessions)
    with detached_cluster("mqfed-admin-", env={"MQFED_SESSIONS_REPLICAS": "1"}) as (path, info):
        yield AdminCluster(path, info)


# `nodes`: real single `mqfed node` processes (tests/node), stopped by PID after each test
from tests.system.node.conftest import nodes  # noqa: E402, F401
