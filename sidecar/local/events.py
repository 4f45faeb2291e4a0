"""Typed plugin events, replies and commands: the sidecar's side of docs/plugin-protocol.md (v1).

Decoding is strict about what the contract promises (a missing field or a wrong type is a
`ProtocolError` naming it) and lenient about what it does not forbid (unknown extra keys are
ignored, so the plugin may add fields). The dataclasses below are the schema: each field's type
annotation picks its JSON conversion, and a field with a default may be absent.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from sidecar.local.protocol import (
    CALIBRATION_SESSION_EXPIRY,
    CONTROL_TOPIC,
    EVENTS_TOPIC,
    PROTOCOL_VERSION,
    REPLY_PREFIX,
    SIDECAR_USERNAME,
)
from sidecar.message import MessageProperties

__all__ = [
    "CALIBRATION_SESSION_EXPIRY",
    "CONTROL_TOPIC",
    "EVENTS_TOPIC",
    "PROTOCOL_VERSION",
    "REPLY_PREFIX",
    "SIDECAR_USERNAME",
    "CommandFailed",
    "Connect",
    "ConnectRejected",
    "Disconnect",
    "Event",
    "Heartbeat",
    "MessageProperties",
    "ProtocolError",
    "Reply",
    "RetainedSeen",
    "SessionExpired",
    "Snapshot",
    "SnapshotAssembler",
    "SnapshotClient",
    "SnapshotSubscription",
    "Subscribe",
    "Unsubscribe",
    "Will",
    "decode_event",
    "decode_reply",
    "encode_command",
]


class ProtocolError(ValueError):
    """A plugin message does not follow the protocol; the message says what is wrong."""


class CommandFailed(ProtocolError):
    """The plugin answered a command with ``ok: false``; `code` is its ``error`` field."""

    def __init__(self, message: str, code: str | None) -> None:
        super().__init__(message)
        self.code = code


# --- JSON field conversions ------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a string")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("an integer")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("true or false")
    return value


def _b64(value: Any) -> bytes:
    try:
        return base64.b64decode(_str(value), validate=True)
    except (binascii.Error, TypeError):
        raise TypeError("base64 text") from None


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None:
            return None
        try:
            return convert(value)
        except TypeError as exc:
            raise TypeError(f"{exc} or null") from None

    return check


def _obj(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("an object")
    return value


def _b64_text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def properties_to_json(props: MessageProperties) -> dict[str, Any]:
    """The protocol's ``properties`` object: only the keys that are set."""
    out: dict[str, Any] = {}
    if props.user:
        out["user"] = [[k, v] for k, v in props.user]
    for f in dataclasses.fields(props)[1:]:
        value = getattr(props, f.name)
        if value is not None:
            out[f.name] = _b64_text(value) if isinstance(value, bytes) else value
    return out


def properties_from_json(obj: Any) -> MessageProperties:
    """Parse a ``properties`` object (null or absent keys are unset); `ProtocolError` if bad."""
    if obj is None:
        return MessageProperties()
    try:
        obj = _obj(obj)
    except TypeError:
        raise ProtocolError(f"properties must be an object, got {_type_name(obj)}") from None
    user = obj.get("user") or []
    if not isinstance(user, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in user
    ):
        raise ProtocolError("properties: 'user' must be a list of [key, value] strings")
    props = _build(MessageProperties, {**obj, "user": None}, "properties")
    return dataclasses.replace(props, user=tuple((k, v) for k, v in user))


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Will:
    """A client's will as it set it at CONNECT: ``delay`` is its Will Delay Interval (s);
    ``properties`` include its Message Expiry Interval."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    delay: int = 0
    properties: MessageProperties = MessageProperties()


@dataclass(frozen=True)
class Connect:
    """A client connection was accepted by every auth provider."""

    TYPE: ClassVar[str] = "connect"
    epoch: str
    seq: int
    t_ms: int
    client: str
    username: str | None
    protocol: str
    clean_start: bool
    session_expiry: int | None
    keepalive: int
    session_present: bool
    address: str | None
    will: Will | bool | None = None
    """The client's `Will`, False when it set none, None when unknown (unreadable)."""
    accepted_ms: int | None = None
    """When Mosquitto accepted it (its CONNACK went out then; `t_ms` is when the plugin
    reported it, at Mosquitto's next tick). None: an older plugin."""


