"""Remote interest: per-peer versions, local forwarding subscriptions, forward-once decisions."""

from __future__ import annotations

import tracemalloc
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.routing.interest import (
    MAX_SUBSCRIPTION_ID,
    ForwardDecision,
    InterestDelta,
    InterestSnapshot,
    LocalInterest,
    LocalSubscribe,
    LocalUnsubscribe,
    RemoteInterest,
    RequestSnapshot,
    SharedDelivery,
)
from sidecar.routing.table import InterestAdded, InterestKey, InterestRemoved
from sidecar.topics import TopicError, matches, parse_filter


def K(verbatim: str) -> InterestKey:
    return InterestKey.parse(verbatim)


def snap(version: int, *filters: str) -> InterestSnapshot:
    return InterestSnapshot(version, frozenset(K(f) for f in filters))


def delta(a: int, b: int, added=(), removed=()) -> InterestDelta:
    return InterestDelta(a, b, frozenset(map(K, added)), frozenset(map(K, removed)))


def deliver(ri: RemoteInterest, topic: str, **kw) -> list[ForwardDecision]:
    """What Mosquitto does: one copy per matching local subscription, each with its id."""
    subs = ri.local_subscriptions()
    return [ri.forward_targets(topic, [sid], **kw) for f, sid in subs.items() if matches(f, topic)]


def forwarded(decisions: list[ForwardDecision]) -> list[frozenset[str]]:
    return [d.peers for d in decisions if d.peers]


def test_overlapping_filters_forward_once_to_matching_peers():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "a/+"))
    ri.apply_snapshot("p2", snap(1, "a/#"))
    ri.apply_snapshot("p3", snap(1, "+/b", "a/b"))
    assert forwarded(deliver(ri, "a/b")) == [{"p1", "p2", "p3"}]
    assert forwarded(deliver(ri, "a/c")) == [{"p1", "p2"}]
    assert forwarded(deliver(ri, "x/b")) == [{"p3"}]
    assert forwarded(deliver(ri, "a")) == [{"p2"}]  # a/# matches the parent level
    assert deliver(ri, "x/y") == []
    assert ri.peers_for("a/b/c") == {"p2"}


def test_copy_with_all_ids_at_once_also_forwards_once():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "a/+", "a/#"))
    ids = list(ri.local_subscriptions().values())
    assert ri.forward_targets("a/b", ids).peers == {"p1"}
    assert ri.forward_targets("a/b", list(reversed(ids))).peers == {"p1"}


def test_dollar_topics_and_leading_wildcards():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "#", "+/x"))
    ri.apply_snapshot("p2", snap(1, "$SYS/#"))
    ri.apply_snapshot("p3", snap(1, "$SYS/+/x"))
    assert forwarded(deliver(ri, "$SYS/x")) == [{"p2"}]
    assert forwarded(deliver(ri, "$SYS/a/x")) == [{"p2", "p3"}]
    assert forwarded(deliver(ri, "a/x")) == [{"p1"}]
    # even if a copy for "#" showed up for a $-topic, it is not a valid reason to forward
    sid = ri.local_subscriptions()["#"]
    assert not ri.forward_targets("$SYS/x", [sid])


def test_local_subscriptions_are_refcounted_over_peers():
    ri = RemoteInterest()
    [sub] = ri.apply_snapshot("p1", snap(1, "a/b"))
    assert sub == LocalSubscribe("a/b", 1) and sub.no_local
    assert ri.apply_snapshot("p2", snap(7, "a/b")) == []
    assert ri.remove_peer("p1") == []
    assert ri.peers_for("a/b") == {"p2"}
    assert ri.apply_delta("p2", delta(7, 8, removed=["a/b"])) == [LocalUnsubscribe("a/b", 1)]
    assert ri.local_subscriptions() == {}
    assert ri.peers_for("a/b") == set()


def test_snapshot_replaces_and_emits_only_the_difference():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "a", "b"))
    actions = ri.apply_snapshot("p1", snap(1, "b", "c"))  # e.g. after a reconnect
    assert actions == [LocalUnsubscribe("a", 1), LocalSubscribe("c", 2)]  # a, b shared id 1
    assert ri.keys("p1") == {K("b"), K("c")}


