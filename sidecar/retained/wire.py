"""Retained entries and anti-entropy frames <-> `peer.proto` (adapter helpers)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from sidecar._proto import peer_pb2
from sidecar.peering.envelopes import properties_from
from sidecar.retained.entry import RetainedEntry, Version

CHUNK_ENTRIES = 500
CHUNK_BYTES = 1 << 20
MAX_FRAME = 64 << 20  # the peer transport's default max_message_bytes
FRAME_OVERHEAD = 64  # Frame + RetainedEntries around the entries (tags, exchange, last)
ENTRY_OVERHEAD = 6  # tag and length of one entry in RetainedEntries


def entry_to_proto(entry: RetainedEntry, now_ms: int) -> peer_pb2.RetainedEntry:
    """An entry as sent at `now_ms` (an expired one without its value)."""
    msg = peer_pb2.RetainedEntry(topic=entry.topic, hlc=entry.hlc, origin_node=entry.origin,
                                 deleted=entry.deleted, qos=entry.qos)
    if entry.deleted:
        return msg
    if not entry.live(now_ms):
        msg.expired = True
        return msg
    props = entry.properties
    msg.payload = entry.payload
    msg.user_properties.extend(peer_pb2.UserProperty(key=k, value=v) for k, v in props.user)
    for name, value in (("content_type", props.content_type),
                        ("payload_format_indicator", props.payload_format),
                        ("correlation_data", props.correlation_data),
                        ("response_topic", props.response_topic),
                        ("message_expiry", entry.remaining_expiry(now_ms))):
        if value is not None:
            setattr(msg, name, value)
    return msg


def entry_from_proto(msg: peer_pb2.RetainedEntry, now_ms: int) -> RetainedEntry:
    """A received entry; its expiry counts from `now_ms` (the time it arrived)."""
    if msg.deleted or msg.expired:
        return RetainedEntry(msg.topic, msg.hlc, msg.origin_node, qos=msg.qos, deleted=True)
    props = properties_from(msg, with_expiry=False)
    expires = now_ms + msg.message_expiry * 1000 if msg.HasField("message_expiry") else None
    return RetainedEntry(msg.topic, msg.hlc, msg.origin_node, msg.payload, msg.qos, props,
                         expires_at_ms=expires)


def entries_frames(entries: Sequence[RetainedEntry], now_ms: int, exchange: int = 0,
                   last: bool = False, max_frame: int = MAX_FRAME,
                   too_large: Callable[[RetainedEntry, int], None] | None = None
                   ) -> Iterator[bytes]:
    """Serialized `Frame{retained_entries}` chunks (`last` set on the final one; at least one
    frame when `last` is asked for, so the peer always learns the answer ended), each below
    `max_frame` bytes. An entry too large for any frame goes without its value, as expired:
    peers then hold its version as deleted (their older value goes, anti-entropy agrees and
    does not ask again); `too_large(entry, size)` is told."""
    batch: list[peer_pb2.RetainedEntry] = []
    size = 0

    def frame(is_last: bool) -> bytes:
        msg = peer_pb2.RetainedEntries(entries=batch, exchange=exchange, last=is_last)
        return peer_pb2.Frame(retained_entries=msg).SerializeToString()

    for entry in entries:
        msg = entry_to_proto(entry, now_ms)
        entry_size = msg.ByteSize() + ENTRY_OVERHEAD
        if entry_size > max_frame - FRAME_OVERHEAD:
            if too_large is not None:
                too_large(entry, entry_size)
            msg = peer_pb2.RetainedEntry(topic=entry.topic, hlc=entry.hlc,
                                         origin_node=entry.origin, qos=entry.qos, expired=True)
            entry_size = msg.ByteSize() + ENTRY_OVERHEAD
        if batch and size + entry_size > max_frame - FRAME_OVERHEAD:
            yield frame(False)
            batch, size = [], 0
        batch.append(msg)
        size += entry_size
        if len(batch) >= CHUNK_ENTRIES or size >= CHUNK_BYTES:
            yield frame(False)
            batch, size = [], 0
    if batch or last:
        yield frame(last)


def digest_frame(exchange: int, digests: Sequence[int], counts: Sequence[int]) -> bytes:
    msg = peer_pb2.RetainedDigest(exchange=exchange, buckets=digests, counts=counts)
    return peer_pb2.Frame(retained_digest=msg).SerializeToString()


def versions_frame(exchange: int, buckets: Sequence[int],
                   versions: Sequence[tuple[str, Version]]) -> bytes:
    msg = peer_pb2.RetainedVersions(exchange=exchange, buckets=buckets, versions=[
        peer_pb2.RetainedVersion(topic=t, hlc=v.hlc, origin_node=v.origin) for t, v in versions])
    return peer_pb2.Frame(retained_versions=msg).SerializeToString()


def request_frame(exchange: int, topics: Sequence[str]) -> bytes:
    msg = peer_pb2.RetainedRequest(exchange=exchange, topics=topics)
    return peer_pb2.Frame(retained_request=msg).SerializeToString()


def versions_from(msg: peer_pb2.RetainedVersions) -> list[tuple[str, Version]]:
    return [(v.topic, Version(v.hlc, v.origin_node)) for v in msg.versions]
