"""Constants of the plugin ↔ sidecar protocol (docs/plugin-protocol.md)."""

from __future__ import annotations

import hashlib

PROTOCOL_VERSION = 1
"""The protocol version this sidecar speaks (the ``v`` field)."""

EVENTS_TOPIC = "$SYS/broker/mqfed/events"
"""The plugin publishes its events here (QoS 1)."""

CONTROL_TOPIC = "$CONTROL/mqfed/v1"
"""The sidecar publishes commands here."""

REPLY_PREFIX = "$SYS/broker/mqfed/replies/"
"""Every command's ``reply`` topic must start with this."""

CALIBRATION_SESSION_EXPIRY = 1234567891
"""Session expiry the sidecar connects with, so the plugin can find the field in memory."""

SIDECAR_USERNAME = "mqfed-sidecar"
"""Username of the sidecar's connection to its Mosquitto."""

DEFAULT_SIDECAR_ID = "mqfed-sidecar"
"""Default client id of the sidecar's connection (plugin option ``sidecar_id``), and the prefix
of every id `sidecar_client_id` makes."""


def sidecar_client_id(secret: str) -> str:
    """The client id of a node's sidecar on its Mosquitto: `mqfed-sidecar-` and 16 hex digits
    derived from the node's secret (its forwarding connection adds `.fwd`).

    Unguessable on purpose: on a TLS listener with `use_identity_as_username` (or a PSK one)
    Mosquitto asks no plugin before it lets a new connection take over the session of the
    same client id, so a client that could name the sidecar's id could kick it, whatever the
    plugin then denies it (docs/plugin-protocol.md, "Identity and access")."""
    digest = hashlib.sha256(b"mqfed sidecar client id\0" + secret.encode()).hexdigest()
    return f"{DEFAULT_SIDECAR_ID}-{digest[:16]}"

SESSION_EXPIRY_NEVER = 4294967295
"""``session_expiry`` value meaning the session never expires."""
