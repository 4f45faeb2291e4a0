"""Membership on etcd (adapter, architecture §4, issue 4): I/O only, rules live in `view`.

`EtcdMembership` registers `/<cluster>/nodes/<node_id>` under a lease it keeps alive itself,
watches the prefix into a `MembershipView` and reports `peers()` changes to `on_change`.
etcd unreachable: the last view is kept, every loop retries with backoff, the state change is
logged once; when etcd is back the node re-registers (if its lease was lost) and resyncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import time
from collections.abc import Callable, Sequence

import aetcd

from sidecar.membership.etcd_access import EtcdAccess, EtcdClient
from sidecar.membership.view import BadRecord, Change, MembershipView, NodeRecord

__all__ = ["DuplicateNodeId", "EtcdMembership", "EtcdUnavailable", "MembershipError",
           "grpc_target"]

log = logging.getLogger("mqfed.membership")

# Reconnect fast after etcd returns (gRPC's default backoff grows to 120 s) and notice a
# silent etcd on the watch stream (etcd 3.4 refuses pings more often than every 5 s).
_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.min_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 2000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}


class MembershipError(RuntimeError):
    """Membership cannot start."""


class DuplicateNodeId(MembershipError):
    """A live node already holds this node id."""


class EtcdUnavailable(MembershipError):
    """No etcd endpoint answered in time."""


def grpc_target(endpoints: Sequence[str]) -> tuple[str, int]:
    """(host, port) for `aetcd.Client` (it connects to f"{host}:{port}"). Several endpoints
    become one `ipv4:h1:p1,h2:p2,...` target that gRPC fails over across."""
    parsed: list[tuple[str, int]] = []
    for ep in endpoints:
        rest = ep.split("://", 1)[-1].rstrip("/")
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise MembershipError(f"etcd endpoint {ep!r} is not host:port (e.g. 127.0.0.1:2379)")
        parsed.append((host, int(port)))
    if not parsed:
        raise MembershipError("no etcd endpoint given; pass at least one host:port")
    if len(parsed) == 1:
        return parsed[0]
    for host, _ in parsed:
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise MembershipError(
                f"several etcd endpoints must be IPv4 addresses (got {host!r}); give IPs, "
                "or a single DNS name") from None
    *head, (last_host, last_port) = parsed
    return "ipv4:" + ",".join(f"{h}:{p}" for h, p in head) + "," + last_host, last_port


_REFUSALS = ("authentication failed", "permission denied", "user name is empty",
             "invalid auth token", "user name not found")


def _refused(exc: Exception) -> bool:
    """etcd refused our credentials or permissions (retrying will not help)."""
    return isinstance(exc, aetcd.exceptions.UnauthenticatedError) or any(
        r in str(exc).lower() for r in _REFUSALS)


class _Backoff:
    def __init__(self, first: float = 0.2, cap: float = 2.0) -> None:
        self.first, self.cap, self.delay = first, cap, first

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.first


class EtcdMembership:
    """One node's registration and membership view in etcd.

    `on_change(peers)` gets node id -> gRPC address (this node excluded) whenever it
    changes; `on_events(changes)` (optional) gets joined/left/restarted/updated events.
    Both are called on the event loop and must not block."""

    def __init__(self, endpoints: Sequence[str], cluster: str, record: NodeRecord,
                 lease_ttl: int = 5, *,
                 on_change: Callable[[dict[str, str]], None] | None = None,
                 on_events: Callable[[list[Change]], None] | None = None,
                 op_timeout: float = 2.0, start_timeout: float = 10.0,
                 stream_down_after: float = 5.0, supersedes: int | None = None,
                 access: EtcdAccess | None = None) -> None:
        if lease_ttl < 1:
            raise MembershipError("lease_ttl must be at least 1 second")
        self.endpoints = list(endpoints)
        self.access = access or EtcdAccess()  # TLS and credentials (none by default)
        self.cluster = cluster
        self.record = record
        # the incarnation this node ran with before (from its own run dir): its unexpired key
        # after a crash is ours to replace, not a duplicate
        self.supersedes = supersedes
        self.lease_ttl = int(lease_ttl)
        self.on_change = on_change
        self.on_events = on_events
        self.op_timeout = op_timeout
        self.start_timeout = start_timeout
        self.prefix = f"/{cluster}/nodes/"
        self.key = (self.prefix + record.node_id).encode()
        self.view = MembershipView(self.prefix, record.node_id, stream_down_after)
        self._host, self._port = grpc_target(self.endpoints)
        self._client: aetcd.Client | None = None
        self._lease_id: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._kick = asyncio.Event()
        self._reachable: bool | None = None
        self._conflict_logged = False
        self._last_peers: dict[str, str] | None = None

    # -- public ----------------------------------------------------------------------------
    def peers(self) -> dict[str, str]:
        return self.view.peers()

    @property
    def reachable(self) -> bool:
        """Whether etcd answered the last keep-alive or watch (False before the first)."""
        return bool(self._reachable)

    @property
    def registered(self) -> bool:
        """True while this node believes its key is in etcd under a live lease."""
        return self._lease_id is not None

    async def start(self) -> None:
        """Register (refusing a live duplicate id), load the view, start keep-alive and watch.

        Raises `DuplicateNodeId`, `EtcdUnavailable` if no endpoint answers within
        `start_timeout`, `MembershipError` if etcd refuses the credentials."""
        self._client = EtcdClient(self._host, self._port, self.access,
                                  timeout=self.op_timeout, options=_CHANNEL_OPTIONS)
        deadline = time.monotonic() + self.start_timeout
        backoff = _Backoff()
        while True:
            try:
                await self._register(starting=True)
                revision = await self._resync()
                break
            except DuplicateNodeId:
                await self._close_client()
                raise
            except Exception as exc:
                if not _refused(exc):  # any other etcd/gRPC failure: retry
                    if time.monotonic() >= deadline:
                        await self._close_client()
                        raise EtcdUnavailable(
                            f"etcd at {', '.join(self.endpoints)} did not answer within "
                            f"{self.start_timeout:.0f}s ({exc}); start etcd or fix the "
                            "endpoints") from exc
                    await asyncio.sleep(backoff.next())
                    continue
                await self._close_client()  # wrong credentials or no permission: final
                raise MembershipError(
                    f"etcd at {', '.join(self.endpoints)} refused this node"
                    f" ({self.access.describe()}): {exc}; check membership.etcd_user and its"
                    f" password, and that the user may read and write {self.prefix!r}") from None
        self._set_reachable(True)
        log.info("membership started", extra={
            "cluster": self.cluster, "node_id": self.record.node_id,
            "etcd": self.access.describe(),
            "incarnation": self.record.incarnation, "peers": len(self.view.peers())})
        self._tasks = [asyncio.create_task(self._keepalive_loop(), name="etcd-keepalive"),
                       asyncio.create_task(self._watch_loop(revision), name="etcd-watch")]

    async def stop(self, graceful: bool = True) -> None:
        """Leave: delete our key first (peers see it at once), then revoke the lease.
        `graceful=False` only stops the loops, like a crash: the key goes at lease expiry."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if graceful and self._client is not None:
            await self._leave()
        await self._close_client()

    # -- registration ----------------------------------------------------------------------
    async def _register(self, starting: bool) -> None:
        """Grant a lease and create our key if absent (or still ours, same incarnation)."""
        client = self._require_client()
        value = self.record.encode()
        lease = await client.lease(self.lease_ttl)
        tx = client.transactions
        ok, responses = await client.transaction(
            compare=[tx.version(self.key) == 0],
            success=[tx.put(self.key, value, lease.id)],
            failure=[tx.get(self.key)])
        if not ok:
            held = responses[0][0][0] if responses and responses[0] else b""
            mine = False
            try:
                held_incarnation = NodeRecord.decode(held).incarnation
                mine = held_incarnation == self.record.incarnation or (
                    starting and self.supersedes is not None
                    and held_incarnation == self.supersedes)
            except BadRecord:
                pass
            if not mine:
                await client.revoke_lease(lease.id)
                other = held.decode(errors="replace")
                msg = (f"node id {self.record.node_id!r} is already registered in cluster "
                       f"{self.cluster!r} by a live node ({other}); stop that node or give "
                       f"this one another node id (a crashed node's key expires within "
                       f"{self.lease_ttl}s)")
                if starting:
                    raise DuplicateNodeId(msg)
                if not self._conflict_logged:
                    log.error("cannot re-register: " + msg)
                    self._conflict_logged = True
                return
            await client.put(self.key, value, lease=lease.id)
        old, self._lease_id = self._lease_id, lease.id
        self._conflict_logged = False
        if old is not None and old != lease.id:
            with contextlib.suppress(Exception):
                await client.revoke_lease(old)
        if not starting:
            log.info("re-registered in etcd", extra={"node_id": self.record.node_id})

    async def _leave(self) -> None:
        client = self._require_client()
        tx = client.transactions
        try:
            leaving = dataclasses.replace(self.record, leaving=True).encode()
            if self._lease_id is not None:  # announce the leave, so peers drop us at once
                await client.transaction(compare=[tx.value(self.key) == self.record.encode()],
                                         success=[tx.put(self.key, leaving, self._lease_id)],
                                         failure=[])
            await client.transaction(compare=[tx.value(self.key) == leaving],
                                     success=[tx.delete(self.key)], failure=[])
            await client.transaction(compare=[tx.value(self.key) == self.record.encode()],
                                     success=[tx.delete(self.key)], failure=[])
            if self._lease_id is not None:
                await client.revoke_lease(self._lease_id)
            log.info("left the cluster", extra={"node_id": self.record.node_id})
        except Exception as exc:
            log.warning("could not remove our key from etcd; peers drop us at lease expiry",
                        extra={"error": str(exc), "ttl": self.lease_ttl})
        self._lease_id = None

    async def _keepalive_loop(self) -> None:
        interval = max(self.lease_ttl / 3, 0.2)
        backoff = _Backoff(cap=max(interval, 0.2))
        delay = interval
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), delay)
            kicked = self._kick.is_set()
            self._kick.clear()
            client = self._require_client()
            try:
                alive = False
                if self._lease_id is not None and not kicked:
                    reply = await client.refresh_lease(self._lease_id)
                    alive = reply is not None and reply.TTL > 0
                if not alive:
                    if not kicked:
                        log.warning("lease lost; re-registering",
                                    extra={"node_id": self.record.node_id})
                    await self._register(starting=False)
                self._set_reachable(True)
                backoff.reset()
                delay = interval
            except Exception as exc:  # etcd/gRPC failure: keep the view, retry
                self._set_reachable(False, exc)
                await self._renew_session(exc)
                delay = backoff.next()

    # -- watch -----------------------------------------------------------------------------
    async def _resync(self) -> int:
        """Load the whole prefix into the view; returns the revision to watch from."""
        client = self._require_client()
        result = await client.get_prefix(self.prefix.encode())
        self._publish(self.view.snapshot((kv.key, kv.value) for kv in result))
        return result.header.revision + 1

    async def _watch_loop(self, revision: int) -> None:
        backoff = _Backoff()
        need_resync = False
        while True:
            client = self._require_client()
            try:
                if need_resync:
                    revision = await self._resync()
                    need_resync = False
                watch = await client.watch_prefix(self.prefix.encode(), start_revision=revision)
                self._set_reachable(True)
                backoff.reset()
                async for event in watch:
                    revision = event.kv.mod_revision + 1
                    if event.kind == "PUT":
                        changes = self.view.put(event.kv.key, event.kv.value)
                    else:
                        changes = self.view.delete(event.kv.key)
                        if event.kv.key == self.key and self._lease_id is not None:
                            self._kick.set()  # our key vanished while we live: re-register
                    self._publish(changes)
                raise ConnectionError("etcd watch stream ended")
            except Exception as exc:  # keep the view, resync when etcd is back
                self._set_reachable(False, exc)
                await self._renew_session(exc)
                need_resync = True
                await asyncio.sleep(backoff.next())

    # -- helpers ---------------------------------------------------------------------------
    def _publish(self, changes: list[Change]) -> None:
        for c in changes:
            log.info(f"member {c.kind}", extra={"peer": c.node_id, "incarnation":
                                                c.record.incarnation if c.record else None})
        if changes and self.on_events is not None:
            self.on_events(changes)
        peers = self.view.peers()
        if peers != self._last_peers:
            self._last_peers = peers
            if self.on_change is not None:
                self.on_change(dict(peers))

    def _set_reachable(self, reachable: bool, exc: Exception | None = None) -> None:
        if reachable == self._reachable:
            return
        previous, self._reachable = self._reachable, reachable
        if not reachable:
            log.warning("etcd unreachable; keeping the last membership view and retrying",
                        extra={"endpoints": ",".join(self.endpoints), "error": str(exc)})
        elif previous is not None:
            log.info("etcd reachable again", extra={"endpoints": ",".join(self.endpoints)})

    async def _renew_session(self, exc: Exception) -> None:
        """etcd forgot our authentication token (it restarted, or the token expired): drop
        the connection, so that the next call connects and authenticates again."""
        if self.access.user and isinstance(exc, aetcd.exceptions.UnauthenticatedError):
            client = self._require_client()
            with contextlib.suppress(Exception):
                await client.close()

    def _require_client(self) -> aetcd.Client:
        if self._client is None:
            raise MembershipError("membership is not started; call start() first")
        return self._client

    async def _close_client(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None