def test_version_gaps_ask_for_a_snapshot_once():
    ri = RemoteInterest()
    assert ri.apply_delta("p1", delta(0, 1, added=["a"])) == [
        RequestSnapshot("p1", None, "delta before any snapshot")
    ]
    ri.apply_snapshot("p1", snap(5, "a"))
    assert ri.apply_delta("p1", delta(5, 6, added=["b"])) == [LocalSubscribe("b", 2)]
    [request] = ri.apply_delta("p1", delta(7, 8, added=["c"]))  # 6 -> 7 went missing
    assert isinstance(request, RequestSnapshot) and request.have_version == 6
    assert "from version 7, have 6" in request.reason
    assert ri.apply_delta("p1", delta(8, 9, added=["d"])) == []  # already asked
    assert ri.version("p1") == 6 and ri.keys("p1") == {K("a"), K("b")}
    ri.apply_snapshot("p1", snap(9, "a", "b", "c", "d"))
    assert ri.apply_delta("p1", delta(9, 9)) != []  # does not advance: ask again
    assert ri.local_subscriptions().keys() == {"a", "b", "c", "d"}


def test_remove_peer_drops_its_interest():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "a", "$share/g/s"))
    ri.apply_snapshot("p2", snap(1, "a"))
    actions = ri.remove_peer("p1")
    assert actions == [LocalUnsubscribe("$share/g/s", 2)]
    assert ri.peers() == {"p2"} and ri.shared_peers("g", "s") == set()
    assert ri.remove_peer("nobody") == []


def test_a_peer_that_left_is_dropped_in_steps_and_passed_over_meanwhile():
    """remove_peer with a step: the peer stops counting at once, its keys go `max_keys` per
    call (operation counts: journal ops per step, one unsubscribe per filter nobody holds)."""
    ri = RemoteInterest(journal=True)
    many = [f"d/{i}" for i in range(12_000)]
    ri.apply_snapshot("p1", snap(1, *many, "w/+", "$share/g/s"))
    ri.apply_snapshot("p2", snap(1, "d/5", "$share/g/s"))
    ri.take_journal()
    steps = [ri.remove_peer("p1", 5000)]
    removed = [sum(op[0] == "-" for op in ri.take_journal())]
    assert ri.removing and ri.peers() == {"p2"} and not ri.holds("p1", K("d/7"))
    for topic in ("d/5", "d/7", "w/x"):  # p1's filters may still be subscribed: not for p1
        assert all("p1" not in d.peers for d in deliver(ri, topic))
    assert ri.peers_for("d/5") == {"p2"} and ri.shared_peers("g", "s") == {"p2"}
    assert [s.peer for d in deliver(ri, "s") for s in d.shared] == ["p2"]
    while ri.removing:
        steps.append(ri.continue_removals(5000))
        removed.append(sum(op[0] == "-" for op in ri.take_journal()))
    assert removed == [5000, 5000, 2002] and ri.continue_removals() == []
    assert sum(isinstance(a, LocalUnsubscribe) for step in steps for a in step) == 12_000
    assert set(ri.local_subscriptions()) == {"d/5", "$share/g/s"}


def test_a_peer_back_before_its_removal_ended_starts_afresh():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, *(f"d/{i}" for i in range(100))))
    ri.remove_peer("p1", 10)
    actions = ri.apply_snapshot("p1", snap(1, "d/1", "e"))
    assert not ri.removing and set(ri.local_subscriptions()) == {"d/1", "e"}
    assert ri.keys("p1") == {K("d/1"), K("e")}
    assert ri.forward_targets("d/1", [ri.local_subscriptions()["d/1"]]).peers == {"p1"}
    subs = [a.filter for a in actions if isinstance(a, LocalSubscribe)]
    assert sorted(subs) == ["d/1", "e"] or sorted(subs) == ["e"]


def test_invalid_keys_are_skipped_and_counted():
    ri = RemoteInterest()
    bad = {InterestKey(None, "a/#/b"), InterestKey(None, "$share/g/x"), InterestKey("g+", "x")}
    actions = ri.apply_snapshot("p1", InterestSnapshot(1, frozenset(bad | {K("ok")})))
    assert actions == [LocalSubscribe("ok", 1)]
    assert ri.invalid_keys == 3


