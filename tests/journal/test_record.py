"""The journal file format (sidecar.journal.record), as the plugin writes it."""

from __future__ import annotations

import zlib

from sidecar.journal.record import (
    MAGIC,
    encode_message,
    encode_trim,
    fingerprint,
    pack_fingerprints,
    parse,
)


def test_fingerprint_is_crc32_of_topic_and_payload():
    fp = fingerprint("a/b", b"xyz")
    assert fp >> 32 == zlib.crc32(b"a/b") and fp & 0xFFFFFFFF == zlib.crc32(b"xyz")
    assert pack_fingerprints([1, 2**64 - 1]) == b"\x01" + b"\x00" * 7 + b"\xff" * 8


def test_trimmed_entries_are_not_replayed():
    data = (MAGIC + encode_message(1, 1, False, 1000, "t/a", b"one")
            + encode_message(2, 2, True, 1001, "t/b", b"two", b'{"user":[["k","v"]]}')
            + encode_trim([1]) + encode_message(3, 1, False, 1002, "t/c", b""))
    out = parse(data)
    assert out.problem is None and out.written == 3 and out.trimmed == 1
    assert [(e.seq, e.topic, e.payload, e.qos, e.retain) for e in out.entries] == [
        (2, "t/b", b"two", 2, True), (3, "t/c", b"", 1, False)]
    assert out.entries[0].properties.user == (("k", "v"),)


def test_a_record_cut_short_ends_the_file():
    whole = MAGIC + encode_message(1, 1, False, 1, "t/a", b"one")
    cut = encode_message(2, 1, False, 1, "t/b", b"two")[:-1]
    out = parse(whole + cut)
    assert [e.seq for e in out.entries] == [1] and out.problem == "a record cut short"
    assert parse(whole + encode_trim([1])[:5]).problem == "a record cut short"


def test_other_files_are_refused_and_bad_properties_dropped():
    assert parse(b"hello").problem and not parse(b"hello").entries
    out = parse(MAGIC + encode_message(1, 1, False, 1, "t", b"p", b"{not json"))
    assert out.entries[0].payload == b"p" and out.entries[0].properties.user == ()
    assert "unknown record type" in (parse(MAGIC + b"Z" * 40).problem or "")
