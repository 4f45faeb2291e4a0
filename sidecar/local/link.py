"""The MQTT v5 link from the sidecar to its local Mosquitto (adapter).

paho-mqtt runs its network loop in its own thread (the hot path later); decoded plugin events
are handed to asyncio in batches, command replies are matched to waiting requests by id.
The link uses a persistent session (clean start false) with the calibration session expiry
the plugin uses to locate the session-expiry field (docs/plugin-protocol.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from sidecar.local import mqtt_codec
from sidecar.local.events import (
    CommandFailed,
    Event,
    ProtocolError,
    Reply,
    Snapshot,
    SnapshotAssembler,
    decode_event,
    decode_reply,
    encode_command,
)
from sidecar.local.protocol import (
    CALIBRATION_SESSION_EXPIRY,
    CONTROL_TOPIC,
    EVENTS_TOPIC,
    REPLY_PREFIX,
    SIDECAR_USERNAME,
)
from sidecar.thread_handoff import ThreadHandoff

log = logging.getLogger("mqfed.link")

REPLY_TOPIC = REPLY_PREFIX + "sidecar"
SENTINEL_TOPIC = "$mqfed/read-sentinel"
"""A retained message the link keeps on its Mosquitto: it marks the end of a `read_retained`
answer (`$` topics are not matched by wildcards; the plugin reserves `$mqfed/` for the sidecar:
no other client may publish, subscribe or receive there)."""
SENTINEL_REPAIR_AFTER = 1.0
"""Seconds a retained read waits for the sentinel before it puts the sentinel back and asks
for it again (it is gone: deleted, or expired, or lost with a restarted Mosquitto)."""
READ_TIMEOUT = 4.0
"""Seconds a retained read waits at most (below its callers' own timeouts, so that the repair
runs and the read fails with this link's message rather than theirs)."""


OBSERVER_FILTER = "#"
"""The control link's subscription with catch-up on: every routing makes a READ check for it,
which the plugin refuses after noting the routing (recent.c)."""


class LinkError(RuntimeError):
    """The link to the local Mosquitto or its plugin failed; the message says what to check."""


LINK_RECEIVE_MAXIMUM = 65535
"""QoS 1 events and replies Mosquitto may have in flight to the control link."""


def sidecar_client(client_id: str, secret: str, manual_ack: bool = False,
                   client_class: type[mqtt.Client] = mqtt.Client) -> mqtt.Client:
    """A paho MQTT v5 client over the private unix socket with the sidecar's credentials,
    reconnecting quickly, with no client-side publish queue limit."""
    client = client_class(
        callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
        protocol=mqtt.MQTTv5, transport="unix", reconnect_on_failure=True, manual_ack=manual_ack,
    )
    client.username_pw_set(SIDECAR_USERNAME, secret)
    client.reconnect_delay_set(min_delay=0.1, max_delay=2)
    client.max_queued_messages_set(0)
    return client


class _EventClient(mqtt.Client):
    """paho, with plugin events (QoS 1 on `EVENTS_TOPIC`) decoded by `mqtt_codec` and handed
    to `on_event_payload` without paho's per-message `MQTTMessage`, `Properties` and
    `ReasonCode` objects (most of the link's CPU in a burst of subscriptions). Everything else
    goes through paho."""

    on_event_payload: Callable[[bytes], None] | None = None

    def _handle_publish(self) -> mqtt.MQTTErrorCode:
        hook = self.on_event_payload
        if hook is None or self._protocol != mqtt.MQTTv5:
            return super()._handle_publish()
        try:
            packet = mqtt_codec.decode_publish(self._in_packet["command"],
                                               self._in_packet["packet"])
        except (ValueError, IndexError):
            return super()._handle_publish()
        if packet.topic != EVENTS_TOPIC or packet.qos != 1:
            return super()._handle_publish()
        with self._in_callback_mutex:
            hook(packet.payload)
        return self._send_puback(packet.mid)


class LocalLink:
    """Connects to Mosquitto's private unix socket as the plugin's trusted sidecar."""

    def __init__(self, socket_path: Path, secret: str, client_id: str = "mqfed-sidecar",
                 on_events: Callable[[list[Event]], None] | None = None,
                 on_reconnect: Callable[[], None] | None = None,
                 on_protocol_error: Callable[[ProtocolError], None] | None = None) -> None:
        self.socket_path = socket_path
        self.client_id = client_id
        self.on_events = on_events or (lambda events: None)
        self.on_reconnect = on_reconnect or (lambda: None)
        self.on_protocol_error = on_protocol_error or (lambda exc: None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: ThreadHandoff[Event] = ThreadHandoff(self._flush_events)
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[asyncio.Future, SnapshotAssembler | None]] = {}
        self._ids = itertools.count(1)
        self._connected = asyncio.Event()
        self._connections = 0
        self._refused: str | None = None
        self.events_received = 0
        self._client = sidecar_client(client_id, secret, client_class=_EventClient)
        self._client.on_event_payload = self._on_event_payload
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        self._subscribing: dict[int, list[str]] = {}  # SUBSCRIBE mid -> its filters
        self._reading: tuple[int, dict[str, mqtt.MQTTMessage], asyncio.Future] | None = None
        self._read_lock = asyncio.Lock()
        self._read_id = 0
        self._observing = False

    # ---- paho thread -------------------------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self._refused = str(reason_code)
            return
        _, mid = client.subscribe([(EVENTS_TOPIC, 1), (REPLY_TOPIC, 1)])
        with self._lock:
            self._subscribing[mid] = [EVENTS_TOPIC, REPLY_TOPIC]
        if self._observing:
            self._subscribe_observer()
        self._publish_sentinel()  # (again: a restarted Mosquitto has lost it)
        self._connections += 1
        first = self._connections == 1
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._connected.set)
        if not first:
            self._loop.call_soon_threadsafe(self.on_reconnect)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._connected.clear)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        """Check each SUBACK: a refused filter is logged; a refused read fails that read at
        once (rather than after its timeout)."""
        with self._lock:
            filters = self._subscribing.pop(mid, [])
            reading = self._reading
        refused = [f"{f} (0x{rc.value:02x})" for f, rc in zip(filters, reason_codes, strict=False)
                   if rc.is_failure]
        if not refused:
            return
        log.error("Mosquitto refused the sidecar's subscription to %s; check that the mqfed "
                  "plugin is the first `plugin` line of Mosquitto's config", ", ".join(refused))
        if reading is not None and SENTINEL_TOPIC in filters and self._loop is not None:
            done = reading[2]
            error = LinkError(f"Mosquitto refused reading retained messages: {refused[0]}")
            self._loop.call_soon_threadsafe(
                lambda: done.done() or done.set_exception(error))

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        assert self._loop is not None
        try:
            if msg.topic == EVENTS_TOPIC:
                self._on_event_payload(msg.payload)
            elif msg.topic == REPLY_TOPIC:
                reply = decode_reply(msg.payload)
                self._loop.call_soon_threadsafe(self._deliver_reply, reply)
            elif msg.retain:
                self._on_read(msg)
        except ProtocolError as exc:
            self._loop.call_soon_threadsafe(self.on_protocol_error, exc)

    def _on_event_payload(self, payload: bytes) -> None:
        assert self._loop is not None
        try:  # several events in one message are separated by newlines (event_batch)
            events = [decode_event(line) for line in payload.split(b"\n")]
        except ProtocolError as exc:
            self._loop.call_soon_threadsafe(self.on_protocol_error, exc)
            return
        self._events.put(self._loop, events)

    def _on_read(self, msg: mqtt.MQTTMessage) -> None:
        props = getattr(msg, "properties", None)
        sids = getattr(props, "SubscriptionIdentifier", None) or ()
        with self._lock:
            if self._reading is None or self._reading[0] not in (
                    sids if isinstance(sids, list) else [sids]):
                return
            _, got, done = self._reading
            got[msg.topic] = msg
        if msg.topic == SENTINEL_TOPIC:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    # ---- asyncio thread ----------------------------------------------------------------
    async def read_retained(self, topics: list[str],
                            timeout: float = READ_TIMEOUT) -> dict[str, mqtt.MQTTMessage]:
        """Mosquitto's retained message of each topic that has one. One SUBSCRIBE (QoS 0, a
        subscription identifier of its own) to the topics and then to the sentinel, a retained
        message this link keeps on `SENTINEL_TOPIC`: Mosquitto queues the retained messages in
        filter order and sends them in order, so the sentinel's arrival (with that identifier)
        means all have arrived. Then unsubscribe.

        Repairs itself: without the sentinel after `SENTINEL_REPAIR_AFTER`, it publishes the
        sentinel again and subscribes to it again; Mosquitto handles both after the first
        SUBSCRIBE, so the new sentinel still comes after every answer to it."""
        async with self._read_lock:
            assert self._loop is not None
            self._read_id = self._read_id % 0xFFFFFFF + 1
            got: dict[str, mqtt.MQTTMessage] = {}
            done = self._loop.create_future()
            with self._lock:
                self._reading = (self._read_id, got, done)
            props = Properties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = self._read_id
            filters = [*topics, SENTINEL_TOPIC]
            try:
                self._subscribe_read(filters, props)
                repair_after = min(SENTINEL_REPAIR_AFTER, timeout / 2)
                await asyncio.wait({done}, timeout=repair_after)
                if not done.done():
                    self._publish_sentinel()
                    self._subscribe_read([SENTINEL_TOPIC], props)
                    await asyncio.wait({done}, timeout=timeout - repair_after)
                if not done.done():
                    raise LinkError(f"Mosquitto did not answer a read of {len(topics)} retained "
                                    f"topic(s) within {timeout:.0f}s (its read sentinel "
                                    f"{SENTINEL_TOPIC} was published again)")
                done.result()  # a refused subscription raises here
            finally:
                with self._lock:
                    self._reading = None
                self._client.unsubscribe(filters)
            got.pop(SENTINEL_TOPIC, None)
            return got

    def _subscribe_read(self, filters: list[str], props: Properties) -> None:
        with self._lock:  # (the SUBACK may come before subscribe() returns)
            rc, mid = self._client.subscribe(
                [(t, SubscribeOptions(qos=0)) for t in filters], properties=props)
            self._subscribing[mid] = filters
        if rc != mqtt.MQTT_ERR_SUCCESS:
            raise LinkError(f"cannot read retained messages: {mqtt.error_string(rc)}")

    def observe(self) -> None:
        """Subscribe to `#` (QoS 0, no retained messages) for the plugin's catch-up ring: the
        plugin refuses every message routed to it and notes the routing instead (it never
        arrives here). Made again at every reconnect."""
        self._observing = True
        if self.connected:
            self._subscribe_observer()

    def unobserve(self) -> None:
        """Drop the `#` subscription (catch-up off): with the plugin's ring off, messages
        routed to it would reach the link."""
        self._observing = False
        self._client.unsubscribe(OBSERVER_FILTER)

    def _subscribe_observer(self) -> None:
        options = SubscribeOptions(qos=0, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
        with self._lock:
            _, mid = self._client.subscribe(OBSERVER_FILTER, options=options)
            if mid is not None:
                self._subscribing[mid] = [OBSERVER_FILTER]

    def _publish_sentinel(self) -> None:
        self._client.publish(SENTINEL_TOPIC, b"1", qos=1, retain=True)

    def _flush_events(self, batch: list[Event]) -> None:
        self.events_received += len(batch)
        self.on_events(batch)

    def _deliver_reply(self, reply: Reply) -> None:
        entry = self._waiting.get(reply.id)
        if entry is None:
            log.debug("reply for unknown request", extra={"id": reply.id, "cmd": reply.cmd})
            return
        future, assembler = entry
        if future.done():
            return
        if not reply.ok:
            future.set_exception(CommandFailed(f"plugin refused {reply.cmd}: {reply.error}",
                                               reply.error))
        elif assembler is None:
            future.set_result(reply)
        else:
            try:
                snapshot = assembler.add(reply)
            except ProtocolError as exc:
                future.set_exception(exc)
                return
            if snapshot is not None:
                future.set_result(snapshot)

    async def connect(self, timeout: float = 10.0) -> None:
        """Connect (persistent session) and subscribe to events and replies."""
        self._loop = asyncio.get_running_loop()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = CALIBRATION_SESSION_EXPIRY
        # Events are QoS 1: without this Mosquitto sends 20 at a time (max_inflight_messages)
        # and waits for their PUBACKs, about 2,500 events/s; the plugin's event_window bounds
        # what is in flight instead
        props.ReceiveMaximum = LINK_RECEIVE_MAXIMUM
        try:
            self._client.connect(str(self.socket_path), port=1883, keepalive=30,
                                 clean_start=False, properties=props)
        except OSError as exc:
            raise LinkError(f"cannot reach Mosquitto's private socket {self.socket_path}: "
                            f"{exc.strerror or exc}; is Mosquitto running with the mqfed "
                            "config?") from None
        self._client.loop_start()
        try:
            await asyncio.wait_for(self._connected.wait(), timeout)
        except TimeoutError:
            why = f" (refused: {self._refused})" if self._refused else ""
            raise LinkError(f"no MQTT session on {self.socket_path} within {timeout:.0f}s{why}; "
                            "check that the mqfed plugin is loaded with this node's "
                            "secret") from None

    def _publish_command(self, cmd: str, request_id: str | None, **fields) -> None:
        payload = encode_command(cmd, request_id=request_id,
                                 reply=REPLY_TOPIC if request_id else None, **fields)
        self._client.publish(CONTROL_TOPIC, payload, qos=1)

    def send(self, cmd: str, **fields) -> None:
        """Fire-and-forget command (e.g. `ack`)."""
        self._publish_command(cmd, None, **fields)

    @property
    def connected(self) -> bool:
        """The MQTT session to the plugin is up."""
        return self._connected.is_set()

    async def request(self, cmd: str, timeout: float = 5.0, **fields) -> Reply:
        """Send a command and wait for its reply; raises CommandFailed or LinkError."""
        return await self._await(cmd, None, timeout, fields)

    async def snapshot(self, timeout: float = 10.0) -> Snapshot:
        """Ask the plugin for a consistent cut of clients and subscriptions."""
        return await self._await("snapshot", SnapshotAssembler(), timeout, {})

    async def _await(self, cmd: str, assembler: SnapshotAssembler | None, timeout: float,
                     fields: dict):
        assert self._loop is not None, "connect() first"
        request_id = f"{cmd}-{next(self._ids)}"
        future = self._loop.create_future()
        self._waiting[request_id] = (future, assembler)
        try:
            self._publish_command(cmd, request_id, **fields)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise LinkError(f"the mqfed plugin did not answer '{cmd}' within {timeout:.0f}s: is "
                            "the plugin loaded as the first `plugin` line of Mosquitto's config "
                            f"(check {self.socket_path.parent.parent}/mosquitto.log)?") from None
        finally:
            self._waiting.pop(request_id, None)

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> mqtt.MQTTMessageInfo:
        """Publish on the local Mosquitto (re-injection path)."""
        return self._client.publish(topic, payload, qos=qos, retain=retain, properties=properties)

    def close(self) -> None:
        """Disconnect cleanly (the session stays) and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()