def test_subscription_ids_grow_above_those_in_use_and_are_reused_from_the_top():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "a/+", "b/+", "c/+"))
    assert ri.local_subscriptions() == {"a/+": 1, "b/+": 2, "c/+": 3}
    ri.apply_delta("p1", delta(1, 2, removed=["a/+"]))
    assert ri.apply_delta("p1", delta(2, 3, added=["d/+"])) == [LocalSubscribe("d/+", 4)]
    ri.apply_delta("p1", delta(3, 4, removed=["c/+", "d/+"]))
    assert ri.apply_delta("p1", delta(4, 5, added=["e/+"])) == [LocalSubscribe("e/+", 3)]


def test_subscription_ids_fall_back_to_the_smallest_free_at_the_limit():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "a/+", "b/+"))
    ri._top_sid = MAX_SUBSCRIPTION_ID  # as if ids had climbed all the way
    ri.apply_delta("p1", delta(1, 2, removed=["a/+"]))
    assert ri.apply_delta("p1", delta(2, 3, added=["c/+"])) == [LocalSubscribe("c/+", 1)]


def test_new_filter_never_steals_the_forwarding_copy():
    """A copy routed before a new overlapping subscription took effect is still forwarded."""
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "a/#"))
    old = ri.local_subscriptions()["a/#"]
    ri.apply_snapshot("p2", snap(1, "a/b"))  # Mosquitto has not applied it yet
    assert ri.forward_targets("a/b", [old]).peers == {"p1", "p2"}


def test_stale_ids_are_ignored():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "a/+", "b/+"))
    ri.apply_delta("p1", delta(1, 2, removed=["b/+"]))
    ri.apply_delta("p1", delta(2, 3, added=["c/+"]))  # reuses id 2
    assert ri.local_subscriptions() == {"a/+": 1, "c/+": 2}
    assert not ri.forward_targets("b/x", [2])  # a late copy for the old "b/+"
    assert not ri.forward_targets("b/x", [99])
    assert ri.forward_targets("c/x", [2]).peers == {"p1"}


def test_shared_interest_joins_the_group_and_picks_one_peer():
    ri = RemoteInterest()
    [sub] = ri.apply_snapshot("p1", snap(1, "$share/g/a/+"))
    assert sub == LocalSubscribe("$share/g/a/+", 1) and not sub.no_local
    ri.apply_snapshot("p2", snap(1, "$share/g/a/+", "$share/h/a/+"))
    ri.apply_snapshot("p3", snap(1, "$share/g/a/+"))
    assert ri.shared_peers("g", "a/+") == {"p1", "p2", "p3"}
    assert ri.peers_for("a/b") == set()  # shared interest is not plain interest
    subs = ri.local_subscriptions()
    assert subs.keys() == {"$share/g/a/+", "$share/h/a/+"}
    picks = Counter()
    for _ in range(300):
        decisions = deliver(ri, "a/b")
        for d in decisions:
            assert not d.peers and len(d.shared) == 1
        g = [d.shared[0] for d in decisions if d.shared[0].group == "g"]
        h = [d.shared[0] for d in decisions if d.shared[0].group == "h"]
        assert len(g) == 1 and h == [SharedDelivery("p2", "h", "a/+")]
        picks[g[0].peer] += 1
    assert picks == {"p1": 100, "p2": 100, "p3": 100}


