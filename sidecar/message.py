"""The message values every part shares: cores and adapters alike (no I/O, no codec)."""

from __future__ import annotations

from dataclasses import dataclass

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


def publish_problem(topic: str, qos: int, props: MessageProperties) -> str | None:
    """Why a message received from a peer cannot be published on the local Mosquitto (it
    would refuse it, or drop the sidecar's connection for it); None if it can."""
    try:
        validate_topic(topic)
    except TopicError as exc:
        return str(exc)
    if topic.startswith(RESERVED_PREFIXES):
        return f"topic {topic[:60]!r} is reserved for mqfed's own traffic"
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
