"""A fake mqfed node for attack tests: a gRPC server that answers every method (the peer
service's and the admin service's, Challenge included) like a node would, and records all it
receives: method paths, call metadata and request bytes. It plays the most capable impostor a
forged membership record can point nodes at, short of knowing the tokens."""

from __future__ import annotations

import os
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from sidecar._proto import admin_pb2, peer_pb2

BOGUS_ANSWER = (("mqfed-auth-answer", "00" * 32),)


@dataclass
class Received:
    method: str
    metadata: dict[str, str]
    messages: list[bytes] = field(default_factory=list)


class FakeNode:
    """Start with `start()`, stop with `stop()`; `calls` holds what it received."""

    def __init__(self) -> None:
        self.calls: list[Received] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                                   options=[("grpc.so_reuseport", 0)])
        self._server.add_generic_rpc_handlers((_Handler(self),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeNode:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(None).wait(5)

    def record(self, received: Received) -> Received:
        with self._lock:
            self.calls.append(received)
        return received

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.calls)

    def everything(self) -> bytes:
        """All bytes it received: metadata keys and values, request messages."""
        out = bytearray()
        for call in self.snapshot():
            for key, value in call.metadata.items():
                out += key.encode() + b"=" + value.encode() + b"\n"
            for message in call.messages:
                out += message
        return bytes(out)


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, fake: FakeNode) -> None:
        self.fake = fake

    def service(self, details: grpc.HandlerCallDetails):
        method = details.method
        metadata = {k: v if isinstance(v, str) else v.decode(errors="replace")
                    for k, v in details.invocation_metadata}
        if method.endswith("/Challenge"):
            reply = (peer_pb2.ChallengeReply if ".peer." in method else admin_pb2.ChallengeReply)

            def challenge(request: bytes, context) -> bytes:
                self.fake.record(Received(method, metadata, [request]))
                return reply(nonce=os.urandom(40).hex()).SerializeToString()

            return grpc.unary_unary_rpc_method_handler(challenge)
        if method.endswith("/Stream"):
            def stream(requests, context):
                got = self.fake.record(Received(method, metadata))
                context.send_initial_metadata(BOGUS_ANSWER)
                for request in requests:  # whatever a dialler sends after the "proof"
                    got.messages.append(request)
                yield from ()

            return grpc.stream_stream_rpc_method_handler(stream)

        def unary(request: bytes, context) -> bytes:
            self.fake.record(Received(method, metadata, [request]))
            context.send_initial_metadata(BOGUS_ANSWER)
            return b""

        return grpc.unary_unary_rpc_method_handler(unary)