def test_shared_pick_avoids_down_peers_and_reports_unroutable():
    ri = RemoteInterest(seed=1)
    ri.apply_snapshot("p1", snap(1, "$share/g/t"))
    ri.apply_snapshot("p2", snap(1, "$share/g/t"))
    sid = ri.local_subscriptions()["$share/g/t"]
    assert {ri.forward_targets("t", [sid], down={"p1"}).shared[0].peer for _ in range(5)} == {"p2"}
    both_down = {ri.forward_targets("t", [sid], down={"p1", "p2"}).shared[0].peer for _ in range(4)}
    assert both_down == {"p1", "p2"}
    # the interest went away but a copy was already on its way: Mosquitto picked the
    # forwarding client for it instead of another member, so it is reported (a local member
    # takes it); its id is not handed out again while it is remembered
    ri.apply_delta("p1", delta(1, 2, removed=["$share/g/t"]))
    ri.apply_delta("p2", delta(1, 2, removed=["$share/g/t"]))
    stale = ri.forward_targets("t", [sid])
    assert list(stale.unroutable) == [K("$share/g/t")] and not stale.shared
    assert not ri.forward_targets("other", [sid])  # its filter does not match: ignored
    ri.apply_delta("p1", delta(2, 3, added=["x/#"]))
    assert ri.local_subscriptions()["x/#"] != sid


def test_same_seed_same_picks():
    def picks(seed):
        ri = RemoteInterest(seed=seed)
        for p in ("p1", "p2", "p3"):
            ri.apply_snapshot(p, snap(1, "$share/g/t"))
        sid = ri.local_subscriptions()["$share/g/t"]
        return [ri.forward_targets("t", [sid]).shared[0].peer for _ in range(6)]

    assert picks(5) == picks(5)
    assert picks(0)[:3] == ["p1", "p2", "p3"] and picks(1)[:3] == ["p2", "p3", "p1"]


def test_plain_and_shared_copies_of_one_message():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "t/#", "$share/g/t/+"))
    ri.apply_snapshot("p2", snap(1, "t/+"))
    decisions = deliver(ri, "t/x")
    assert forwarded(decisions) == [{"p1", "p2"}]
    assert [d.shared for d in decisions if d.shared] == [(SharedDelivery("p1", "g", "t/+"),)]


def test_resubscribe_everything():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "b", "a", "$share/g/c"))
    assert ri.subscriptions() == [  # literal filters first, sharing an id
        LocalSubscribe("a", 1), LocalSubscribe("b", 1), LocalSubscribe("$share/g/c", 2)
    ]


def test_local_interest_versions_and_deltas():
    li = LocalInterest()
    assert li.snapshot() == InterestSnapshot(0, frozenset())
    d1 = li.apply([InterestAdded(K("a")), InterestAdded(K("$share/g/b"))])
    assert d1 == delta(0, 1, added=["a", "$share/g/b"])
    assert li.apply([InterestAdded(K("a"))]) is None  # already there
    assert li.apply([InterestAdded(K("c")), InterestRemoved(K("c"))]) is None  # cancels out
    d2 = li.apply(
        [InterestRemoved(K("a")), InterestAdded(K("a")), InterestRemoved(K("$share/g/b"))]
    )
    assert d2 == delta(1, 2, removed=["$share/g/b"])
    assert li.snapshot() == snap(2, "a")
    ri = RemoteInterest()
    ri.apply_snapshot("me", snap(0))
    assert ri.apply_delta("me", d1) and ri.apply_delta("me", d2)
    assert ri.keys("me") == li.snapshot().keys


# ---- properties ----------------------------------------------------------------------------

LEVELS = ["a", "b", "$SYS", "+", "#"]


def literal(verbatim: str) -> bool:
    return not verbatim.startswith("$share/") and "+" not in verbatim and "#" not in verbatim


def _filter(levels: list[str], group: str | None) -> str | None:
    text = "/".join(levels)
    if group is not None:
        text = f"$share/{group}/{text}"
    try:
        parse_filter(text)
    except TopicError:
        return None
    return text


filters = st.builds(
    _filter,
    st.lists(st.sampled_from(LEVELS), min_size=1, max_size=3),
    st.sampled_from([None, None, None, "g", "h"]),
).filter(lambda f: f is not None)
peers = st.sampled_from(["p1", "p2", "p3"])
ops = st.lists(
    st.tuples(st.sampled_from(["snap", "delta", "remove", "leave"]), peers,
              st.sets(filters, max_size=4),
              st.sets(filters, max_size=3)),
    max_size=25,
)
topics = st.lists(st.sampled_from(["a", "b", "$SYS", "x"]), min_size=1, max_size=4).map("/".join)


