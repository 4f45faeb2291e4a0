"""One real 2-node cluster (`mqfed up --detach`: etcd, Mosquitto with the plugin, sidecars)
for the whole package, after one QoS 1 message crossed it, so that the peer-labelled series
exist."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import connect, detached_cluster


@pytest.fixture(scope="package")
def cluster() -> Iterator[dict[str, dict]]:
    """node id -> its `mqfed up --json` entry, once a message crossed the 2-node cluster."""
    with detached_cluster("mqfed-observability-", nodes=2) as (_, info):
        nodes = {n["id"]: n for n in info["nodes"]}
        sub = connect(int(nodes["n1"]["mqtt"].rpartition(":")[2]))
        pub = connect(int(nodes["n2"]["mqtt"].rpartition(":")[2]))
        try:
            sub.subscribe("obs/t")

            def delivered() -> bool:  # repeated until n2 has learnt n1's interest
                pub.publish("obs/t", b"x")
                return sub.received("obs/t", b"x")
            wait_for(delivered, 30, "a QoS 1 message from n2 to n1's subscriber", interval=0.3)
            yield nodes
        finally:
            sub.close()
            pub.close()
