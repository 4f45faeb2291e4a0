"""A peer's message: what keeps it from being published locally."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.message import (
    CACHED_TOPIC_LENGTH,
    MessageProperties,
    _topic_problem,
    publish_problem,
    topic_problem,
)

NO_PROPERTIES = MessageProperties()


@given(st.text(alphabet="ab/+#$\x00 ", max_size=12))
def test_the_kept_answer_is_the_answer(topic: str) -> None:
    assert topic_problem(topic) == _topic_problem(topic)
    assert topic_problem(topic) == _topic_problem(topic)  # (the second time from the cache)


def test_bad_topics_are_refused_every_time_long_ones_too() -> None:
    for _ in range(2):
        assert "wildcard" in (publish_problem("a/+", 1, NO_PROPERTIES) or "")
        assert "reserved" in (publish_problem("$mqfed/x", 1, NO_PROPERTIES) or "")
        long = "x/" * CACHED_TOPIC_LENGTH + "#"
        assert publish_problem(long, 0, NO_PROPERTIES) is not None
        assert publish_problem(long[:-1] + "y", 0, NO_PROPERTIES) is None
    assert publish_problem("a/b", 3, NO_PROPERTIES) == "QoS 3 is not 0, 1 or 2"
