"""Shadow connections: the sidecar acting as a client on its own Mosquitto (adapter).

A plugin cannot create a session, so the sidecar makes one the MQTT way: it connects over the
private socket with the client's id and the sidecar's username and secret (the plugin knows
such a connection as a shadow: docs/plugin-protocol.md), subscribes, and leaves. MQTT's own
takeover then hands that session to the real client (session present).

- `materialize`: make a session with the given subscriptions and expiry;
- `drain`: resume the session, take every message Mosquitto queued for it (up to a marker the
  caller has delivered behind them), and leave it to `finish`: deleted (expiry 0) once another
  node holds the messages, or given back to try again: what the other node did not take stays
  in the session (QoS 1 unacknowledged; QoS 2, whose PUBREC the shadow sent, delivered into it
  again: Mosquitto keeps only their PUBRELs);
- `discard`: delete the session (a clean start with expiry 0; an offline session is never
  kicked, a use-after-free in Mosquitto 2.0.11).

Shadows never reconnect by themselves: one that did would take the session back from its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from sidecar.local.forward_client import from_paho_properties
from sidecar.local.protocol import SESSION_EXPIRY_NEVER, SIDECAR_USERNAME
from sidecar.message import MessageProperties
from sidecar.sessions.record import Subscription
from sidecar.sessions.unreleased import without_resent
from sidecar.thread_handoff import ThreadHandoff

log = logging.getLogger("mqfed.sessions")

MARKER_TOPIC = "$SYS/broker/mqfed/drain-marker"
TIMEOUT = 5.0


class ShadowError(RuntimeError):
    """A shadow connection failed; the message says where."""


@dataclass(frozen=True, slots=True)
class Queued:
    """One message Mosquitto had queued for the session."""

    topic: str
    payload: bytes
    qos: int
    properties: MessageProperties
    subscription_ids: tuple[int, ...] = ()
    """Of the subscriptions it matched (as Mosquitto sent it, MQTT v5)."""


class Shadow:
    """One connection as client `client_id` (paho's thread bridged to asyncio)."""

    def __init__(self, socket_path: Path, secret: str, client_id: str) -> None:
        self.socket_path = socket_path
        self.client_id = client_id
        self._loop = asyncio.get_running_loop()
        self._connack: asyncio.Future = self._loop.create_future()
        self._acks: dict[int, asyncio.Future] = {}
        self.messages: list[tuple[mqtt.MQTTMessage, Queued]] = []
        self.restore: dict[str, int] = {}  # a drain's: what the session gets back if it fails
        self.resent: frozenset[int] = frozenset()  # a drain's: QoS 2 ids sent as unreleased
        self.arrived = asyncio.Event()
        self._incoming: ThreadHandoff[tuple[mqtt.MQTTMessage, Queued]] = ThreadHandoff(
            self._take_incoming)
        self._client = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
            protocol=mqtt.MQTTv5, transport="unix", reconnect_on_failure=False,
            manual_ack=True)
        self._client.username_pw_set(SIDECAR_USERNAME, secret)
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_ack
        self._client.on_unsubscribe = self._on_ack
        self._client.on_message = self._on_message
        self._client.on_disconnect = self._on_disconnect

    # ---- paho thread ---------------------------------------------------------------------
    def _call(self, fn: Callable[[], object]) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        def done() -> None:
            if self._connack.done():
                return
            if reason_code.is_failure:
                self._connack.set_exception(ShadowError(f"CONNACK {reason_code}"))
            else:
                self._connack.set_result(bool(flags.session_present))
        self._call(done)

    def _on_ack(self, client, userdata, mid, reason_codes, properties) -> None:
        codes = [int(rc.value) for rc in reason_codes] if isinstance(reason_codes, list) else []

        def done() -> None:
            fut = self._acks.pop(mid, None)
            if fut is not None and not fut.done():
                fut.set_result(codes)
        self._call(done)

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        """Messages go over to asyncio in runs (one wake-up per message cost more than the
        rest of collecting a queue)."""
        props, sids = from_paho_properties(getattr(msg, "properties", None))
        self._incoming.put(self._loop, [(msg, Queued(msg.topic, msg.payload, msg.qos, props,
                                                      sids))])

    def _take_incoming(self, items: list[tuple[mqtt.MQTTMessage, Queued]]) -> None:
        self.messages.extend(items)
        self.arrived.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        def done() -> None:
            if not self._connack.done():
                self._connack.set_exception(ShadowError(f"closed before CONNACK: {reason_code}"))
        self._call(done)

    # ---- asyncio -------------------------------------------------------------------------
    async def connect(self, clean_start: bool, expiry: int, receive_maximum: int = 0) -> bool:
        """Connect; returns session present."""
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = expiry
        if receive_maximum:
            props.ReceiveMaximum = receive_maximum
        try:
            self._client.connect(str(self.socket_path), port=1883, keepalive=30,
                                 clean_start=clean_start, properties=props)
        except OSError as exc:
            raise ShadowError(f"cannot reach {self.socket_path}: {exc}") from None
        self._client.loop_start()
        try:
            return await asyncio.wait_for(self._connack, TIMEOUT)
        except TimeoutError:
            raise ShadowError("no CONNACK") from None

    async def _await_ack(self, send: Callable[[], tuple[int, int]], what: str) -> list[int]:
        fut = self._loop.create_future()
        rc, mid = send()
        if rc != mqtt.MQTT_ERR_SUCCESS:
            raise ShadowError(f"{what} not sent ({rc})")
        self._acks[mid] = fut
        try:
            return await asyncio.wait_for(fut, TIMEOUT)
        except TimeoutError:
            raise ShadowError(f"no {what.upper()}ACK") from None

    async def subscribe(self, subscriptions: dict[str, int]) -> None:
        """Make every subscription (`SessionRecord.subscriptions`: QoS, No Local, Retain As
        Published, identifier) as its client made it, at most 100 per SUBSCRIBE and one
        SUBSCRIBE per identifier (a packet carries one). Retain Handling 2: a session made
        here gets no retained messages (its client got them when it subscribed); refused
        subscriptions raise."""
        by_id: dict[int, list[tuple[str, SubscribeOptions]]] = {}
        for filter, value in subscriptions.items():
            sub = Subscription.unpack(value)
            by_id.setdefault(sub.identifier, []).append((filter, SubscribeOptions(
                qos=sub.qos, noLocal=sub.no_local, retainAsPublished=sub.retain_as_published,
                retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)))
        for identifier, items in by_id.items():
            props = None
            if identifier:
                props = Properties(PacketTypes.SUBSCRIBE)
                props.SubscriptionIdentifier = identifier
            for i in range(0, len(items), 100):
                chunk = items[i:i + 100]
                codes = await self._await_ack(
                    lambda c=chunk, p=props: self._client.subscribe(c, properties=p), "sub")
                refused = [f for (f, _), code in zip(chunk, codes, strict=False) if code >= 0x80]
                if refused or len(codes) != len(chunk):
                    raise ShadowError(f"subscriptions refused: {refused[:5]}")

    async def unsubscribe(self, filters: list[str]) -> None:
        """Unsubscribe from every filter (at most 100 per UNSUBSCRIBE)."""
        for i in range(0, len(filters), 100):
            chunk = filters[i:i + 100]
            await self._await_ack(lambda c=chunk: self._client.unsubscribe(c), "unsub")

    async def wait_for(self, topic: str, payload: bytes, timeout: float = TIMEOUT) -> None:
        """Until the message `topic`/`payload` arrived (the marker behind the queue)."""
        deadline = self._loop.time() + timeout
        seen = 0  # messages already looked at (a queue of thousands came in many runs)
        while not any(m.topic == topic and m.payload == payload
                      for m, _ in self.messages[seen:]):
            seen = len(self.messages)
            self.arrived.clear()
            left = deadline - self._loop.time()
            if left <= 0:
                raise ShadowError("the drain marker did not arrive")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), left)

    def queue(self) -> list[tuple[mqtt.MQTTMessage, Queued]]:
        """A drain's messages for the new owner: all but those that travel as unreleased."""
        return without_resent(self.messages, self.resent)

    def ack(self, messages: list[tuple[mqtt.MQTTMessage, Queued]]) -> None:
        """PUBACK or PUBCOMP each: Mosquitto forgets it."""
        for msg, _ in messages:
            if msg.qos:
                self._client.ack(msg.mid, msg.qos)

    async def disconnect(self, expiry: int | None = None) -> None:
        """Leave; with `expiry` (e.g. 0: delete the session) set in the DISCONNECT."""
        props = None
        if expiry is not None:
            props = Properties(PacketTypes.DISCONNECT)
            props.SessionExpiryInterval = expiry
        self._client.disconnect(properties=props)
        await asyncio.get_running_loop().run_in_executor(None, self._client.loop_stop)


