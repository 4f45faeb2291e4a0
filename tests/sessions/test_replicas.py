"""Replicas of persistent sessions in the registry core: where they are, when they queue, and
what happens to them when the client comes back, moves, or its owner dies."""

from __future__ import annotations

from sidecar.sessions.registry import (
    Admit,
    Discard,
    Drain,
    Hold,
    Materialize,
    Resubscribe,
    SessionRegistry,
)
from tests.sessions.test_registry import Cluster


class Replicated(Cluster):
    """Nodes n1..nN with `replicas` 2, every stream up; replica materializations and discards
    succeed when `finish` is called."""

    def __init__(self, n: int = 3, replicas: int = 2) -> None:
        super().__init__(n)
        names = set(self.nodes)
        self.nodes = {k: SessionRegistry(k, replicas=replicas, started_ms=self.now)
                      for k in sorted(names)}
        for k, reg in self.nodes.items():
            reg.on_peers(names - {k}, self.now)

    def finish(self, node: str) -> None:
        """Complete the node's pending shadow operations (replicate/materialize, discard)."""
        reg = self.nodes[node]
        for _ in range(10):
            made = self.take(node, Materialize) + self.take(node, Resubscribe)
            gone = self.take(node, Discard)
            if not made and not gone:
                return
            for m in made:
                client = m.client if isinstance(m, Resubscribe) else m.record.client
                self.run(node, reg.on_materialized(client, True, self.now))
            for d in gone:
                self.run(node, reg.on_discarded(d.client, True, self.now))

    def replica_of(self, client: str, owner: str) -> str:
        return self.nodes[owner].replica_nodes(client, owner)[0]

    def kill(self, node: str) -> None:
        """`node` stops: every other node's stream to it goes down."""
        del self.nodes[node]
        for k, reg in self.nodes.items():
            self.run(k, reg.on_peers(set(self.nodes) - {k}, self.now))

    def tick(self, ms: int) -> None:
        self.now += ms
        for k, reg in self.nodes.items():
            self.run(k, reg.on_tick(self.now))


def online_with_replica(c: Replicated, filters: tuple[str, ...] = ("a/#",)) -> str:
    """`dev` online on n1 subscribed to `filters` (QoS 1), its replica made; returns where."""
    c.connect("n1", "dev")
    for f in filters:
        c.run("n1", c.nodes["n1"].on_subscribe("dev", f, 1, c.now))
    rep = c.replica_of("dev", "n1")
    for node in c.nodes:
        c.finish(node)
    return rep


def test_one_other_node_holds_a_replica_held_with_a_ring_while_the_client_is_online():
    c = Replicated()
    rep = online_with_replica(c)
    other = ({"n2", "n3"} - {rep}).pop()
    assert c.nodes[rep].replica["dev"] == ("n1", frozenset({("a/#", 1)}))
    assert c.nodes[rep].presence["dev"] == "session"
    holds = c.take(rep, Hold)
    assert holds[-1] == Hold("dev", True, ring=True)
    assert "dev" not in c.nodes[other].replica and "dev" not in c.nodes["n1"].replica
    # a connect there would take the replica's session: it stays denied
    assert "dev" in c.nodes[rep].denied


def test_the_replica_queues_from_the_disconnect_minus_the_margin():
    c = Replicated()
    rep = online_with_replica(c)
    c.take(rep, Hold)
    c.disconnect("n1", "dev")
    since = c.nodes["n1"].records["dev"].since_ms
    assert c.take(rep, Hold) == [Hold("dev", False, since_ms=since - 1_000)]
    assert "dev" in c.nodes[rep].queueing


def test_a_client_back_on_its_owner_has_its_replica_made_again_held():
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev")
    c.take(rep, Hold)
    c.connect("n1", "dev", present=True)
    assert c.take(rep, Discard) == [Discard("dev")]
    c.run(rep, c.nodes[rep].on_discarded("dev", True, c.now))
    c.finish(rep)
    assert c.nodes[rep].replica["dev"][0] == "n1"
    assert "dev" not in c.nodes[rep].queueing
    assert c.take(rep, Hold)[-1] == Hold("dev", True, ring=True)


def test_owner_dead_while_offline_a_connect_on_the_replica_promotes_it():
    c = Replicated()
    rep = online_with_replica(c)
    other = ({"n2", "n3"} - {rep}).pop()
    c.disconnect("n1", "dev")
    c.kill("n1")
    # before the grace has passed the client is told to retry; the grace passed, the replica
    # is promoted and admits it (its claim holds: it tried here)
    assert c.nodes[rep].on_connect_rejected("dev", "denied", c.now) == []
    c.take(rep, Admit)
    c.tick(1_500)
    assert c.take(rep, Admit) == [Admit("dev")] and not c.take(rep, Discard)
    assert c.nodes[rep].counters["promoted"] == 1
    c.connect(rep, "dev", present=True)
    assert c.nodes[other].records["dev"].owner == rep
    assert not c.take(other, Drain)
    assert c.nodes[rep].records["dev"].subscriptions == {"a/#": 1}


