"""Decoding plugin events and replies, assembling snapshots, encoding commands (protocol v1)."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.local import protocol
from sidecar.local.events import (
    CommandFailed,
    Connect,
    ConnectRejected,
    Disconnect,
    Heartbeat,
    ProtocolError,
    Reply,
    RetainedSeen,
    SessionExpired,
    Snapshot,
    SnapshotAssembler,
    SnapshotClient,
    SnapshotSubscription,
    Subscribe,
    Unsubscribe,
    Will,
    decode_event,
    decode_reply,
    encode_command,
    properties_from_json,
    properties_to_json,
)
from sidecar.message import MessageProperties

HEAD = {"v": 1, "epoch": "0123456789abcdef", "seq": 7, "t": 1700000000123}


def raw(**fields: Any) -> bytes:
    return json.dumps({**HEAD, **fields}).encode()


EXAMPLES: list[tuple[dict[str, Any], Any]] = [
    (
        {
            "type": "connect",
            "client": "c1",
            "username": "u",
            "protocol": "mqtt5",
            "clean_start": False,
            "session_expiry": 4294967295,
            "keepalive": 60,
            "session_present": True,
            "address": "10.0.0.1",
        },
        Connect(
            "0123456789abcdef",
            7,
            1700000000123,
            "c1",
            "u",
            "mqtt5",
            False,
            4294967295,
            60,
            True,
            "10.0.0.1",
        ),
    ),
    (
        {
            "type": "connect",
            "client": "c1",
            "username": None,
            "protocol": "mqtt311",
            "clean_start": True,
            "session_expiry": None,
            "keepalive": 0,
            "session_present": False,
            "address": None,
        },
        Connect(
            "0123456789abcdef", 7, 1700000000123, "c1", None, "mqtt311", True, None, 0, False, None
        ),
    ),
    (
        {"type": "connect_rejected", "client": None, "username": "u", "reason": "auth"},
        ConnectRejected("0123456789abcdef", 7, 1700000000123, None, "u", "auth"),
    ),
    (
        {
            "type": "disconnect",
            "client": "c",
            "taken_over": True,
            "session_kept": True,
            "session_expiry": 30,
        },
        Disconnect("0123456789abcdef", 7, 1700000000123, "c", True, True, 30),
    ),
    (
        {
            "type": "subscribe",
            "client": "c",
            "filter": "$share/g/a/#",
            "qos": 2,
            "options": None,
            "subscription_id": None,
        },
        Subscribe("0123456789abcdef", 7, 1700000000123, "c", "$share/g/a/#", 2),
    ),
    (
        {"type": "unsubscribe", "client": "c", "filter": "a/+"},
        Unsubscribe("0123456789abcdef", 7, 1700000000123, "c", "a/+"),
    ),
    (
        {
            "type": "retained",
            "client": "c",
            "topic": "t",
            "payload": "",
            "qos": 0,
            "properties": {},
        },
        RetainedSeen("0123456789abcdef", 7, 1700000000123, "c", "t", b"", 0),
    ),
    (
        {"type": "session_expired", "client": "c"},
        SessionExpired("0123456789abcdef", 7, 1700000000123, "c"),
    ),
    (
        {"type": "heartbeat", "clients": 1, "sessions": 2, "subscriptions": 3, "buffered": 4},
        Heartbeat("0123456789abcdef", 7, 1700000000123, 1, 2, 3, 4),
    ),
]


@pytest.mark.parametrize(("fields", "expected"), EXAMPLES, ids=lambda x: getattr(x, "TYPE", ""))
def test_decode_every_type(fields: dict[str, Any], expected: Any) -> None:
    assert decode_event(raw(**fields)) == expected


def test_retained_payload_and_properties() -> None:
    props = {
        "user": [["k", "v"], ["k", "w"]],
        "content_type": "text/plain",
        "payload_format": 1,
        "correlation_data": base64.b64encode(b"\x00\xff").decode(),
        "response_topic": "r/t",
        "message_expiry": 60,
    }
    event = decode_event(
        raw(
            type="retained",
            client="c",
            topic="t",
            payload=base64.b64encode(b"\x00hi").decode(),
            qos=1,
            properties=props,
        )
    )
    assert isinstance(event, RetainedSeen)
    assert event.payload == b"\x00hi"
    assert event.properties == MessageProperties(
        user=(("k", "v"), ("k", "w")),
        content_type="text/plain",
        payload_format=1,
        correlation_data=b"\x00\xff",
        response_topic="r/t",
        message_expiry=60,
    )
    assert properties_to_json(event.properties) == props


def test_extra_fields_are_ignored() -> None:
    event = decode_event(raw(type="session_expired", client="c", future_field=[1, 2]))
    assert event == SessionExpired("0123456789abcdef", 7, 1700000000123, "c")


def test_optional_fields_may_be_absent() -> None:
    event = decode_event(raw(type="subscribe", client="c", filter="a", qos=1))
    assert event == Subscribe("0123456789abcdef", 7, 1700000000123, "c", "a", 1, None, None)
    retained = decode_event(raw(type="retained", client="c", topic="t", payload="", qos=0))
    assert isinstance(retained, RetainedSeen)
    assert retained.properties == MessageProperties()


CONNECT = {"type": "connect", "client": "c", "username": None, "protocol": "mqtt5",
           "clean_start": True, "session_expiry": 0, "keepalive": 60,
           "session_present": False, "address": None}


def test_connect_will_object_false_or_unknown() -> None:
    will = {"topic": "w/t", "payload": base64.b64encode(b"bye").decode(), "qos": 2,
            "retain": True, "delay": 30, "properties": {"user": [["k", "v"]],
                                                        "message_expiry": 9}}
    event = decode_event(raw(**CONNECT, will=will))
    assert event.will == Will("w/t", b"bye", 2, True, 30,
                              MessageProperties(user=(("k", "v"),), message_expiry=9))
    assert decode_event(raw(**CONNECT, will=False)).will is False
    assert decode_event(raw(**CONNECT, will=None)).will is None  # unreadable
    assert decode_event(raw(**CONNECT)).will is None  # an older plugin
    with pytest.raises(ProtocolError, match="field 'will' must be a will object"):
        decode_event(raw(**CONNECT, will=True))
    with pytest.raises(ProtocolError, match="'qos' must be 0, 1 or 2"):
        decode_event(raw(**CONNECT, will={**will, "qos": 3}))


def test_disconnect_will_fate() -> None:
    base = {"type": "disconnect", "client": "c", "taken_over": False, "session_kept": False,
            "session_expiry": 0}
    assert decode_event(raw(**base, will="delayed")).will == "delayed"
    assert decode_event(raw(**base)).will is None


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{", "event is not valid JSON"),
        (b"\xff", "event is not UTF-8"),
        (b"[1]", "event must be a JSON object, got list"),
        (b'{"type":"heartbeat"}', "missing field 'v'"),
        (
            b'{"v":2}',
            "plugin speaks protocol version 2, this sidecar speaks 1: upgrade the sidecar",
        ),
        (b'{"v":0}', "plugin speaks protocol version 0, this sidecar speaks 1: upgrade the plugin"),
        (b'{"v":"1"}', "plugin speaks protocol version '1'"),
        (b'{"v":true}', "plugin speaks protocol version True"),
        (raw(), "event: missing field 'type'"),
        (raw(type="bogus"), "event: unknown type 'bogus' (known: connect, "),
        (raw(type="unsubscribe", client="c"), "event 'unsubscribe' seq 7: missing field 'filter'"),
        (
            {**HEAD, "type": "session_expired", "client": "c", "seq": None},
            "event 'session_expired': field 'seq' must be an integer, got null",
        ),
        (
            raw(type="unsubscribe", client=3, filter="a"),
            "field 'client' must be a string, got int",
        ),
        (
            raw(
                type="disconnect", client="c", taken_over=1, session_kept=True, session_expiry=None
            ),
            "field 'taken_over' must be true or false, got int",
        ),
        (
            raw(type="heartbeat", clients=True, sessions=0, subscriptions=0, buffered=0),
            "field 'clients' must be an integer, got bool",
        ),
        (
            raw(type="connect_rejected", client=None, username=5, reason="auth"),
            "field 'username' must be a string or null, got int",
        ),
        (
            raw(type="retained", client="c", topic="t", payload="!!", qos=0),
            "field 'payload' must be base64 text, got str",
        ),
        (
            raw(type="subscribe", client="c", filter="a", qos=3),
            "field 'qos' must be 0, 1 or 2, got 3",
        ),
        (
            raw(
                type="retained",
                client="c",
                topic="t",
                payload="",
                qos=0,
                properties={"user": [["k"]]},
            ),
            "'user' must be a list of [key, value] strings",
        ),
        (
            raw(
                type="retained",
                client="c",
                topic="t",
                payload="",
                qos=0,
                properties={"message_expiry": "x"},
            ),
            "field 'message_expiry' must be an integer or null",
        ),
    ],
)
def test_decode_errors(payload: bytes | dict[str, Any], message: str) -> None:
    if isinstance(payload, dict):
        payload = json.dumps(payload).encode()
    with pytest.raises(ProtocolError, match=re.escape(message)):
        decode_event(payload)


def test_every_required_field_is_checked() -> None:
    for fields, _ in EXAMPLES:
        full = {**HEAD, **fields}
        for key in full:
            if key in ("options", "subscription_id", "properties"):
                continue
            broken = {k: v for k, v in full.items() if k != key}
            with pytest.raises(ProtocolError, match="missing field"):
                decode_event(json.dumps(broken).encode())


props_strategy = st.builds(
    MessageProperties,
    user=st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), max_size=3).map(tuple),
    content_type=st.none() | st.text(max_size=5),
    payload_format=st.none() | st.sampled_from([0, 1]),
    correlation_data=st.none() | st.binary(max_size=8),
    response_topic=st.none() | st.text(min_size=1, max_size=5),
    message_expiry=st.none() | st.integers(0, 2**32 - 1),
)


@settings(max_examples=60, deadline=None)
@given(props_strategy)
def test_properties_round_trip(props: MessageProperties) -> None:
    obj = properties_to_json(props)
    assert json.loads(json.dumps(obj)) == obj
    assert properties_from_json(obj) == props
    assert all(v is not None for v in obj.values())


def test_properties_from_json_null_and_errors() -> None:
    assert properties_from_json(None) == MessageProperties()
    assert properties_to_json(MessageProperties()) == {}
    with pytest.raises(ProtocolError, match="properties must be an object"):
        properties_from_json([])


# ---- replies -------------------------------------------------------------------------------


def test_decode_reply() -> None:
    reply = decode_reply(b'{"v":1,"id":"r1","cmd":"resume","ok":true,"epoch":"e","from_seq":5}')
    assert reply == Reply("r1", "resume", True, None, {"epoch": "e", "from_seq": 5})
    failed = decode_reply(b'{"v":1,"id":"r2","cmd":"resume","ok":false,"error":"gap","oldest":9}')
    assert failed == Reply("r2", "resume", False, "gap", {"oldest": 9})


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"v":1,"cmd":"x","ok":true}', "reply: missing field 'id'"),
        (b'{"v":1,"id":"a","cmd":"x"}', "reply: missing field 'ok'"),
        (b'{"v":1,"id":"a","ok":"yes"}', "field 'ok' must be true or false"),
        (b'{"v":3,"id":"a","ok":true}', "plugin speaks protocol version 3"),
        (b"nope", "reply is not valid JSON"),
    ],
)
def test_decode_reply_errors(payload: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(message)):
        decode_reply(payload)


# ---- snapshots -----------------------------------------------------------------------------


def chunk(
    i: int,
    n: int,
    clients: list[dict[str, Any]],
    *,
    id: str = "s1",
    epoch: str = "e",
    seq: int = 10,
) -> Reply:
    return Reply(
        id,
        "snapshot",
        True,
        None,
        {"epoch": epoch, "seq": seq, "chunk": i, "chunks": n, "clients": clients},
    )


def client(name: str, *subs: tuple[str, int], online: bool = True) -> dict[str, Any]:
    return {
        "client": name,
        "username": None,
        "protocol": "mqtt5",
        "clean_start": False,
        "session_expiry": 100,
        "online": online,
        "subscriptions": [{"filter": f, "qos": q} for f, q in subs],
    }


def test_snapshot_chunks_in_any_order() -> None:
    asm = SnapshotAssembler("s1")
    assert asm.feed(chunk(2, 3, [client("c", ("x", 0))])) is None
    assert asm.feed(chunk(0, 3, [client("a", ("a/#", 1), ("$share/g/b", 2))])) is None
    assert asm.feed(chunk(0, 3, [client("a")])) is None  # a repeated chunk is ignored
    snap = asm.feed(chunk(1, 3, [client("b", online=False)]))
    assert snap == Snapshot(
        "e",
        10,
        (
            SnapshotClient(
                "a",
                None,
                "mqtt5",
                False,
                100,
                True,
                (SnapshotSubscription("a/#", 1), SnapshotSubscription("$share/g/b", 2)),
            ),
            SnapshotClient("b", None, "mqtt5", False, 100, False, ()),
            SnapshotClient("c", None, "mqtt5", False, 100, True, (SnapshotSubscription("x", 0),)),
        ),
    )


def test_a_client_split_over_chunks_is_one_client_again() -> None:
    asm = SnapshotAssembler("s1")
    asm.feed(chunk(1, 3, [client("big", ("b", 1)), client("next", ("n", 0))]))
    asm.feed(chunk(0, 3, [client("first"), client("big", ("a", 1))]))
    snap = asm.feed(chunk(2, 3, [client("last")]))
    assert [c.client for c in snap.clients] == ["first", "big", "next", "last"]
    assert [s.filter for s in snap.clients[1].subscriptions] == ["a", "b"]


def test_snapshot_of_an_empty_broker() -> None:
    assert SnapshotAssembler("s1").feed(chunk(0, 1, [])) == Snapshot("e", 10, ())
    assert SnapshotAssembler("s1").feed(chunk(0, 0, [])) == Snapshot("e", 10, ())


def test_snapshot_assembler_takes_first_id_when_none_given() -> None:
    asm = SnapshotAssembler()
    assert asm.add(chunk(0, 2, [], id="x")) is None
    with pytest.raises(ProtocolError, match="fed to the assembler of request 'x'"):
        asm.add(chunk(1, 2, [], id="y"))


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (
            chunk(1, 2, [], epoch="f"),
            "says epoch f seq 10 of 2 chunks, earlier chunks said epoch e",
        ),
        (chunk(1, 2, [], seq=11), "seq 11"),
        (chunk(1, 3, []), "of 3 chunks"),
        (chunk(2, 2, []), "chunk 2 of 2 is out of range"),
        (chunk(1, 2, [], id="other"), "fed to the assembler of request 's1'"),
        (chunk(1, 2, [{"client": "a"}]), "client: missing field 'subscriptions'"),
        (chunk(1, 2, ["a"]), "each client must be an object"),
        (
            Reply("s1", "snapshot", True, None, {"epoch": "e", "seq": 10, "chunk": 1}),
            "missing field 'chunks'",
        ),
        (
            Reply("s1", "snapshot", True, None, {"epoch": "e", "seq": 10, "chunk": 1, "chunks": 2}),
            "field 'clients' must be a list",
        ),
    ],
)
def test_snapshot_assembler_rejects(second: Reply, message: str) -> None:
    asm = SnapshotAssembler("s1")
    asm.feed(chunk(0, 2, []))
    with pytest.raises(ProtocolError, match=re.escape(message)):
        asm.feed(second)


def test_snapshot_failure_is_command_failed() -> None:
    with pytest.raises(CommandFailed, match="snapshot request 's1' failed: busy") as info:
        SnapshotAssembler("s1").feed(Reply("s1", "snapshot", False, "busy", {}))
    assert info.value.code == "busy"


# ---- commands ------------------------------------------------------------------------------


def test_encode_ack() -> None:
    assert encode_command("ack", seq=5) == b'{"v":1,"cmd":"ack","seq":5}'


def test_encode_deliver() -> None:
    payload = encode_command(
        "deliver",
        request_id="r7",
        reply=protocol.REPLY_PREFIX + "x",
        client="c",
        topic="t/é",
        payload=b"\x00\x01",
        qos=1,
        properties=MessageProperties(user=(("a", "b"),), correlation_data=b"z"),
        absent=None,
    )
    obj = json.loads(payload)
    assert list(obj)[:4] == ["v", "id", "reply", "cmd"]
    assert obj == {
        "v": 1,
        "id": "r7",
        "reply": "$SYS/broker/mqfed/replies/x",
        "cmd": "deliver",
        "client": "c",
        "topic": "t/é",
        "payload": "AAE=",
        "qos": 1,
        "properties": {"user": [["a", "b"]], "correlation_data": "eg=="},
    }


def test_encode_command_errors() -> None:
    with pytest.raises(ValueError, match="must start with"):
        encode_command("stats", request_id="1", reply="elsewhere")
    with pytest.raises(ValueError, match="reserved"):
        encode_command("stats", v=2)


def test_constants() -> None:
    from sidecar.local import events

    assert events.EVENTS_TOPIC == protocol.EVENTS_TOPIC == "$SYS/broker/mqfed/events"
    assert events.CONTROL_TOPIC == "$CONTROL/mqfed/v1"
    assert events.REPLY_PREFIX == "$SYS/broker/mqfed/replies/"
    assert events.CALIBRATION_SESSION_EXPIRY == 1234567891
    assert events.SIDECAR_USERNAME == "mqfed-sidecar"
