"""Shared subscriptions across nodes: each message reaches exactly one member cluster-wide."""

from __future__ import annotations

import collections
import time

import pytest

from tests.harness.procs import wait_for
from tests.system.node.mqtt import Client

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


def _wait_shared_interest(cluster, group: str, flt: str, members_on=("n1", "n2", "n3")) -> None:
    def ready() -> bool:
        for node in members_on:
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
        if i % 100 == 99:
            # at most ~2,500 msgs/s: flat out, this 2-core machine can fall behind far enough
            # that the origin sheds the publisher, whose QoS 1 resends may then be duplicates
            time.sleep(0.04)

    def delivered() -> int:
        return sum(len(m.messages) for m in members)

    wait_for(lambda: delivered() >= COUNT, 120, f"{COUNT} shared deliveries")
    time.sleep(1.5)
    counts = collections.Counter(int(msg.payload) for m in members for msg in m.messages)
    duplicates = {k: v for k, v in counts.items() if v > 1}
    shed = cluster.metrics("n1").get(("mqfed_publishers_shed_total", ()), 0)
    assert not duplicates, (f"{len(duplicates)} messages delivered more than once (publisher "
                            f"shed {shed:g} times)")
    assert len(counts) == COUNT, f"lost {COUNT - len(counts)}"
    per_member = [len(m.messages) for m in members]
    assert all(per_member), f"every member gets some: {per_member}"
    if plain is not None:
        assert len(plain.wait_count(COUNT, timeout=30)) == COUNT
        plain.close()
    for c in members + [pub]:
        c.close()


def test_members_leaving_lose_nothing_and_stop_receiving(cluster_factory):
    """Members on n2 leave mid-stream: what is in flight to n2 moves to the remaining member on
    n3 (n2 rejects, the origin re-routes), nothing is lost or doubled, and the leavers get
    nothing after they left."""
    cluster = cluster_factory(3)
    leavers = [Client(cluster.ports["n2"], f"leaver-{k}") for k in range(2)]
    stayer = Client(cluster.ports["n3"], "stayer")
    for c in [*leavers, stayer]:
        assert c.wait_connected()
        c.subscribe("$share/w/work/#", 1)
    _wait_shared_interest(cluster, "w", "work/#", members_on=("n2", "n3"))
    pub = Client(cluster.ports["n1"], "work-pub")
    assert pub.wait_connected()
    total = 3000
    for i in range(total):
        pub.publish(f"work/{i % 5}", str(i).encode(), qos=1, wait=False)
        if i == total // 3:
            for c in leavers:
                c.unsubscribe("$share/w/work/#")
            left_at = [len(c.messages) for c in leavers]
    everyone = [*leavers, stayer]
    wait_for(lambda: sum(len(c.messages) for c in everyone) >= total, 60, "all deliveries")
    time.sleep(1.5)
    counts = collections.Counter(int(m.payload) for c in everyone for m in c.messages)
    assert len(counts) == total, f"lost {total - len(counts)}"
    assert max(counts.values()) == 1, "a message was delivered twice"
    late = [len(c.messages) - n for c, n in zip(leavers, left_at, strict=True)]
    assert sum(late) < 50, f"leavers kept receiving after they left: {late}"
    assert len(stayer.messages) > total // 2
    for c in [*everyone, pub]:
        c.close()
