"""`LinkPlan` (which peers the plugin links to, and what each link carries) and the commands
`LinkWiring` makes of it (issue 25, slice 3: the sidecar half of the links)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.peering.handshake import LINKS, Hello
from sidecar.routing.links import LinkPlan, SetLinkFilters, SetLinks
from sidecar.routing.links_wiring import FILTERS_PER_COMMAND, LinkWiring, link_secret
from sidecar.routing.table import InterestKey

A = ("127.0.0.1", 1884)
B = ("127.0.0.1", 1885)


def test_links_carry_filters_only_once_every_peer_in_the_view_takes_links():
    plan = LinkPlan()
    assert plan.on_view({"n2", "n3"}) == [] and not plan.carrying
    assert plan.on_interest("n2", {"a/#"}) == []
    assert plan.on_address("n2", A) == [SetLinks((("n2", *A),))]  # n3 takes none (yet)
    assert not plan.carrying
    out = plan.on_address("n3", B)
    assert out == [SetLinks((("n2", *A), ("n3", *B))), SetLinkFilters("n2", ("a/#",), ())]
    assert plan.carrying
    assert plan.on_interest("n3", {"b", "c/+"}) == [SetLinkFilters("n3", ("b", "c/+"), ())]
    assert plan.on_interest("n3", {"b"}) == [SetLinkFilters("n3", (), ("c/+",))]


def _linked(peer: str, filters: set[str]) -> LinkPlan:
    """n2 and n3 in the view, both taking links; `peer` wants `filters`."""
    plan = LinkPlan()
    plan.on_view({"n2", "n3"})
    plan.on_address("n2", A)
    plan.on_address("n3", B)
    plan.on_interest(peer, filters)
    return plan


def test_a_peer_without_links_takes_every_filter_back_but_the_links_stay():
    plan = _linked("n2", {"a"})
    # a fourth node that takes no links joins: records go through the sidecars again
    out = plan.on_view({"n2", "n3", "n4"})
    assert out == [SetLinkFilters("n2", (), ("a",))]
    assert plan.on_address("n4", None) == []
    out = plan.on_view({"n2", "n3"})  # it left
    assert out == [SetLinkFilters("n2", ("a",), ())]


def test_a_peer_that_leaves_loses_its_link_and_one_that_moves_keeps_it():
    plan = _linked("n3", {"x"})
    assert plan.on_address("n3", ("127.0.0.2", 1885)) == [
        SetLinks((("n2", *A), ("n3", "127.0.0.2", 1885)))]  # its filters stay on the link
    out = plan.on_view({"n2"})
    assert out == [SetLinks((("n2", *A),))]
    assert "n3" not in plan.applied and "n3" not in plan.wanted
    # back: a new link in the plugin (empty), its interest comes again with its snapshot
    out = plan.on_view({"n2", "n3"})
    assert out == [SetLinks((("n2", *A), ("n3", "127.0.0.2", 1885)))]
    assert plan.on_interest("n3", {"x"}) == [SetLinkFilters("n3", ("x",), ())]


def test_a_restarted_plugin_gets_every_link_and_filter_again():
    plan = LinkPlan()
    plan.on_view({"n2"})
    plan.on_address("n2", A)
    plan.on_interest("n2", {"a", "b"})
    assert plan.on_reset() == [SetLinks((("n2", *A),)), SetLinkFilters("n2", ("a", "b"), ())]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["view", "address", "interest", "reset"]),
    st.sampled_from(["n2", "n3", "n4"]),
    st.frozensets(st.sampled_from(["a", "b", "c/#", "d/+"]), max_size=3),
    st.booleans()), max_size=30))
def test_the_plugin_ends_as_the_plan_says_whatever_the_order(steps):
    """Apply every command to a model of the plugin: its links and filters end exactly as
    the plan's inputs say (links for the peers in the view that gave an address; filters
    only while every peer in the view did)."""
    plan = LinkPlan()
    links: dict[str, tuple[str, int]] = {}
    filters: dict[str, set[str]] = {}
    view: set[str] = set()
    addresses: dict[str, tuple[str, int]] = {}
    interest: dict[str, frozenset[str]] = {}

    def apply(actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, SetLinks):
                new = {p: (h, port) for p, h, port in action.links}
                for peer in set(links) - set(new):
                    filters.pop(peer, None)
                links.clear()
                links.update(new)
            else:
                assert action.peer in links
                assert not set(action.add) & filters.get(action.peer, set())
                assert set(action.remove) <= filters.get(action.peer, set())
                filters.setdefault(action.peer, set()).update(action.add)
                filters[action.peer] -= set(action.remove)

    for kind, peer, fs, flag in steps:
        if kind == "view":
            view = view | {peer} if flag else view - {peer}
            interest = {p: f for p, f in interest.items() if p in view}
            apply(plan.on_view(view))
        elif kind == "address":
            if flag:
                addresses[peer] = A
            else:
                addresses.pop(peer, None)
            apply(plan.on_address(peer, A if flag else None))
        elif kind == "interest":
            interest[peer] = fs
            apply(plan.on_interest(peer, fs))
        else:
            links.clear()
            filters.clear()
            apply(plan.on_reset())
    assert set(links) == {p for p in addresses if p in view}
    carrying = bool(view) and all(p in addresses for p in view)
    for peer in links:
        want = set(interest.get(peer, ())) if carrying else set()
        assert filters.get(peer, set()) == want


class Plugin:
    def __init__(self) -> None:
        self.commands: list[tuple[str, dict[str, Any]]] = []

    async def request(self, cmd: str, **fields: Any) -> Any:
        self.commands.append((cmd, fields))


async def _wired() -> None:
    plugin = Plugin()
    wiring = LinkWiring("n1", link_secret("t" * 32), plugin.request)
    wiring.start()
    try:
        wiring.on_view({"n2": "n2.example:7000"})
        # a listener on every address is reached at the host of the peer's gRPC address
        wiring.on_peer_hello(Hello("c", "n2", 1, grpc_address="127.0.0.5:7000",
                                   mqtt_address="0.0.0.0:1883"), frozenset({LINKS}))
        wiring.on_interest("n2", [InterestKey(None, f"t/{i}") for i in range(2500)]
                           + [InterestKey("g", "shared/#")])
        await asyncio.sleep(0.1)
    finally:
        await wiring.stop()
    cmd, fields = plugin.commands[0]
    assert cmd == "links" and fields["node"] == "n1"
    assert fields["links"] == [{"peer": "n2", "host": "127.0.0.5", "port": 1883,
                                "username": "mqfed-link", "password": link_secret("t" * 32)}]
    adds = [f for c, f in plugin.commands[1:] if c == "link_filters"]
    assert [len(f["add"]) for f in adds] == [FILTERS_PER_COMMAND, FILTERS_PER_COMMAND, 500]
    assert all(f["peer"] == "n2" and f["remove"] == [] for f in adds)
    assert "shared/#" not in {x for f in adds for x in f["add"]}  # a shared pick stays


def test_the_wiring_sends_numeric_addresses_and_filters_in_chunks():
    asyncio.run(_wired())


def test_the_link_password_is_the_same_for_one_token_and_long_enough_for_the_plugin():
    one = link_secret("token-1" * 5)
    assert one == link_secret("token-1" * 5) and one != link_secret("token-2" * 5)
    assert 16 <= len(one) <= 200


class Stats:
    """A plugin whose link to n2 took 10 records and PUBACKs them 4 per `stats` read."""

    def __init__(self) -> None:
        self.reads = 0

    async def request(self, cmd: str, **fields: Any) -> Any:
        if cmd != "stats":
            return None
        self.reads += 1
        acked = min(10, 4 * (self.reads - 1))

        class Reply:
            pass
        reply = Reply()
        reply.fields = {"links": {"list": [{"peer": "n2", "records": 10,  # type: ignore
                                            "acked_records": acked}]}}
        return reply


async def _settling() -> tuple[bool, int, bool]:
    plugin = Stats()
    wiring = LinkWiring("n1", link_secret("t" * 32), plugin.request)
    wiring.plan.on_view({"n2"})
    wiring.plan.on_address("n2", A)
    ok = await wiring.settled("n2", 5.0)
    return ok, plugin.reads, await wiring.settled("n3", 0.0)


def test_a_barrier_waits_until_the_link_to_that_peer_acknowledged_what_it_took():
    ok, reads, unlinked = asyncio.run(_settling())
    assert ok and reads == 4  # target read, then 4, 8, 10 acknowledged
    assert unlinked  # no link to n3: nothing to wait for
