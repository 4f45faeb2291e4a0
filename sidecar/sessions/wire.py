"""Conversions between session records and `peer.proto` frames (adapter helpers)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from sidecar._proto import peer_pb2
from sidecar.config import NODE_ID_RE
from sidecar.peering.envelopes import decode_envelope, encode_envelope
from sidecar.routing.forwarder import Envelope
from sidecar.sessions.cuts import OldCopyCuts
from sidecar.sessions.record import SessionRecord, Subscription
from sidecar.sessions.unreleased import Unreleased
from sidecar.topics import MAX_SUBSCRIPTION_ID, TopicError, mqtt_string_problem, validate_filter

RECORDS_PER_FRAME = 500


def record_to_proto(r: SessionRecord) -> peer_pb2.SessionRecord:
    return peer_pb2.SessionRecord(
        client=r.client, owner=r.owner, connect_hlc=r.connect_hlc, change_hlc=r.change_hlc,
        protocol=r.protocol, session_expiry=r.expiry, fresh=r.fresh, online=r.online,
        since_ms=r.since_ms, deleted=r.deleted, client_connect_hlc=r.client_connect_hlc,
        settles_by_ms=r.settles_by_ms,
        subscriptions=[_subscription(f, Subscription.unpack(v))
                       for f, v in r.subscriptions.items()])


def _subscription(filter: str, s: Subscription) -> peer_pb2.SessionSubscription:
    return peer_pb2.SessionSubscription(filter=filter, qos=s.qos, no_local=s.no_local,
                                        retain_as_published=s.retain_as_published,
                                        identifier=s.identifier)


PROTOCOLS = ("mqtt31", "mqtt311", "mqtt5", "")  # "" in records of older peers: mqtt5


def record_problem(m: peer_pb2.SessionRecord) -> str | None:
    """Why a peer's record cannot be a session a Mosquitto holds (applied, it would make
    shadows fail or be refused forever); None when it can."""
    if not m.client:
        return "an empty client id (a session needs one)"
    problem = mqtt_string_problem(m.client)
    if problem is not None:
        return f"client id: {problem}"
    if not NODE_ID_RE.match(m.owner):
        return f"owner {m.owner[:64]!r} is not a node id"
    if m.protocol not in PROTOCOLS:
        return f"unknown protocol {m.protocol[:32]!r}"
    for sub in m.subscriptions:
        try:
            validate_filter(sub.filter)
        except TopicError as exc:
            return str(exc)
        if sub.qos > 2:
            return f"subscription {sub.filter[:64]!r}: QoS {sub.qos}"
        if sub.identifier > MAX_SUBSCRIPTION_ID:
            return f"subscription {sub.filter[:64]!r}: identifier {sub.identifier}"
    return None


def record_from_proto(m: peer_pb2.SessionRecord) -> SessionRecord:
    return SessionRecord(
        m.client, m.owner, m.connect_hlc, m.change_hlc, m.protocol or "mqtt5",
        m.session_expiry if m.HasField("session_expiry") else None, m.fresh, m.online,
        m.since_ms, m.deleted,
        {s.filter: Subscription(s.qos, s.no_local, s.retain_as_published, s.identifier).pack()
         for s in m.subscriptions}, m.client_connect_hlc, m.settles_by_ms)


def records_frames(records: Iterable[SessionRecord], snapshot: bool = False) -> Iterator[bytes]:
    """`Frame{session_records}`s of at most RECORDS_PER_FRAME records each."""
    batch: list[peer_pb2.SessionRecord] = []
    for r in records:
        batch.append(record_to_proto(r))
        if len(batch) == RECORDS_PER_FRAME:
            yield _records(batch, snapshot)
            batch = []
    if batch:
        yield _records(batch, snapshot)


def _records(batch: list[peer_pb2.SessionRecord], snapshot: bool) -> bytes:
    return peer_pb2.Frame(session_records=peer_pb2.SessionRecords(
        records=batch, snapshot=snapshot)).SerializeToString()


def backlog_frame(client: str, exchange: int, envelopes: Iterable[Envelope],
                  unreleased: Iterable[tuple[Unreleased, Envelope]] = (),
                  last: bool = False, cuts: OldCopyCuts | None = None) -> bytes:
    """A part of a moving queue (`last`: the hand-over's last one); `unreleased`: each with
    the envelope that carries it; `cuts`: what the new copy leaves out (cut mode,
    sidecar.sessions.cuts)."""
    msg = peer_pb2.SessionBacklog(client=client, exchange=exchange, last=last)
    if cuts is not None:
        if cuts.cut is not None:
            msg.cut_origin, msg.cut_seq = cuts.cut
        for origin, seq in cuts.granted:
            msg.granted_origins.append(origin)
            msg.granted_seqs.append(seq)
        for origin, seq in cuts.upstream:
            msg.upstream_cut_origins.append(origin)
            msg.upstream_cut_seqs.append(seq)
    for env in envelopes:
        _add(msg.envelopes.add(), env)
    for u, env in unreleased:
        _add(msg.unreleased.add(packet_id=u.packet_id, pubrel=u.pubrel).envelope, env)
    return peer_pb2.Frame(session_backlog=msg).SerializeToString()


def _add(item: peer_pb2.Envelope, env: Envelope) -> None:
    item.ParseFromString(encode_envelope(env))
    item.subscription_ids.extend(env.subscription_ids)


def _backlog_envelope(item: peer_pb2.Envelope) -> Envelope:
    env = decode_envelope(item)
    return replace(env, subscription_ids=tuple(item.subscription_ids)) \
        if item.subscription_ids else env


def backlog_from(msg: peer_pb2.SessionBacklog) -> list[Envelope]:
    return [_backlog_envelope(e) for e in msg.envelopes]


def unreleased_from(msg: peer_pb2.SessionBacklog) -> list[Unreleased]:
    out = []
    for item in msg.unreleased:
        env = _backlog_envelope(item.envelope)
        out.append(Unreleased(item.packet_id, env.topic, env.payload, env.qos, env.properties,
                              env.subscription_ids, item.pubrel))
    return out


def backlog_ack_frame(client: str, exchange: int, ok: bool) -> bytes:
    return peer_pb2.Frame(session_backlog_ack=peer_pb2.SessionBacklogAck(
        client=client, exchange=exchange, ok=ok)).SerializeToString()


def sync_frame(client: str, exchange: int) -> bytes:
    return peer_pb2.Frame(session_sync=peer_pb2.SessionSync(
        client=client, exchange=exchange)).SerializeToString()


def synced_frame(client: str, exchange: int, ok: bool) -> bytes:
    return peer_pb2.Frame(session_synced=peer_pb2.SessionSynced(
        client=client, exchange=exchange, ok=ok)).SerializeToString()


def claim_frame(client: str, hlc: int, lasts_ms: int, withdrawn: bool,
                renews: str = "") -> bytes:
    return peer_pb2.Frame(session_claim=peer_pb2.SessionClaim(
        client=client, hlc=hlc, lasts_ms=lasts_ms, withdrawn=withdrawn,
        renews=renews)).SerializeToString()


def claimed_frame(client: str, hlc: int, granted: bool) -> bytes:
    return peer_pb2.Frame(session_claimed=peer_pb2.SessionClaimed(
        client=client, hlc=hlc, granted=granted)).SerializeToString()
