"""QoS 2 messages a client had acknowledged with PUBREC but not seen released (PUBREL) when it
left a node: the old owner's plugin keeps them (command `unreleased`), its drain sends them with
the session's queue, and the new owner's plugin sends each again under the same packet id
(command `release`), so the client gets the release it waits for, or only the PUBREL for one
whose PUBREC the old owner had read (`pubrel`: the client has it, and may have completed it)
(deploy/mosquitto-plugin `inflight.c`)."""

from __future__ import annotations

import base64
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sidecar.local.events import deliver_item, properties_from_json
from sidecar.message import MessageProperties
from sidecar.topics import MAX_SUBSCRIPTION_ID

SUBSCRIPTION_IDS_MAX = 64
"""Most Subscription Identifiers the plugin takes for one delivered message (util.c)."""


@dataclass(frozen=True)
class Unreleased:
    """One such message and the packet id the client holds it under; `pubrel`: the client
    answered it with PUBREC, so it needs only the PUBREL."""

    packet_id: int
    topic: str
    payload: bytes
    qos: int
    properties: MessageProperties = MessageProperties()
    subscription_ids: tuple[int, ...] = ()
    pubrel: bool = False


def problem(u: Unreleased) -> str | None:
    """Why a peer's message cannot be released, or None."""
    if not 1 <= u.packet_id <= 65535:
        return f"packet id {u.packet_id} outside 1..65535"
    if u.qos not in (1, 2):
        return f"QoS {u.qos}"
    if not u.topic:
        return "empty topic"
    if len(u.subscription_ids) > SUBSCRIPTION_IDS_MAX or not all(
            1 <= s <= MAX_SUBSCRIPTION_ID for s in u.subscription_ids):
        return f"subscription identifiers {list(u.subscription_ids)[:4]} out of range"
    return None


def from_plugin(fields: dict[str, Any]) -> list[Unreleased]:
    """The `unreleased` reply's messages (a malformed one raises ValueError)."""
    out = []
    for item in fields.get("messages") or []:
        if not isinstance(item, dict):
            raise ValueError(f"unreleased message is not an object: {item!r}")
        try:
            payload = base64.b64decode(item["payload"], validate=True)
            out.append(Unreleased(int(item["mid"]), str(item["topic"]), payload,
                                  int(item["qos"]),
                                  properties_from_json(item.get("properties") or {}),
                                  tuple(int(s) for s in item.get("subscription_ids") or ()),
                                  item.get("pubrel") is True))
        except (KeyError, TypeError, ValueError) as exc:  # binascii.Error, ProtocolError
            raise ValueError(f"malformed unreleased message: {exc}") from exc
    return out


def without_resent(collected: list[tuple[Any, Any]], resent: Collection[int]) -> list:
    """A drained queue (the shadow's (paho message, queued) pairs) without the QoS 2 messages
    that travel as unreleased (`resent`: their packet ids): Mosquitto sent those to the shadow
    again under the same packet ids (they were in flight at the client's departure, awaiting
    its PUBREC)."""
    return [(m, q) for m, q in collected if not (resent and m.qos == 2 and m.mid in resent)]


def to_plugin(messages: list[Unreleased]) -> list[dict[str, Any]]:
    """The `release` command's messages."""
    return [{**deliver_item(u.topic, u.payload, u.qos, u.properties, u.subscription_ids),
             "mid": u.packet_id, **({"pubrel": True} if u.pubrel else {})} for u in messages]
