"""Constants of the plugin ↔ sidecar protocol (docs/plugin-protocol.md)."""

from __future__ import annotations

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
"""Default client id of the sidecar's connection (plugin option ``sidecar_id``)."""

SESSION_EXPIRY_NEVER = 4294967295
"""``session_expiry`` value meaning the session never expires."""