@settings(max_examples=150, deadline=None)
@given(ops, st.lists(topics, min_size=1, max_size=5))
def test_properties(operations, sample_topics):
    ri = RemoteInterest()
    model: dict[str, set[str]] = {}  # peer -> verbatim filters
    versions: dict[str, int] = {}
    subscribed: dict[str, int] = {}  # what Mosquitto would have, from the actions

    def track(actions) -> None:
        for action in actions:
            if isinstance(action, LocalSubscribe):
                assert action.filter not in subscribed
                holders = [f for f, sid in subscribed.items() if sid == action.subscription_id]
                # only literal plain filters share an id (no topic matches two of them)
                assert all(literal(f) for f in holders + [action.filter]) or not holders
                subscribed[action.filter] = action.subscription_id
            elif isinstance(action, LocalUnsubscribe):
                assert subscribed.pop(action.filter) == action.subscription_id

    for kind, peer, a, b in operations:
        track(ri.continue_removals(1))  # (a departed peer's keys go one per operation)
        if kind == "snap":
            versions[peer] = versions.get(peer, 0) + 1
            actions = ri.apply_snapshot(peer, snap(versions[peer], *a))
            model[peer] = set(a)
        elif kind == "delta" and peer in model:
            v = versions[peer]
            versions[peer] = v + 1
            actions = ri.apply_delta(peer, delta(v, v + 1, added=a, removed=b - a))
            model[peer] = (model[peer] | a) - (b - a)
        else:
            actions = ri.remove_peer(peer, 1 if kind == "leave" else None)
            model.pop(peer, None)
            versions.pop(peer, None)
        track(actions)
        for topic in sample_topics:  # a peer that left gets nothing, its keys dropped or not
            plain = {p for p, fs in model.items() if any(
                matches(f, topic) for f in fs if not f.startswith("$share/"))}
            assert forwarded(deliver(ri, topic)) == ([plain] if plain else [])
    while ri.removing:
        track(ri.continue_removals(1))
    wanted = set().union(*model.values()) if model else set()
    assert subscribed == ri.local_subscriptions()
    assert set(subscribed) == wanted
    for topic in sample_topics:
        decisions = deliver(ri, topic)
        plain = {p for p, fs in model.items() if any(
            matches(f, topic) for f in fs if not f.startswith("$share/"))}
        assert forwarded(decisions) == ([plain] if plain else [])
        shared_keys = {f for f in wanted if f.startswith("$share/") and matches(f, topic)}
        deliveries = [s for d in decisions for s in d.shared]
        assert len(deliveries) == len(shared_keys)
        for s in deliveries:
            assert f"$share/{s.group}/{s.filter}" in model[s.peer]
        assert all(not d.unroutable for d in decisions)


def test_export_restore_keeps_identifiers_and_decisions():
    from sidecar.routing.interest import InterestSnapshot as Snap
    from sidecar.routing.interest import LocalSubscribe as Sub
    from sidecar.routing.interest import LocalUnsubscribe as Unsub
    from sidecar.routing.interest import RemoteInterest as RI
    from sidecar.routing.table import InterestKey as K

    first = RI()
    first.apply_snapshot("n2", Snap(1, frozenset({K.parse("a/#"), K.parse("$share/g/j")})))
    first.apply_snapshot("n3", Snap(4, frozenset({K.parse("a/+"), K.parse("a/#")})))
    first.apply_snapshot("n3", Snap(5, frozenset({K.parse("a/+")})))  # leaves a gap in sids
    again = RI()
    again.restore(first.export())
    assert again.local_subscriptions() == first.local_subscriptions()
    sids = first.local_subscriptions()
    for sid in sids.values():
        assert again.forward_targets("a/x", [sid]) == first.forward_targets("a/x", [sid])
    assert again.version("n2") is None
    # a fresh snapshot reconciles: only the real difference becomes (un)subscribe actions
    actions = again.apply_snapshot("n3", Snap(9, frozenset({K.parse("b")})))
    assert Unsub("a/+", sids["a/+"]) in actions
    new = [a for a in actions if isinstance(a, Sub)]
    assert [a.filter for a in new] == ["b"]
    in_use = again.local_subscriptions()
    assert in_use["b"] == new[0].subscription_id
    assert len(set(in_use.values())) == len(in_use), "identifiers stay unique"


