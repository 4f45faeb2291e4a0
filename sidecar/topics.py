"""MQTT 3.1.1/5 topic names and topic filters: validation, matching, and a trie keyed by filter.

Rules (MQTT 5 §4.7, §4.8.2): levels are separated by ``/``; ``+`` matches exactly one level and must
be a whole level; ``#`` matches any number of levels (including the parent: ``a/#`` matches ``a``)
and must be the whole last level; a filter starting with a wildcard never matches a topic starting
with ``$``; ``$share/<group>/<filter>`` is a shared subscription that matches like ``<filter>``.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from sys import intern
from types import MappingProxyType
from typing import Any, Generic, TypeVar

__all__ = [
    "MAX_LENGTH",
    "SHARE_PREFIX",
    "TopicError",
    "TopicTrie",
    "matches",
    "mqtt_string_problem",
    "parse_filter",
    "validate_filter",
    "validate_topic",
]

MAX_LENGTH = 65_535
"""Longest topic name or filter, in UTF-8 bytes."""

MAX_SUBSCRIPTION_ID = 268_435_455
"""Largest MQTT v5 subscription identifier (variable byte integer)."""

SHARE_PREFIX = "$share/"


class TopicError(ValueError):
    """A topic name or topic filter breaks the MQTT rules; the message says what and where."""


def _show(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


_REFUSED = re.compile("[\x00-\x1f\x7f-\x9f\ufdd0-\ufdef" + "".join(
    chr(plane << 16 | 0xFFFE) + chr(plane << 16 | 0xFFFF) for plane in range(17)) + "]")
"""What Mosquitto's UTF-8 check refuses besides encoding errors (it drops the connection
that sends one): U+0000, control characters, non-characters."""


def mqtt_string_problem(text: str) -> str | None:
    """Why `text` cannot be an MQTT UTF-8 string that Mosquitto accepts (topic, filter, client
    id, string property); None if it can. Empty strings are allowed here."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"not encodable as UTF-8 at index {exc.start}"
    if size > MAX_LENGTH:
        return f"{size} UTF-8 bytes, at most {MAX_LENGTH}"
    found = _REFUSED.search(text)
    if found is not None:
        return f"contains U+{ord(found.group()):04X} at index {found.start()}"
    return None


def _check_string(kind: str, text: str) -> None:
    if not text:
        raise TopicError(f"invalid {kind} '': must not be empty")
    problem = mqtt_string_problem(text)
    if problem is not None:
        raise TopicError(f"invalid {kind} {_show(text)}: {problem}")


def validate_topic(topic: str) -> None:
    """Check a topic name (as in PUBLISH); raise `TopicError` if it is not valid."""
    _check_string("topic", topic)
    for char in "+#":
        if char in topic:
            raise TopicError(
                f"invalid topic {_show(topic)}: wildcard {char!r} at index {topic.index(char)}"
                " is not allowed in a topic name"
            )


def _check_levels(kind: str, whole: str, filter: str) -> None:
    levels = filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if level == "#":
            if i != last:
                raise TopicError(f"invalid {kind} {_show(whole)}: '#' must be the last level")
        elif "#" in level:
            raise TopicError(
                f"invalid {kind} {_show(whole)}: '#' must be a whole level"
                f" (level {i + 1} is {level!r})"
            )
        elif level != "+" and "+" in level:
            raise TopicError(
                f"invalid {kind} {_show(whole)}: '+' must be a whole level"
                f" (level {i + 1} is {level!r})"
            )


def _split_share(filter: str) -> tuple[str | None, str]:
    """Split off ``$share/<group>/`` without validating."""
    if filter.startswith(SHARE_PREFIX):
        group, _, inner = filter[len(SHARE_PREFIX) :].partition("/")
        return group, inner
    return None, filter


_PLAIN = re.compile("[^+#\ud800-\udfff" + _REFUSED.pattern[1:-1] + "]+")
"""A filter of these characters alone is valid if not too long and not shared: no wildcard,
nothing Mosquitto refuses, no lone surrogate (so it encodes as UTF-8, at most 4 bytes each)."""


_PLAIN_RUN = re.compile("(?:" + _PLAIN.pattern + "\x00)+")
"""`_PLAIN` filters, each followed by U+0000 (which `_PLAIN` refuses, so it only separates)."""


