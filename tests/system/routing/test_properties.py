"""Every MQTT v5 publish property survives the hop between nodes, each checked on its own."""

from __future__ import annotations

import itertools

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.system.node.mqtt import Client

_topics = itertools.count()

CASES = {
    "user_properties_in_order_with_repeats": (
        "UserProperty", [("k1", "v1"), ("k2", "v2"), ("k1", "again")], None),
    "content_type": ("ContentType", "application/json; charset=utf-8", None),
    "payload_format_indicator": ("PayloadFormatIndicator", 1, None),
    "correlation_data_binary": ("CorrelationData", b"\x00corr\xff", None),
    "response_topic": ("ResponseTopic", "reply/to/me", None),
    "message_expiry_remaining": ("MessageExpiryInterval", 300, range(290, 301)),
}


@pytest.fixture(scope="module")
def pair(shared_cluster):
    """A subscriber on n3 and a publisher on n1 of the module's cluster."""
    sub = Client(shared_cluster.ports["n3"], "prop-sub")
    assert sub.wait_connected()
    sub.subscribe("prop/#", 1)
    shared_cluster.wait_interest("n3", "prop/#")
    pub = Client(shared_cluster.ports["n1"], "prop-pub")
    assert pub.wait_connected()
    yield sub, pub
    sub.close()
    pub.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_property_preserved_across_nodes(pair, case):
    sub, pub = pair
    name, value, accepted = CASES[case]
    props = Properties(PacketTypes.PUBLISH)
    setattr(props, name, value)
    topic = f"prop/{next(_topics)}"
    pub.publish(topic, b"payload", qos=1, properties=props)
    (msg,) = sub.wait_count(1, topic=topic)
    got = getattr(msg.properties, name, None)
    if accepted is None:
        assert got == value
    else:
        assert got in accepted
    others = set(msg.properties.json()) - {name, "SubscriptionIdentifier"}
    assert not others, f"unexpected properties {others}"