def test_owner_dead_a_connect_elsewhere_gets_the_replica_drained_to_it():
    c = Replicated()
    rep = online_with_replica(c)
    other = ({"n2", "n3"} - {rep}).pop()
    c.disconnect("n1", "dev")
    c.kill("n1")
    c.tick(1_500)
    c.take(rep, Hold)
    # the client resumes on the node without a replica
    acts = c.nodes[other].on_connect_rejected("dev", "denied", c.now)
    c.run(other, acts)
    c.finish(other)
    c.connect(other, "dev", present=True)
    drains = c.take(rep, Drain)
    assert drains == [Drain("dev", other, ("a/#",))]


def test_owner_alive_a_connect_on_the_replica_deletes_it_and_the_owner_drains():
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev")
    acts = c.nodes[rep].on_connect_rejected("dev", "denied", c.now)
    assert Discard("dev", urgent=True) in acts and "dev" not in c.nodes[rep].replica
    c.run(rep, acts)
    c.take(rep, Discard)
    c.run(rep, c.nodes[rep].on_discarded("dev", True, c.now))
    made = c.take(rep, Materialize)
    assert made and not made[0].replica  # made for the arriving client, then admitted
    c.run(rep, c.nodes[rep].on_materialized("dev", True, c.now))
    assert "dev" not in c.nodes[rep].denied
    c.connect(rep, "dev", present=True)
    assert c.take("n1", Drain) == [Drain("dev", rep, ("a/#",))]


def test_owner_dead_while_online_the_replica_queues_from_its_death_minus_the_margin():
    c = Replicated()
    rep = online_with_replica(c)
    c.take(rep, Hold)
    killed_at = c.now
    c.kill("n1")
    assert not c.take(rep, Hold)  # not before the grace
    c.tick(1_500)
    assert c.take(rep, Hold) == [Hold("dev", False, since_ms=killed_at - 5_000)]


def test_a_replica_follows_its_client_s_subscriptions_by_their_difference():
    c = Replicated()
    rep = online_with_replica(c)
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "b/#", 2, c.now))
    c.run("n1", c.nodes["n1"].on_unsubscribe("dev", "a/#", c.now))
    assert c.take(rep, Resubscribe) == [Resubscribe("dev", {"b/#": 2}, ())]
    assert not c.take(rep, Discard)
    # a change while the first is applied waits for it, then goes as its own difference
    c.run(rep, c.nodes[rep].on_materialized("dev", True, c.now))
    assert c.nodes[rep].replica["dev"][1] == frozenset({("a/#", 1), ("b/#", 2)})
    assert c.take(rep, Resubscribe) == [Resubscribe("dev", {}, ("a/#",))]
    c.run(rep, c.nodes[rep].on_materialized("dev", True, c.now))
    assert c.nodes[rep].replica["dev"][1] == frozenset({("b/#", 2)})
    assert not c.take(rep, Discard)


def test_replicas_all_and_one():
    c = Replicated(n=4, replicas=0)
    c.connect("n1", "dev")
    assert sorted(c.nodes["n1"].replica_nodes("dev", "n1")) == ["n2", "n3", "n4"]
    c1 = Replicated(replicas=1)
    c1.connect("n1", "dev")
    assert c1.nodes["n2"].replica_nodes("dev", "n1") == []
    assert not c1.take("n2", Materialize) and not c1.take("n3", Materialize)


def test_every_node_agrees_on_the_replica():
    c = Replicated(n=5, replicas=3)
    for i in range(50):
        views = {tuple(sorted(r.replica_nodes(f"c{i}", "n1"))) for r in c.nodes.values()
                 if r.node_id != "n1"}
        # each node ranks itself among the up nodes; all see the same set
        assert len({tuple(sorted(c.nodes["n1"].replica_nodes(f"c{i}", "n1")))} | views) == 1


def test_a_connect_elsewhere_before_the_owner_is_known_dead_waits_for_it():
    c = Replicated()
    rep = online_with_replica(c)
    other = ({"n2", "n3"} - {rep}).pop()
    c.disconnect("n1", "dev")
    c.kill("n1")
    c.take(rep, Hold)
    c.run(other, c.nodes[other].on_connect_rejected("dev", "denied", c.now))
    c.finish(other)
    c.connect(other, "dev", present=True)
    assert not c.take(rep, Drain) and not c.take(rep, Discard)  # n1 may only be cut off
    c.tick(1_500)
    assert c.take(rep, Drain) == [Drain("dev", other, ("a/#",))]


