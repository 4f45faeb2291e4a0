"""A draining node in the registry core (issue 20): it takes no replicas, and the sessions it
owns whose clients did not come back go to other nodes with what they queued."""

from __future__ import annotations

from sidecar.sessions.claims import CLAIM_MS
from sidecar.sessions.registry import (
    Admit,
    Claim,
    Claimed,
    Discard,
    Drain,
    Hold,
    Kick,
    Materialize,
)
from tests.sessions.test_registry import Cluster
from tests.sessions.test_replicas import Replicated, online_with_replica


def drains(c: Cluster, node: str) -> None:
    """Every node counts `node` as unavailable (its NodeState frame reached them)."""
    for name, reg in c.nodes.items():
        c.run(name, reg.set_unavailable(frozenset({node}), c.now))


def test_an_offline_session_goes_to_its_replica_with_the_owner_queue_drained_there():
    c = Replicated()
    rep = online_with_replica(c)
    c.disconnect("n1", "dev")
    since = c.nodes["n1"].records["dev"].since_ms
    client_connect = c.nodes["n1"].records["dev"].connect_hlc
    assert c.nodes["n1"].latest_connect("dev") == client_connect
    drains(c, "n1")
    c.take("n1", Drain)
    c.run("n1", c.nodes["n1"].hand_off_all(c.now))
    for node in c.nodes:
        record = c.nodes[node].records["dev"]
        assert (record.owner, record.online, record.since_ms, record.fresh) == (
            rep, False, since, False)
        # a hand-off is no connect of the client: its delayed will still fires (wills)
        assert record.connect_hlc > client_connect == record.client_connect_hlc
        assert c.nodes[node].latest_connect("dev") == client_connect
    # the copy on n1 goes to the replica after a barrier, as when the client moves
    assert c.take("n1", Drain) == [Drain("dev", rep, ("a/#",), handed_off=True)]
    assert c.nodes[rep].counters["adopted"] == 1 and "dev" not in c.nodes[rep].replica
    assert "dev" not in c.nodes[rep].denied  # the client resumes there directly
    c.run("n1", c.nodes["n1"].on_drained("dev", True, c.now))
    assert c.nodes["n1"].drain_progress(c.now) == {
        "sessions_owned": 0, "session_copies": 0, "session_ops": 0}
    assert c.nodes["n1"].hand_off_all(c.now) == []  # nothing left to hand off


def test_a_draining_node_is_no_replica_and_its_replicas_go():
    c = Replicated()
    rep = online_with_replica(c)
    other = ({"n2", "n3"} - {rep}).pop()
    c.take(rep, Discard)
    drains(c, rep)
    assert c.take(rep, Discard) == [Discard("dev")]
    c.run(rep, c.nodes[rep].on_discarded("dev", True, c.now))
    c.finish(other)
    assert c.nodes["n1"].replica_nodes("dev", "n1") == [other]
    assert c.nodes[other].replica["dev"][0] == "n1"
    assert Hold("dev", True, ring=True) in c.take(other, Hold)


def test_online_and_busy_sessions_are_not_handed_off():
    c = Replicated()
    online_with_replica(c)
    drains(c, "n1")
    assert c.nodes["n1"].hand_off_all(c.now) == []  # its client is still connected here
    c.disconnect("n1", "dev")
    c.nodes["n1"].busy["dev"] = "drain"
    assert c.nodes["n1"].hand_off_all(c.now) == []


def offline_on_n1() -> Cluster:
    """Three nodes without replicas, all up; `dev` subscribed to a/# on n1, then offline."""
    c = Cluster()
    for name, reg in c.nodes.items():
        c.run(name, reg.on_peers(set(c.nodes) - {name}, c.now))
    c.connect("n1", "dev")
    c.run("n1", c.nodes["n1"].on_subscribe("dev", "a/#", 1, c.now))
    c.disconnect("n1", "dev")
    return c


def test_without_replicas_the_session_is_made_again_on_another_node():
    c = offline_on_n1()
    drains(c, "n1")
    c.run("n1", c.nodes["n1"].hand_off_all(c.now))
    target = c.nodes["n2"].records["dev"].owner
    assert target in ("n2", "n3")
    [made] = c.take(target, Materialize)
    assert made.record.subscriptions == {"a/#": 1} and not made.replica
    assert c.take("n1", Drain) == [Drain("dev", target, ("a/#",), handed_off=True)]


