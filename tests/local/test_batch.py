"""MQFB batches (sidecar.local.batch): round trips, the exact layout, and bad input refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.local.batch import (
    NO_PROPERTIES,
    BatchError,
    Record,
    cut_record,
    decode_batch,
    decode_properties,
    encode_batch,
    encode_properties,
    encode_record,
)
from sidecar.message import MessageProperties

FULL = MessageProperties(user=(("k", "v"), ("k", "v2")), content_type="text/plain",
                         payload_format=1, correlation_data=b"\x00corr",
                         response_topic="reply/to", message_expiry=42)

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=20)
props = st.builds(
    MessageProperties,
    user=st.lists(st.tuples(text, text), max_size=3).map(tuple),
    content_type=st.none() | text, payload_format=st.none() | st.sampled_from([0, 1]),
    correlation_data=st.none() | st.binary(max_size=20), response_topic=st.none() | text,
    message_expiry=st.none() | st.integers(0, 2**32 - 1))
records = st.builds(
    Record, topic=text.filter(bool), payload=st.binary(max_size=64),
    qos=st.sampled_from([0, 1, 2]), retain=st.booleans(), seq=st.integers(0, 2**64 - 1),
    hlc=st.integers(0, 2**64 - 1), client=text, properties=props, kind=st.just(1),
    origin=text)


@given(st.integers(0, 2**64 - 1), st.lists(records, max_size=5))
def test_round_trip(batch_id, recs):
    assert decode_batch(encode_batch(batch_id, recs)) == (batch_id, recs)


def test_layout_of_one_record():
    data = encode_batch(7, [Record("a/b", b"hi", 1, retain=True, seq=5, hlc=9, client="c1")])
    assert data[:16] == b"MQFB\x01\x00" + struct.pack("<HQ", 1, 7)
    length, kind, flags, seq, hlc = struct.unpack_from("<IBBQQ", data, 16)
    assert (kind, flags, seq, hlc) == (1, 1 | 4, 5, 9)
    assert length == len(data) - 20
    assert data[38:] == b"\x03\x00a/b\x02\x00c1\x00\x00\x00\x00\x02\x00\x00\x00hi"


def test_properties_use_the_mqtt_encoding():
    assert encode_properties(MessageProperties(message_expiry=1, user=(("a", "b"),))) == (
        b"\x02\x00\x00\x00\x01" b"\x26\x00\x01a\x00\x01b")
    assert decode_properties(encode_properties(FULL)) == FULL
    assert encode_properties(NO_PROPERTIES) == b""


def test_records_already_encoded_join_a_batch():
    r = Record("t", b"", 0)
    assert encode_batch(1, [encode_record(r)]) == encode_batch(1, [r])


@pytest.mark.parametrize("mutate, why", [
    (lambda d: d[:10], "shorter than a batch header"),
    (lambda d: b"XQFB" + d[4:], "not an MQFB batch"),
    (lambda d: d[:4] + b"\x02" + d[5:], "version 2"),
    (lambda d: d[:-1], "runs past|does not fit"),
    (lambda d: d + b"x", "after the last record"),
    (lambda d: d[:6] + struct.pack("<H", 2) + d[8:], "shorter than a record header"),
    (lambda d: d[:21] + b"\x03" + d[22:], "bad flags"),
    (lambda d: d[:21] + b"\x11" + d[22:], "bad flags"),
])
def test_malformed_batches_are_refused(mutate, why):
    data = encode_batch(1, [Record("a/b", b"payload", 1)])
    with pytest.raises(BatchError, match=why):
        decode_batch(mutate(data))


@pytest.mark.parametrize("raw, why", [
    (b"\x01\x02", "not 0 or 1"),
    (b"\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02", "twice"),
    (b"\x0b\x01", "cannot travel"),
    (b"\x03\x00\x05ab", "runs past"),
    (b"\x03\x00\x01\xff", "UTF-8"),
    (b"\x26\x00\x01a", "runs past"),
])
def test_malformed_properties_are_refused(raw, why):
    with pytest.raises(BatchError, match=why):
        decode_properties(raw)


def test_bad_values_are_refused_when_encoding():
    with pytest.raises(BatchError, match="QoS 3"):
        encode_record(Record("t", b"", 3))
    with pytest.raises(BatchError, match="65,535"):
        encode_record(Record("t" * 70000, b"", 0))


def test_a_record_may_name_its_origin_and_a_cut_is_a_record():
    plain = encode_record(Record("t", b"p", 1))
    named = encode_record(Record("t", b"p", 1, origin="n2"))
    assert plain[5] == 1 and named[5] == 1 | 0x08   # flags: QoS 1, and the origin bit
    assert len(named) == len(plain) + 2 + 2         # u16 length + "n2", after the client id
    cut = cut_record("dev-1", "n3", 41)
    _, (back,) = decode_batch(encode_batch(1, [cut]))
    assert back == cut and (back.kind, back.client, back.origin, back.seq) == (
        2, "dev-1", "n3", 41)
