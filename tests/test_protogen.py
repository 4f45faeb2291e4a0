"""peer.proto: code generation, an Envelope with every property, unknown fields from newer peers."""

from __future__ import annotations

import importlib
import shutil
import sys

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from sidecar import protogen
from sidecar.peering.handshake import RefuseCode

PACKAGE = "mqfed_peer_gen_test"


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """Generate the code into a temporary package (not into the source tree) and import it."""
    root = tmp_path_factory.mktemp("gen")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    files = protogen.generate(root / PACKAGE)
    assert {f.name for f in files} >= {"peer_pb2.py", "peer_pb2.pyi", "peer_pb2_grpc.py"}
    assert {f.name for f in files} == {f"{stem}{suffix}" for stem in ("peer_pb2", "admin_pb2")
                                       for suffix in (".py", ".pyi", "_grpc.py")}
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(f"{PACKAGE}.peer_pb2")
        importlib.import_module(f"{PACKAGE}.peer_pb2_grpc")  # the fixed relative import works
        yield module
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith(PACKAGE)]:
            del sys.modules[name]


def full_envelope(pb):
    return pb.Envelope(
        origin_node="n1",
        origin_seq=2**40 + 1,
        origin_incarnation=2**63 + 5,
        hlc=(1_700_000_000_000 << 16) | 3,
        topic="a/b/ü",
        payload=b"\x00\xffbinary",
        qos=2,
        retain=True,
        user_properties=[
            pb.UserProperty(key="k", value="1"),
            pb.UserProperty(key="a", value="2"),
            pb.UserProperty(key="k", value="3"),  # duplicates and order kept
        ],
        content_type="",  # present but empty
        payload_format_indicator=0,
        correlation_data=b"",
        response_topic="reply/x",
        message_expiry=0,
        shared_group="g",
        shared_filter="a/+/ü",
        target_client="c1",
    )


def test_envelope_round_trip_keeps_every_property_and_presence(pb):
    env = full_envelope(pb)
    frame = pb.Frame(message_batch=pb.MessageBatch(envelopes=[env, pb.Envelope(topic="t")]))
    back = pb.Frame.FromString(frame.SerializeToString())
    assert back.WhichOneof("body") == "message_batch"
    got, bare = back.message_batch.envelopes
    assert got == env
    assert [(p.key, p.value) for p in got.user_properties] == [("k", "1"), ("a", "2"), ("k", "3")]
    optional = ["content_type", "payload_format_indicator", "correlation_data", "response_topic",
                "message_expiry", "shared_group", "target_client"]
    for name in optional:
        assert got.HasField(name), name  # zero values are still "present"
        assert not bare.HasField(name), name


def test_hello_and_welcome_are_wire_compatible(pb):
    hello = pb.Hello(cluster_id="c", node_id="n1", protocol_major=1, protocol_minor=2,
                     capabilities=["x", "y"], incarnation=9, grpc_address="h:1", mqtt_address="h:2")
    welcome = pb.Welcome.FromString(hello.SerializeToString())
    assert welcome.node_id == "n1" and list(welcome.capabilities) == ["x", "y"]
    assert welcome.SerializeToString() == hello.SerializeToString()


def test_contract_shape(pb):
    method = pb.DESCRIPTOR.services_by_name["Peer"].methods_by_name["Stream"]
    assert method.client_streaming and method.server_streaming
    assert pb.DESCRIPTOR.package == "mqfed.peer.v1"
    refuse = pb.Refuse.Code
    assert {c.name: c.value for c in RefuseCode} == {
        n: refuse.Value(n) for n in refuse.keys() if n != "CODE_UNSPECIFIED"
    }
    assert set(pb.Ack.Status.keys()) == {"STATUS_UNSPECIFIED", "OK", "QUEUED", "REJECTED"}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_unknown_fields_in_raw_bytes_are_ignored_and_kept(pb):
    env = full_envelope(pb)
    extra = _varint(200 << 3 | 0) + _varint(12345)  # field 200, varint
    extra += _varint(201 << 3 | 2) + _varint(3) + b"new"  # field 201, bytes
    parsed = pb.Envelope.FromString(env.SerializeToString() + extra)
    assert parsed.topic == env.topic and parsed.payload == env.payload
    assert parsed.SerializeToString().endswith(extra)  # passed on unchanged if re-serialized


def newer_pool(pb):
    """peer.proto as a future 1.x would have it: a new Envelope field and a new Frame member."""
    fdp = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = "peer_next.proto"
    fdp.package = "mqfed.peer.next"
    gossip = fdp.message_type.add(name="Gossip")
    gossip.field.add(name="rumour", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                     label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    msgs = {m.name: m for m in fdp.message_type}
    msgs["Envelope"].field.add(
        name="priority", number=40, type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    msgs["Frame"].field.add(
        name="gossip", number=50, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        type_name=".mqfed.peer.next.Gossip", oneof_index=0,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    for message in fdp.message_type:  # re-point type references at the new package
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(".mqfed.peer.v1.", ".mqfed.peer.next.")
    for service in fdp.service:
        for method in service.method:
            method.input_type = method.input_type.replace(".v1.", ".next.")
            method.output_type = method.output_type.replace(".v1.", ".next.")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)

    def cls(name):
        descriptor = pool.FindMessageTypeByName(f"mqfed.peer.next.{name}")
        return message_factory.GetMessageClass(descriptor)

    return cls


def test_newer_peer_fields_and_frames_are_ignored(pb):
    cls = newer_pool(pb)
    Frame, Envelope, Gossip = cls("Frame"), cls("Envelope"), cls("Gossip")
    newer_env = Envelope.FromString(full_envelope(pb).SerializeToString())
    newer_env.priority = 7
    batch = Frame(message_batch={"envelopes": [newer_env]})
    old = pb.Frame.FromString(batch.SerializeToString())
    got = old.message_batch.envelopes[0]
    assert got != full_envelope(pb)  # it still carries the unknown field (kept for re-sending)
    got.DiscardUnknownFields()
    assert got == full_envelope(pb)  # every known field read correctly
    # a frame type this version does not know arrives with no body: receivers ignore it
    unknown = pb.Frame.FromString(Frame(gossip=Gossip(rumour="hi")).SerializeToString())
    assert unknown.WhichOneof("body") is None
    # and the newer peer reads our frames as well
    ours = pb.Frame(heartbeat=pb.Heartbeat(sent_at_ms=5))
    assert Frame.FromString(ours.SerializeToString()).heartbeat.sent_at_ms == 5


def test_fix_imports_only_touches_our_modules():
    src = "import grpc\nimport peer_pb2 as peer__pb2\nimport other_pb2 as o\n"
    assert protogen.fix_imports(src, {"peer_pb2"}) == (
        "import grpc\nfrom . import peer_pb2 as peer__pb2\nimport other_pb2 as o\n"
    )


def test_missing_generated_code_says_how_to_fix(tmp_path):
    pkg = tmp_path / "empty_proto_pkg"
    pkg.mkdir()
    shutil.copy(protogen.OUT_DIR / "__init__.py", pkg / "__init__.py")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ImportError, match=r"run `make install` to generate the gRPC code"):
            importlib.import_module("empty_proto_pkg")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("empty_proto_pkg", None)


def test_protoc_failure_is_reported(tmp_path):
    (tmp_path / "bad.proto").write_text('syntax = "proto3"; message {')
    with pytest.raises(protogen.ProtogenError, match="status 1"):
        protogen.generate(tmp_path / "out", tmp_path)
    assert protogen.main(["--proto", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 1
