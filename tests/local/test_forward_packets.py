"""The forwarding client packs many filters per SUBSCRIBE and UNSUBSCRIBE packet."""

from __future__ import annotations

from pathlib import Path

from sidecar.local.forward_client import PACKET_FILTERS, ForwardClient, cut_marker
from sidecar.routing.forwarder import CutMarker


class Recorder:
    """Stands in for the paho client: records the packets asked for."""

    def __init__(self) -> None:
        self.packets: list[tuple[str, list[str], int | None]] = []

    def subscribe_lean(self, filters, options, subscription_id):
        assert options == (42 if filters[0].startswith("$share/") else 46)  # QoS 2, RAP, no
        self.packets.append(("sub", list(filters), subscription_id))  # retained (+ No Local)
        return len(self.packets)

    def unsubscribe(self, topics):
        self.packets.append(("unsub", list(topics), None))
        return 0, len(self.packets)


def _client() -> tuple[ForwardClient, Recorder]:
    fc = ForwardClient(Path("/nonexistent"), "s", "n1.fwd", on_copies=lambda c: None,
                       on_published=lambda t: None, on_connected=lambda p: None)
    fc._client = rec = Recorder()
    return fc, rec


def test_one_packet_per_identifier_run_and_size():
    fc, rec = _client()
    subs = [(f"d/{i}", 1, True) for i in range(PACKET_FILTERS + 10)]
    subs += [("a/+", 2, True), ("$share/g/x", 3, False), ("e/1", 4, True), ("e/2", 4, True)]
    fc.subscribe_many(subs)
    assert [(kind, len(filters), sid) for kind, filters, sid in rec.packets] == [
        ("sub", PACKET_FILTERS, 1), ("sub", 10, 1), ("sub", 1, 2), ("sub", 1, 3), ("sub", 2, 4)]
    assert fc.subscribe_packets == 5
    fc.unsubscribe_many([f"d/{i}" for i in range(PACKET_FILTERS + 1)])
    assert [len(f) for kind, f, _ in rec.packets if kind == "unsub"] == [PACKET_FILTERS, 1]


def test_suback_codes_are_read_per_filter():
    fc, rec = _client()
    fc.subscribe_many([("a", 1, True), ("b", 1, True)])

    class Code:
        def __init__(self, value: int) -> None:
            self.value = value

    refused = []
    fc._refused = lambda f, sid, code: refused.append((f, sid, code))
    fc._on_subscribe(None, None, 1, [Code(2), Code(0x87)], None)
    assert refused == [("b", 1, 0x87)]


def test_lean_suback_codes_are_read_per_filter():
    fc, rec = _client()
    fc.subscribe_many([("a", 1, True), ("b", 1, True), ("c/+", 2, True)])
    refused = []
    fc._refused = lambda f, sid, code: refused.append((f, sid, code))
    fc._on_suback_codes(2, b"\x02")  # the second packet: c/+
    fc._on_suback_codes(1, b"\x87")  # a code missing: refused (0x80)
    fc._on_suback_codes(1, b"\x02\x02")  # answered already: ignored
    assert refused == [("a", 1, 0x87), ("b", 1, 0x80)]


def test_a_granted_suback_clears_the_filters_earlier_refusals():
    fc, rec = _client()
    fc._subscribe_refusals.update({"a": 2, "z": 1})  # (refused before, asked again)
    fc.subscribe_many([("a", 1, True), ("b", 1, True)])
    fc._on_suback_codes(1, b"\x02\x02")
    assert fc._subscribe_refusals == {"z": 1} and fc.subscribing == 0


def test_a_cut_probe_names_its_client_and_a_new_copys_connect_time():
    assert cut_marker(b"cut:dev/1") == CutMarker("dev/1", 0)
    assert cut_marker(b"cut:dev:x\x001795772290529") == CutMarker("dev:x", 1795772290529)
    assert cut_marker(b"cut:dev\x00junk") == CutMarker("dev", 0)
    assert cut_marker(b"cut:dev\x00" + b"9" * 30) == CutMarker("dev", 0)
    assert cut_marker(b"cut:\xffd") == CutMarker("\ufffdd", 0)
