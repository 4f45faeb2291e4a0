"""Generate the Mosquitto config of one node (pure: text in, text out).

The generated file loads the mqfed plugin first, forces the settings the cluster relies on
(`per_listener_settings false`, `persistence false`), keeps the user's own settings (auth,
ACL, TLS listeners) verbatim, and adds the private unix-socket listener for the sidecar.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

AUTH_KEYS = {"password_file", "auth_plugin"}
ACL_KEYS = {"acl_file", "auth_plugin"}
OWNED_LOG_KEYS = {"log_dest"}
DEFAULT_MAX_QUEUED = 10_000
"""Mosquitto's per-client queue limit when the user sets none (stock: 1000). Larger, because a
cluster queues in bursts a single broker does not have: the sidecar's own sessions while it
restarts, and a peer's backlog draining after an outage."""
EVENT_BATCH = 100
"""Plugin events per message to the sidecar at most, when they wait (a burst of subscriptions):
one MQTT message to decode and acknowledge instead of one per event."""
MAX_FORWARD_WINDOW = 16_384
HEADERS_MAX = 1 << 20
"""Topic and properties of a client's message at most (the plugin's MQFED_HEADERS_MAX)."""
DEFAULT_MESSAGE_SIZE_LIMIT = 16 << 20
"""Default of `mqtt.message_size_limit`: the largest payload a client may publish."""
MAX_MESSAGE_SIZE_LIMIT = 40 << 20
"""The largest `mqtt.message_size_limit`: any packet Mosquitto accepts (`max_packet_size_for`
of it, a will included) still fits a peer frame (64 MiB) with a 1 MiB batch beside it."""