_markers = itertools.count(1)


class Shadows:
    """The shadow operations of one node."""

    def __init__(self, socket_path: Path, secret: str,
                 deliver_marker: Callable[[str, str, bytes], Awaitable[None]],
                 deliver_again: Callable[[str, list[Queued]], Awaitable[None]],
                 set_options: Callable[[str, dict[str, int]], Awaitable[None]]) -> None:
        self.socket_path = socket_path
        self.secret = secret
        self.deliver_marker = deliver_marker  # (client, topic, payload): a targeted delivery
        self.deliver_again = deliver_again  # (client, messages): targeted, in order
        self.set_options = set_options  # (client, {filter: options byte}): sub_options
        self.counters = {"qos2_given_back": 0, "qos2_give_back_failed": 0}

    async def materialize(self, client: str, subscriptions: dict[str, int],
                          expiry: int | None) -> None:
        """Make `client`'s session here; raises ShadowError."""
        shadow = Shadow(self.socket_path, self.secret, client)
        try:
            await shadow.connect(False, _expiry(expiry))
            await shadow.subscribe(subscriptions)
        finally:
            await shadow.disconnect()

    async def update(self, client: str, add: dict[str, int], remove: tuple[str, ...]) -> None:
        """Change the subscriptions of `client`'s session here (a replica): end `remove`,
        make `add`; raises ShadowError. A filter of `add` the session has already keeps its
        first No Local and Retain As Published in Mosquitto 2.0.11, whatever the SUBSCRIBE
        says: `set_options` gives them to every filter of `add`."""
        shadow = Shadow(self.socket_path, self.secret, client)
        try:
            await shadow.connect(False, SESSION_EXPIRY_NEVER)
            if remove:
                await shadow.unsubscribe(list(remove))
            if add:
                await shadow.subscribe(add)
                await self.set_options(client, {f: v & 0xFF for f, v in add.items()})
        finally:
            await shadow.disconnect()

    async def drain(self, client: str, filters: tuple[str, ...],
                    restore: dict[str, int] | None = None,
                    resent: frozenset[int] = frozenset()) -> Shadow:
        """Resume `client`'s session, end its subscriptions `filters` (its client has them
        on its new node) and take what it queued; the caller hands `shadow.queue()` over
        (`resent`: packet ids of the QoS 2 messages that travel as unreleased instead), then
        calls `finish`. If the drain fails, the session gets `restore` (its client's
        subscriptions) back: it may be resumed here as it is, or drained again."""
        shadow = Shadow(self.socket_path, self.secret, client)
        shadow.resent = resent
        try:
            await shadow.connect(False, SESSION_EXPIRY_NEVER, receive_maximum=65535)
            shadow.restore = dict(restore or {})
            await shadow.unsubscribe(list(filters))
            payload = f"{client}:{next(_markers)}".encode()
            await self.deliver_marker(client, MARKER_TOPIC, payload)
            await shadow.wait_for(MARKER_TOPIC, payload)
        except BaseException:
            await self._give_back(shadow)
            raise
        shadow.messages = [(m, q) for m, q in shadow.messages if m.topic != MARKER_TOPIC]
        return shadow

    async def finish(self, shadow: Shadow, handed_over: bool, taken: int = 0) -> None:
        """Delete the drained session (its messages are elsewhere now), or give it back to
        drain again later (`_give_back`: `taken`, how many of `shadow.queue()` the other node
        took before the hand-over failed)."""
        if handed_over:
            shadow.ack(shadow.messages)
            await shadow.disconnect(expiry=0)
        else:
            await self._give_back(shadow, taken)

    async def _give_back(self, shadow: Shadow, taken: int = 0) -> None:
        """A failed drain: the session gets its subscriptions back (Retain Handling 2), so a
        client that resumes it here has them (before, it had none: everything after was
        lost), and keeps what the other node did not take. QoS 1 messages stay
        unacknowledged (Mosquitto sends them again); QoS 2 messages are completed and
        delivered into the session again, last: the shadow sent their PUBRECs, so Mosquitto
        keeps only their PUBRELs (they were lost). What the other node took is acknowledged
        (it has them)."""
        queue = shadow.queue()
        again = [m for m in queue[taken:] if m[0].qos == 2]
        try:
            if shadow.restore:
                await shadow.subscribe(shadow.restore)
        except Exception as exc:  # noqa: BLE001 - its connection is gone (the client took over)
            log.warning("giving a session back its subscriptions after a failed drain "
                        "failed: %s", exc, extra={"client": shadow.client_id})
        finally:
            shadow.ack(queue[:taken] + again)
            await shadow.disconnect()
        if not again:
            return
        try:
            await self.deliver_again(shadow.client_id, [q for _, q in again])
            self.counters["qos2_given_back"] += len(again)
        except Exception as exc:  # noqa: BLE001 - the plugin's link is down: they are lost
            self.counters["qos2_give_back_failed"] += len(again)
            log.error("a failed drain could not give its session back %d QoS 2 messages "
                      "(lost): %s", len(again), exc, extra={"client": shadow.client_id})

    async def discard(self, client: str) -> None:
        """Delete `client`'s session here."""
        shadow = Shadow(self.socket_path, self.secret, client)
        try:
            await shadow.connect(True, 0)
        finally:
            await shadow.disconnect()


def _expiry(expiry: int | None) -> int:
    return SESSION_EXPIRY_NEVER if expiry is None else min(expiry, SESSION_EXPIRY_NEVER)
