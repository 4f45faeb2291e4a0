"""Interest frames are serialized by hand (sidecar.peering.envelopes): the same messages as
protobuf's own serializer, read back into the same snapshots and deltas."""

from __future__ import annotations

from sidecar._proto import peer_pb2
from sidecar.message import MessageProperties
from sidecar.peering import envelopes as frames
from sidecar.routing.forwarder import Envelope
from sidecar.routing.local_interest import InterestDelta, InterestSnapshot
from sidecar.routing.records import read_records
from sidecar.routing.table import InterestKey

KEYS = frozenset([InterestKey(None, "a/b"), InterestKey("g", "x/+"), InterestKey(None, "ü/#"),
                  InterestKey(None, "l" * 300), InterestKey("grp" * 50, "y")])
SINCE = {InterestKey(None, "a/b"): 1_764_140_000_000, InterestKey("g", "x/+"): 5}


def _entries(keys, since=None) -> list[peer_pb2.InterestEntry]:
    times = since or {}
    return [peer_pb2.InterestEntry(group=k.group, filter=k.filter, since_ms=times.get(k, 0))
            for k in keys]


def test_snapshot_frames_match_protobuf_and_read_back():
    for snap in (InterestSnapshot(0, frozenset()), InterestSnapshot(2**40, KEYS),
                 InterestSnapshot(7, KEYS, 3, last=False, since=SINCE)):
        made = peer_pb2.Frame.FromString(frames.interest_snapshot_frame(snap))
        assert made == peer_pb2.Frame(interest_snapshot=peer_pb2.InterestSnapshot(
            version=snap.version, entries=_entries(snap.keys, snap.since), chunk=snap.chunk,
            more=not snap.last))
        back = frames.snapshot_from(made.interest_snapshot)
        assert back == snap and back.since == snap.since


def test_delta_frames_match_protobuf_and_read_back():
    delta = InterestDelta(5, 6, KEYS, frozenset([InterestKey(None, "gone")]), SINCE)
    made = peer_pb2.Frame.FromString(frames.interest_delta_frame(delta))
    assert made == peer_pb2.Frame(interest_delta=peer_pb2.InterestDelta(
        from_version=5, to_version=6, added=_entries(KEYS, SINCE),
        removed=_entries(delta.removed)))
    back = frames.delta_from(made.interest_delta)
    assert back == delta and back.since == SINCE


def test_an_envelope_keeps_its_publisher_across_the_wire():
    env = Envelope("n1", 3, 9, 1 << 16, "t/a", b"x", 1, publisher="dev-7")
    back = frames.decode_envelope(peer_pb2.Envelope.FromString(frames.encode_envelope(env)))
    assert back == env
    old = Envelope("n1", 3, 9, 1 << 16, "t/a", b"x", 1)
    assert frames.decode_envelope(peer_pb2.Envelope.FromString(
        frames.encode_envelope(old))).publisher == ""


def _env(seq: int, **kw) -> Envelope:
    fields = dict(origin_node="n1", origin_incarnation=3, origin_seq=seq, hlc=seq << 16,
                  topic=f"t/{seq}", payload=str(seq).encode(), qos=1, first_seq=seq)
    fields.update(kw)
    return Envelope(**fields)


def test_plain_deliveries_queue_as_records_and_others_as_envelopes():
    plain, shared = _env(1), _env(2, shared_group="g", shared_filter="t/#")
    assert frames.is_record(frames.queued_form(plain))
    assert frames.queued_form(shared) == frames.encode_envelope(shared)
    assert not frames.is_record(frames.queued_form(shared))
    too_long = _env(3, topic="x" * 70000)   # no record carries it: an envelope says why
    assert frames.queued_form(too_long) == frames.encode_envelope(too_long)


def test_frames_carry_one_form_each_in_order():
    envs = [_env(1), _env(2), _env(3, shared_group="g", shared_filter="t/#"), _env(4)]
    queued = [frames.queued_form(e) for e in envs]
    runs = frames.same_form_runs(queued, bytes)
    assert [len(r) for r in runs] == [2, 1, 1]
    as_records = [peer_pb2.Frame.FromString(frames.batch_frame(r)).message_batch for r in runs]
    assert [len(b.envelopes) for b in as_records] == [0, 1, 0]
    got = [rec.envelope() for b in as_records for rec in read_records(b.records)]
    assert got == [envs[0], envs[1], envs[3]]
    assert frames.decode_envelope(as_records[1].envelopes[0]) == envs[2]


def test_a_peer_without_records_gets_every_queued_record_as_an_envelope():
    envs = [_env(1), _env(2, qos=0, properties=MessageProperties(user=(("k", "v"),)))]
    batch = peer_pb2.Frame.FromString(
        frames.batch_frame([frames.queued_form(e) for e in envs], records=False)).message_batch
    assert not batch.records
    assert [frames.decode_envelope(m) for m in batch.envelopes] == envs
