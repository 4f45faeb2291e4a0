"""Subscription options on a real Mosquitto: the plugin reads No Local, Retain As Published and
the subscription identifier of a v5 client's subscription (shared ones too) once Mosquitto
added it, and reports them in a second subscribe event (the first, at the ACL check, cannot see
them)."""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions


def _subscribe(client, filt: str, qos: int, no_local: bool = False, rap: bool = False,
               sub_id: int | None = None) -> None:
    props = None
    if sub_id:
        props = Properties(PacketTypes.SUBSCRIBE)
        props.SubscriptionIdentifier = sub_id
    rc, mid = client.c.subscribe(
        [(filt, SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=rap))],
        properties=props)
    assert rc == 0
    assert all(getattr(c, "value", c) < 0x80 for c in client._wait_ack(mid, 5))


def _subscribes(sidecar, client: str, filt: str) -> list[dict]:
    sidecar.wait_synced()
    return [e for e in sidecar.unique_events()
            if e["type"] == "subscribe" and e["client"] == client and e["filter"] == filt]


def test_options_and_identifier_follow_the_subscribe_event(broker, sidecar, client_factory):
    c = client_factory("opts")
    c.connect()
    _subscribe(c, "o/+/x", 1, no_local=True, rap=True, sub_id=7)
    sidecar.wait_type("subscribe", client="opts", filter="o/+/x", count=2)
    first, second = _subscribes(sidecar, "opts", "o/+/x")
    assert first["options"] is None and first["subscription_id"] is None
    assert second["qos"] == 1 and second["options"] == 1 | 0x04 | 0x08
    assert second["subscription_id"] == 7
    # the same filter again without options or identifier: Mosquitto 2.0.11 replaces the QoS
    # and the identifier of the subscription it holds but keeps its first No Local and Retain
    # As Published (sub__add_leaf); reported as it holds them
    _subscribe(c, "o/+/x", 1)
    sidecar.wait_type("subscribe", client="opts", filter="o/+/x", count=3)
    third = _subscribes(sidecar, "opts", "o/+/x")[2]
    assert third["options"] == 1 | 0x04 | 0x08 and third["subscription_id"] is None


def test_default_options_add_no_event_and_other_kinds_of_filters(broker, sidecar,
                                                                 client_factory):
    c = client_factory("plain")
    c.connect()
    _subscribe(c, "p/#", 2)
    _subscribe(c, "$SYS/broker/uptime", 0, rap=True)
    _subscribe(c, "/lead/", 1, sub_id=3)
    # shared subscriptions (the shared tree, per group): only RAP and the identifier
    _subscribe(c, "$share/g/s/#", 1, sub_id=4)
    _subscribe(c, "$share/h/s/#", 2, rap=True)
    _subscribe(c, "$share/g/$SYS/x", 0, sub_id=5)
    _subscribe(c, "$share/g/plain", 1)
    sidecar.wait_type("subscribe", client="plain", filter="/lead/", count=2)
    sidecar.wait_type("subscribe", client="plain", filter="$share/g/$SYS/x", count=2)
    assert len(_subscribes(sidecar, "plain", "p/#")) == 1
    sys_events = _subscribes(sidecar, "plain", "$SYS/broker/uptime")
    assert [e["options"] for e in sys_events] == [None, 0x08]
    assert _subscribes(sidecar, "plain", "/lead/")[1]["subscription_id"] == 3
    shared = {f: [(e["options"], e["subscription_id"]) for e in _subscribes(sidecar, "plain", f)]
              for f in ("$share/g/s/#", "$share/h/s/#", "$share/g/$SYS/x", "$share/g/plain")}
    assert shared == {"$share/g/s/#": [(None, None), (1, 4)],
                      "$share/h/s/#": [(None, None), (2 | 0x08, None)],
                      "$share/g/$SYS/x": [(None, None), (0, 5)],
                      "$share/g/plain": [(None, None)]}
    assert "subscription options cannot be read" not in broker.log()


def test_a_v311_client_has_no_options_to_read(broker, sidecar, client_factory):
    c = client_factory("old", protocol=4)
    c.connect()
    c.subscribe("v3/#", 1)
    sidecar.wait_type("subscribe", client="old", filter="v3/#")
    assert len(_subscribes(sidecar, "old", "v3/#")) == 1
    assert "subscription options cannot be read" not in broker.log()