@dataclass(frozen=True)
class ConnectRejected:
    """A connection was refused: ``reason`` is ``denied`` (the deny list), ``starting`` (the
    sessions gate), ``draining`` (admission closed by a drain) or ``auth``."""

    TYPE: ClassVar[str] = "connect_rejected"
    epoch: str
    seq: int
    t_ms: int
    client: str | None
    username: str | None
    reason: str


@dataclass(frozen=True)
class Disconnect:
    """A client connection ended (``taken_over``: replaced by a newer one with the same id)."""

    TYPE: ClassVar[str] = "disconnect"
    epoch: str
    seq: int
    t_ms: int
    client: str
    taken_over: bool
    session_kept: bool
    session_expiry: int | None
    will: str | None = None
    """What became of its will: "sent" (published now), "delayed" (after its delay unless it
    comes back), "none" (none, or cleared), None (unknown; always at a takeover)."""


@dataclass(frozen=True)
class Subscribe:
    """A client subscribes (reported at the ACL check, before Mosquitto adds it)."""

    TYPE: ClassVar[str] = "subscribe"
    epoch: str
    seq: int
    t_ms: int
    client: str
    filter: str
    qos: int
    options: int | None = None
    subscription_id: int | None = None


@dataclass(frozen=True)
class Unsubscribe:
    """A client unsubscribes from a filter."""

    TYPE: ClassVar[str] = "unsubscribe"
    epoch: str
    seq: int
    t_ms: int
    client: str
    filter: str


@dataclass(frozen=True)
class RetainedSeen:
    """A client published with retain=1 (an empty payload deletes the retained message)."""

    TYPE: ClassVar[str] = "retained"
    epoch: str
    seq: int
    t_ms: int
    client: str
    topic: str
    payload: bytes
    qos: int
    properties: MessageProperties = MessageProperties()


@dataclass(frozen=True)
class SessionExpired:
    """An offline persistent session expired."""

    TYPE: ClassVar[str] = "session_expired"
    epoch: str
    seq: int
    t_ms: int
    client: str


@dataclass(frozen=True)
class Heartbeat:
    """Periodic counts from the plugin."""

    TYPE: ClassVar[str] = "heartbeat"
    epoch: str
    seq: int
    t_ms: int
    clients: int
    sessions: int
    subscriptions: int
    buffered: int


Event = (
    Connect
    | ConnectRejected
    | Disconnect
    | Subscribe
    | Unsubscribe
    | RetainedSeen
    | SessionExpired
    | Heartbeat
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        Connect,
        ConnectRejected,
        Disconnect,
        Subscribe,
        Unsubscribe,
        RetainedSeen,
        SessionExpired,
        Heartbeat,
    )
}


# --- snapshot ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotSubscription:
    """One subscription of a client in a snapshot (``filter`` verbatim, incl. ``$share/..``)."""

    filter: str
    qos: int


@dataclass(frozen=True)
class SnapshotClient:
    """One session (online, or offline and persistent) in a snapshot."""

    client: str
    username: str | None
    protocol: str
    clean_start: bool
    session_expiry: int | None
    online: bool
    subscriptions: tuple[SnapshotSubscription, ...] = ()
    will: Will | bool | None = None
    """Online clients: as in `Connect`."""


@dataclass(frozen=True)
class Snapshot:
    """Every session at the cut: events ≤ ``seq`` of ``epoch`` are reflected in it."""

    epoch: str
    seq: int
    clients: tuple[SnapshotClient, ...] = ()


def _subscriptions(value: Any) -> tuple[SnapshotSubscription, ...]:
    if not isinstance(value, list):
        raise TypeError("a list")
    return tuple(_build(SnapshotSubscription, _obj(s), "subscription") for s in value)


def _properties(value: Any) -> MessageProperties:
    try:
        return properties_from_json(value)
    except ProtocolError as exc:
        raise TypeError(f"a properties object ({exc})") from None