def test_nothing_is_handed_off_when_no_other_node_is_up():
    c = Replicated(n=1)
    c.connect("n1", "dev")
    c.disconnect("n1", "dev")
    drains(c, "n1")
    assert c.nodes["n1"].hand_off_all(c.now) == []
    assert c.nodes["n1"].drain_progress(c.now)["sessions_owned"] == 1


def test_a_session_made_ahead_then_handed_here_is_drained_where_its_client_connects():
    """Its client tried n2 (a session made there ahead of it) and went on; its draining owner
    n1 then hands the session to n2, which gets n1's queue. When the client connects on n3,
    n2's copy holds that queue: drained to n3, never just deleted (the chaos rolling restart
    lost a client's messages of ~2 s so)."""
    c = offline_on_n1()
    n2 = c.nodes["n2"]
    c.run("n2", n2.on_connect_rejected("dev", "denied", c.now))
    assert len(c.take("n2", Materialize)) == 1
    c.run("n2", n2.on_materialized("dev", True, c.now))  # made ahead: its client went on
    c.run("n1", c.nodes["n1"].set_unavailable(frozenset({"n1", "n3"}), c.now))
    c.run("n1", c.nodes["n1"].hand_off_all(c.now))
    assert n2.records["dev"].owner == "n2"
    # n1's queue goes to n2, whose copy queues only from the hand-off's record: asked first
    assert c.take("n1", Drain) == [Drain("dev", "n2", ("a/#",), handed_off=True)]
    assert c.take("n2", Hold)[-1] == Hold("dev", False)  # and n2's copy queues from now on
    c.take("n2", Discard)
    c.connect("n3", "dev", present=True)
    assert c.take("n2", Discard) == []
    assert c.take("n2", Drain) == [Drain("dev", "n3", ("a/#",))]


def test_a_queue_arriving_after_its_client_moved_on_is_refused():
    """n1's queue for `dev` is on its way to n2 (the owner then) when `dev` connects on n3:
    n2 has drained its own copy to n3 already and must not take the late queue (a chaos
    rolling restart lost 855 messages into such a copy); n1 retries towards n3."""
    c = offline_on_n1()
    n2 = c.nodes["n2"]
    c.run("n1", c.nodes["n1"].set_unavailable(frozenset({"n1", "n3"}), c.now))
    c.run("n1", c.nodes["n1"].hand_off_all(c.now))
    assert n2.records["dev"].owner == "n2" and n2.takes_backlog("dev")
    assert not c.nodes["n3"].takes_backlog("dev")
    c.connect("n3", "dev", present=True)
    assert not n2.takes_backlog("dev") and c.nodes["n3"].takes_backlog("dev")
    c.run("n1", c.nodes["n1"].on_drained("dev", False, c.now))  # refused: n1 keeps its copy
    c.now += 2_000
    c.run("n1", c.nodes["n1"].on_tick(c.now))
    assert c.take("n1", Drain)[-1] == Drain("dev", "n3", ("a/#",))


def test_a_hand_off_racing_the_clients_own_connect_loses_to_it():
    """n1 drains and hands `dev`'s session to n3 while `dev` resumes it on n2, before n1 has
    heard of that: the client's connect wins everywhere and nobody kicks it (a hand-off once
    carried a connect of its own, newer than the client's, and n2 kicked the client: a chaos
    rolling restart lost the messages of its reconnect)."""
    c = offline_on_n1()
    n2 = c.nodes["n2"]
    c.run("n2", n2.on_connect_rejected("dev", "denied", c.now))
    c.take("n2", Materialize)
    c.run("n2", n2.on_materialized("dev", True, c.now))
    c.now += 10
    resumed = n2.on_connect("dev", None, "mqtt5", False, 600, True, c.now)  # not sent yet
    c.run("n1", c.nodes["n1"].set_unavailable(frozenset({"n1", "n2"}), c.now))
    c.run("n1", c.nodes["n1"].hand_off_all(c.now))
    c.run("n2", resumed)
    for name, reg in c.nodes.items():
        assert (reg.records["dev"].owner, reg.records["dev"].online) == ("n2", True), name
    assert c.take("n2", Kick) == []
    # n1's copy was on its way to n3, which no longer takes it; n1 retries towards n2
    assert c.take("n1", Drain) == [Drain("dev", "n3", ("a/#",), handed_off=True)]
    assert not c.nodes["n3"].takes_backlog("dev") and n2.takes_backlog("dev")
    c.run("n1", c.nodes["n1"].on_drained("dev", False, c.now))
    c.now += 2_000
    c.run("n1", c.nodes["n1"].on_tick(c.now))
    assert c.take("n1", Drain) == [Drain("dev", "n2", ("a/#",))]