def test_owner_killed_with_its_client_online_elsewhere_the_replica_replays_then_drains():
    c = Replicated()
    rep = online_with_replica(c)
    other = ({"n2", "n3"} - {rep}).pop()
    c.take(rep, Hold)
    killed_at = c.now
    c.kill("n1")
    c.run(other, c.nodes[other].on_connect_rejected("dev", "denied", c.now))
    c.finish(other)
    c.connect(other, "dev", present=True)
    assert not c.take(rep, Drain) and not c.take(rep, Discard)
    c.tick(1_500)
    assert c.take(rep, Hold) == [Hold("dev", False, since_ms=killed_at - 5_000)]
    assert c.take(rep, Drain) == [Drain("dev", other, ("a/#",))]


def test_an_owner_that_lost_its_copy_hands_the_session_to_its_replica():
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev")
    since = c.nodes["n1"].records["dev"].since_ms
    c.take(rep, Hold)
    # n1's Mosquitto restarted: its snapshot holds nothing
    c.now += 100
    c.run("n1", c.nodes["n1"].on_local_snapshot({}, set(), c.now))
    assert not c.take("n1", Materialize)
    for node in c.nodes:
        assert c.nodes[node].records["dev"].owner == rep
        assert c.nodes[node].records["dev"].since_ms == since
    assert "dev" not in c.nodes[rep].replica and c.nodes[rep].counters["adopted"] == 1
    assert c.nodes[rep].held["dev"][1] is True  # handed over if the client moves on
    assert "dev" not in c.nodes[rep].denied  # the client resumes there directly
    assert "dev" in c.nodes["n1"].denied


def test_an_owner_that_lost_its_copy_while_online_hands_it_over_with_a_lookback():
    c = Replicated()
    rep = online_with_replica(c)
    c.take(rep, Hold)
    c.now += 100
    c.run("n1", c.nodes["n1"].on_local_snapshot({}, set(), c.now))
    record = c.nodes[rep].records["dev"]
    assert record.owner == rep and not record.online
    assert c.take(rep, Hold) == [Hold("dev", False, since_ms=c.now - 5_000 - 1_000)]


def test_two_nodes_without_a_copy_do_not_hand_a_session_back_and_forth():
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev")
    # the replica's Mosquitto restarted too: it lost the replica
    c.run(rep, c.nodes[rep].on_local_snapshot({}, set(), c.now))
    c.take(rep, Materialize)
    c.nodes[rep].busy.pop("dev", None)
    c.run("n1", c.nodes["n1"].on_local_snapshot({}, set(), c.now))
    owners = {c.nodes[n].records["dev"].owner for n in c.nodes}
    assert len(owners) == 1
    made = c.take(owners.pop(), Materialize)
    assert made and not made[0].replica  # the session is made again somewhere, once


def test_a_restarted_node_waits_for_its_peers_before_making_its_sessions_again():
    c = Replicated()
    online_with_replica(c)
    c.disconnect("n1", "dev")
    record = c.nodes["n1"].records["dev"]
    fresh = SessionRegistry("n1", replicas=2, started_ms=c.now)
    fresh.records["dev"] = record
    acts = fresh.on_local_snapshot({}, set(), c.now)
    assert not [a for a in acts if isinstance(a, Materialize)]
    assert "dev" in fresh.denied  # no connect resumes nothing meanwhile
    acts = fresh.on_tick(c.now + 1_500)  # no peer came up within the grace
    assert [a for a in acts if isinstance(a, Materialize)] == [Materialize(record)]


def test_replicas_are_deleted_at_the_session_s_cluster_wide_expiry():
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev", expiry=60)
    c.take(rep, Discard)
    c.tick(30_000)
    assert not c.take(rep, Discard)
    c.tick(31_000)  # past the expiry, on the next sweep
    assert c.take(rep, Discard) == [Discard("dev")]


def test_a_replica_that_became_the_session_expires_as_a_tombstone():
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev", expiry=60)
    c.run("n1", c.nodes["n1"].on_local_snapshot({}, set(), c.now))  # handed to the replica
    assert c.nodes[rep].records["dev"].owner == rep
    c.tick(61_000)
    c.tick(5_000)
    assert c.take(rep, Discard) == [Discard("dev")]
    for node in c.nodes:
        assert c.nodes[node].records["dev"].deleted