def max_packet_size_for(limit: int) -> int:
    """Mosquitto's `max_packet_size` for a client message size limit: room for the sidecar's
    `deliver` command of the largest message a client may send (its payload base64-encoded,
    4/3, and its topic and properties JSON-escaped, at most 6 times HEADERS_MAX) and 1 MiB
    more. Any larger packet is refused by Mosquitto before it is read (MQTT v5: DISCONNECT
    0x95); a client message between the limit and this is refused by the plugin."""
    return -(-limit * 4 // 3) + 6 * HEADERS_MAX + (1 << 20)


def forward_receive_maximum(max_queued: int) -> int:
    """The Receive Maximum the forwarding client asks for, given `max_queued_messages`.

    Mosquitto drops a copy for good only when the client's in-flight plus queued messages reach
    Receive Maximum + `max_queued_messages`; packets it drops before writing them stay in
    flight and are resent after a reconnect (sidecar.local.midgaps). Both together span less
    than half the 65,535 packet ids, so the sidecar can tell a resend from a new copy."""
    if max_queued <= 0:  # unlimited
        return MAX_FORWARD_WINDOW
    return max(20, min(MAX_FORWARD_WINDOW, 32_767 - max_queued))


def backlog_max_for(max_queued: int) -> int:
    """Copies Mosquitto may hold for the forwarding client before the plugin sheds
    publishers: half of `max_queued_messages` (0, never, when it is unlimited)."""
    return max(100, max_queued // 2) if max_queued > 0 else 0


class BrokerConfigError(ValueError):
    """The user's Mosquitto settings conflict with what the cluster needs."""


@dataclass(frozen=True)
class UserSettings:
    """What mqfed learned from the user's included Mosquitto settings."""

    lines: tuple[str, ...]
    external_auth: bool
    external_acl: bool
    sets_allow_anonymous: bool
    sets_log_dest: bool
    sets_max_queued: bool = False
    max_queued: int = DEFAULT_MAX_QUEUED


def _refuse(path: Path, lineno: int, line: str, why: str) -> BrokerConfigError:
    return BrokerConfigError(f"{path}:{lineno}: '{line.strip()}': {why}")


def read_user_settings(path: Path) -> UserSettings:
    """Parse the user's Mosquitto settings file; refuse what the cluster cannot run with."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise BrokerConfigError(f"cannot read mqtt.include {path}: {exc.strerror}") from None
    lines: list[str] = []
    external_auth = external_acl = sets_anon = sets_log_dest = sets_max_queued = False
    max_queued = DEFAULT_MAX_QUEUED
    anonymous = True
    for lineno, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            lines.append(line)
            continue
        key, args = words[0], words[1:]
        if key == "per_listener_settings" and args[:1] == ["true"]:
            raise _refuse(path, lineno, line, "mqfed needs per_listener_settings false "
                          "(the plugin's timer never runs with true); remove the line")
        if key == "persistence" and args[:1] == ["true"]:
            raise _refuse(path, lineno, line, "mqfed owns durability and runs Mosquitto with "
                          "persistence false (sessions restored from Mosquitto's file are "
                          "invisible to the cluster); remove the line")
        if key in ("include_dir",):
            raise _refuse(path, lineno, line, "include_dir cannot be checked by mqfed; put the "
                          "settings in the included file itself")
        if key in ("message_size_limit", "max_packet_size"):
            raise _refuse(path, lineno, line, "mqfed sets the message size limit on every "
                          "node alike: set mqtt.message_size_limit in the node's config "
                          "instead (Mosquitto's max_packet_size is derived from it)")
        if key == "plugin" and args and "mqfed" in Path(args[0]).name:
            raise _refuse(path, lineno, line, "mqfed loads its own plugin first; remove the line")
        if key == "plugin" or key in AUTH_KEYS:
            external_auth = True
        if key == "plugin" or key in ACL_KEYS:
            external_acl = True
        if key == "allow_anonymous":
            sets_anon = True
            anonymous = args[:1] == ["true"]
        if key in OWNED_LOG_KEYS:
            sets_log_dest = True
        if key == "max_queued_messages":
            if len(args) != 1 or not args[0].isdigit():
                raise _refuse(path, lineno, line, "max_queued_messages takes one number "
                              "(0 = unlimited)")
            sets_max_queued, max_queued = True, int(args[0])
        lines.append(line)
    if sets_anon and not anonymous:
        external_auth = True
    return UserSettings(tuple(lines), external_auth, external_acl, sets_anon, sets_log_dest,
                        sets_max_queued, max_queued)


def _decide(setting: str, detected: bool) -> bool:
    return {"auto": detected, "yes": True, "no": False}[setting]


@dataclass(frozen=True)
class BrokerConfig:
    """Everything needed to write one node's mosquitto.conf."""

    node_id: str
    plugin_path: Path
    socket_path: Path
    secret: str
    listen: str = ""
    user: UserSettings | None = None
    include_path: Path | None = None
    external_auth: str = "auto"
    external_acl: str = "auto"
    sidecar_id: str = "mqfed-sidecar"
    fwd_backlog_max: int = 0
    message_size_limit: int = DEFAULT_MESSAGE_SIZE_LIMIT
    catchup_ms: int = 0
    catchup_bytes: int = 16 << 20
    journal_dir: Path | None = None  # the plugin's journal (sidecar.journal); None: none
    capture_socket: Path | None = None  # the sidecar's capture socket (routing.capture)
    link_secret: str = ""  # the password of peers' plugin links (routing.links); "": none


def render(cfg: BrokerConfig) -> str:
    """The full text of mosquitto.conf for one node."""
    user = cfg.user
    auth = _decide(cfg.external_auth, bool(user and user.external_auth))
    acl = _decide(cfg.external_acl, bool(user and user.external_acl))
    out = [
        f"# Generated by mqfed for node {cfg.node_id}. Do not edit: change the node's config",
        "# or the Mosquitto settings file it includes, then restart the node.",
        "per_listener_settings false",
        "persistence false",
        f"plugin {cfg.plugin_path}",
        f"plugin_opt_sidecar_id {cfg.sidecar_id}",
        f"plugin_opt_sidecar_secret {cfg.secret}",
        f"plugin_opt_sidecar_socket {cfg.socket_path}",
        f"plugin_opt_message_size_limit {cfg.message_size_limit}",
        f"plugin_opt_auth {'defer' if auth else 'grant'}",
        f"plugin_opt_acl {'defer' if acl else 'grant'}",
        f"plugin_opt_event_batch {EVENT_BATCH}",
        "plugin_opt_sessions_gate true",
    ]
    backlog_max = cfg.fwd_backlog_max or backlog_max_for(user.max_queued if user
                                                         else DEFAULT_MAX_QUEUED)
    if backlog_max > 0:
        out.append(f"plugin_opt_fwd_backlog_max {backlog_max}")
    # the plugin leaves a slow subscriber out of its inject replies' `queued` near this bound
    max_queued = user.max_queued if user else DEFAULT_MAX_QUEUED
    out.append(f"plugin_opt_max_queued_messages {max(0, max_queued)}")
    if cfg.catchup_ms > 0:
        out.append(f"plugin_opt_catchup_ms {cfg.catchup_ms}")
        out.append(f"plugin_opt_catchup_bytes {cfg.catchup_bytes}")
    if cfg.journal_dir is not None:
        out.append(f"plugin_opt_journal_dir {cfg.journal_dir}")
    if cfg.capture_socket is not None:
        out.append(f"plugin_opt_capture_socket {cfg.capture_socket}")
    if cfg.link_secret:
        out.append(f"plugin_opt_link_secret {cfg.link_secret}")
    if not (user and user.sets_allow_anonymous):
        out.append("allow_anonymous true")
    if not (user and user.sets_max_queued):
        out.append(f"max_queued_messages {DEFAULT_MAX_QUEUED}")
    out.append(f"max_packet_size {max_packet_size_for(cfg.message_size_limit)}")
    if not (user and user.sets_log_dest):
        out += ["log_dest stderr", "log_type error", "log_type warning", "log_type notice"]
    if user is not None:
        out.append(f"# ---- user settings from {cfg.include_path} ----")
        out += list(user.lines)
        out.append("# ---- end of user settings ----")
    out.append(f"listener 0 {cfg.socket_path}")
    if cfg.listen:
        host, _, port = cfg.listen.rpartition(":")
        out.append(f"listener {port} {shlex.quote(host)}")
    return "\n".join(out) + "\n"
