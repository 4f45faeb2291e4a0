"""Topic names, topic filters, matching and the trie (MQTT 5 §4.7)."""

from __future__ import annotations

import re
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.topics import (
    TopicError,
    TopicTrie,
    all_literal,
    matches,
    mqtt_string_problem,
    parse_filter,
    validate_filter,
    validate_topic,
)


def naive_match(filter: str, topic: str) -> bool:
    """Reference matcher, written independently of the module: recursion over level lists."""
    if filter.startswith("$share/"):
        filter = filter.split("/", 2)[2]

    def rec(f: list[str], t: list[str]) -> bool:
        if not f:
            return not t
        if f[0] == "#":
            return True
        if not t:
            return False
        return (f[0] == "+" or f[0] == t[0]) and rec(f[1:], t[1:])

    if topic.startswith("$") and filter[0] in "+#":
        return False
    return rec(filter.split("/"), topic.split("/"))


# ---- spec examples (§4.7.1, §4.7.2) ---------------------------------------------------------

SPEC_CASES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("sport/tennis/#", "sport/tennis", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+", "sport", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/broker", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("ACCOUNTS", "Accounts", False),
    ("/", "/", True),
    ("a/b", "a/b/", False),
    ("$share/g/sport/#", "sport/tennis", True),
    ("$share/g/#", "$SYS/x", False),
    ("$share/g/a/+", "a/b", True),
]


@pytest.mark.parametrize(("filter", "topic", "expected"), SPEC_CASES)
def test_spec_examples(filter: str, topic: str, expected: bool) -> None:
    assert matches(filter, topic) is expected
    assert naive_match(filter, topic) is expected
    trie: TopicTrie[str] = TopicTrie()
    trie.add(filter, "v")
    assert trie.match(topic) == ({"v"} if expected else set())
    assert trie.matching_filters(topic) == ([filter] if expected else [])


# ---- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["a", "/", "a//b", "$SYS/x", "é/ü", "a b", "x" * 65535])
def test_valid_topics(topic: str) -> None:
    assert validate_topic(topic) is None  # a refusal raises TopicError


@pytest.mark.parametrize(
    ("topic", "message"),
    [
        ("", "must not be empty"),
        ("a/+", "wildcard '+' at index 2"),
        ("a/#", "wildcard '#' at index 2"),
        ("a/b#", "wildcard '#'"),
        ("a\0b", "U+0000 at index 1"),
        ("x" * 65536, "65536 UTF-8 bytes, at most 65535"),
        ("é" * 32768, "65536 UTF-8 bytes"),
        ("a\udc80", "not encodable as UTF-8 at index 1"),
    ],
)
def test_invalid_topics(topic: str, message: str) -> None:
    with pytest.raises(TopicError, match=re.escape(message)) as info:
        validate_topic(topic)
    assert str(info.value).startswith("invalid topic ")


@pytest.mark.parametrize(
    "filter",
    [
        "#",
        "+",
        "a/#",
        "+/+",
        "/+",
        "a/+/b",
        "+/#",
        "a//#",
        "$SYS/#",
        "$share/g/#",
        "$share/g/a/+",
        "$share",
        "$shared/x",
        "a/$share/b",
    ],
)
def test_valid_filters(filter: str) -> None:
    assert validate_filter(filter) is None  # a refusal raises TopicError


@pytest.mark.parametrize(
    ("filter", "message"),
    [
        ("", "must not be empty"),
        ("a/#/b", "invalid topic filter 'a/#/b': '#' must be the last level"),
        ("#/a", "'#' must be the last level"),
        ("a#", "'#' must be a whole level (level 1 is 'a#')"),
        ("a/b#", "'#' must be a whole level (level 2 is 'b#')"),
        ("a/b+/c", "'+' must be a whole level (level 2 is 'b+')"),
        ("++", "'+' must be a whole level"),
        ("a\0", "U+0000"),
        ("a/" + "x" * 65534, "at most 65535"),
        ("$share/", "empty share name"),
        ("$share//a", "empty share name"),
        ("$share/g", "missing topic filter after share name 'g'"),
        ("$share/g/", "missing topic filter after share name 'g'"),
        ("$share/g+/a", "share name 'g+' contains '+'"),
        ("$share/#/a", "share name '#' contains '#'"),
        ("$share/g/a/#/b", "'#' must be the last level"),
    ],
)
def test_invalid_filters(filter: str, message: str) -> None:
    with pytest.raises(TopicError, match=re.escape(message)) as info:
        validate_filter(filter)
    assert str(info.value).startswith("invalid topic filter ")
    assert isinstance(info.value, ValueError)