def all_literal(filters: Sequence[str]) -> bool:
    """Whether every filter is a valid plain filter without wildcards (not shared), checked in
    one regex pass over them all (a peer's snapshot chunk of 5,000). False says only that at
    least one is not: check those with `parse_filter`."""
    if not filters or max(map(len, filters)) > MAX_LENGTH // 4:
        return not filters
    joined = "\x00".join(filters) + "\x00"
    return (_PLAIN_RUN.fullmatch(joined) is not None
            and joined.count("\x00") == len(filters)  # (none holds a U+0000 of its own)
            and not joined.startswith(SHARE_PREFIX) and "\x00" + SHARE_PREFIX not in joined)


def parse_filter(filter: str) -> tuple[str | None, str]:
    """Validate a topic filter and return ``(share group or None, topic filter)``."""
    if (len(filter) <= MAX_LENGTH // 4 and _PLAIN.fullmatch(filter) is not None
            and not filter.startswith(SHARE_PREFIX)):
        return None, filter  # the common case in one regex (literal filters, issue 24)
    return _parse_filter(filter)


def _parse_filter(filter: str) -> tuple[str | None, str]:
    """`parse_filter` rule by rule."""
    kind = "topic filter"
    _check_string(kind, filter)
    if filter.startswith(SHARE_PREFIX):
        group, sep, inner = filter[len(SHARE_PREFIX) :].partition("/")
        if not group:
            raise TopicError(f"invalid {kind} {_show(filter)}: empty share name after '$share/'")
        for char in "+#":
            if char in group:
                raise TopicError(
                    f"invalid {kind} {_show(filter)}: share name {group!r} contains {char!r}"
                )
        if not sep or not inner:
            raise TopicError(
                f"invalid {kind} {_show(filter)}: missing topic filter after share name {group!r}"
            )
        _check_levels(kind, filter, inner)
        return group, inner
    _check_levels(kind, filter, filter)
    return None, filter


def validate_filter(filter: str) -> None:
    """Check a topic filter (as in SUBSCRIBE), shared or not; raise `TopicError` if invalid."""
    parse_filter(filter)


def matches(filter: str, topic: str) -> bool:
    """Whether the topic filter (shared or not) matches the topic name. Neither is validated."""
    _, filter = _split_share(filter)
    if topic.startswith("$") and filter[:1] in ("+", "#"):
        return False
    flevels = filter.split("/")
    tlevels = topic.split("/")
    for i, flevel in enumerate(flevels):
        if flevel == "#":
            return True
        if i >= len(tlevels):
            return False
        if flevel != "+" and flevel != tlevels[i]:
            return False
    return len(flevels) == len(tlevels)


V = TypeVar("V", bound=Hashable)

_NO_CHILDREN: Mapping[str, Any] = MappingProxyType({})
"""The children of every leaf (shared, read-only): a node gets its own dict with its first child."""

_SEVERAL = "\x00several"
"""`_Node.filter` when several filters end on the node (no valid filter contains U+0000)."""


_ABSENT: Any = object()
"""`_Node.lookup` of a filter not stored (None is a value like any other)."""


class _Many(set):
    """Several values under one filter (a single value is stored as itself, without a set)."""

    __slots__ = ()


class _Node(Generic[V]):
    """One level. Memory per stored filter is what the routing tables pay per remote filter, so
    a leaf holds no containers of its own: the filter ending here and its value (or a `_Many`)
    sit in two slots; only a node where several filters end (``a`` and ``$share/g/a``) keeps a
    dict filter -> value."""

    __slots__ = ("children", "filter", "value")

    def __init__(self) -> None:
        self.children: Mapping[str, _Node[V]] = _NO_CHILDREN
        self.filter: str | None = None  # the filter ending here, None, or _SEVERAL
        self.value: Any = None  # its value or _Many; with _SEVERAL: dict filter -> either

    def entries(self) -> Iterator[tuple[str, Any]]:
        """(filter, value or _Many) of every filter ending here."""
        if self.filter is None:
            return iter(())
        if self.filter is _SEVERAL:
            return iter(self.value.items())
        return iter(((self.filter, self.value),))

    def lookup(self, filter: str) -> Any:
        """The value (or _Many) stored under `filter` here, `_ABSENT` if none."""
        if self.filter is _SEVERAL:
            return self.value.get(filter, _ABSENT)
        return self.value if self.filter == filter else _ABSENT

    def store(self, filter: str, stored: Any) -> None:
        """Set the value (or _Many) of `filter`, or remove it (`stored` `_ABSENT`)."""
        if self.filter is _SEVERAL:
            entries: dict[str, Any] = self.value
            if stored is _ABSENT:
                entries.pop(filter, None)
                if len(entries) == 1:
                    (self.filter, self.value), = entries.items()
            else:
                entries[filter] = stored
        elif self.filter is None or self.filter == filter:
            self.filter, self.value = (None, None) if stored is _ABSENT else (filter, stored)
        elif stored is not _ABSENT:
            self.value = {self.filter: self.value, filter: stored}
            self.filter = _SEVERAL


