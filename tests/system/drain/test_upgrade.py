"""An upgrade node by node from an earlier version that has the drain (issue 20): three nodes
of `MQFED_DRAIN_COMMIT` (default: the last version that landed before this one), then, for
each in turn, `mqfed ctl drain NODE --wait`, its graceful stop, and this tree started on the
same run dir. Under continuous QoS 1 traffic with 100 persistent-session subscribers through
the front: `mqfed audit` over the traces finds nothing lost, every session resumes with
session present, and the duplicates are printed. While it runs the cluster mixes the two
versions (old and new nodes hand sessions to each other both ways).

Upgrading from a version without the drain (1.2 and earlier) is test_mixed_versions.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.cluster.conftest import REPO, mqfed
from tests.system.drain import versions
from tests.system.drain.traffic import under_traffic

DRAIN_COMMIT = os.environ.get("MQFED_DRAIN_COMMIT", "c2b5853")
"""An earlier version with the drain (peer protocol 1.3): the tree of the last stop that
landed before this work."""


@pytest.fixture(scope="module")
def drain_tree() -> Iterator[Path]:
    with versions.old_tree(DRAIN_COMMIT) as tree:
        yield tree


def test_upgrade_node_by_node_with_drain_loses_nothing(mixed, drain_tree, tmp_path):
    cluster = mixed
    cluster.start_etcd()
    for ident in ("n1", "n2", "n3"):
        cluster.start_node(ident, drain_tree)
    for ident in cluster.nodes:
        cluster.wait_ready(ident)
    cluster.wait_meshed()
    cluster.start_front()
    drains: list[str] = []

    def upgrade() -> None:
        for ident in ("n1", "n2", "n3"):
            drained = mqfed("ctl", "--node", cluster.admin(ident), "drain", ident, "--wait",
                            "--wait-timeout", "90", timeout=120)
            assert drained.returncode == 0, drained.stderr[-2000:]
            cluster.stop_node(ident)
            cluster.start_node(ident, REPO)
            cluster.wait_ready(ident)
            cluster.wait_meshed()
            last = drained.stdout.strip().splitlines()[-1:] or [""]
            drains.append(f"{ident}: {last[0]}")

    outcome = under_traffic(cluster.front, upgrade, tmp_path / "traces")
    print(f"upgrade of 3 nodes from {DRAIN_COMMIT} ({'; '.join(drains)}): {outcome.line()}")
    assert all(node.tree == REPO for node in cluster.nodes.values())
    assert outcome.summary["lost"] == 0, outcome.summary["lost_ranges"][:5]
    assert all(outcome.reconnects), "every subscriber was moved at least once"
    assert all(all(r) for r in outcome.reconnects), "a session did not resume"
