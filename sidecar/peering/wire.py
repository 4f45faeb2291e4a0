"""Wire helpers for the peer stream: method path, gRPC options, frame encoding, Hello/Refuse
conversions between `sidecar.peering.handshake` types and `peer.proto` messages."""

from __future__ import annotations

import time

from google.protobuf.message import DecodeError

from sidecar._proto import peer_pb2
from sidecar.peering.handshake import Hello, Refuse

Frame = peer_pb2.Frame

_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["Peer"]
SERVICE_NAME = _SERVICE.full_name  # "mqfed.peer.v1.Peer"
METHOD = f"/{SERVICE_NAME}/{_SERVICE.methods_by_name['Stream'].name}"
CHALLENGE = f"/{SERVICE_NAME}/{_SERVICE.methods_by_name['Challenge'].name}"

KEEPALIVE_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000


def decode(data: bytes) -> tuple[int, peer_pb2.Frame | None]:
    """gRPC deserializer: the frame and its size on the wire (for the byte counters); None
    for bytes that are not a Frame (the reader ends the stream with a clear reason: raised
    here, the error would end it inside gRPC with none)."""
    try:
        return len(data), Frame.FromString(data)
    except DecodeError:
        return len(data), None


NOT_A_FRAME = "the peer sent bytes that are not a peer.proto Frame (a bug or an attack)"


def encode(frame: peer_pb2.Frame | bytes) -> bytes:
    """A frame as bytes; bytes are taken to be an already serialized Frame."""
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


def hello_frame(hello: Hello) -> bytes:
    return Frame(hello=peer_pb2.Hello(**_fields(hello))).SerializeToString()


def welcome_frame(hello: Hello) -> bytes:
    return Frame(welcome=peer_pb2.Welcome(**_fields(hello))).SerializeToString()


def refuse_message(refuse: Refuse) -> peer_pb2.Refuse:
    return peer_pb2.Refuse(
        code=int(refuse.code), message=refuse.message, supported_majors=refuse.supported_majors
    )


def refuse_code_name(code: int) -> str:
    """The enum name of a Refuse code; the number for a code from a newer minor version."""
    return peer_pb2.Refuse.Code.Name(code) if code in peer_pb2.Refuse.Code.values() else str(code)


def heartbeat_frame() -> bytes:
    beat = peer_pb2.Heartbeat(sent_at_ms=int(time.time() * 1000))
    return Frame(heartbeat=beat).SerializeToString()


def hello_from(msg: peer_pb2.Hello | peer_pb2.Welcome) -> Hello:
    """A received Hello or Welcome as the handshake core's `Hello`."""
    return Hello(
        cluster_id=msg.cluster_id,
        node_id=msg.node_id,
        incarnation=msg.incarnation,
        grpc_address=msg.grpc_address,
        mqtt_address=msg.mqtt_address,
        admin_address=msg.admin_address,
        protocol_major=msg.protocol_major,
        protocol_minor=msg.protocol_minor,
        capabilities=frozenset(msg.capabilities),
    )


def _fields(hello: Hello) -> dict:
    return {
        "cluster_id": hello.cluster_id,
        "node_id": hello.node_id,
        "protocol_major": hello.protocol_major,
        "protocol_minor": hello.protocol_minor,
        "capabilities": sorted(hello.capabilities),
        "incarnation": hello.incarnation,
        "grpc_address": hello.grpc_address,
        "mqtt_address": hello.mqtt_address,
        "admin_address": hello.admin_address,
    }


SERVER_READ_AHEAD = 1 << 20  # bytes gRPC reads ahead on one incoming stream


def _common_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Client side: peers are dialled directly (never through an HTTP proxy from the
    environment), each dial attempt on its own connection (no subchannel shared with an
    earlier, failed attempt, so no hidden gRPC reconnect backoff: ours is the only one)."""
    return _common_options(max_message_bytes) + [
        ("grpc.enable_http_proxy", 0),
        ("grpc.use_local_subchannel_pool", 1),
    ]


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Server side: no SO_REUSEPORT (a second process on our port must fail, not share it)
    and tolerate the clients' keepalive pings. A fixed 1 MiB read-ahead per stream instead of
    BDP probing: with probing, gRPC grew its window (and our memory) by tens of MB for a few
    unauthenticated callers sending huge requests nobody reads; 1 MiB still fills ~1 GB/s at
    1 ms round trip."""
    return _common_options(max_message_bytes) + [
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", SERVER_READ_AHEAD),
        ("grpc.so_reuseport", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
        ("grpc.http2.max_ping_strikes", 0),
    ]