def _values(stored: Any) -> Iterator[Any]:
    return iter(stored) if type(stored) is _Many else iter((stored,))


class TopicTrie(Generic[V]):
    """Values stored under topic filters, looked up by topic name.

    A trie over filter levels (shared filters are keyed by their inner filter), so a lookup costs
    about the number of levels times the number of wildcard branches, not the number of filters.
    `match` returns a new set of the values of every matching filter. A filter with one value
    costs one node and its key in the parent (no per-filter set or dict; level names are
    interned, so ``.../0`` … ``.../999`` under many parents share their strings).
    """

    def __init__(self) -> None:
        self._root: _Node[V] = _Node()
        self._count = 0

    def add(self, filter: str, value: V, *, checked: bool = False) -> bool:
        """Store value under filter (validated, unless the caller did: `checked`); return False
        if it was already there."""
        _, inner = _split_share(filter) if checked else parse_filter(filter)
        node = self._root
        for level in inner.split("/"):
            child = node.children.get(level)
            if child is None:
                if node.children is _NO_CHILDREN:
                    node.children = {}
                child = node.children[intern(level)] = _Node()  # type: ignore[index]
            node = child
        stored = node.lookup(filter)
        if stored is _ABSENT:
            node.store(filter, value)
            self._count += 1
            return True
        if type(stored) is _Many:
            if value in stored:
                return False
            stored.add(value)
            return True
        if stored is value or stored == value:
            return False
        node.store(filter, _Many((stored, value)))
        return True

    def remove(self, filter: str, value: V) -> bool:
        """Remove value from filter; return False if it was not there."""
        _, inner = _split_share(filter)
        path: list[tuple[_Node[V], str]] = []
        node = self._root
        for level in inner.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        stored = node.lookup(filter)
        if stored is _ABSENT:
            return False
        if type(stored) is _Many:
            if value not in stored:
                return False
            stored.discard(value)
            if len(stored) == 1:
                node.store(filter, next(iter(stored)))
            return True
        if not (stored is value or stored == value):
            return False
        node.store(filter, _ABSENT)
        self._count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.filter is not None or child.children:
                break
            del parent.children[level]  # type: ignore[attr-defined]
            if not parent.children:
                parent.children = _NO_CHILDREN
        return True

    def get(self, filter: str) -> set[V]:
        """A copy of the values stored under exactly this filter (empty if none)."""
        node: _Node[V] | None = self._root
        for level in _split_share(filter)[1].split("/"):
            node = node.children.get(level) if node is not None else None
        stored = node.lookup(filter) if node is not None else _ABSENT
        return set() if stored is _ABSENT else set(_values(stored))

    def _nodes(self, topic: str) -> Iterator[_Node[V]]:
        """Every node whose filters match the topic, each once."""
        levels = topic.split("/")
        depth = len(levels)
        dollar = topic.startswith("$")
        stack: list[tuple[_Node[V], int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            children = node.children
            if i == depth:
                yield node
                hash_ = children.get("#")
                if hash_ is not None:  # "a/#" matches "a"
                    yield hash_
                continue
            plus = None
            if i > 0 or not dollar:
                hash_ = children.get("#")
                if hash_ is not None:
                    yield hash_
                plus = children.get("+")
                if plus is not None:
                    stack.append((plus, i + 1))
            child = children.get(levels[i])
            if child is not None and child is not plus:
                stack.append((child, i + 1))

    def match(self, topic: str) -> set[V]:
        """The values of every filter that matches the topic name."""
        result: set[V] = set()
        for node in self._nodes(topic):
            filter = node.filter
            if filter is None:
                continue
            for stored in (node.value.values() if filter is _SEVERAL else (node.value,)):
                if type(stored) is _Many:
                    result |= stored
                else:
                    result.add(stored)
        return result

    def matching_filters(self, topic: str) -> list[str]:
        """Every stored filter (as given, shared or not) that matches the topic name, sorted."""
        return sorted(f for node in self._nodes(topic) for f, _ in node.entries())

    def filters(self) -> Iterator[str]:
        """Every stored filter, as given."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            for filter, _ in node.entries():
                yield filter
            stack.extend(node.children.values())

    def __contains__(self, filter: object) -> bool:
        return isinstance(filter, str) and bool(self.get(filter))

    def __len__(self) -> int:
        """Number of distinct filters holding at least one value."""
        return self._count
