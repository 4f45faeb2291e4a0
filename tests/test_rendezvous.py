"""Rendezvous choice: deterministic, spread, and only a leaving node's keys move."""

from __future__ import annotations

from collections import Counter

from sidecar.rendezvous import choose, weight


def test_same_choice_whatever_the_order_of_the_nodes():
    nodes = ["n1", "n2", "n3", "n4"]
    for key in (f"client-{i}" for i in range(50)):
        assert choose(key, nodes) == choose(key, list(reversed(nodes)))


def test_weights_are_stable_across_processes():
    # a fixed value: the hash is not Python's per-process salted hash()
    assert weight("client-1", "n2") == 0xCAD8531613F15625


def test_keys_spread_and_only_the_removed_nodes_keys_move():
    nodes = ["n1", "n2", "n3", "n4"]
    keys = [f"client-{i}" for i in range(2000)]
    before = {k: choose(k, nodes) for k in keys}
    spread = Counter(before.values())
    assert set(spread) == set(nodes) and min(spread.values()) > 350
    after = {k: choose(k, ["n1", "n2", "n4"]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "n3" for k in moved)


def test_no_nodes_no_choice():
    assert choose("c", []) is None


def test_ranked_starts_with_the_chosen_node_and_holds_every_node_once():
    from sidecar.rendezvous import ranked

    nodes = [f"n{i}" for i in range(7)]
    for key in ("a", "b", "dev-1"):
        order = ranked(key, nodes)
        assert order[0] == choose(key, nodes) and sorted(order) == sorted(nodes)
        assert ranked(key, reversed(nodes)) == order