def claimed_elsewhere(made: bool) -> tuple[Replicated, str]:
    """`dev` offline, owner n1, a replica queueing on the third node; its client tried the
    returned node, which claims it (granted everywhere) and makes its copy (`made`: done);
    n1 drains."""
    c = Replicated()
    for name, reg in c.nodes.items():
        others = set(c.nodes) - {name}
        reg.on_peers(others, c.now, others, others)
    rep = online_with_replica(c)
    other = ({"n2", "n3"} - {rep}).pop()
    c.disconnect("n1", "dev")
    c.finish(rep)
    c.run(other, c.nodes[other].on_connect_rejected("dev", "denied", c.now))
    if made:
        c.finish(other)
    deliver_claims(c, other)
    drains(c, "n1")
    return c, other


def test_a_client_another_nodes_claim_is_admitting_is_handed_to_that_node():
    """`dev` (offline, owner n1, a replica queueing on a third node) is being admitted on
    `other`: n1 granted that claim. Handed to the replica, n1's copy was held at its barrier
    while `other`'s held everything until the client connected there, so what came between
    was only in the replica, which the connect's record deleted when it came there before
    the hand-off's (a rolling restart lost 1 or 2 messages so in about one run of ten). Now
    the session goes to the claimant, whose copy queues from the hand-off's record on."""
    c, other = claimed_elsewhere(made=True)
    assert c.take(other, Admit) == [Admit("dev")]
    for actions in c.actions.values():
        actions.clear()
    c.run("n1", c.nodes["n1"].hand_off_all(c.now))
    assert c.take("n1", Drain) == [Drain("dev", other, ("a/#",), handed_off=True)]
    assert c.take(other, Hold)[-1] == Hold("dev", False)  # queues from the record on
    assert c.nodes[other].takes_backlog("dev")
    c.connect(other, "dev", present=True)  # its own session now
    assert c.take(other, Discard) == [] and c.take(other, Drain) == []
    for name, reg in c.nodes.items():
        assert (reg.records["dev"].owner, reg.records["dev"].online) == (other, True), name
    assert c.nodes["n1"].hand_off_all(c.now) == []


def test_a_session_handed_to_a_claimant_still_making_its_copy_queues_once_made():
    """The hand-off comes while the claimant's copy is being made: once made, it queues
    (it is the session now), instead of refusing everything until its client connects."""
    c, other = claimed_elsewhere(made=False)
    c.run("n1", c.nodes["n1"].hand_off_all(c.now))
    assert c.take("n1", Drain) == [Drain("dev", other, ("a/#",), handed_off=True)]
    c.take(other, Hold)
    c.finish(other)
    assert c.take(other, Hold) == [Hold("dev", False)]
    assert c.take(other, Admit) == [Admit("dev")]


def deliver_claims(c: Cluster, node: str) -> None:
    """Every claim `node` sent, to its peers, and their answers back."""
    for action in c.take(node, Claim):
        for peer in action.peers:
            c.run(peer, c.nodes[peer].on_claim(action.client, node, action.hlc, CLAIM_MS,
                                                action.withdrawn, c.now, action.renews))
    for name in c.nodes:
        for answer in c.take(name, Claimed):
            c.run(answer.peer, c.nodes[answer.peer].on_claimed(
                answer.client, name, answer.hlc, answer.granted, c.now))
