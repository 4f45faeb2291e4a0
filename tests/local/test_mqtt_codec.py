"""The lean PUBLISH decoder agrees with paho's on every packet paho itself encodes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt import _packet
from paho.mqtt.client import MQTTv5
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar.local.forward_client import from_paho_properties
from sidecar.local.mqtt_codec import NO_PROPERTIES, decode_publish

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=20)


@st.composite
def publishes(draw):
    props = Properties(PacketTypes.PUBLISH)
    if draw(st.booleans()):
        props.UserProperty = draw(st.lists(st.tuples(text, text), max_size=4))
    for name, strategy in (("ContentType", text), ("ResponseTopic", text),
                           ("PayloadFormatIndicator", st.integers(0, 1)),
                           ("CorrelationData", st.binary(max_size=16)),
                           ("MessageExpiryInterval", st.integers(0, 2**32 - 1))):
        if draw(st.booleans()):
            setattr(props, name, draw(strategy))
    sids = draw(st.lists(st.integers(1, 268_435_455), max_size=3))
    if sids:
        props.SubscriptionIdentifier = sids
    qos = draw(st.integers(0, 1))
    header = 0x30 | (qos << 1) | draw(st.integers(0, 1)) | (draw(st.integers(0, 1)) << 3)
    topic = draw(text.filter(bool)).encode()
    body = struct.pack("!H", len(topic)) + topic
    if qos:
        body += struct.pack("!H", draw(st.integers(1, 65535)))
    body += props.pack() + draw(st.binary(max_size=40))
    return header, body


@given(publishes())
def test_agrees_with_paho(packet):
    header, body = packet
    ours = decode_publish(header, body)
    theirs = _packet.decode_publish(header, body, MQTTv5)
    props, sids = from_paho_properties(theirs.properties)
    assert (ours.mid, ours.topic, ours.payload, ours.qos, ours.retain, ours.dup) == (
        theirs.mid, theirs.topic.decode(), theirs.payload, theirs.qos, theirs.retain,
        theirs.dup)
    assert ours.properties == props
    assert ours.subscription_ids == sids


def test_no_properties_share_one_object():
    body = struct.pack("!H", 1) + b"t" + struct.pack("!H", 7) + b"\x00" + b"payload"
    msg = decode_publish(0x32, body)
    assert msg.properties is NO_PROPERTIES and msg.payload == b"payload" and msg.mid == 7


@pytest.mark.parametrize("body", [
    struct.pack("!H", 5) + b"t",  # topic runs past the packet
    struct.pack("!H", 1) + b"t" + struct.pack("!H", 1) + b"\x03\x23\x00\x01",  # topic alias
    struct.pack("!H", 1) + b"t" + struct.pack("!H", 1) + b"\x05\x01\x01",  # block too long
    struct.pack("!H", 1) + b"t" + struct.pack("!H", 1) + b"\x04\x01\x01\x01\x00",  # 0x01 twice
    struct.pack("!H", 1) + b"t" + struct.pack("!H", 1) + b"\xff\xff\xff\xff\x7f",  # varint
])
def test_refuses_what_it_does_not_know(body):
    """Refused packets go to paho, which decodes them or reports them malformed."""
    with pytest.raises((ValueError, IndexError)):
        decode_publish(0x32, body)


@pytest.mark.parametrize("sid", [1, 127, 300, 268_435_455])
def test_subscribe_packet_is_what_paho_builds(sid):
    from paho.mqtt.client import Client
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.subscribeoptions import SubscribeOptions

    from sidecar.local.mqtt_codec import subscribe_packet

    client = Client(CallbackAPIVersion.VERSION2, protocol=MQTTv5)
    queued = []
    client._packet_queue = lambda command, packet, mid, qos, info=None: queued.append(
        (command, bytes(packet), mid))
    filters = ["a/+", "$share/g/b/#", "ü" * 70, "x" * 200]
    options = SubscribeOptions(qos=2, noLocal=True, retainAsPublished=True,
                               retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
    props = Properties(PacketTypes.SUBSCRIBE)
    props.SubscriptionIdentifier = sid
    client._send_subscribe(False, [(f.encode(), options) for f in filters], props)
    [(command, packet, mid)] = queued
    assert command == 0x82
    assert bytes(subscribe_packet(mid, filters, sid, options.pack()[0])) == packet


def test_suback_decodes_as_paho_does():
    from sidecar.local.mqtt_codec import decode_suback

    props = Properties(PacketTypes.SUBACK)
    props.ReasonString = "why"
    for body in (b"\x01\x02\x00\x02\x87", b"\xff\xfe" + props.pack() + b"\x00\x80"):
        theirs = _packet.decode_suback(0x90, body, MQTTv5)
        assert decode_suback(body) == (theirs.mid, bytes(c.value for c in theirs.reason_codes))
    with pytest.raises(ValueError):
        decode_suback(b"\x00\x01\x05\x00")  # properties longer than the packet
