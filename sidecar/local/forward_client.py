"""The hot-path MQTT client of the sidecar on its local Mosquitto (adapter).

A second trusted connection (client id `<sidecar_id>.fwd`), separate from the control link so
that forwarded traffic never delays plugin events. It holds the forwarding subscriptions (the
union of peers' interest: QoS 2, No Local, Retain As Published, one subscription identifier
per filter), receives local publishes with manual acks, and re-injects messages that peers
forwarded. No Local means it never receives its own re-injections, so nothing loops.

Every publish passes through `ReinjectWindow` (sidecar.local.reinjection): at most Mosquitto's
Receive Maximum of QoS 1/2 publishes in flight, and only a publish Mosquitto *accepted* (a
PUBACK/PUBCOMP, not a PUBREC or PUBACK with a failure reason) is reported to `on_published`;
a refused one is sent again after a backoff, in order per topic. `publish` returns a ticket
(not a paho mid) that `on_published` reports.

Its network I/O runs on the asyncio loop (sidecar.local.paho_loop), not on paho's thread: a
copy reaches the forwarder and its ack leaves without a thread handoff. The loop may then read
more slowly than Mosquitto routes; overload shedding (sidecar.local.pressure) bounds what
Mosquitto holds meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import itemgetter
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from sidecar.journal.confirmations import Confirmations
from sidecar.local.batch import INJECT_REPLY, INJECT_TOPIC, WAKE_TOPIC
from sidecar.local.link import sidecar_client
from sidecar.local.midgaps import CopyTracker, Verdict
from sidecar.local.mqtt_codec import NO_PROPERTIES, LeanPublish
from sidecar.local.paho_loop import LeanClient, LoopDriver
from sidecar.local.reinjection import (
    Confirm,
    Refused,
    Reinjection,
    ReinjectWindow,
    Send,
    backoff,
    reason_name,
)
from sidecar.local.shards import MID_BITS, mid_range
from sidecar.message import MessageProperties
from sidecar.routing.forwarder import CutMarker, LocalCopy

log = logging.getLogger("mqfed.forward")

FORWARD_SESSION_EXPIRY = 3600
BARRIER_TOPIC = "$CONTROL/mqfed/barrier"
PROBE_TOPIC = "$SYS/broker/mqfed/fwd-probe"
"""Topic of the plugin's targeted probes to the forwarding client (sidecar.local.midgaps)."""
CUT_PREFIX = b"cut:"  # a probe carrying a moving session's cut (plugin hold.c, cut mode)
_ID_AND_OPTIONS = itemgetter(1, 2)  # (subscription id, no local) of a subscribe_many triple
PACKET_FILTERS = 256
"""Most filters per SUBSCRIBE or UNSUBSCRIBE packet (the identifier groups' size too)."""

_OPTIONS = {no_local: SubscribeOptions(qos=2, noLocal=no_local, retainAsPublished=True,
                                       retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND
                                       ).pack()[0] for no_local in (False, True)}
"""The forwarding subscriptions' options byte, with and without No Local."""


def cut_marker(payload: bytes) -> CutMarker:
    """A cut probe's payload: `cut:<client>`, a new copy's followed by NUL and its client's
    connect time (decimal wall clock ms; an MQTT client id has no NUL)."""
    client, _, connect = payload[len(CUT_PREFIX):].partition(b"\0")
    return CutMarker(client.decode("utf-8", "replace"), CutMarker.connect_ms_of(connect))


def to_paho_properties(props: MessageProperties) -> Properties | None:
    """MQTT v5 PUBLISH properties for paho, or None when there are none."""
    if props == NO_PROPERTIES:  # most messages: no paho object to build
        return None
    out = Properties(PacketTypes.PUBLISH)
    if props.user:
        out.UserProperty = list(props.user)
    for name, value in (("ContentType", props.content_type),
                        ("PayloadFormatIndicator", props.payload_format),
                        ("CorrelationData", props.correlation_data),
                        ("ResponseTopic", props.response_topic),
                        ("MessageExpiryInterval", props.message_expiry)):
        if value is not None:
            setattr(out, name, value)
    return out