def _will(value: Any) -> Will | bool:
    if value is False:
        return False
    if not isinstance(value, dict):
        raise TypeError("a will object or false")
    try:
        return _build(Will, value, "will")
    except ProtocolError as exc:
        raise TypeError(f"a will object ({exc})") from None


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "str": _str,
    "str | None": _optional(_str),
    "int": _int,
    "int | None": _optional(_int),
    "bool": _bool,
    "bytes": _b64,
    "bytes | None": _optional(_b64),
    "MessageProperties": _properties,
    "tuple[SnapshotSubscription, ...]": _subscriptions,
    "Will | bool | None": _optional(_will),
}

_JSON_NAME = {"t_ms": "t"}
_QOS_FIELDS = {"qos"}


def _build(cls: type[Any], obj: Mapping[str, Any], where: str) -> Any:
    """Build dataclass `cls` from a JSON object, checking each field against its annotation."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = _JSON_NAME.get(f.name, f.name)
        if key not in obj or (obj[key] is None and f.default is not dataclasses.MISSING):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{where}: missing field {key!r}")
            continue
        value = obj[key]
        try:
            value = _CONVERTERS[str(f.type)](value)
        except TypeError as exc:
            raise ProtocolError(
                f"{where}: field {key!r} must be {exc}, got {_type_name(value)}"
            ) from None
        if f.name in _QOS_FIELDS and value not in (0, 1, 2):
            raise ProtocolError(f"{where}: field {key!r} must be 0, 1 or 2, got {value}")
        kwargs[f.name] = value
    return cls(**kwargs)


# --- decoding ---------------------------------------------------------------------------------


def _load(payload: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(payload.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {_type_name(obj)}")
    if "v" not in obj:
        raise ProtocolError(f"{what}: missing field 'v' (protocol version)")
    version = obj["v"]
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        hint = (
            "upgrade the sidecar (mqfed) to match the plugin"
            if isinstance(version, int) and version > PROTOCOL_VERSION
            else "upgrade the plugin to match the sidecar"
        )
        raise ProtocolError(
            f"plugin speaks protocol version {version!r}, this sidecar speaks"
            f" {PROTOCOL_VERSION}: {hint}"
        )
    return obj


def decode_event(payload: bytes) -> Event:
    """Decode one message of `EVENTS_TOPIC`; raise `ProtocolError` if it breaks the contract."""
    obj = _load(payload, "event")
    kind = obj.get("type")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        if "type" not in obj:
            raise ProtocolError("event: missing field 'type'")
        known = ", ".join(sorted(EVENT_TYPES))
        raise ProtocolError(f"event: unknown type {kind!r} (known: {known})")
    where = f"event {kind!r}"
    if isinstance(obj.get("seq"), int):
        where += f" seq {obj['seq']}"
    event: Event = _build(cls, obj, where)
    return event


@dataclass(frozen=True)
class Reply:
    """A plugin's answer to a command; `fields` holds every key besides v/id/cmd/ok/error."""

    id: str
    cmd: str | None
    ok: bool
    error: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def decode_reply(payload: bytes) -> Reply:
    """Decode one message of a reply topic; raise `ProtocolError` if it breaks the contract."""
    obj = _load(payload, "reply")
    head = _build(_ReplyHead, obj, "reply")
    rest = {k: v for k, v in obj.items() if k not in ("v", "id", "cmd", "ok", "error")}
    return Reply(id=head.id, cmd=head.cmd, ok=head.ok, error=head.error, fields=rest)


@dataclass(frozen=True)
class _ReplyHead:
    id: str
    ok: bool
    cmd: str | None = None
    error: str | None = None