def test_long_names_are_shortened_in_messages() -> None:
    with pytest.raises(TopicError) as info:
        validate_topic("x" * 70000)
    assert len(str(info.value)) < 200


def test_parse_filter() -> None:
    assert parse_filter("a/+") == (None, "a/+")
    assert parse_filter("$share/grp/a/#") == ("grp", "a/#")
    assert parse_filter("$share/g//") == ("g", "/")
    with pytest.raises(TopicError):
        parse_filter("$share/g")


@settings(max_examples=500)
@given(st.lists(st.sampled_from(["a", "/", "+", "#", "$", "$share/", "ü", "\x00", "\x9f",
                                  "\ud800", "\ufdd0", "\U0001ffff", "\ufffd"]), max_size=12))
def test_parse_filter_fast_path_agrees_with_the_rules(parts: list[str]) -> None:
    from sidecar.topics import _parse_filter

    text = "".join(parts)

    try:
        expected: object = _parse_filter(text)
    except TopicError:
        expected = TopicError
    try:
        got: object = parse_filter(text)
    except TopicError:
        got = TopicError
    assert got == expected


@settings(max_examples=300)
@given(st.lists(st.lists(st.sampled_from(["a", "/", "+", "#", "$", "$share/", "ü", "\x00",
                                          "\x9f", "\ud800", "\ufdd0", "\U0001ffff"]),
                         max_size=6).map("".join), max_size=4))
def test_all_literal_agrees_with_parse_filter(filters: list[str]) -> None:
    def literal(text: str) -> bool:
        try:
            group, inner = parse_filter(text)
        except TopicError:
            return False
        return group is None and "+" not in inner and "#" not in inner

    assert all_literal(filters) == all(literal(f) for f in filters)