def test_literal_filters_share_ids_yet_forward_once():
    ri = RemoteInterest(literal_group=2)
    actions = ri.apply_snapshot("p1", snap(1, "a", "b", "c", "x/+"))
    assert actions == [LocalSubscribe("a", 1), LocalSubscribe("b", 1), LocalSubscribe("c", 2),
                       LocalSubscribe("x/+", 3)]  # literal first: ascending ids
    ri.apply_snapshot("p2", snap(1, "x/a"))
    assert forwarded(deliver(ri, "x/a")) == [{"p1", "p2"}]
    assert not ri.forward_targets("b", [2])  # id 2 names "c" only
    ri.apply_snapshot("p1", snap(1, "b", "c", "x/+"))  # "a" leaves, id 1 still has "b"
    assert ri.forward_targets("b", [1]).peers == {"p1"} and not ri.forward_targets("a", [1])


def test_literal_filters_are_found_by_topic_not_in_the_trie():
    """Literal filters cost no trie node (a joining node's 100,000 of them were most of its
    apply time): the trie holds the wildcard ones alone, and the literal equal to a topic is
    found in the union map, also next to wildcard filters matching the same topic."""
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, *(f"dev/{i}" for i in range(1000)), "dev/+", "$share/g/dev/7"))
    ri.apply_snapshot("p2", snap(1, "dev/7", "#"))
    assert len(ri._wild) == 2  # "dev/+" and "#": wildcard plain filters only
    assert ri.peers_for("dev/7") == {"p1", "p2"} and ri.peers_for("dev/1000") == {"p1", "p2"}
    assert ri.peers_for("$share/g/dev/7") == set()  # (a topic "#" skips; not the shared one)
    assert forwarded(deliver(ri, "dev/7")) == [{"p1", "p2"}]  # once, over three filters
    assert ri.remove_peer("p1")
    assert len(ri._wild) == 1 and ri.peers_for("dev/7") == {"p2"}
    assert ri.peers_for("dev/8") == {"p2"} and forwarded(deliver(ri, "dev/8")) == [{"p2"}]


def test_a_chunk_of_literal_filters_is_validated_at_once_and_bad_ones_still_counted():
    ri = RemoteInterest()
    good = [K(f"t/{i}") for i in range(100)]
    for bad in (InterestKey(None, "$share/g/x"), InterestKey(None, "a\x00b"),
                InterestKey(None, ""), InterestKey(None, "x" * 70_000)):
        ri.apply_snapshot("p1", InterestSnapshot(1, frozenset([*good, bad])))
        assert ri.keys("p1") == frozenset(good)
    assert ri.invalid_keys == 4


def test_chunked_snapshots_take_effect_with_the_last_chunk():
    li = LocalInterest()
    li.apply([InterestAdded(K(f"t/{i}")) for i in range(5)])
    chunks = list(li.snapshot_chunks(max_keys=2))
    assert [(c.chunk, c.last, len(c.keys)) for c in chunks] == [(0, False, 2), (1, False, 2),
                                                                (2, True, 1)]
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(1, "old"))
    # each chunk's new keys are subscribed as it comes; the version and removals wait
    assert [a.filter for a in ri.apply_snapshot("p1", chunks[0])] == sorted(
        k.filter for k in chunks[0].keys)
    assert len(ri.apply_snapshot("p1", chunks[1])) == 2
    assert ri.version("p1") == 1 and ri.holds("p1", K("old"))
    last = ri.apply_snapshot("p1", chunks[2])
    assert [type(a) for a in last] == [LocalUnsubscribe, LocalSubscribe]
    assert ri.version("p1") == 1 and ri.keys("p1") == li.snapshot().keys  # (li is at 1 too)
    [request] = ri.apply_snapshot("p1", chunks[1])  # out of order: ask again
    assert isinstance(request, RequestSnapshot)
    assert ri.apply_snapshot("p1", chunks[2]) == []  # still out of order, asked already
    for chunk in chunks:
        ri.apply_snapshot("p1", chunk)
    assert ri.keys("p1") == li.snapshot().keys