class SnapshotAssembler:
    """Collects the chunk replies of one snapshot request, in any order, into a `Snapshot`.

    `feed` returns the `Snapshot` once every chunk arrived, else None. It raises `CommandFailed`
    for an ``ok: false`` reply and `ProtocolError` for a reply of another request, chunks that
    disagree on epoch, cut or chunk count, or a malformed chunk. A repeated chunk is ignored.
    """

    def __init__(self, request_id: str | None = None) -> None:
        """`request_id` None: take the id of the first reply fed."""
        self.request_id = request_id
        self._head: tuple[str, int, int] | None = None  # epoch, seq, chunks
        self._chunks: dict[int, tuple[SnapshotClient, ...]] = {}

    def feed(self, reply: Reply) -> Snapshot | None:
        """Add one chunk reply; return the complete `Snapshot` when this was the last one."""
        where = f"snapshot reply {reply.id!r}"
        if self.request_id is None:
            self.request_id = reply.id
        if reply.id != self.request_id:
            raise ProtocolError(f"{where} fed to the assembler of request {self.request_id!r}")
        if not reply.ok:
            raise CommandFailed(f"snapshot request {reply.id!r} failed: {reply.error}", reply.error)
        f = reply.fields
        head = _build(_ChunkHead, f, where)
        if head.chunks < 0 or not 0 <= head.chunk < max(head.chunks, 1):
            raise ProtocolError(f"{where}: chunk {head.chunk} of {head.chunks} is out of range")
        if not isinstance(f.get("clients"), list):
            raise ProtocolError(f"{where}: field 'clients' must be a list")
        key = (head.epoch, head.seq, head.chunks)
        if self._head is None:
            self._head = key
        elif key != self._head:
            raise ProtocolError(
                f"{where}: chunk {head.chunk} says epoch {head.epoch} seq {head.seq} of"
                f" {head.chunks} chunks, earlier chunks said epoch {self._head[0]}"
                f" seq {self._head[1]} of {self._head[2]}"
            )
        if head.chunk not in self._chunks:
            self._chunks[head.chunk] = tuple(
                _build(SnapshotClient, _client_obj(c, where), f"{where} client")
                for c in f["clients"]
            )
        if len(self._chunks) < max(head.chunks, 1):
            return None
        return Snapshot(epoch=head.epoch, seq=head.seq, clients=_merge_split(
            c for i in sorted(self._chunks) for c in self._chunks[i]))

    add = feed


def _merge_split(clients: Iterable[SnapshotClient]) -> tuple[SnapshotClient, ...]:
    """A client with more subscriptions than one chunk holds comes as consecutive entries
    (its subscriptions split between them): one entry each again."""
    out: list[SnapshotClient] = []
    for c in clients:
        if out and out[-1].client == c.client:
            out[-1] = replace(out[-1], subscriptions=out[-1].subscriptions + c.subscriptions)
        else:
            out.append(c)
    return tuple(out)


@dataclass(frozen=True)
class _ChunkHead:
    epoch: str
    seq: int
    chunk: int
    chunks: int


def _client_obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where}: each client must be an object, got {_type_name(value)}")
    if "subscriptions" not in value:
        raise ProtocolError(f"{where} client: missing field 'subscriptions'")
    return value


# --- commands ---------------------------------------------------------------------------------

_RESERVED = {"v", "id", "reply", "cmd"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return _b64_text(value)
    if isinstance(value, MessageProperties):
        return properties_to_json(value)
    return value


def deliver_item(topic: str, payload: bytes, qos: int,
                 properties: MessageProperties | None = None,
                 subscription_ids: tuple[int, ...] = ()) -> dict[str, Any]:
    """One message of a `deliver_batch` command's `messages`; `subscription_ids`: the
    Subscription Identifiers it goes to its client with."""
    item: dict[str, Any] = {"topic": topic, "payload": _b64_text(payload), "qos": qos}
    if properties is not None:
        item["properties"] = properties_to_json(properties)
    if subscription_ids:
        item["subscription_ids"] = list(subscription_ids)
    return item


def encode_command(
    cmd: str, *, request_id: str | None = None, reply: str | None = None, **fields: Any
) -> bytes:
    """A command for `CONTROL_TOPIC` as compact JSON with ``"v": 1``.

    bytes become base64 and `MessageProperties` its JSON; fields that are None are left out.
    `reply` must start with `REPLY_PREFIX`.
    """
    if reply is not None and not reply.startswith(REPLY_PREFIX):
        raise ValueError(f"reply topic {reply!r} must start with {REPLY_PREFIX!r}")
    clash = _RESERVED & fields.keys()
    if clash:
        raise ValueError(f"command field(s) {sorted(clash)} are reserved")
    obj: dict[str, Any] = {"v": PROTOCOL_VERSION}
    if request_id is not None:
        obj["id"] = request_id
    if reply is not None:
        obj["reply"] = reply
    obj["cmd"] = cmd
    obj.update((k, _jsonable(v)) for k, v in fields.items() if v is not None)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