def test_all_literal_edges() -> None:
    assert not all_literal(["a\x00b"])  # (U+0000 separates them: one inside is refused)
    assert not all_literal(["a", "$share/g/b"]) and not all_literal(["a", ""])
    assert all_literal(["a" * (65_535 // 4)])
    assert not all_literal(["a", "a" * (65_535 // 4 + 1)])  # (parse_filter checks those)
    assert all_literal([])


# ---- trie ----------------------------------------------------------------------------------


def test_trie_add_remove_len_filters() -> None:
    trie: TopicTrie[int] = TopicTrie()
    assert trie.add("a/+", 1)
    assert not trie.add("a/+", 1)
    assert trie.add("a/+", 2)
    assert trie.add("$share/g/a/+", 3)
    assert trie.add("#", 4)
    assert len(trie) == 3
    assert sorted(trie.filters()) == ["#", "$share/g/a/+", "a/+"]
    assert trie.match("a/b") == {1, 2, 3, 4}
    assert trie.matching_filters("a/b") == ["#", "$share/g/a/+", "a/+"]
    assert trie.get("a/+") == {1, 2}
    assert "a/+" in trie and "a/b" not in trie
    assert trie.remove("a/+", 1)
    assert not trie.remove("a/+", 1)
    assert not trie.remove("x/y", 1)
    assert trie.remove("a/+", 2)
    assert "a/+" not in trie
    assert trie.match("a/b") == {3, 4}
    assert trie.remove("$share/g/a/+", 3)
    assert trie.remove("#", 4)
    assert len(trie) == 0
    assert list(trie.filters()) == []
    assert trie._root.children == {}  # pruned


def test_trie_values_collapse_back_to_one_and_none_is_a_value() -> None:
    trie: TopicTrie[int | None] = TopicTrie()
    assert trie.add("a", None) and not trie.add("a", None)
    assert trie.match("a") == {None} and "a" in trie
    assert trie.add("a", 1) and trie.add("$share/g/a", 2)  # two values, two filters on "a"
    assert trie.remove("a", None) and trie.get("a") == {1}
    assert trie.remove("$share/g/a", 2) and trie.matching_filters("a") == ["a"]
    assert not trie.remove("a", 2) and trie.match("a") == {1}
    assert trie.add("a/b", 3, checked=True) and trie.match("a/b") == {3}  # (caller validated)


def test_trie_leaf_costs_no_container_of_its_own() -> None:
    """A filter with one value is a node and its key in the parent (the routing tables pay this
    per remote filter): well under the ~600 B a dict and a set per leaf cost before."""
    names = [f"s/{i // 100}/{i % 100}" for i in range(10_000)]
    trie: TopicTrie[str] = TopicTrie()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for name in names:
            trie.add(name, name)
        per_filter = (tracemalloc.get_traced_memory()[0] - before) / len(names)
    finally:
        tracemalloc.stop()
    assert per_filter < 200, per_filter
    assert trie.match("s/7/42") == {"s/7/42"} and len(trie) == 10_000


def test_trie_rejects_invalid_filters() -> None:
    trie: TopicTrie[int] = TopicTrie()
    with pytest.raises(TopicError, match="'#' must be the last level"):
        trie.add("a/#/b", 1)
    assert len(trie) == 0


def test_trie_remove_keeps_other_branches() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a/b/c", "x")
    trie.add("a/b", "y")
    assert trie.remove("a/b/c", "x")
    assert trie.match("a/b") == {"y"}
    assert trie.match("a/b/c") == set()


def test_trie_dollar_topics() -> None:
    trie: TopicTrie[str] = TopicTrie()
    for f in ["#", "+/x", "$SYS/#", "$SYS/+", "+/+"]:
        trie.add(f, f)
    assert trie.match("$SYS/x") == {"$SYS/#", "$SYS/+"}
    assert trie.match("a/x") == {"#", "+/x", "+/+"}


# ---- properties ----------------------------------------------------------------------------

LEVELS = ["a", "b", "", "ü"]
topics = st.builds(
    lambda first, rest: "/".join([first, *rest]) or "/",
    st.sampled_from(LEVELS + ["$SYS", "$x"]),
    st.lists(st.sampled_from(LEVELS), max_size=3),
)


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(LEVELS + ["+", "$SYS"]), min_size=0, max_size=4))
    if not levels or draw(st.booleans()):
        levels.append("#")
    share = draw(st.sampled_from(["", "", "$share/g/", "$share/h/"]))
    return share + ("/".join(levels) or "/")


@settings(max_examples=300, deadline=None)
@given(filters(), topics)
def test_matches_agrees_with_reference(filter: str, topic: str) -> None:
    validate_filter(filter)
    validate_topic(topic)
    assert matches(filter, topic) == naive_match(filter, topic)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(filters(), st.integers(0, 3)), max_size=25),
    st.lists(st.tuples(filters(), st.integers(0, 3)), max_size=10),
    st.lists(topics, min_size=1, max_size=8),
)
def test_trie_agrees_with_reference(
    added: list[tuple[str, int]], removed: list[tuple[str, int]], probe: list[str]
) -> None:
    trie: TopicTrie[int] = TopicTrie()
    model: set[tuple[str, int]] = set()
    for f, v in added:
        assert trie.add(f, v) == ((f, v) not in model)
        model.add((f, v))
    for f, v in removed:
        assert trie.remove(f, v) == ((f, v) in model)
        model.discard((f, v))
    assert len(trie) == len({f for f, _ in model})
    assert sorted(trie.filters()) == sorted({f for f, _ in model})
    for topic in probe:
        assert trie.match(topic) == {v for f, v in model if naive_match(f, topic)}
        assert trie.matching_filters(topic) == sorted(
            {f for f, _ in model if naive_match(f, topic)}
        )


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=20))
def test_validation_never_crashes(text: str) -> None:
    """Any text is accepted or refused with TopicError (no other exception), and a valid
    topic is a valid filter too, unless it reads as a shared subscription (`$share/...`)."""
    outcomes = {}
    for check in (validate_topic, validate_filter):
        try:
            check(text)
            outcomes[check.__name__] = True
        except TopicError:
            outcomes[check.__name__] = False
    if not text.startswith("$share/"):
        assert not outcomes["validate_topic"] or outcomes["validate_filter"], text


@pytest.mark.parametrize("text", ["a\x01b", "a\x1f", "a\x7f", "a\x85", "a\ufdd0", "\uffff",
                                  "a\U0001fffe", "a\x00", "a\ud800"])
def test_strings_mosquitto_refuses_are_invalid(text: str) -> None:
    """Mosquitto drops a connection that sends one of these (control characters,
    non-characters, U+0000, lone surrogates): a peer must not make the sidecar send them."""
    assert mqtt_string_problem(text) is not None
    with pytest.raises(TopicError):
        validate_topic(text)
    with pytest.raises(TopicError):
        validate_filter(text + "/#")


def test_strings_mosquitto_accepts_are_valid() -> None:
    for text in ("", "a/b", "fuzz/ü/😀", "\u2028", "\ufeff", "\ufdcf", "\ufdf0", "\ufffd"):
        assert mqtt_string_problem(text) is None, text
    assert mqtt_string_problem("a" * 65_536) == "65536 UTF-8 bytes, at most 65535"
