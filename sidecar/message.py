"""The message values every part shares: cores and adapters alike (no I/O, no codec)."""

from __future__ import annotations

from dataclasses import dataclass


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
