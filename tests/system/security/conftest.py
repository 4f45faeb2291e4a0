"""Fixtures of the attack tests (issue 16): one real 2-node cluster (`mqfed up --detach`:
etcd, Mosquitto with the plugin, sidecars, random tokens) shared by a module, always brought
down by PID; and the plugin and node fixtures (a real Mosquitto with the mqfed plugin)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.admin.conftest import AdminCluster
from tests.system.cluster.conftest import PLUGIN, base_port, cleanup, logs_of, mqfed
from tests.system.node.conftest import nodes  # noqa: F401 (fixture)
from tests.system.plugin.conftest import (  # noqa: F401 (fixtures)
    broker,
    client_factory,
    clients,
    make_broker,
    plugin_so,
    sidecar,
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[AdminCluster]:
    if not PLUGIN.exists():
        pytest.skip(f"plugin not built at {PLUGIN}: run `make install`")
    path = Path(tempfile.mkdtemp(prefix="mqfed-sec-", dir="/tmp"))
    path.chmod(0o755)
    ok = False
    try:
        result = mqfed("up", "--nodes", "2", "--detach", "--json", "--base-port",
                       str(base_port(2)), "--run-dir", str(path), timeout=120)
        assert result.returncode == 0, result.stderr + logs_of(path)
        yield AdminCluster(path, json.loads(result.stdout))
        ok = True
    finally:
        if not ok:
            print(logs_of(path))
        left = cleanup(path)
        if ok and not left:
            shutil.rmtree(path, ignore_errors=True)
        assert not left, f"processes of {path} still running: {left}"