def from_paho_properties(props: Properties | None) -> tuple[MessageProperties, tuple[int, ...]]:
    """(message properties, subscription identifiers) of a received paho message."""
    if props is None:
        return MessageProperties(), ()
    get = props.__dict__.get
    sids = get("SubscriptionIdentifier") or ()
    if isinstance(sids, int):
        sids = (sids,)
    return MessageProperties(
        user=tuple(tuple(kv) for kv in get("UserProperty", ())),
        content_type=get("ContentType"),
        payload_format=get("PayloadFormatIndicator"),
        correlation_data=get("CorrelationData"),
        response_topic=get("ResponseTopic"),
        message_expiry=get("MessageExpiryInterval"),
    ), tuple(sids)


class ForwardClient:
    """Forwarding subscriptions in, re-injections out; copies handed to asyncio in batches."""

    def __init__(self, socket_path: Path, secret: str, client_id: str,
                 on_copies: Callable[[list[LocalCopy | CutMarker]], None],
                 on_published: Callable[[list[int]], None],
                 on_connected: Callable[[bool], None], receive_maximum: int = 20,
                 max_queued: int = 0, mid_base: int = 0, clean_start: bool = False) -> None:
        """`receive_maximum`: copies Mosquitto may have in flight to us (see
        `sidecar.broker.conf.forward_receive_maximum`); `max_queued`: Mosquitto's
        `max_queued_messages`, named in the log when Mosquitto drops copies; `mid_base`:
        added to the packet id of every copy handed over (and taken off in `ack`): a shard's
        copies are told apart from the other shards' (sidecar.local.shards); `clean_start`:
        the first connect starts a new session (the shards were laid out differently)."""
        self.socket_path = socket_path
        self.client_id = client_id
        self.mid_base = mid_base
        self._clean_start = clean_start
        self.receive_maximum = receive_maximum
        self.max_queued = max_queued
        self.tracker = CopyTracker()
        self._lost_logged = 0
        self.on_copies = on_copies
        self.on_published = on_published
        self.on_connected = on_connected
        self._loop: asyncio.AbstractEventLoop | None = None
        self._copies: list[LocalCopy | CutMarker] = []
        self._probes: dict[bytes, asyncio.Future] = {}  # barrier probes awaited
        self._probed: list[bytes] = []  # arrived, resolved at the next flush
        self._injecting: dict[int, asyncio.Future] = {}  # batch id -> the plugin's reply
        self._published: list[int] = []
        self._flush_scheduled = False
        self._ready = asyncio.Event()
        self._driver: LoopDriver | None = None
        self.received = 0
        self.taken = 0  # new QoS > 0 copies (Verdict.TAKE), reported to the plugin
        self.reinjected = 0
        self.window = ReinjectWindow()
        self._tickets = 0
        self._by_mid: dict[int, int] = {}  # paho mid of a QoS > 0 publish -> its ticket
        self._retry_timer: asyncio.TimerHandle | None = None
        self._subscribing: dict[int, tuple[list[str], int]] = {}  # SUBSCRIBE mid -> filters, id
        self._sub_waiters: list[tuple[set[int], Callable[[], None]]] = []  # when_subscribed
        self.subscribe_packets = 0  # SUBSCRIBE and UNSUBSCRIBE packets sent
        self._subscribed: dict[str, tuple[int, bool]] = {}  # filter -> id, no local (wanted)
        self._subscribe_refusals: dict[str, int] = {}  # filter -> refusals in a row
        self.subscribe_refused = 0
        # copies settled, for the plugin's journal (sidecar.journal; None: no journal)
        self.confirmations: Confirmations | None = None
        self._client = sidecar_client(client_id, secret, manual_ack=True,
                                      client_class=LeanClient)
        # No cap in paho: with one, paho scans every message in flight on each PUBACK
        # (`_update_inflight`), a third of a receiving sidecar's CPU at full speed. The
        # window (Mosquitto's Receive Maximum) is kept by `self.window` instead.
        self._client.max_inflight_messages_set(0)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_publish_packet = self._on_packet
        self._client.on_publish = self._on_publish
        self._client.on_subscribe = self._on_subscribe
        self._client.on_suback_codes = self._on_suback_codes

    # ---- paho callbacks (on the loop thread, from LoopDriver) --------------------------
    def _schedule(self) -> None:
        """Hand copies and publish confirmations over: after the read under way, else once
        this loop iteration ends."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            if self._driver is None or not self._driver.reading:
                assert self._loop is not None
                self._loop.call_soon(self._flush)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            log.error("forwarding client refused: %s", reason_code)
            return
        assert self._loop is not None
        self.tracker.on_connect(bool(flags.session_present))
        self._run(self.window.on_connack(getattr(properties, "ReceiveMaximum", None)))
        self._ready.set()
        if self.confirmations is not None and not flags.session_present:
            self.confirmations.reset(mid_range(self.mid_base >> MID_BITS))
        self._loop.call_soon(self.on_connected, bool(flags.session_present))

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self._ready.clear()

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    @property
    def subscribing(self) -> int:
        """SUBSCRIBE packets sent and not answered yet."""
        return len(self._subscribing)

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage) -> None:
        """A copy paho decoded (one the lean decoder left to paho)."""
        props, sids = from_paho_properties(getattr(msg, "properties", None))
        self._on_packet(LeanPublish(msg.mid, msg.topic, msg.payload, msg.qos, bool(msg.retain),
                                    bool(msg.dup), props, sids))

    def _on_packet(self, msg: LeanPublish) -> None:
        client = self._client
        if msg.topic == INJECT_REPLY:  # QoS 0, targeted: no packet id, not a copy
            self._on_inject_reply(msg.payload)
            return
        if msg.topic == PROBE_TOPIC:
            self.tracker.on_probe(msg.mid)
            if msg.payload.startswith(CUT_PREFIX):  # in order with the copies
                self._copies.append(cut_marker(msg.payload))
                self._schedule()
            elif msg.payload in self._probes:  # a barrier: resolved once the copies before it
                self._probed.append(msg.payload)  # have been handed over (`_flush`)
                self._schedule()
            recover = self.tracker.holding
            client.ack(msg.mid, msg.qos)
        else:
            verdict = self.tracker.on_copy(msg.mid, msg.qos, msg.dup, time.monotonic())
            recover = self.tracker.holding or self.tracker.lost > self._lost_logged
            if verdict is Verdict.TAKE:
                self.taken += msg.qos > 0  # the plugin counts QoS > 0 copies routed to us
                if msg.qos and self.confirmations is not None:
                    self.confirmations.on_copy(self.mid_base + msg.mid, msg.topic, msg.payload)
                self._copies.append(LocalCopy(self.mid_base + msg.mid, msg.topic, msg.payload,
                                              msg.qos, msg.retain, msg.properties,
                                              msg.subscription_ids))
                self._schedule()
            elif verdict is Verdict.REACK:
                client.ack(msg.mid, msg.qos)
        if recover:
            assert self._loop is not None
            self._loop.call_soon(self._recover)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        """A PUBACK or PUBCOMP, or a PUBREC with a failure (`LeanClient`); QoS 0 publishes
        are reported when written (not ours to confirm)."""
        ticket = self._by_mid.pop(mid, None)
        if ticket is not None:
            self._run(self.window.on_ack(ticket, reason_code.value, time.monotonic()))

    # ---- the window's actions ----------------------------------------------------------
    def _run(self, actions) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.item)
            elif isinstance(action, Confirm):
                self._published.extend(action.tickets)
                self._schedule()
            elif isinstance(action, Refused):
                self._log_refused(action)
        self._arm_retry()

    def _send(self, item: Reinjection) -> None:
        info = self._client.publish(item.topic, item.payload, qos=item.qos, retain=item.retain,
                                    properties=to_paho_properties(item.properties))
        if item.qos:
            self._by_mid[info.mid] = item.ticket

    def _log_refused(self, action: Refused) -> None:
        item = action.item
        extra = {"topic": item.topic, "qos": item.qos, "reason": reason_name(item.reason),
                 "refusals": item.refusals}
        if action.persistent:
            log.error("Mosquitto keeps refusing a message forwarded to this node (reason "
                      "0x%02x); it and later messages on its topic are held and retried, and "
                      "their origin keeps them. Check this node's ACL and limits for the "
                      "sidecar's forwarding identity (message_size_limit, acl_file)",
                      item.reason, extra=extra)
        elif item.refusals == 1:
            log.warning("Mosquitto refused a forwarded message; retrying it", extra=extra)

    def _arm_retry(self) -> None:
        due = self.window.next_due()
        timer = self._retry_timer
        if due is None or (timer is not None and timer.when() <= due):
            return
        if timer is not None:
            timer.cancel()
        assert self._loop is not None
        self._retry_timer = self._loop.call_at(due, self._on_retry_timer)

    def _on_retry_timer(self) -> None:
        self._retry_timer = None
        self._run(self.window.on_timer(time.monotonic()))

    # ---- forwarding subscriptions ------------------------------------------------------
    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        """Check the SUBACK, one reason code per filter: a refused forwarding subscription
        means peers' clients would miss this node's publishes; it is logged, counted and
        asked again with backoff."""
        entries = self._subscribing.pop(mid, None)
        if entries is None:
            return
        if self._sub_waiters:
            self._wake_sub_waiters(mid)
        self._subacked(entries, [c.value for c in reason_codes or ()])

    def _on_suback_codes(self, mid: int, codes: bytes) -> None:
        """A SUBACK as `LeanClient` reads it: what `_on_subscribe` does with paho's."""
        entries = self._subscribing.pop(mid, None)
        if entries is None:
            return
        if self._sub_waiters:
            self._wake_sub_waiters(mid)
        self._subacked(entries, codes)

    def _subacked(self, entries: tuple[list[str], int], codes: Sequence[int]) -> None:
        filters, subscription_id = entries
        refusals = self._subscribe_refusals
        if len(codes) >= len(filters) and (not codes or max(codes) < 0x80):  # all granted
            if refusals:
                for filter in filters:
                    refusals.pop(filter, None)
            return
        for i, filter in enumerate(filters):
            code = codes[i] if i < len(codes) else 0x80
            if code < 0x80:
                self._subscribe_refusals.pop(filter, None)
            else:
                self._refused(filter, subscription_id, code)

    def _wake_sub_waiters(self, mid: int) -> None:
        assert self._loop is not None
        left = []
        for mids, callback in self._sub_waiters:
            mids.discard(mid)
            if mids:
                left.append((mids, callback))
            else:
                self._loop.call_soon(callback)
        self._sub_waiters = left

    def when_subscribed(self, callback: Callable[[], None]) -> None:
        """Call `callback` (soon) once Mosquitto has answered every SUBSCRIBE sent so far: the
        forwarding subscriptions issued until now are in effect (or refused). Never called if
        the connection drops first (the caller has its own deadline)."""
        loop = self._loop or asyncio.get_running_loop()
        if not self._subscribing:
            loop.call_soon(callback)
        else:
            self._sub_waiters.append((set(self._subscribing), callback))

    def _refused(self, filter: str, subscription_id: int, code: int) -> None:
        self.subscribe_refused += 1
        refusals = self._subscribe_refusals[filter] = self._subscribe_refusals.get(filter, 0) + 1
        delay = backoff(refusals, first=0.5, cap=30.0)
        log.error("Mosquitto refused the forwarding subscription %r (reason 0x%02x): peers' "
                  "subscribers miss this node's publishes on it until it is accepted; "
                  "retrying in %.1fs. Check this node's ACL for the sidecar identity",
                  filter, code, delay, extra={"filter": filter, "refusals": refusals})
        assert self._loop is not None
        self._loop.call_later(delay, self._subscribe_again, filter, subscription_id)

    def _subscribe_again(self, filter: str, subscription_id: int) -> None:
        wanted = self._subscribed.get(filter)
        if wanted is not None and wanted[0] == subscription_id:
            self.subscribe(filter, subscription_id, wanted[1])

    def _recover(self) -> None:
        """Reconnect (the session stays), so Mosquitto resends the copies it dropped."""
        recover = self.tracker.should_recover(time.monotonic())
        dropped, lost = self.tracker.dropped_seen, self.tracker.lost
        if lost > self._lost_logged:
            self._lost_logged = lost
            log.error("Mosquitto discarded messages that peers subscribe to: its queue for the "
                      "forwarding client overflowed (%d in flight + max_queued_messages %d); "
                      "their publishers had their PUBACK. Raise max_queued_messages in the "
                      "node's mqtt.include, or reduce the load", self.receive_maximum,
                      self.max_queued, extra={"lost_total": lost})
        if not recover:
            return
        log.warning("Mosquitto dropped packets for the forwarding client (more than "
                    "max_queued_messages %d waiting to be written); reconnecting so it resends "
                    "them in order", self.max_queued, extra={"dropped_total": dropped})
        sock = self._client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # paho reconnects at once, the session stays

    def wants_probe(self) -> bool:
        """True (once per due probe) when the plugin should send a probe now."""
        due = self.tracker.should_probe(time.monotonic())
        self._recover()
        return due

    def backlog(self) -> tuple[int, int]:
        """Copies taken from Mosquitto and not acknowledged to it yet, and QoS > 0 copies taken
        in all (new ones only, not resends) since this client was made."""
        return len(self.tracker.unacked), self.taken

    def stats(self) -> dict[str, int]:
        return {"dropped_by_mosquitto": self.tracker.dropped_seen,
                "lost": self.tracker.lost,
                "awaited": self.tracker.awaited,
                "recoveries": self.tracker.recoveries,
                "unacked": len(self.tracker.unacked),
                "subscribe_refused": self.subscribe_refused,
                "subscribe_packets": self.subscribe_packets,
                "subscribing": len(self._subscribing),
                "reinject": self.window.status()}

    def refused_by_reason(self) -> dict[str, int]:
        """Re-injections Mosquitto refused, by reason (each refusal of each attempt)."""
        return {reason_name(code): n for code, n in self.window.refused_by_reason.items()}

    def _flush(self) -> None:
        if not self._flush_scheduled:
            return
        copies, self._copies = self._copies, []
        published, self._published = self._published, []
        self._flush_scheduled = False
        if copies:
            self.received += len(copies)
            self.on_copies(copies)
        if published:
            self.on_published(published)
        probed, self._probed = self._probed, []
        for token in probed:
            fut = self._probes.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def expect_probe(self, token: bytes) -> asyncio.Future:
        """A future resolved when the plugin's probe with payload `token` has arrived and
        every copy Mosquitto routed here before it has been handed to `on_copies`."""
        assert self._loop is not None
        fut = self._loop.create_future()
        self._probes[token] = fut
        fut.add_done_callback(lambda f: self._probes.pop(token, None))
        return fut

    async def connect(self, timeout: float = 10.0) -> None:
        """Connect with a persistent session (unacked copies are redelivered after a crash)."""
        self._loop = asyncio.get_running_loop()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = FORWARD_SESSION_EXPIRY
        props.ReceiveMaximum = self.receive_maximum
        self._driver = LoopDriver(self._client, self._loop)
        self._driver.after_read = self._flush
        # a clean start applies to the first connect only: paho's reconnects keep the session
        clean = mqtt.MQTT_CLEAN_START_FIRST_ONLY if self._clean_start else False
        self._client.connect(str(self.socket_path), port=1883, keepalive=30, clean_start=clean,
                             properties=props)
        self._driver.start()
        await asyncio.wait_for(self._ready.wait(), timeout)

    def subscribe(self, filter: str, subscription_id: int, no_local: bool) -> None:
        """Subscribe one filter with its identifier (see `subscribe_many`)."""
        self.subscribe_many([(filter, subscription_id, no_local)])

    def subscribe_many(self, subs: list[tuple[str, int, bool]]) -> None:
        """Subscribe (filter, identifier, no local) triples in order: consecutive ones with the
        same identifier and options share a SUBSCRIBE packet (up to `PACKET_FILTERS`), so each
        copy still carries the identifier of the filter it matched."""
        for wanted, run in groupby(subs, key=_ID_AND_OPTIONS):
            filters = [filter for filter, _, _ in run]
            self._subscribed.update(dict.fromkeys(filters, wanted))  # (one tuple per run)
            for i in range(0, len(filters), PACKET_FILTERS):
                self._send_subscribe(filters[i:i + PACKET_FILTERS], *wanted)

    def _send_subscribe(self, filters: list[str], subscription_id: int, no_local: bool) -> None:
        mid = self._client.subscribe_lean(filters, _OPTIONS[no_local], subscription_id)
        self.subscribe_packets += 1
        if mid is not None:
            self._subscribing[mid] = (filters, subscription_id)

    def unsubscribe(self, filter: str) -> None:
        self.unsubscribe_many([filter])

    def unsubscribe_many(self, filters: list[str]) -> None:
        """Unsubscribe filters, up to `PACKET_FILTERS` per UNSUBSCRIBE packet."""
        for filter in filters:
            self._subscribed.pop(filter, None)
            self._subscribe_refusals.pop(filter, None)
        for i in range(0, len(filters), PACKET_FILTERS):
            self._client.unsubscribe(filters[i:i + PACKET_FILTERS])
            self.subscribe_packets += 1

    def ack(self, mid: int, qos: int) -> None:
        """Accept a received copy (`mid` as handed over: `mid_base` + its packet id): PUBACK,
        or PUBREC at QoS 2 (`LeanClient.ack`)."""
        if qos > 0:
            packet_id = mid - self.mid_base
            self.tracker.on_ack(packet_id)
            self._client.ack(packet_id, qos)
            if self.confirmations is not None:
                self.confirmations.on_ack(mid)

    def publish(self, topic: str, payload: bytes, qos: int,
                properties: MessageProperties, retain: bool = False) -> int:
        """Re-inject a forwarded message (`retain`: a replicated retained message); returns
        a ticket that `on_published` reports once Mosquitto accepted it (QoS > 0)."""
        self.reinjected += 1
        return self._offer(topic, payload, qos, retain, properties)

    def inject(self, batch_id: int, batch: bytes) -> asyncio.Future:
        """Hand an MQFB batch to the plugin (`sidecar.local.batch`; QoS 0, so outside the
        re-injection window); the future gets the plugin's reply (`ok`, `count` or `error`),
        sent once every message is in its subscribers' queues. The caller bounds the wait
        and calls `forget_injection` when it gives up."""
        assert self._loop is not None, "start() first"
        future = self._loop.create_future()
        self._injecting[batch_id] = future
        self._client.publish(INJECT_TOPIC, batch, qos=0)
        return future

    def forget_injection(self, batch_id: int) -> None:
        """Stop waiting for a batch's reply."""
        self._injecting.pop(batch_id, None)

    def wake(self) -> None:
        """Make Mosquitto's loop turn once more: a QoS 0 publish to a `$CONTROL/` topic without
        a handler (read, then dropped). The plugin answers a batch at the end of the loop
        iteration that routed it, which on an idle Mosquitto waits for its next socket event
        (up to 100 ms: its `epoll_wait` timeout)."""
        self._client.publish(WAKE_TOPIC, b"", qos=0)

    def _on_inject_reply(self, payload: bytes) -> None:
        try:
            reply = json.loads(payload)
            future = self._injecting.pop(reply["batch"], None)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed inject reply", extra={"bytes": len(payload)})
            return
        if future is not None and not future.done():
            future.set_result(reply)

    def barrier(self) -> int:
        """A QoS 1 publish Mosquitto acknowledges and delivers to nobody (a `$CONTROL/` topic
        without a handler): its PUBACK (`on_published`) proves every earlier QoS 0 publish of
        this connection was processed. Returns its ticket."""
        return self._offer(BARRIER_TOPIC, b"", 1, False, NO_PROPERTIES)

    def _offer(self, topic: str, payload: bytes, qos: int, retain: bool,
               properties: MessageProperties) -> int:
        self._tickets += 1
        self._run(self.window.offer(Reinjection(self._tickets, topic, payload, qos, retain,
                                                properties)))
        return self._tickets

    def close(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        if self._driver is not None:
            self._driver.stop()
