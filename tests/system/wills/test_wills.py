"""Wills of clients whose node died or drained (issue 19), against real clusters: Mosquitto with
the plugin, sidecars, etcd, gRPC. A whole node is killed with -9 (`mqfed stop-node --kill`) or
drained (`mqfed stop-node`, SIGTERM)."""

from __future__ import annotations

import os
import signal
import time

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.wills.clients import Subscriber, WillClient
from tests.system.wills.conftest import GRACE, LEASE_TTL


def _kill(cluster, node: str) -> float:
    """SIGKILL `node`'s sidecar and Mosquitto; returns when (monotonic: just before the
    command, which itself takes a while on a loaded machine; the survivors count their
    grace from the moment the streams go down, inside it)."""
    started = time.monotonic()
    result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), node, "--kill")
    assert result.returncode == 0, result.stderr
    return started


def _published(cluster, nodes: list[str]) -> dict[str, int]:
    """Wills each node published on behalf of a dead node (its metric)."""
    out = {}
    for node in nodes:
        metrics = cluster.metrics(node)
        out[node] = int(metrics.get(("mqfed_wills_published_total",
                                     (("reason", "dead_node"),)), 0))
    return out


def _wait_wills_known(cluster, nodes: list[str], count: int) -> None:
    """Every node holds `count` pending will records (the wills were replicated)."""
    wait_for(lambda: all((cluster.state(n).get("wills") or {}).get("pending", 0) >= count
                         for n in nodes), 10, f"{count} wills replicated to {nodes}")


def test_killed_node_will_reaches_every_other_node_once(will_cluster):
    cluster = will_cluster(4)
    survivors = ["n2", "n3", "n4"]
    subs = {n: Subscriber(cluster.ports[n], f"sub-{n}", "dead/#") for n in survivors}
    for n in survivors:
        cluster.wait_interest(n, "dead/#")
    victim = WillClient(cluster.ports["n1"], "dev-1", "dead/dev-1", b"dev-1 is gone")
    keeper = WillClient(cluster.ports["n1"], "dev-2", "dead/dev-2/state", b"offline",
                        retain=True, expiry=60)
    _wait_wills_known(cluster, survivors, 2)
    try:
        killed = _kill(cluster, "n1")
        assert victim.down.wait(5) and keeper.down.wait(5), "the clients lost their node"
        for n, sub in subs.items():
            wait_for(lambda s=sub: len(s.messages("dead/dev-1")) >= 1, 30,
                     f"dev-1's will at {n}")
        took = {n: sub.messages("dead/dev-1")[0][0] - killed for n, sub in subs.items()}
        # dead = lease expired (at most TTL after the kill: the last keepalive was up to a
        # third of it before) and streams down for the grace (counted from the kill)
        print(f"\nwill of a client of a node killed with -9 reached the other nodes after "
              f"{min(took.values()):.2f}-{max(took.values()):.2f} s (lease TTL {LEASE_TTL} s, "
              f"grace {GRACE} s: expected max(lease expiry, grace) <= {max(LEASE_TTL, GRACE)}"
              f" s, at most TTL + grace = {LEASE_TTL + GRACE} s)")
        # the retained one too, everywhere (retained replication), also for a new subscriber
        for n, sub in subs.items():
            wait_for(lambda s=sub: len(s.messages("dead/dev-2/state")) >= 1, 10,
                     f"dev-2's retained will at {n}")
        late = Subscriber(cluster.ports["n3"], "late", "dead/dev-2/state")
        wait_for(lambda: late.messages(), 10, "the retained will for a later subscriber")
        assert late.messages()[0][1].retain and late.messages()[0][1].payload == b"offline"
        late.close()
        time.sleep(2.0)  # any second publication would have arrived by now
        for n, sub in subs.items():
            got = sub.messages("dead/dev-1")
            assert len(got) == 1, f"{n} got dev-1's will {len(got)} times"
            msg = got[0][1]
            assert msg.payload == b"dev-1 is gone" and msg.qos == 1
            assert ("from", "dev-1") in (msg.properties.UserProperty or [])
            assert len(sub.messages("dead/dev-2/state")) == 1, n
        counts = _published(cluster, survivors)
        assert sum(counts.values()) == 2, f"exactly one survivor published each will: {counts}"
        # it counts as a confirmed death, not before the lease expired plus the grace
        assert all(t >= GRACE for t in took.values()), took
    finally:
        for sub in subs.values():
            sub.close()


