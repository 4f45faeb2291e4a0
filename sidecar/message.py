"""The message values every part shares: cores and adapters alike (no I/O, no codec)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sidecar.topics import MAX_LENGTH, TopicError, mqtt_string_problem, validate_topic


@dataclass(frozen=True)
class MessageProperties:
    """MQTT v5 properties a message carries across the cluster (the plugin protocol's JSON form
    is `sidecar.local.events.properties_to_json`)."""

    user: tuple[tuple[str, str], ...] = ()
    content_type: str | None = None
    payload_format: int | None = None
    correlation_data: bytes | None = None
    response_topic: str | None = None
    message_expiry: int | None = None


RESERVED_PREFIXES = ("$mqfed/", "$CONTROL/mqfed")
"""Topics of the cluster's own traffic (the plugin reserves them): never a peer's message."""


CACHED_TOPIC_LENGTH = 256
"""Longest topic (characters) whose answer `topic_problem` keeps (8,192 of them: 8 MiB at most)."""


def topic_problem(topic: str) -> str | None:
    """Why a peer's message cannot be published on `topic`; None if it can. Kept for the
    short topics seen last: a topic's answer never changes, and a stream repeats its topics."""
    if len(topic) <= CACHED_TOPIC_LENGTH:
        return _cached_topic_problem(topic)
    return _topic_problem(topic)


def _topic_problem(topic: str) -> str | None:
    try:
        validate_topic(topic)
    except TopicError as exc:
        return str(exc)
    if topic.startswith(RESERVED_PREFIXES):
        return f"topic {topic[:60]!r} is reserved for mqfed's own traffic"
    return None


_cached_topic_problem = lru_cache(maxsize=8192)(_topic_problem)


def publish_problem(topic: str, qos: int, props: MessageProperties) -> str | None:
    """Why a message received from a peer cannot be published on the local Mosquitto (it
    would refuse it, or drop the sidecar's connection for it); None if it can."""
    problem = topic_problem(topic)
    if problem is not None:
        return problem
    if qos not in (0, 1, 2):
        return f"QoS {qos} is not 0, 1 or 2"
    strings = [("content type", props.content_type), ("response topic", props.response_topic)]
    strings += [("user property", text) for pair in props.user for text in pair]
    for name, text in strings:
        problem = None if text is None else mqtt_string_problem(text)
        if problem is not None:
            return f"{name}: {problem}"
    if props.response_topic is not None:
        try:
            validate_topic(props.response_topic)
        except TopicError as exc:
            return f"response topic: {exc}"
    if props.payload_format not in (None, 0, 1):
        return f"payload format indicator {props.payload_format} is not 0 or 1"
    if props.correlation_data is not None and len(props.correlation_data) > MAX_LENGTH:
        return f"correlation data of {len(props.correlation_data)} bytes, at most {MAX_LENGTH}"
    if props.message_expiry is not None and not 0 <= props.message_expiry < 1 << 32:
        return f"message expiry {props.message_expiry} is not a 32-bit number"
    return None
