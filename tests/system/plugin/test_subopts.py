"""Subscription options on a real Mosquitto: the plugin reads No Local, Retain As Published and
the subscription identifier of a v5 client's subscription (shared ones too) once Mosquitto
added it, and reports them in a second subscribe event (the first, at the ACL check, cannot see
them)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from sidecar.sessions.record import Subscription
from sidecar.sessions.shadow import Shadows
from tests.system.plugin.helpers import SECRET


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


def _own_messages_come_back(c, topic: str, payload: bytes) -> bool:
    c.publish(topic, payload, qos=1)
    return bool(c.wait_messages(lambda m: m.payload == payload, timeout=1.0))


def test_sub_options_gives_an_existing_subscription_no_local_mosquitto_kept_unset(
        broker, sidecar, client_factory):
    """A session copy made before its client's options were known has a subscription without
    No Local, and a shadow's SUBSCRIBE of the same filter cannot set it (2.0.11): the
    `sub_options` command does, connected or offline, and Mosquitto's own routing follows."""
    c = client_factory("renl", clean_start=False, session_expiry=300)
    c.connect()
    _subscribe(c, "nl/#", 1)
    _subscribe(c, "nl/#", 1, no_local=True)  # what a shadow does: Mosquitto keeps it unset
    assert _own_messages_come_back(c, "nl/a", b"before")
    rep = sidecar.call("sub_options", client="renl", subscriptions={"nl/#": 1 | 0x04})
    assert rep["ok"] is True, rep
    sidecar.wait_events(lambda e: e["type"] == "subscribe" and e["client"] == "renl"
                        and e["options"] == 1 | 0x04)
    assert not _own_messages_come_back(c, "nl/b", b"after")
    other = client_factory("renl-other")
    other.connect()
    other.publish("nl/c", b"theirs", qos=1)
    assert c.wait_messages(lambda m: m.payload == b"theirs")
    # an offline session: Retain As Published on, No Local off again
    c.disconnect()
    rep = sidecar.call("sub_options", client="renl", subscriptions={"nl/#": 0x08})
    assert rep["ok"] is True, rep
    sidecar.wait_events(lambda e: e["type"] == "subscribe" and e["client"] == "renl"
                        and e["options"] == 1 | 0x08)
    c.connect()
    assert _own_messages_come_back(c, "nl/d", b"again")


def test_sub_options_refusals(broker, sidecar, client_factory):
    c = client_factory("renl2")
    c.connect()
    _subscribe(c, "r/#", 0)
    _subscribe(c, "$share/g/r/#", 1)
    assert sidecar.call("sub_options", client="nobody",
                        subscriptions={"r/#": 4})["error"] == "unknown_client"
    assert sidecar.call("sub_options", client="renl2",
                        subscriptions={"q/#": 4})["error"] == "not_subscribed"
    for bad in ({"r/#": 256}, {"r/#": "4"}, ["r/#"]):
        assert sidecar.call("sub_options", client="renl2",
                            subscriptions=bad)["error"] == "bad_request"
    # a shared subscription takes Retain As Published only
    assert sidecar.call("sub_options", client="renl2",
                        subscriptions={"$share/g/r/#": 0x04 | 0x08})["ok"] is True
    sidecar.wait_events(lambda e: e["type"] == "subscribe" and e["filter"] == "$share/g/r/#"
                        and e["options"] == 1 | 0x08)
    assert "subscription options cannot be read" not in broker.log()


@pytest.mark.parametrize("with_command", [True, False], ids=["sub_options", "subscribe_only"])
def test_a_replica_update_gives_a_filter_it_has_its_no_local(broker, sidecar, client_factory,
                                                            with_command):
    """`Shadows.update` (a replica's Resubscribe) of a filter the session has, now with No
    Local: the session's own messages skip it afterwards; a SUBSCRIBE alone does not do it."""
    c = client_factory(f"repl-{with_command}", clean_start=False, session_expiry=300)
    c.connect()
    _subscribe(c, "rp/#", 1)
    c.disconnect()

    async def set_options(client: str, subscriptions: dict[str, int]) -> None:
        if with_command:
            reply = await asyncio.to_thread(sidecar.call, "sub_options", client=client,
                                            subscriptions=subscriptions)
            assert reply["ok"] is True, reply

    async def unused(*args) -> None:
        raise AssertionError("not a drain")

    shadows = Shadows(Path(broker.sock), SECRET, unused, unused, set_options)
    asyncio.run(shadows.update(c.client_id, {"rp/#": Subscription(1, no_local=True).pack()},
                               ()))
    c.connect()
    assert _own_messages_come_back(c, "rp/x", b"own") is not with_command