def test_will_delay_honoured_and_skipped_for_a_client_back_elsewhere(will_cluster):
    cluster = will_cluster(3)
    sub = Subscriber(cluster.ports["n3"], "sub-delay", "delay/#")
    cluster.wait_interest("n3", "delay/#")
    delay = 8
    stays = WillClient(cluster.ports["n1"], "stays-away", "delay/stays", b"late", delay=delay,
                       expiry=60)
    returns = WillClient(cluster.ports["n1"], "comes-back", "delay/returns", b"never",
                         delay=delay, expiry=60)
    _wait_wills_known(cluster, ["n2", "n3"], 2)
    try:
        killed = _kill(cluster, "n1")
        assert returns.down.wait(5) and stays.down.wait(5), "the clients saw their node go"
        returns.connect(cluster.ports["n2"], timeout=15)  # within the delay, on another node
        wait_for(lambda: sub.messages("delay/stays"), delay + LEASE_TTL + GRACE + 15,
                 "the delayed will")
        took = sub.messages("delay/stays")[0][0] - killed
        print(f"\ndelayed will ({delay} s) of a client of a killed node arrived after "
              f"{took:.2f} s")
        assert took >= delay - 0.5, f"published before its Will Delay Interval: {took:.2f} s"
        time.sleep(3.0)
        assert not sub.messages("delay/returns"), "the client came back: no will"
        assert len(sub.messages("delay/stays")) == 1
        # its new connection's will (armed on n2) replaced the old one everywhere
        assert sum(_published(cluster, ["n2", "n3"]).values()) == 1
    finally:
        returns.close()
        sub.close()


def test_drain_hands_a_delayed_will_to_a_survivor(will_cluster):
    cluster = will_cluster(3)
    subs = {n: Subscriber(cluster.ports[n], f"sub-{n}", "drained/#") for n in ("n2", "n3")}
    for n in subs:
        cluster.wait_interest(n, "drained/#")
    delay = 8  # due well after the drain hands the wills over (about 3 s after the kick)
    WillClient(cluster.ports["n1"], "drained-dev", "drained/dev", b"after drain", delay=delay,
               expiry=60)
    _wait_wills_known(cluster, ["n2", "n3"], 1)
    try:
        started = time.monotonic()
        result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n1")  # SIGTERM: drain
        assert result.returncode == 0, result.stderr
        for n, sub in subs.items():
            wait_for(lambda s=sub: s.messages("drained/dev"), delay + 15,
                     f"the delayed will at {n}")
        took = min(s.messages("drained/dev")[0][0] for s in subs.values()) - started
        print(f"\ndelayed will ({delay} s) of a client kicked by a drain arrived after "
              f"{took:.2f} s")
        assert took >= delay - 0.5, took
        time.sleep(2.0)
        for n, sub in subs.items():
            assert len(sub.messages("drained/dev")) == 1, n
        published = sum(int(cluster.metrics(n).get(
            ("mqfed_wills_published_total", (("reason", "leaving"),)), 0)) for n in subs)
        assert published == 1
    finally:
        for sub in subs.values():
            sub.close()


def test_node_taken_for_dead_that_returns_is_counted(will_cluster):
    """n1's sidecar stalls (SIGSTOP) long enough for its lease to expire and its streams to be
    declared dead: the others confirm it dead and publish the will of its client, which is in
    fact still connected to n1's Mosquitto. When it resumes with the same incarnation, that is
    counted as a false death (on the survivors) and as a will published while its client was
    online (on n1)."""
    cluster = will_cluster(3)
    sub = Subscriber(cluster.ports["n2"], "sub-false", "false/#")
    cluster.wait_interest("n2", "false/#")
    dev = WillClient(cluster.ports["n1"], "still-here", "false/dev", b"not really gone")
    _wait_wills_known(cluster, ["n2", "n3"], 1)
    pid = cluster.sidecar_pid("n1")
    incarnation = cluster.routing("n1")["incarnation"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: sub.messages("false/dev"), 30, "the will of the stalled node's client")
        assert not dev.down.is_set(), "its client stayed connected to n1's Mosquitto"
        wait_for(lambda: all(cluster.metrics(n).get(("mqfed_node_deaths_confirmed_total", ()))
                             for n in ("n2", "n3")), 20, "both survivors confirmed n1 dead")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: sum(int(cluster.metrics(n).get(("mqfed_will_false_death_total", ()), 0))
                         for n in ("n2", "n3")) == 2, 30, "both survivors count a false death")
    assert cluster.routing("n1")["incarnation"] == incarnation
    wait_for(lambda: int(cluster.metrics("n1").get(
        ("mqfed_wills_published_while_online_total", ()), 0)) == 1, 20,
        "n1 counts its client's will published while it was online")
    dev.close()
    sub.close()
