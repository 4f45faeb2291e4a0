"""Hypothesis strategies for peer frames, built from the `peer.proto` descriptors: every field
of every Frame body gets a value meant to hurt (edge integers, absurd HLCs, invalid and huge
topic filters, NUL characters, unknown enum values, large payloads), plus frames no encoder
would produce: unknown bodies, invalid UTF-8 in string fields, truncated and random bytes."""

from __future__ import annotations

import time

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from sidecar._proto import peer_pb2

U32_EDGES = [0, 1, 2, 255, 65535, 2**31 - 1, 2**31, 2**32 - 1]
U64_EDGES = [0, 1, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**63, 2**64 - 1]
TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000

NASTY_STRINGS = [
    "", "#", "+", "a/#/b", "+x", "x+", "a/b#", "a/+/b", "/", "//", "a\x00b", "\x00",
    "$share/g/a/#", "$share//a", "$share/g", "$share/g+/a", "$share/g/", "$SYS/x",
    "$mqfed/read-sentinel", "$CONTROL/mqfed", "mqfed-sidecar", "mqfed-sidecar.fwd",
    "fuzz/ü/😀", "\u2028\ufeff", "\uffff", "a\x01b", "\x7f", "a\x85", "\ufdd0", "n1", "n2",
    "fuzz", "a" * 70_000, "a/" * 5_000,
]


def hlc_values() -> st.SearchStrategy[int]:
    """HLCs (wall_ms << 16 | logical): now-ish, far past, ten years ahead, the extremes."""
    now = int(time.time() * 1000)
    return st.one_of(
        st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1,
                         (now + TEN_YEARS_MS) << 16, (now - TEN_YEARS_MS) << 16]),
        st.integers(now - 60_000, now + 60_000).map(lambda ms: ms << 16),
        st.integers(0, 2**64 - 1))


def strings() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NASTY_STRINGS), st.text(max_size=24))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return strings()
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\x00" * (256 << 10)))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:  # proto3 enums are open: unknown values arrive as ints
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]),
                         st.integers(-(2**31), 2**31 - 1))
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        if field.name == "hlc" or field.name.endswith("_hlc"):
            return hlc_values()
        return st.one_of(st.sampled_from(U64_EDGES), st.integers(0, 2**64 - 1),
                         st.integers(0, 10))
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.one_of(st.sampled_from(U32_EDGES), st.integers(0, 2**32 - 1),
                         st.integers(0, 3))
    raise NotImplementedError(f"no strategy for {field.full_name} (type {t})")


def _value(field: FieldDescriptor) -> st.SearchStrategy:
    one = messages(field.message_type) if field.type == FieldDescriptor.TYPE_MESSAGE \
        else _scalar(field)
    if field.is_repeated:
        return st.lists(one, max_size=2 if field.type == FieldDescriptor.TYPE_MESSAGE else 4)
    return one


def messages(descriptor: Descriptor) -> st.SearchStrategy:
    """Messages of `descriptor`'s type with any subset of their fields set (one member of each
    real oneof at most); proto3 `optional` fields are sometimes present, sometimes not."""
    cls = getattr(peer_pb2, descriptor.name)
    plain = {f.name: _value(f) for f in descriptor.fields
             if f.containing_oneof is None or f.containing_oneof.name.startswith("_")}
    oneofs = [st.one_of(st.just({}), *(_value(f).map(lambda v, n=f.name: {n: v})
                                       for f in o.fields))
              for o in descriptor.oneofs if not o.name.startswith("_")]

    def build(fields: dict, chosen: list[dict]) -> object:
        for member in chosen:
            fields.update(member)
        return cls(**fields)

    return st.builds(build, st.fixed_dictionaries({}, optional=plain),
                     st.tuples(*oneofs).map(list) if oneofs else st.just([]))


def frames() -> st.SearchStrategy[bytes]:
    """Serialized Frames, each with one body (any member, handshake ones included)."""
    members = peer_pb2.Frame.DESCRIPTOR.oneofs_by_name["body"].fields
    return st.one_of(*(messages(f.message_type).map(
        lambda m, n=f.name: peer_pb2.Frame(**{n: m}).SerializeToString()) for f in members))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# (Frame body, repeated field, string field) paths whose strings are topics, filters, ids
_STRING_PATHS = [(5, 3, 2), (4, 2, 2), (6, 1, 5), (6, 1, 1), (10, 1, 1), (10, 1, 3), (12, 3, 1),
                 (20, 1, 1), (20, 1, 2), (30, 1, 1), (30, 1, 11), (21, 3, 5)]


def odd_bytes() -> st.SearchStrategy[bytes]:
    """Bytes no mqfed node sends: unknown bodies, invalid UTF-8 where a string belongs,
    truncated frames, noise."""
    unknown = st.builds(lambda n, b: _field(n, b),
                        st.integers(41, 2**29 - 1).filter(lambda n: not 19_000 <= n < 20_000),
                        st.binary(max_size=32))
    bad_utf8 = st.builds(
        lambda path, junk: _field(path[0], _field(path[1], _field(path[2], junk))),
        st.sampled_from(_STRING_PATHS),
        st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"a\xfe/b", b"\x80" * 3]))
    truncated = frames().flatmap(lambda data: st.integers(0, max(0, len(data) - 1)).map(
        lambda cut: data[:cut]))
    return st.one_of(unknown, bad_utf8, truncated, st.binary(max_size=64))
