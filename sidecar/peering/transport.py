"""`PeerTransport`: the gRPC adapter between sidecars (architecture §3, §4, §6).

Per ordered pair of nodes there is one stream, dialled by the sender: this node dials every
peer in the membership view (`set_peers`) for the traffic it originates ("outbound": Hello,
then interest, message batches) and serves the Peer service for the streams peers dial to it
("inbound": their traffic; we answer with acks and interest requests via `reply`). The
transport only moves frames; what to send and when is the node's business.

Callback guarantees (all on the event loop, from the transport's own tasks):
- per peer and direction, up and down alternate, starting with up: `on_*_up` once the
  handshake succeeded, `on_*_down` exactly once after it (also on `set_peers` removal and
  `stop`); a failed dial attempt calls nothing (see `states()`), a refusal calls `on_refused`;
- `on_frame` gets every frame other than handshake and heartbeat frames, in stream order,
  only between up and down; a newer inbound stream from the same node calls the old stream's
  `on_inbound_down` before its own `on_inbound_up`;
- frames accepted by `send`/`reply` but not yet written when a stream goes down are dropped:
  after the next `on_outbound_up` the node re-sends what the peer has not acked.
All methods must be called on the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import grpc
import grpc.aio

from sidecar._proto import peer_pb2
from sidecar.grpc_auth import Authenticator, Checked, Gate, Prover, refusal_of
from sidecar.peering import wire
from sidecar.peering.capabilities import needs
from sidecar.peering.dialer import Backoff, DialError, Dialled, PeerRefused, dial
from sidecar.peering.frame_stream import Counters, FrameStream
from sidecar.peering.handshake import Accept, Handshake, Refuse
from sidecar.peering.tls import PeerTls

__all__ = ["Backoff", "FrameTooLarge", "PeerHandler", "PeerTransport", "PeerTransportError"]

log = logging.getLogger("mqfed.peering")

STOPPING = "this node is stopping"
REMOVED = "removed from the membership view"


class PeerTransportError(RuntimeError):
    """The transport cannot run (e.g. its listen address is taken); the message says why."""


class FrameTooLarge(ValueError):
    """A frame exceeds `max_message_bytes`: split the batch."""


class PeerHandler(Protocol):
    """What the node does with stream events; see the module docstring for the ordering."""

    def on_outbound_up(self, peer: str, accept: Accept) -> None:
        """Our stream to `peer` is ready: send the interest snapshot now."""

    def on_outbound_down(self, peer: str, reason: str) -> None: ...

    def on_inbound_up(self, peer: str, accept: Accept) -> None:
        """`peer`'s stream to us is ready."""

    def on_inbound_down(self, peer: str, reason: str) -> None: ...

    def on_frame(self, peer: str, frame: peer_pb2.Frame, inbound: bool) -> None:
        """A frame from `peer`; `inbound` if it came on the stream the peer dialled."""

    def on_outbound_drained(self, peer: str) -> None:
        """Our stream to `peer` wrote its last queued frame: it is free for the next one
        (see `busy`)."""

    def on_refused(self, peer: str, refuse: peer_pb2.Refuse) -> None:
        """The handshake with `peer` failed (wrong cluster, version, ...); we keep dialling,
        slowly."""


