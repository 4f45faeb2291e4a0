"""The bench's own MQTT 3.1.1 packets (`sidecar.bench.wire`): bytes as the spec lays them out,
and a reader that splits a stream wherever it was cut."""

from __future__ import annotations

import pytest

from sidecar.bench import wire


@pytest.mark.parametrize("n, encoded", [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"), (2_097_151, b"\xff\xff\x7f"), (2_097_152, b"\x80\x80\x80\x01"),
    (268_435_455, b"\xff\xff\xff\x7f")])
def test_remaining_length_matches_the_spec_examples(n, encoded):
    assert wire.remaining_length(n) == encoded


@pytest.mark.parametrize("n", [-1, 268_435_456])
def test_remaining_length_out_of_range_is_refused(n):
    with pytest.raises(ValueError):
        wire.remaining_length(n)


def test_connect_is_mqtt_311_clean_with_the_keepalive_and_client_id():
    assert wire.connect("ab", keepalive=60) == (
        b"\x10\x0e" b"\x00\x04MQTT" b"\x04" b"\x02" b"\x00\x3c" b"\x00\x02ab")
    assert wire.connect("ab", clean=False)[9] == 0


def test_subscribe_has_the_reserved_flags_packet_id_and_each_filter_with_its_qos():
    assert wire.subscribe(10, [("a/b", 1), ("c", 0)]) == (
        b"\x82\x0c" b"\x00\x0a" b"\x00\x03a/b\x01" b"\x00\x01c\x00")
    with pytest.raises(ValueError):
        wire.subscribe(1, [])


def test_publish_carries_a_packet_id_only_at_qos_1():
    assert wire.publish("t", b"hi", 0) == b"\x30\x05\x00\x01thi"
    assert wire.publish("t", b"hi", 1, 7) == b"\x32\x07\x00\x01t\x00\x07hi"
    with pytest.raises(ValueError):
        wire.publish("t", b"", 2, 1)


def test_puback_and_disconnect():
    assert wire.puback(258) == b"\x40\x02\x01\x02"
    assert wire.disconnect() == b"\xe0\x00"


def test_a_publish_parses_back_to_what_was_encoded():
    reader = wire.PacketReader()
    for qos, pid in ((0, 0), (1, 65535)):
        [packet] = reader.feed(wire.publish("a/ü", b"\x00payload", qos, pid))
        assert packet.kind == wire.PUBLISH
        assert wire.parse_publish(packet) == wire.Message("a/ü", qos, pid, b"\x00payload")


def test_the_reader_splits_a_stream_cut_anywhere_including_inside_the_length():
    big = wire.publish("big", b"x" * 20_000, 1, 3)  # a 3-byte remaining length
    stream = wire.puback(1) + big + b"\x90\x03\x00\x05\x01" + wire.puback(2)
    for cut in range(len(stream) + 1):
        reader = wire.PacketReader()
        packets = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert [p.kind for p in packets] == [wire.PUBACK, wire.PUBLISH, wire.SUBACK,
                                             wire.PUBACK], cut
        assert packets[2].packet_id() == 5 and packets[2].body[2:] == b"\x01"
        assert wire.parse_publish(packets[1]).payload == b"x" * 20_000


def test_the_reader_takes_a_stream_byte_by_byte():
    stream = wire.connect("c1") + wire.subscribe(1, [("t", 1)]) + wire.publish("t", b"p")
    reader = wire.PacketReader()
    packets = [p for i in range(len(stream)) for p in reader.feed(stream[i:i + 1])]
    assert [p.kind for p in packets] == [wire.CONNECT, wire.SUBSCRIBE, wire.PUBLISH]


def test_a_remaining_length_of_more_than_four_bytes_is_refused():
    with pytest.raises(ValueError):
        wire.PacketReader().feed(b"\x30\xff\xff\xff\xff\x01")
