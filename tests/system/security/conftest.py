"""Fixtures of the attack tests (issue 16): one real 2-node cluster (`mqfed up --detach`:
etcd, Mosquitto with the plugin, sidecars, random tokens) shared by a module, always brought
down by PID; and the plugin and node fixtures (a real Mosquitto with the mqfed plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system.admin.conftest import AdminCluster
from tests.system.cluster.conftest import detached_cluster
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
    with detached_cluster("mqfed-sec-", nodes=2) as (path, info):
        yield AdminCluster(path, info)