class _Peer:
    """What the transport knows about one peer node."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.address: str | None = None  # set while in the membership view
        self.dial_task: asyncio.Task | None = None
        self.outbound: FrameStream | None = None
        self.inbound: FrameStream | None = None
        self.out_state = "idle"  # idle | connecting | up | backoff | refused
        self.out_counters = Counters()
        self.in_counters = Counters()
        self.ups = 0
        self.failures = 0
        self.last_error: str | None = None
        self.incarnation: int | None = None
        # what the handshake of each stream settled on (sidecar.peering.capabilities)
        self.out_caps: frozenset[str] = frozenset()
        self.in_caps: frozenset[str] = frozenset()
        self.minor: int | None = None  # the peer's protocol minor, as its last handshake said
        self.withheld: dict[str, int] = {}  # frames not sent: capability -> count


class PeerTransport:
    """gRPC server plus one dialled stream per peer (see the module docstring)."""

    def __init__(
        self,
        handshake: Handshake,
        listen: str,
        handler: PeerHandler,
        *,
        heartbeat_interval: float = 1.0,
        dead_after: float = 5.0,
        hello_timeout: float = 5.0,
        connect_timeout: float | None = None,
        max_message_bytes: int = 64 << 20,
        backoff: Backoff | None = None,
        token: str = "",
        tls: PeerTls | None = None,
        check_address: bool = True,
    ) -> None:
        if dead_after < 2 * heartbeat_interval:
            raise ValueError(f"dead_after ({dead_after:g}s) must be at least twice"
                             f" heartbeat_interval ({heartbeat_interval:g}s)")
        self.handshake = handshake
        self.node_id = handshake.me.node_id
        self.listen = listen
        self.handler = handler
        self.heartbeat_interval = heartbeat_interval
        self.dead_after = dead_after
        self.hello_timeout = hello_timeout
        self.connect_timeout = dead_after if connect_timeout is None else connect_timeout
        self.max_message_bytes = max_message_bytes
        self.backoff = backoff or Backoff()
        self.token = token  # shared peer token: proven when dialling, required when served
        # the addresses a dialler may name in its proof: the one we advertise (None: any, for
        # a static peer list, which no outsider can write)
        me = handshake.me
        addresses = frozenset({me.grpc_address}) if check_address and me.grpc_address else None
        self.auth = (Authenticator(token, "peer", self.node_id, addresses) if token else None)
        self._prover = Prover(token, "peer", self.node_id) if token else None
        self.gate = Gate()  # streams not authenticated yet (or, without a token, before Hello)
        self.tls = tls  # mutual TLS on both sides when set
        self._credentials = None if tls is None else tls.channel_credentials()
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._peers: dict[str, _Peer] = {}
        self._retiring: set[asyncio.Task] = set()
        self._stopping = False
        self._loud: dict[str, str] = {}
        self._channel_options = wire.channel_options(max_message_bytes)
        self.blocked: frozenset[str] = frozenset()

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen for peers on `listen`; raise PeerTransportError if that is impossible."""
        if self._server is not None or self._stopping:
            raise PeerTransportError("PeerTransport.start() called twice or after stop()")
        server = grpc.aio.server(options=wire.server_options(self.max_message_bytes))
        method = grpc.stream_stream_rpc_method_handler(
            self._serve, request_deserializer=wire.decode, response_serializer=None
        )
        # request-streaming, so that gRPC does not read (up to max_message_bytes) what an
        # unauthenticated caller sends: the request is never read at all
        challenge = grpc.stream_unary_rpc_method_handler(
            self._challenge, request_deserializer=None, response_serializer=None)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            wire.SERVICE_NAME, {"Stream": method, "Challenge": challenge}),))
        try:
            port = (server.add_insecure_port(self.listen) if self.tls is None else
                    server.add_secure_port(self.listen, self.tls.server_credentials()))
        except RuntimeError:
            port = 0
        if not port:
            await server.stop(None)
            raise PeerTransportError(
                f"cannot listen for peers on {self.listen}: the address is in use or not"
                " available on this host; stop whatever holds it or choose another [grpc] listen"
                " address"
            )
        await server.start()
        self._server, self.port = server, port
        log.info("peer service listening", extra={"listen": self.listen, "port": port})

    async def stop(self) -> None:
        """Close every stream (down callbacks fire) and the server; no task is left behind."""
        self._stopping = True
        for p in list(self._peers.values()):
            self._stop_dialling(p, STOPPING)
            if p.inbound is not None:
                p.inbound.close(STOPPING)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(1.0)
            self._server = None

    # ---- membership --------------------------------------------------------------------------

    def set_peers(self, peers: Mapping[str, str]) -> None:
        """The membership view, node id -> gRPC address (our own id is ignored): dial new
        peers, redial moved ones, close the streams of removed ones and stop dialling them."""
        if self._stopping:
            return
        wanted = {node: addr for node, addr in peers.items() if node != self.node_id}
        for p in list(self._peers.values()):
            if p.address is not None and p.node_id not in wanted:
                self._stop_dialling(p, REMOVED)
                p.address, p.out_state = None, "idle"
                if p.inbound is not None:
                    p.inbound.close(REMOVED)
                self._forget_if_unused(p)
        for node, address in wanted.items():
            p = self._peer(node)
            if p.address == address:
                continue
            if p.address is not None:
                self._stop_dialling(p, f"its address changed to {address}")
            p.address, p.failures = address, 0
            p.dial_task = asyncio.create_task(self._dial_loop(p, address), name=f"peer-dial-{node}")

    def block(self, peers: frozenset[str]) -> None:
        """Fault injection (tests, drills): no stream with these peers until unblocked; their
        streams close now, dials to them wait, their dials to us are refused."""
        newly = peers - self.blocked
        self.blocked = peers
        for node in newly:
            p = self._peers.get(node)
            if p is None:
                continue
            if p.outbound is not None:
                p.outbound.close("blocked (fault injection)")
            if p.inbound is not None:
                p.inbound.close("blocked (fault injection)")

    # ---- sending -----------------------------------------------------------------------------

    def send(self, peer: str, frame: peer_pb2.Frame | bytes) -> bool:
        """Queue a frame (or a serialized Frame) on our stream to `peer`; False if it is not up.
        Raises FrameTooLarge if it exceeds `max_message_bytes`."""
        p = self._peers.get(peer)
        return p is not None and self._enqueue(p.outbound, frame, p, p.out_caps)

    def reply(self, peer: str, frame: peer_pb2.Frame | bytes) -> bool:
        """Queue a frame on the stream `peer` dialled to us (acks, interest requests)."""
        p = self._peers.get(peer)
        return p is not None and self._enqueue(p.inbound, frame, p, p.in_caps)

    def reply_latest(self, peer: str, key: str, frame: peer_pb2.Frame | bytes) -> bool:
        """`reply` a cumulative frame: one of `key` still queued on that stream is replaced by
        it (`FrameStream.send_latest`)."""
        p = self._peers.get(peer)
        return p is not None and self._enqueue(p.inbound, frame, p, p.in_caps, key)

    def capabilities(self, peer: str) -> frozenset[str] | None:
        """What the handshake with `peer` settled on (our stream to it first; None: no stream
        was ever up)."""
        p = self._peers.get(peer)
        if p is None or p.minor is None:
            return None
        return p.out_caps if p.outbound is not None or not p.in_caps else p.in_caps

    def connected(self, peer: str, inbound: bool = False) -> bool:
        """Whether our stream to `peer` (or, with `inbound`, its stream to us) is up."""
        p = self._peers.get(peer)
        stream = None if p is None else p.inbound if inbound else p.outbound
        return stream is not None and stream.announced and not stream.closed

    def queued(self, peer: str, inbound: bool = False) -> int:
        """Frames waiting to be written on that stream (0 if it is not up)."""
        p = self._peers.get(peer)
        stream = None if p is None else p.inbound if inbound else p.outbound
        return 0 if stream is None else stream.queued

    def busy(self, peer: str) -> bool:
        """Whether our stream to `peer` is writing a frame or has one queued (False if it
        is not up)."""
        p = self._peers.get(peer)
        return p is not None and p.outbound is not None and p.outbound.busy

    def states(self) -> dict[str, dict[str, Any]]:
        """Per peer: address, stream states, reconnects, last error, traffic, queue depths."""
        out: dict[str, dict[str, Any]] = {}
        for node, p in sorted(self._peers.items()):
            out[node] = {
                "address": p.address,
                "member": p.address is not None,
                "incarnation": p.incarnation,
                "reconnects": max(0, p.ups - 1),
                "failures": p.failures,
                "last_error": p.last_error,
                "protocol": None if p.minor is None else f"1.{p.minor}",
                "capabilities": sorted(self.capabilities(node) or ()),
                "withheld": dict(p.withheld),
                "outbound": self._stream_state(
                    p.outbound, "down" if p.out_state == "up" else p.out_state, p.out_counters),
                "inbound": self._stream_state(p.inbound, "down", p.in_counters),
            }
        return out

    # ---- internals ---------------------------------------------------------------------------

    def _enqueue(self, stream: FrameStream | None, frame: peer_pb2.Frame | bytes, p: _Peer,
                 caps: frozenset[str], latest: str | None = None) -> bool:
        if stream is None or not stream.announced or stream.closed:
            return False
        data = wire.encode(frame)
        needed = needs(data)
        if needed is not None and needed not in caps:  # a frame that peer cannot read
            p.withheld[needed] = p.withheld.get(needed, 0) + 1
            return False
        if len(data) > self.max_message_bytes:
            raise FrameTooLarge(
                f"a frame of {len(data)} bytes for peer {stream.peer!r} exceeds"
                f" max_message_bytes={self.max_message_bytes}: send smaller batches"
            )
        return stream.send(data) if latest is None else stream.send_latest(latest, data)

    @staticmethod
    def _stream_state(stream: FrameStream | None, down: str, counters: Counters) -> dict:
        up = stream is not None and stream.announced and not stream.closed
        return {
            "state": "up" if up else down,
            "queued": stream.queued if stream is not None and up else 0,
            "queued_bytes": stream.queued_bytes if stream is not None and up else 0,
            **counters.as_dict(),
        }

    def _peer(self, node: str) -> _Peer:
        p = self._peers.get(node)
        if p is None:
            p = self._peers[node] = _Peer(node)
        return p

    def _stop_dialling(self, p: _Peer, reason: str) -> None:
        if p.outbound is not None:
            p.outbound.close(reason)
        task, p.dial_task = p.dial_task, None
        if task is not None and not task.done():
            task.cancel()
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def _forget_if_unused(self, p: _Peer) -> None:
        if p.address is None and p.inbound is None and p.outbound is None and p.dial_task is None:
            if self._peers.get(p.node_id) is p:
                del self._peers[p.node_id]

    def _new_stream(self, p: _Peer, inbound: bool, read: Callable[[], Awaitable[Any]],
                    write: Callable[[bytes], Awaitable[Any]]) -> FrameStream:
        return FrameStream(
            p.node_id, inbound, read, write,
            on_frame=self.handler.on_frame,
            on_closed=self._stream_closed,
            on_drained=self._stream_drained,
            counters=p.in_counters if inbound else p.out_counters,
            heartbeat_interval=self.heartbeat_interval,
            dead_after=self.dead_after,
        )

    def _stream_drained(self, stream: FrameStream) -> None:
        p = self._peers.get(stream.peer)
        if not stream.inbound and p is not None and p.outbound is stream:
            self.handler.on_outbound_drained(stream.peer)

    def _stream_closed(self, stream: FrameStream, reason: str) -> None:
        p = self._peers.get(stream.peer)
        if p is not None:
            if stream.inbound and p.inbound is stream:
                p.inbound = None
            elif not stream.inbound and p.outbound is stream:
                p.outbound = None
                if p.out_state == "up":
                    p.out_state = "idle" if p.address is None else "backoff"
        if not stream.announced:
            return
        direction = "inbound" if stream.inbound else "outbound"
        quiet = self._stopping or reason == REMOVED
        log.log(logging.INFO if quiet else logging.WARNING, "peer stream down",
                extra={"peer": stream.peer, "direction": direction, "reason": reason})
        callback = self.handler.on_inbound_down if stream.inbound else self.handler.on_outbound_down
        self._notify(callback, stream.peer, reason)
        if p is not None:
            self._forget_if_unused(p)

    def _notify(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("a peer handler callback failed: this is a bug",
                          extra={"callback": getattr(callback, "__name__", str(callback))})

    def _log_loudly(self, key: str, message: str, **extra: Any) -> None:
        """Log an error once per distinct message (refusals repeat every few seconds)."""
        level = logging.DEBUG if self._loud.get(key) == message else logging.ERROR
        self._loud[key] = message
        log.log(level, message, extra=extra)

    # ---- outbound ----------------------------------------------------------------------------

    async def _dial_loop(self, p: _Peer, address: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if p.node_id in self.blocked:
                p.out_state = "blocked"
                await asyncio.sleep(0.2)
                continue
            p.out_state = "connecting"
            try:
                dialled = await dial(p.node_id, address, self.handshake,
                                     options=self._channel_options, timeout=self.connect_timeout,
                                     prover=self._prover, credentials=self._credentials)
            except PeerRefused as exc:
                p.failures += 1
                p.out_state, p.last_error = "refused", exc.refuse.message
                who = f"peer {p.node_id!r} refused this node" if exc.by_peer else (
                    f"this node refused peer {p.node_id!r}")
                self._log_loudly(f"out:{p.node_id}", f"{who}: {exc.refuse.message}",
                                 peer=p.node_id, address=address,
                                 code=wire.refuse_code_name(exc.refuse.code))
                self._notify(self.handler.on_refused, p.node_id, exc.refuse)
                delay = self.backoff.refused_delay()
            except DialError as exc:
                p.failures += 1
                p.out_state, p.last_error = "backoff", str(exc)
                log.log(logging.INFO if p.failures == 1 else logging.DEBUG, "peer dial failed",
                        extra={"peer": p.node_id, "address": address, "reason": str(exc),
                               "failures": p.failures})
                delay = self.backoff.delay(p.failures)
            else:
                up_at = loop.time()
                reason = await self._run_outbound(p, dialled)
                if loop.time() - up_at >= self.backoff.stable_after:
                    p.failures = 0
                p.failures += 1
                p.last_error = reason
                delay = self.backoff.delay(p.failures)
            await asyncio.sleep(delay)

    async def _run_outbound(self, p: _Peer, dialled: Dialled) -> str:
        call = dialled.call
        stream = self._new_stream(p, False, call.read, call.write)
        try:
            p.outbound, p.out_state, p.incarnation = stream, "up", dialled.accept.peer.incarnation
            p.out_caps, p.minor = dialled.accept.capabilities, dialled.accept.peer.protocol_minor
            p.ups += 1
            stream.announced = True
            log.info("peer stream up", extra={"peer": p.node_id, "direction": "outbound",
                                              "incarnation": p.incarnation})
            self._notify(self.handler.on_outbound_up, p.node_id, dialled.accept)
            return await stream.run()
        finally:
            stream.close(STOPPING if self._stopping else "the stream was cancelled")
            call.cancel()
            await dialled.channel.close(None)

    # ---- inbound -----------------------------------------------------------------------------

    async def _serve(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        if not self.gate.enter():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"node {self.node_id!r}: too many peer streams are being"
                                " authenticated at once; retry")
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.gate.leave()

        try:
            caller = await self._authenticate(context, release)  # before any frame is read
            if caller is not None:
                release()  # authenticated: its Hello is read outside the gate
            accept = await self._read_hello(context)
        finally:
            release()
        if caller is not None and accept.peer.node_id != caller:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"the Hello names node {accept.peer.node_id!r}, the proof of"
                                f" the peer token node {caller!r}")
        if self._stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {self.node_id!r}: {STOPPING}")
        node = accept.peer.node_id
        if node in self.blocked:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{node!r} is blocked here")
        old = self._peers.get(node)
        if old is not None and old.inbound is not None:  # check() admitted a newer incarnation
            old.inbound.close(f"replaced by a newer stream from {node!r}"
                              f" (incarnation {accept.peer.incarnation})")
        p = self._peer(node)
        stream = self._new_stream(p, True, context.read, context.write)
        p.inbound = stream
        try:
            await context.write(wire.welcome_frame(self.handshake.me))
        except BaseException:
            stream.close("could not send Welcome", local=False)
            raise
        if stream.closed:  # replaced or stopped while Welcome was being sent
            await context.abort(grpc.StatusCode.UNAVAILABLE, stream.reason)
        p.incarnation = accept.peer.incarnation
        p.in_caps, p.minor = accept.capabilities, accept.peer.protocol_minor
        stream.announced = True
        log.info("peer stream up", extra={"peer": node, "direction": "inbound",
                                          "incarnation": p.incarnation})
        self._notify(self.handler.on_inbound_up, node, accept)
        reason = await stream.run()
        if stream.closed_locally:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {self.node_id!r}: {reason}")

    async def _challenge(self, _requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        """A server nonce for the dialler's proof (its request is not read)."""
        if not self.gate.enter():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"node {self.node_id!r}: too many unauthenticated calls; retry")
        try:
            if self.auth is None:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"node {self.node_id!r} has no peer token, so it cannot"
                                    " prove one: every node of a cluster needs the same"
                                    " grpc.token or grpc.token_file")
            return peer_pb2.ChallengeReply(nonce=self.auth.challenge()).SerializeToString()
        finally:
            self.gate.leave()

    async def _authenticate(self, context: grpc.aio.ServicerContext,
                            release: Callable[[], None]) -> str | None:
        """With a peer token, check the dialler's proof (metadata only: nothing is read) and
        answer with ours; return the proven node id. A failed proof aborts the RPC (`release`
        frees its gate slot before it waits for the dialler to hang up)."""
        if self.auth is None:
            await context.send_initial_metadata(())
            return None
        metadata = context.invocation_metadata() or ()
        checked = self.auth.check(metadata)
        if isinstance(checked, Checked):
            await context.send_initial_metadata(checked.answer)
            return checked.claim.caller
        help_ = ("every node of a cluster needs the same grpc.token or grpc.token_file")
        if checked is not None:
            message = (f"node {self.node_id!r} refused a stream whose proof of the peer token"
                       f" failed: {checked}; {help_}")
        elif refusal_of(metadata):
            message = (f"node {self.node_id!r} refused a stream that presented the peer token"
                       " itself: this is an older mqfed (peer protocol 1.1); nodes of protocol"
                       " 1.2 prove the token without sending it: upgrade this node")
        else:
            message = f"node {self.node_id!r} refused a stream with no peer token: {help_}"
        self._log_loudly(f"in-auth:{message[:60]}", message, remote=context.peer())
        if checked is None:  # an older or tokenless dialler reads a Refuse, not the status
            refuse = peer_pb2.Refuse(code=peer_pb2.Refuse.UNAUTHENTICATED, message=message)
            await context.write(peer_pb2.Frame(refuse=refuse).SerializeToString())
            release()
            await self._await_hangup(context)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        return None  # not reached: abort raises

    async def _await_hangup(self, context: grpc.aio.ServicerContext) -> None:
        """Give a dialler that sent its Hello unasked (it is not read) the time to read our
        Refuse and cancel: aborted under it, its gRPC call now and then never got a status
        (one task left behind per refused dial in that process)."""
        gone = asyncio.Event()
        context.add_done_callback(lambda _context: gone.set())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.hello_timeout):
                await gone.wait()

    async def _read_hello(self, context: grpc.aio.ServicerContext) -> Accept:
        """The dialling side's Hello, checked; aborts the RPC (with a Refuse frame) otherwise."""
        try:
            async with asyncio.timeout(self.hello_timeout):
                item = await context.read()
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no Hello within {self.hello_timeout:g}s: a mqfed peer sends"
                                " Hello first (is the client a mqfed sidecar?)")
        if item is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "stream ended before Hello")
        frame: peer_pb2.Frame | None = item[1]
        if frame is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, wire.NOT_A_FRAME)
        kind = frame.WhichOneof("body")
        if kind != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the first frame must be Hello, not {kind or 'an unknown body'}")
        result = self.handshake.check(wire.hello_from(frame.hello))
        if isinstance(result, Refuse):
            self._log_loudly(f"in:{frame.hello.node_id}", f"refused a peer: {result.message}",
                             peer=frame.hello.node_id, code=result.code.name, remote=context.peer())
            refuse = peer_pb2.Frame(refuse=wire.refuse_message(result))
            await context.write(refuse.SerializeToString())
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, result.message)
        return result