def test_chunk_keys_with_a_subscribe_time_wait_for_the_last_chunk():
    """A key with a subscribe time gets a catch-up, planned when the snapshot takes effect:
    it is subscribed with the last chunk, the others as their chunk comes."""
    fresh, settled = K("fresh/1"), K("settled/1")
    first = InterestSnapshot(7, frozenset({fresh, settled}), 0, last=False, since={fresh: 5})
    ri = RemoteInterest()
    assert ri.apply_snapshot("p1", first) == [LocalSubscribe("settled/1", 1)]
    assert not ri.holds("p1", fresh) and ri.version("p1") is None
    assert ri.apply_snapshot("p1", InterestSnapshot(7, frozenset(), 1)) == [
        LocalSubscribe("fresh/1", 2)]
    assert ri.version("p1") == 7 and ri.keys("p1") == {fresh, settled}


def test_an_abandoned_chunked_snapshot_is_reconciled_by_the_next():
    ri = RemoteInterest()
    ri.apply_snapshot("p1", InterestSnapshot(3, frozenset({K("a"), K("b")}), 0, last=False))
    [request] = ri.apply_snapshot("p1", InterestSnapshot(3, frozenset({K("c")}), 2))
    assert isinstance(request, RequestSnapshot) and ri.version("p1") is None
    actions = ri.apply_snapshot("p1", snap(4, "a", "c"))
    assert actions == [LocalUnsubscribe("b", 1), LocalSubscribe("c", 2)]
    assert ri.keys("p1") == {K("a"), K("c")} and ri.version("p1") == 4


def test_large_deltas_are_split_in_consecutive_versions():
    li = LocalInterest()
    deltas = li.apply_chunked([InterestAdded(K(f"t/{i}")) for i in range(5)], max_keys=2)
    assert [(d.from_version, d.to_version, len(d.added)) for d in deltas] == [
        (0, 1, 2), (1, 2, 2), (2, 3, 1)]
    ri = RemoteInterest()
    ri.apply_snapshot("p1", snap(0))
    for d in deltas:
        ri.apply_delta("p1", d)
    assert ri.keys("p1") == li.snapshot().keys


def test_memory_per_remote_filter_stays_small():
    """What the routing core keeps per remote filter (the keys themselves excepted): the peers'
    key sets, the union entry with its id (a literal filter has no trie leaf). Peer sets are
    shared between filters held by the same peers: ~200 B here with two peers holding every
    filter (~280 B with a trie leaf per literal filter, 1,130 B when each filter had its own
    sets and dicts)."""
    keys = frozenset(K(f"scale/{i // 1000}/{i % 1000}") for i in range(20_000))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ri = RemoteInterest(journal=True)
        for peer in ("p1", "p2"):
            ri.apply_snapshot(peer, InterestSnapshot(1, keys))
            ri.take_journal()
        per_filter = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
    finally:
        tracemalloc.stop()
    assert per_filter < 300, per_filter
    assert ri.subscription_count() == 20_000
    assert ri.forward_targets("scale/7/42", [ri.local_subscriptions()["scale/7/42"]]).peers \
        == {"p1", "p2"}


def test_subscribe_times_are_forgotten_oldest_first_in_one_pass():
    """50,000 subscribe times at once, then a change 10 s later forgets them all in one call.
    They are an OrderedDict: with a dict each removal re-scanned the entries removed before it
    (O(n^2): 100,000 bulk subscriptions blocked a sidecar's loop for 8 s; not timed here)."""
    li = LocalInterest(keep_ms=10_000)
    li.apply([InterestAdded(K(f"bulk/{i}"), at_ms=i // 10) for i in range(50_000)])
    assert len(li.snapshot().since) == 50_000  # within 5 s of each other
    [d] = li.apply_chunked([InterestAdded(K("late"), at_ms=14_000)])
    assert d.since == {K("late"): 14_000}
    assert li.snapshot().since == {K(f"bulk/{i}"): i // 10 for i in range(40_000, 50_000)} | {
        K("late"): 14_000}  # the last second of them is within 10 s of the late one
