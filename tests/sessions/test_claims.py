"""Claims: at most one node at a time admits a client whose session another node owns."""

from __future__ import annotations

from sidecar.sessions.claims import CLAIM_MARGIN_MS, CLAIM_MAX_MS, CLAIM_MS, Claims
from sidecar.sessions.registry import Admit, Claim, Claimed, Deny, Materialize
from tests.sessions.test_registry import Cluster


def test_a_claim_is_granted_once_every_peer_answered_and_keeps_the_client_out_there():
    n2, n1 = Claims("n2"), Claims("n1")
    claim = n2.start("dev", 10, {"n1", "n3"}, 0)
    assert claim is not None and not n2.admits("dev", 0)
    assert n1.answer("dev", "n2", 10, CLAIM_MS, 0) == (True, None)
    assert n1.keeps_out("dev", 0)
    assert n2.answered("dev", "n1", 10, True) == ""
    assert n2.answered("dev", "n3", 10, True) == "granted"
    assert n2.admits("dev", CLAIM_MS) and not n2.admits("dev", CLAIM_MS + 1)
    assert not n1.keeps_out("dev", CLAIM_MS + CLAIM_MARGIN_MS + 1)


def test_of_two_claims_the_earlier_wins_and_a_granted_one_wins_over_any():
    n2, n3 = Claims("n2"), Claims("n3")
    n2.start("dev", 10, {"n3"}, 0)
    n3.start("dev", 11, {"n2"}, 0)
    assert n2.answer("dev", "n3", 11, CLAIM_MS, 0) == (False, None)
    granted, beaten = n3.answer("dev", "n2", 10, CLAIM_MS, 0)
    assert granted and beaten is not None and beaten.hlc == 11 and "dev" not in n3.own
    assert n3.keeps_out("dev", 0)
    # a third node that granted the later one first still grants the earlier: both keep out
    n1 = Claims("n1")
    assert n1.answer("dev", "n3", 11, CLAIM_MS, 0)[0]
    assert n1.answer("dev", "n2", 10, CLAIM_MS, 0)[0]
    assert not n1.answer("dev", "n4", 12, CLAIM_MS, 0)[0]
    # a node whose own claim is granted refuses every other, even an earlier one
    n2.answered("dev", "n3", 10, True)
    assert n2.answer("dev", "n5", 1, CLAIM_MS, 0) == (False, None)


def test_a_refusal_drops_the_claim_and_a_node_kept_out_does_not_claim():
    n2 = Claims("n2")
    n2.start("dev", 10, {"n1", "n3"}, 0)
    assert n2.answered("dev", "n1", 10, False) == "refused" and "dev" not in n2.own
    n2.answer("dev", "n3", 5, CLAIM_MS, 0)
    assert n2.start("dev", 20, {"n1"}, 1) is None


def test_a_client_trying_anywhere_renews_the_claim_everywhere():
    n2, n1 = Claims("n2"), Claims("n1")
    n2.start("dev", 10, {"n1"}, 0)
    n1.answer("dev", "n2", 10, CLAIM_MS, 0)
    n2.answered("dev", "n1", 10, True)
    later = CLAIM_MS - 10
    assert n1.in_force("dev", later) == [("n2", 10)]
    n1.renew("dev", "n2", 10, later)
    n2.renew("dev", "n2", 10, later)
    assert n2.admits("dev", later + CLAIM_MS) and n1.keeps_out("dev", later + CLAIM_MS)
    assert n2.lapse(later + CLAIM_MS)[0] == []
    lapsed, _ = n2.lapse(later + CLAIM_MS + 1)
    assert [c for c, _ in lapsed] == ["dev"]
    n1.renew("dev", "n2", 99, later * 3)  # (another claim's renewal renews nothing)
    assert n1.lapse(later + CLAIM_MS + CLAIM_MARGIN_MS + 1) == ([], ["dev"])


def test_renewals_end_a_claim_at_most_its_longest_time_after_it_was_made():
    """A client that keeps trying only nodes the claim keeps it out of (its owner, with a
    direct connection) is admitted there at last."""
    n2, n1 = Claims("n2"), Claims("n1")
    n2.start("dev", 10, {"n1"}, 0)
    n1.answer("dev", "n2", 10, CLAIM_MS, 0)
    n2.answered("dev", "n1", 10, True)
    for t in range(0, CLAIM_MAX_MS + CLAIM_MS, 1_000):
        n1.renew("dev", "n2", 10, t)
        n2.renew("dev", "n2", 10, t)
    assert n2.admits("dev", CLAIM_MAX_MS) and not n2.admits("dev", CLAIM_MAX_MS + 1)
    assert n1.keeps_out("dev", CLAIM_MAX_MS + CLAIM_MARGIN_MS)
    assert not n1.keeps_out("dev", CLAIM_MAX_MS + CLAIM_MARGIN_MS + 1)


