"""Shared subscriptions across nodes: each message reaches exactly one member cluster-wide."""

from __future__ import annotations

import collections
import time

import pytest

from tests.harness.procs import wait_for
from tests.node.mqtt import Client

COUNT = 10_000


def _members(cluster, group: str, flt: str) -> list[Client]:
    members = []
    for node in ("n1", "n2", "n3"):
        for k in range(2):
            c = Client(cluster.ports[node], f"{group}-{node}-{k}")
            assert c.wait_connected()
            c.subscribe(f"$share/{group}/{flt}", 1)
            members.append(c)
    return members


def _wait_shared_interest(cluster, group: str, flt: str) -> None:
    def ready() -> bool:
        for node in cluster.ports:
            keys = {(g, f) for g, f, _ in cluster.state(node).get("interest", [])}
            if (group, flt) not in keys:
                return False
        return all(cluster.routing(n).get("forwarding_subscriptions", 0) >= 1
                   for n in cluster.ports)
    wait_for(ready, 15, f"$share/{group}/{flt} interest everywhere")


@pytest.mark.parametrize("plain_subscriber", [False, True],
                         ids=["group-only", "group-and-plain-subscriber"])
def test_each_message_reaches_one_member(cluster_factory, plain_subscriber):
    cluster = cluster_factory(3)
    members = _members(cluster, "g", "jobs/#")
    plain = None
    if plain_subscriber:  # makes n2 re-inject every message: its group must not see them
        plain = Client(cluster.ports["n2"], "plain-jobs")
        assert plain.wait_connected()
        plain.subscribe("jobs/#", 1)
        cluster.wait_interest("n2", "jobs/#")
    _wait_shared_interest(cluster, "g", "jobs/#")
    pub = Client(cluster.ports["n1"], "jobs-pub")
    assert pub.wait_connected()
    for i in range(COUNT):
        pub.publish(f"jobs/{i % 10}", str(i).encode(), qos=1, wait=False)

    def delivered() -> int:
        return sum(len(m.messages) for m in members)

    wait_for(lambda: delivered() >= COUNT, 120, f"{COUNT} shared deliveries")
    time.sleep(1.5)
    counts = collections.Counter(int(msg.payload) for m in members for msg in m.messages)
    duplicates = {k: v for k, v in counts.items() if v > 1}
    assert not duplicates, f"{len(duplicates)} messages delivered more than once"
    assert len(counts) == COUNT, f"lost {COUNT - len(counts)}"
    per_member = [len(m.messages) for m in members]
    assert all(per_member), f"every member gets some: {per_member}"
    if plain is not None:
        assert len(plain.wait_count(COUNT, timeout=30)) == COUNT
        plain.close()
    for c in members + [pub]:
        c.close()
