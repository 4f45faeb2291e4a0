"""Plain messages between nodes as MQFB records (capability `records`, issue 25)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.local.batch import (
    BatchError,
    Record,
    cut_record,
    decode_batch,
    encode_batch,
    encode_record,
)
from sidecar.message import MessageProperties
from sidecar.routing.forwarder import Envelope
from sidecar.routing.records import (
    encode_wire_record,
    read_records,
    record_of,
    travels_as_record,
    with_identity,
)

PROPS = MessageProperties(user=(("n", "1"), ("k", "v"), ("n", "2")), content_type="text/plain",
                          payload_format=1, correlation_data=b"\x00c",
                          response_topic="reply/1", message_expiry=290)


def env(seq: int = 7, **kw) -> Envelope:
    fields = dict(origin_node="n1", origin_incarnation=1234, origin_seq=seq, hlc=99 << 16,
                  topic="a/b", payload=b"hello", qos=1, properties=PROPS, publisher="pub-1",
                  first_seq=seq)
    fields.update(kw)
    return Envelope(**fields)


def test_a_record_carries_what_the_receiver_needs_and_becomes_the_same_envelope_again():
    e = env()
    [rec] = read_records(encode_wire_record(e))
    assert (rec.origin_node, rec.origin_incarnation, rec.origin_seq, rec.hlc, rec.qos,
            rec.topic, rec.publisher) == ("n1", 1234, 7, 99 << 16, 1, "a/b", "pub-1")
    assert rec.properties == PROPS
    assert rec.envelope() == e
    # the bytes are the very record the plugin re-injects (identity: origin and first seq)
    assert rec.data == encode_record(record_of(e))
    _, [batch_record] = decode_batch(encode_batch(1, [rec.data]))
    assert (batch_record.origin, batch_record.seq, batch_record.client) == ("n1/1234", 7, "pub-1")


def test_several_records_of_several_origins_in_one_run():
    envs = [env(1, qos=0, properties=MessageProperties(), payload=b""),
            env(2, origin_node="node/with/slashes", topic="x"),
            env(3, qos=2, payload=b"\x00" * 70000)]
    got = read_records(b"".join(encode_wire_record(e) for e in envs))
    assert [r.envelope() for r in got] == envs
    assert [(r.origin_node, r.props) for r in got][:2] == [("n1", b""),
                                                           ("node/with/slashes", got[1].props)]


def test_only_plain_deliveries_under_their_first_seq_travel_as_records():
    assert travels_as_record(env())
    assert not travels_as_record(env(shared_group="g", shared_filter="a/#"))
    assert not travels_as_record(env(cut_client="c", topic="", payload=b""))
    assert not travels_as_record(env(subscription_ids=(3,)))
    assert not travels_as_record(env(seq=9, first_seq=7))     # renumbered by a catch-up
    assert not travels_as_record(env(seq=9, first_seq=0))     # a catch-up replay


def _mangle(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize("bad, why", [
    (encode_wire_record(env())[:-1], "does not fit"),
    (encode_wire_record(env()) + b"\x00", "runs past"),
    (_mangle(encode_wire_record(env()), 4, "<B", 2), "not a plain message"),   # kind
    (_mangle(encode_wire_record(env()), 5, "<B", 3), "not a plain message"),   # QoS 3
    (_mangle(encode_wire_record(env()), 5, "<B", 1), "not a plain message"),   # no origin
    (_mangle(encode_wire_record(env()), 22, "<H", 4), "runs past"),            # topic length
    (_mangle(encode_wire_record(env()) + b"\x00", 0, "<I",
             len(encode_wire_record(env())) - 3), "bytes after its payload"),   # a byte too many
    (encode_record(cut_record("c", "n1/1", 5)), "not a plain message"),
    (encode_record(record_of(env(first_seq=0, seq=0))), "not a plain message"),
    (encode_wire_record(env(origin_node="n1", origin_incarnation=1)).replace(b"n1/1", b"n1/x"),
     "not node/incarnation"),
    (encode_wire_record(env(origin_node="n\u00e9")).replace("n\u00e9".encode(), b"n\xff\xfe"),
     "origin .* is not UTF-8"),
    (encode_wire_record(env(topic="\u00e9")).replace("\u00e9".encode(), b"\xff\xfe"),
     "not UTF-8"),
])
def test_a_malformed_record_is_a_batch_error(bad: bytes, why: str):
    with pytest.raises(BatchError, match=why):
        read_records(bad)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_records_or_a_batch_error(data: bytes):
    try:
        records = read_records(data)
    except BatchError:
        return
    assert b"".join(r.data for r in records) == data   # every byte accounted for


@settings(max_examples=200, deadline=None)
@given(topic=st.text(min_size=1, max_size=40).filter(lambda t: "\x00" not in t),
       payload=st.binary(max_size=300), qos=st.integers(0, 2),
       user=st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=3)
       .map(lambda u: tuple((k.replace("\x00", ""), v.replace("\x00", "")) for k, v in u)),
       seq=st.integers(1, 2**63), incarnation=st.integers(0, 2**63))
def test_records_round_trip(topic, payload, qos, user, seq, incarnation):
    e = env(seq, topic=topic, payload=payload, qos=qos, origin_incarnation=incarnation,
            properties=MessageProperties(user=user))
    [rec] = read_records(encode_wire_record(e))
    assert rec.envelope() == e


@settings(max_examples=200, deadline=None)
@given(topic=st.text(min_size=1, max_size=40).filter(lambda t: "\x00" not in t),
       payload=st.binary(max_size=300), qos=st.integers(0, 2), retain=st.booleans(),
       client=st.text(max_size=20).filter(lambda t: "\x00" not in t),
       expiry=st.none() | st.integers(0, 2**32 - 1), seq=st.integers(1, 2**63))
def test_a_captured_record_with_the_forwarders_identity_is_the_record_it_would_encode(
        topic, payload, qos, retain, client, expiry, seq):
    props = MessageProperties(user=(("k", "v"),), message_expiry=expiry)
    captured = encode_record(Record(topic, payload, qos, retain, seq=77, hlc=5 << 16,
                                    client=client, properties=props))
    e = env(seq, topic=topic, payload=payload, qos=qos, publisher=client, properties=props)
    spliced = encode_wire_record(env(seq, topic=topic, payload=payload, qos=qos,
                                     publisher=client, properties=props, record=captured))
    assert spliced == encode_wire_record(e)
    assert read_records(spliced)[0].envelope() == e


def test_only_a_captured_message_record_takes_an_identity():
    with pytest.raises(BatchError, match="captured"):
        with_identity(encode_record(cut_record("c", "n1/1", 5)), "n1/2", 1, 0)
    with pytest.raises(BatchError, match="captured"):
        with_identity(encode_wire_record(env()), "n1/2", 1, 0)   # has an origin already