def test_an_expired_replica_is_made_again_held_then_released():
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev")
    assert "dev" in c.nodes[rep].queueing
    c.take(rep, Hold)
    # Mosquitto expired the replica's session (an older build made it with an expiry)
    c.run(rep, c.nodes[rep].on_session_expired("dev", c.now))
    assert "dev" not in c.nodes[rep].queueing
    c.finish(rep)
    holds = c.take(rep, Hold)
    assert holds[0] == Hold("dev", True, ring=True) and holds[-1].on is False


def test_a_client_stays_denied_on_its_replica_node_while_the_replica_is_deleted():
    """Back on its owner, the replica elsewhere is deleted and made again: a connect there
    meanwhile must not find the session gone (session present 0)."""
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev")
    c.connect("n1", "dev", present=True)
    assert c.take(rep, Discard) == [Discard("dev")]
    assert "dev" in c.nodes[rep].denied and not c.take(rep, Admit)
    c.run(rep, c.nodes[rep].on_discarded("dev", True, c.now))
    assert "dev" in c.nodes[rep].denied and not c.take(rep, Admit)


def test_a_replica_makes_no_shared_subscription_and_ignores_their_changes():
    """A replica held while its client is online would be a member of the client's shared
    groups on its node: its Mosquitto would pick it for a share of the messages and peers
    would route a share there (half of them lost for the client). It makes none."""
    c = Replicated()
    rep = online_with_replica(c, ("a/#", "$share/g/jobs/#"))
    assert c.nodes[rep].replica["dev"][1] == frozenset({("a/#", 1)})
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "$share/h/x", 2, c.now))
    c.run("n1", c.nodes["n1"].on_unsubscribe("dev", "$share/g/jobs/#", c.now))
    assert not c.take(rep, Resubscribe) and not c.take(rep, Discard)


def test_a_promoted_replica_makes_the_shared_subscriptions_before_its_client_resumes():
    c = Replicated()
    rep = online_with_replica(c, ("a/#", "$share/g/jobs/#"))
    c.disconnect("n1", "dev")
    c.kill("n1")
    c.tick(1_500)
    acts = c.nodes[rep].on_connect_rejected("dev", "denied", c.now)
    assert Resubscribe("dev", {"$share/g/jobs/#": 1}, ()) in acts
    assert Admit("dev") not in acts, "kept out until its shared subscriptions are made"
    assert c.nodes[rep].counters["promoted"] == 1
    # a failure is tried again; the client stays out meanwhile
    after = c.nodes[rep].on_materialized("dev", False, c.now)
    assert Admit("dev") not in after and "dev" in c.nodes[rep].denied
    c.tick(2_000)
    assert c.take(rep, Resubscribe) == [Resubscribe("dev", {"$share/g/jobs/#": 1}, ())]
    assert Admit("dev") in c.nodes[rep].on_materialized("dev", True, c.now)
    assert "dev" not in c.nodes[rep].unshared


def test_an_adopted_replica_makes_the_shared_subscriptions_too():
    c = Replicated()
    rep = online_with_replica(c, ("$share/g/jobs/#",))
    c.disconnect("n1", "dev")
    c.take(rep, Hold)
    c.now += 100
    c.run("n1", c.nodes["n1"].on_local_snapshot({}, set(), c.now))  # n1 lost its copy
    assert c.nodes[rep].counters["adopted"] == 1
    assert c.take(rep, Resubscribe) == [Resubscribe("dev", {"$share/g/jobs/#": 1}, ())]
    assert "dev" in c.nodes[rep].denied
    c.run(rep, c.nodes[rep].on_materialized("dev", True, c.now))
    assert "dev" not in c.nodes[rep].denied and "dev" not in c.nodes[rep].unshared


def test_a_replica_takes_no_cut():
    """A replica queues for its client's offline session: a cut there (cut mode sends one to
    every peer) would refuse what it must keep if its owner dies."""
    c = Replicated()
    rep = online_with_replica(c)
    assert c.nodes["n1"].cut_applies("dev")
    assert not c.nodes[rep].cut_applies("dev")



def test_a_client_that_tried_its_replica_before_its_owner_was_dead_is_admitted_at_the_death():
    """The owner is killed while its client is online; the client tries the replica before the
    grace has passed (kept out: the owner may only be partitioned) and then other nodes (a
    round-robin front), which keep it out under this node's claim. The replica is promoted and
    admits as soon as the owner is dead, not only at the client's next try there."""
    c = Replicated()
    rep = online_with_replica(c)
    c.kill("n1")
    c.take(rep, Admit)
    c.run(rep, c.nodes[rep].on_connect_rejected("dev", "denied", c.now))
    assert not c.take(rep, Admit) and "dev" in c.nodes[rep].denied
    c.tick(1_500)
    assert c.take(rep, Admit) == [Admit("dev")]
    assert c.nodes[rep].counters["promoted"] == 1
