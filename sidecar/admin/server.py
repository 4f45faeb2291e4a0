"""The admin gRPC server (adapter): authenticates calls, answers locally or fans out.

A call with `local = false` is answered for the cluster: every target node (see
`Directory.targets`) is asked concurrently with `local = true`, this node answers itself, and
the answers are merged (`fanout.merge`); nodes that did not answer within `fanout_timeout`
are listed in `missing`. `Nodes` answers from this node's view only; `Retained` is answered by
this node alone unless nodes are named (each node holds the whole replicated index).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar._proto import admin_pb2
from sidecar.admin.answers import Answers, node_info
from sidecar.admin.auth import AuthPolicy
from sidecar.admin.client import AdminCallError, AdminClient
from sidecar.admin.directory import Directory, UnknownNode
from sidecar.admin.fanout import merge
from sidecar.admin.trace import TRACE_PROPERTY, TraceRecorder, new_trace_id
from sidecar.admin.wire import METHODS, SERVICE_NAME, Method
from sidecar.grpc_auth import Authenticator, Checked, Gate, refusal_of
from sidecar.peering.tls import PeerTls
from sidecar.topics import TopicError, validate_topic

if TYPE_CHECKING:
    from sidecar.node.facts import NodeView

__all__ = ["AdminServer", "AdminServerError", "AdminUnavailable"]

log = logging.getLogger("mqfed.admin")

FANOUT_TIMEOUT = 3.0
MAX_REQUEST = 1 << 20  # bytes of one admin request (a Query, a Trace with its test payload)
TRACE_WAIT_MS = 1000


class AdminServerError(RuntimeError):
    """The admin server cannot listen; the message says why."""


class AdminUnavailable(RuntimeError):
    """The node cannot answer this query now; the message says why."""


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class AdminServer:
    """Serves the Admin service of one node on `listen`."""

    def __init__(self, node: NodeView, listen: str, policy: AuthPolicy, directory: Directory,
                 answers: Answers, token: str | None,
                 fanout_timeout: float = FANOUT_TIMEOUT, tls: PeerTls | None = None) -> None:
        self.node = node
        self.listen = listen
        self.policy = policy
        self.directory = directory
        self.answers = answers
        self.token = token
        self.fanout_timeout = fanout_timeout
        self.tls = tls  # serve (and call other nodes) over TLS when set
        self._server: grpc.aio.Server | None = None
        self._peer_clients: dict[tuple[str, str], AdminClient] = {}
        # other nodes name our id and advertised admin address in their proofs; `mqfed ctl`
        # names neither (it knows only the address it was given)
        config = node.config
        addresses = frozenset({listen, config.advertised("admin")})
        self.auth = (Authenticator(token, "admin", config.node_id, addresses,
                                   accept_unbound=True) if token else None)
        self.gate = Gate()  # calls not authenticated yet

    @property
    def node_id(self) -> str:
        return self.answers.node_id

    async def start(self) -> None:
        # no BDP probing: its growing window let unauthenticated callers of huge requests (read
        # by nobody) raise our memory by tens of MB; admin requests are small
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_REQUEST),
                                          ("grpc.http2.bdp_probe", 0)])
        # request-streaming handlers: a unary request is read in full before any code of ours
        # runs; these read it only once the caller proved the token (a unary caller cannot
        # tell the difference)
        handlers = {name: grpc.stream_unary_rpc_method_handler(
            self._handler(method), request_deserializer=method.request.FromString,
            response_serializer=method.reply.SerializeToString) for name, method in METHODS.items()}
        handlers["Challenge"] = grpc.stream_unary_rpc_method_handler(
            self._challenge, request_deserializer=None, response_serializer=None)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        try:
            port = (server.add_insecure_port(self.listen) if self.tls is None else
                    server.add_secure_port(self.listen, self.tls.server_credentials(
                        require_client_auth=False)))
        except RuntimeError:
            port = 0
        if not port:
            await server.stop(None)
            raise AdminServerError(f"cannot listen for admin calls on {self.listen}: the "
                                   "address is in use or not available on this host; choose "
                                   "another admin.listen")
        await server.start()
        self._server = server
        log.info("admin service listening", extra={"listen": self.listen})

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)
            self._server = None
        for client in self._peer_clients.values():
            await client.close()
        self._peer_clients.clear()

    # ---- dispatch --------------------------------------------------------------------------
    def _handler(self, method: Method) -> Callable[..., Any]:
        impl = getattr(self, "_" + method.name.lower())

        async def handle(_requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._authenticate(context)
            request = await context.read()
            if request is grpc.aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")
            try:
                return await impl(request)
            except _Refused as exc:
                await context.abort(exc.code, str(exc))
            except (UnknownNode, ValueError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except Exception as exc:
                if isinstance(exc, grpc.aio.AbortError):
                    raise
                log.exception("admin call failed: this is a bug", extra={"method": method.name})
                await context.abort(grpc.StatusCode.INTERNAL,
                                    f"node {self.node_id}: {method.name} failed: {exc!r}")

        return handle

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        """Check the caller's proof (metadata only: its request is not read yet) and send
        ours back; abort the call if it is refused."""
        if not self.gate.enter():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"node {self.node_id}: too many unauthenticated calls; retry")
        try:
            metadata = context.invocation_metadata() or ()
            checked = None if self.auth is None else self.auth.check(metadata)
            proof = "ok" if isinstance(checked, Checked) else checked
            refusal = self.policy.refusal(proof, refusal_of(metadata))
            if refusal is not None:
                log.warning("admin call refused", extra={"reason": refusal,
                                                         "remote": context.peer()})
                await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                    f"node {self.node_id}: {refusal}")
            await context.send_initial_metadata(
                checked.answer if isinstance(checked, Checked) else ())
        finally:
            self.gate.leave()

    async def _challenge(self, _requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        """A server nonce for the caller's proof (its request is not read)."""
        if self.auth is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"node {self.node_id} has no admin token, so it cannot prove"
                                " one (admin.dev_mode without admin.token): call it without a"
                                " token")
        assert self.auth is not None
        return admin_pb2.ChallengeReply(nonce=self.auth.challenge()).SerializeToString()

    def _require_routing(self) -> None:
        if self.node.routing is None:
            raise _Refused(grpc.StatusCode.UNAVAILABLE,
                           f"node {self.node_id} is still starting; try again")

    async def _fanout(self, name: str, query: admin_pb2.Query, local: Callable[[], Any]) -> Any:
        method = METHODS[name]
        if query.local:
            return merge(method, self.node_id, [await _answer(local)], {})
        targets = self.directory.targets(query.nodes, time.monotonic())
        sub = admin_pb2.Query()
        sub.CopyFrom(query)
        sub.local = True
        del sub.nodes[:]

        async def ask(node: str, address: str) -> Any:
            if node == self.node_id:
                return await _answer(local)
            if not address:
                raise AdminCallError("its admin address is unknown (static membership, or a "
                                     "node older than the admin API)", "UNKNOWN", True)
            return await self._peer(node, address).call(name, sub, self.fanout_timeout)

        ids = [(e.record.node_id, e.record.admin) for e in targets]
        results = await asyncio.gather(*(ask(n, a) for n, a in ids), return_exceptions=True)
        answers, missing = [], {}
        for (node, address), result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                missing[node] = (address, str(result))
            else:
                answers.append(result)
        return merge(method, self.node_id, answers, missing)

    def _peer(self, node: str, address: str) -> AdminClient:
        """A client to another node's admin endpoint; it proves it is `node` at `address`
        before its answer counts."""
        client = self._peer_clients.get((node, address))
        if client is None:
            client = self._peer_clients[(node, address)] = AdminClient(
                address, self.token, None if self.tls is None else self.tls.channel_credentials(),
                caller=self.node_id, callee=node)
        return client

    async def answer(self, name: str, request: Any) -> Any:
        """Answer `name` as an authenticated admin call would (for callers that checked the
        token themselves: the status page). AdminUnavailable when the node refuses it now
        (still starting); ValueError or UnknownNode for a bad request."""
        if name not in METHODS or name in ("Drain", "Trace"):
            raise ValueError(f"{name} is not a read-only admin query")
        try:
            return await getattr(self, "_" + name.lower())(request)
        except _Refused as exc:
            raise AdminUnavailable(str(exc)) from None

    # ---- methods ---------------------------------------------------------------------------
    async def _drain(self, request: admin_pb2.DrainRequest) -> admin_pb2.DrainReply:
        """Drain, undrain or report on one node: this one, or passed on to the one named."""
        target = request.node_id or self.node_id
        if target != self.node_id:
            entry = self.directory.targets([target], time.monotonic())[0]
            if entry.state != "up":
                raise _Refused(grpc.StatusCode.FAILED_PRECONDITION,
                               f"node {target} is {entry.state}: nothing to drain")
            if not entry.record.admin:
                raise _Refused(grpc.StatusCode.UNAVAILABLE,
                               f"the admin address of node {target} is unknown here; call it "
                               "directly (mqfed ctl --node ITS_ADMIN_ADDRESS)")
            try:
                return await self._peer(target, entry.record.admin).call(
                    "Drain", request, self.fanout_timeout)
            except AdminCallError as exc:
                if exc.code == "UNIMPLEMENTED":
                    raise _Refused(grpc.StatusCode.FAILED_PRECONDITION,
                                   f"node {target} has no drain: it runs an older version "
                                   "(before peer protocol 1.3); stop it gracefully instead, "
                                   "see docs/operations.md, \"Upgrading from a version "
                                   "without drain\"") from None
                raise _Refused(grpc.StatusCode.UNAVAILABLE if exc.unreachable
                               else grpc.StatusCode.FAILED_PRECONDITION,
                               f"node {target}: {exc}") from None
        drainer = self.node.drainer
        if drainer is None:
            raise _Refused(grpc.StatusCode.UNAVAILABLE,
                           f"node {self.node_id} is still starting; try again")
        if self.node.stopping:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION,
                           f"node {self.node_id} is stopping")
        if request.undrain:
            progress = drainer.stop()
        elif request.status_only:
            progress = drainer.progress()
        else:
            progress = drainer.start()
        return admin_pb2.DrainReply(answered_by=self.node_id, progress=admin_pb2.DrainProgress(
            node_id=self.node_id, **progress.as_dict()))

    async def _status(self, query: admin_pb2.Query) -> admin_pb2.StatusReply:
        reply = await self._fanout(
            "Status", query, lambda: admin_pb2.StatusReply(statuses=[self.answers.status()]))
        reply.cluster = self.node.config.cluster
        answered = {s.node_id for s in reply.statuses}
        for entry in self.directory.entries():
            info = node_info(entry, self.node_id)
            info.answered = info.node_id in answered
            reply.nodes.append(info)
        return reply

    async def _nodes(self, query: admin_pb2.Query) -> admin_pb2.NodesReply:
        return admin_pb2.NodesReply(answered_by=self.node_id, nodes=[
            node_info(e, self.node_id) for e in self.directory.entries()])

    async def _routes(self, query: admin_pb2.Query) -> admin_pb2.RoutesReply:
        self._require_routing()
        if query.topic:
            try:
                validate_topic(query.topic)
            except TopicError as exc:
                raise ValueError(f"topic {query.topic!r}: {exc}") from None
        return await self._fanout(
            "Routes", query, lambda: admin_pb2.RoutesReply(routes=self.answers.routes(query)))

    async def _subscriptions(self, query: admin_pb2.Query) -> admin_pb2.SubscriptionsReply:
        return await self._fanout("Subscriptions", query, lambda: admin_pb2.SubscriptionsReply(
            subscriptions=self.answers.subscriptions(query)))

    async def _clients(self, query: admin_pb2.Query) -> admin_pb2.ClientsReply:
        return await self._fanout("Clients", query, lambda: admin_pb2.ClientsReply(
            clients=self.answers.clients(query)))

    async def _sessions(self, query: admin_pb2.Query) -> admin_pb2.SessionsReply:
        async def local() -> admin_pb2.SessionsReply:
            return admin_pb2.SessionsReply(sessions=await self.answers.sessions(query))
        return await self._fanout("Sessions", query, local)

    async def _retained(self, query: admin_pb2.Query) -> admin_pb2.RetainedReply:
        if not query.nodes:
            query.local = True
        return await self._fanout("Retained", query, lambda: self.answers.retained(query))

    async def _tracehops(self, query: admin_pb2.Query) -> admin_pb2.TraceHopsReply:
        self._require_routing()
        return await self._fanout("TraceHops", query, lambda: admin_pb2.TraceHopsReply(
            hops=[_hop(h) for h in self._tracer().hops(query.trace_id)]))

    async def _trace(self, request: admin_pb2.TraceRequest) -> admin_pb2.TraceReply:
        self._require_routing()
        link = self.node.link
        if link is None:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, f"node {self.node_id} is starting")
        try:
            validate_topic(request.topic)
        except TopicError as exc:
            raise ValueError(f"topic {request.topic!r}: {exc}") from None
        if request.qos > 1:
            raise ValueError("trace messages use QoS 0 or 1")
        trace = new_trace_id()
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [(TRACE_PROPERTY, trace)]
        payload = request.payload or f"mqfed trace {trace}".encode()
        self._tracer().record(trace, "published", time.time() * 1000,
                              detail=f"qos {request.qos}, {len(payload)} bytes")
        link.publish(request.topic, payload, qos=request.qos, properties=props)
        await asyncio.sleep((request.wait_ms or TRACE_WAIT_MS) / 1000)
        hops = await self._tracehops(admin_pb2.Query(trace_id=trace))
        reply = admin_pb2.TraceReply(trace_id=trace, origin=self.node_id, topic=request.topic,
                                     hops=sorted(hops.hops, key=lambda h: h.at_ms))
        reply.missing.extend(hops.missing)
        return reply

    def _tracer(self) -> TraceRecorder:
        assert self.node.routing is not None
        return self.node.routing.tracer


def _hop(h: Any) -> admin_pb2.TraceHop:
    return admin_pb2.TraceHop(trace_id=h.trace_id, node_id=h.node_id, event=h.event,
                              at_ms=h.at_ms, peer=h.peer, detail=h.detail)


async def _answer(local: Callable[[], Any]) -> Any:
    """This node's part: `local()`, awaited when it is a coroutine."""
    result = local()
    return await result if inspect.isawaitable(result) else result