def test_a_claim_is_passed_over_by_a_peer_that_went_down_and_ends_with_its_record():
    n2, n1 = Claims("n2"), Claims("n1")
    n2.start("dev", 10, {"n1", "n3"}, 0)
    n2.answered("dev", "n1", 10, True)
    assert n2.passed_over({"n1"}) == ["dev"] and n2.admits("dev", 0)
    n1.answer("dev", "n2", 10, CLAIM_MS, 0)
    n1.withdrawn("dev", "n2", 9)  # (an older record of n2's ends nothing)
    assert n1.keeps_out("dev", 0)
    n1.withdrawn("dev", "n2", 12)  # n2's record of the client's connect after its claim
    assert not n1.keeps_out("dev", 0)
    n1.answer("dev", "n2", 10, CLAIM_MS, 0)
    assert n1.drop_from({"n3"}) == ["dev"] and not n1.keeps_out("dev", 0)


class Claiming(Cluster):
    """The registry cluster with every peer up and taking claims; claims and answers are
    delivered by hand (`deliver`)."""

    def __init__(self) -> None:
        super().__init__()
        for name, reg in self.nodes.items():
            others = set(self.nodes) - {name}
            reg.on_peers(others, self.now, others, others)

    def deliver(self, node: str) -> None:
        """Every claim and answer `node` sent, to their peers (and their answers back)."""
        for action in self.take(node, Claim):
            for peer in action.peers:
                self.run(peer, self.nodes[peer].on_claim(
                    action.client, node, action.hlc, CLAIM_MS, action.withdrawn, self.now,
                    action.renews))
        for node_ in self.nodes:
            for answer in self.take(node_, Claimed):
                self.run(answer.peer, self.nodes[answer.peer].on_claimed(
                    answer.client, node_, answer.hlc, answer.granted, self.now))


def _tried_n2() -> Claiming:
    """`dev`'s session made on n1, offline; its client tried n2, which made a copy (and
    claimed the client: its claim not yet delivered)."""
    c = Claiming()
    c.connect("n1", "dev")
    c.disconnect("n1", "dev")
    n2 = c.nodes["n2"]
    c.run("n2", n2.on_connect_rejected("dev", "denied", c.now))
    assert c.take("n2", Materialize)
    c.run("n2", n2.on_materialized("dev", True, c.now))
    return c


def test_the_owner_keeps_its_own_client_out_while_another_nodes_claim_is_in_force():
    """The traced case (session 19): the client, through a round-robin front, connected to
    n2 and then n1 again within milliseconds; n1, which had not yet got n2's record, took it
    for a resume of its own session, while n2's copy kept messages too: duplicates. Now n2
    admits only under its claim, and n1, which granted it, keeps its client out meanwhile."""

    c = _tried_n2()
    n1, n2 = c.nodes["n1"], c.nodes["n2"]
    assert not c.take("n2", Admit), "not before its claim is granted"
    c.deliver("n2")
    assert c.take("n2", Admit) == [Admit("dev")]
    assert "dev" in n1.denied and c.take("n1", Deny) == [Deny("dev")]
    # the client tries n3 and n1: kept out; n3 renews n2's claim everywhere (no claim of
    # its own while n2's is in force), its owner does not (a client trying only its owner
    # gets in there once the claim lapsed)
    tried = c.nodes["n3"].on_connect_rejected("dev", "denied", c.now)
    assert [(a.renews, a.peers) for a in tried if isinstance(a, Claim)] == [
        ("n2", ("n1", "n2"))]
    assert n1.on_connect_rejected("dev", "denied", c.now) == []
    c.connect("n2", "dev", present=True)  # its record ends the claim everywhere
    assert not n1.claims.keeps_out("dev", c.now) and not n2.claims.own
    assert n1.records["dev"].owner == "n2"


def test_a_claim_that_lapses_lets_the_owner_admit_its_client_again():
    c = _tried_n2()
    n2 = c.nodes["n2"]
    c.deliver("n2")
    c.take("n1", Deny)
    c.take("n2", Deny)
    c.now += CLAIM_MS + 1
    c.run("n2", n2.on_tick(c.now))
    assert c.take("n2", Deny) == [Deny("dev")]
    c.deliver("n2")  # the withdrawal
    assert c.take("n1", Admit) == [Admit("dev")]
    assert n2.counters["claims_lapsed"] == 1
