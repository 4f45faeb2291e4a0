"""The membership view (sans-IO core, architecture §4).

Fed the contents of `/<cluster>/nodes/` (an initial `snapshot`, then watch `put`/`delete`)
and the health of peer streams; answers `peers()` (node id -> gRPC address, what the
transport dials) and `up(now)` (what routing may use), and returns `Change` events.

Rules:
- a peer is a member while its key exists; the key goes when its lease expires or it leaves;
- nothing is fed while etcd is unreachable, so the last view is kept (availability first);
- a record whose incarnation is lower than the highest seen for that node id is stale and
  ignored; a higher one means the node restarted;
- a member is down for routing while its stream has failed for longer than
  `stream_down_after` seconds; up again once the stream is ok (and it is still a member).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["BadRecord", "Change", "MembershipView", "NodeRecord"]

log = logging.getLogger("mqfed.membership")

ChangeKind = Literal["joined", "left", "restarted", "updated", "down", "up", "crashed"]


class BadRecord(ValueError):
    """A node record that cannot be decoded; it is skipped."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a sidecar publishes under `/<cluster>/nodes/<node_id>`.

    `incarnation` must grow across restarts of one node id (e.g. `time.time_ns()`)."""

    node_id: str
    grpc: str
    mqtt: str
    version: str
    incarnation: int
    started_at: float
    leaving: bool = False  # set just before a graceful leave deletes the key
    admin: str = ""  # host:port of the node's admin API ("" from nodes older than issue 6)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | str) -> NodeRecord:
        """Parse a record; unknown keys are ignored, anything invalid raises `BadRecord`."""
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRecord(f"node record is not JSON ({exc}); delete the key or fix "
                            "the writer") from None
        if not isinstance(obj, dict):
            raise BadRecord("node record must be a JSON object")
        try:
            rec = cls(node_id=obj["node_id"], grpc=obj["grpc"], mqtt=obj["mqtt"],
                      version=obj["version"], incarnation=obj["incarnation"],
                      started_at=obj["started_at"], leaving=obj.get("leaving", False) is True,
                      admin=obj.get("admin", ""))
        except KeyError as exc:
            raise BadRecord(f"node record lacks field {exc.args[0]!r}") from None
        for name in ("node_id", "grpc", "mqtt", "version", "admin"):
            if not isinstance(getattr(rec, name), str):
                raise BadRecord(f"node record field {name!r} must be a string")
        if not rec.node_id or not rec.grpc:
            raise BadRecord("node record fields 'node_id' and 'grpc' must not be empty")
        if not isinstance(rec.incarnation, int) or isinstance(rec.incarnation, bool):
            raise BadRecord("node record field 'incarnation' must be an integer")
        if not isinstance(rec.started_at, int | float) or isinstance(rec.started_at, bool):
            raise BadRecord("node record field 'started_at' must be a number")
        return rec


@dataclass(frozen=True, slots=True)
class Change:
    """One membership event; `record` is the new record (the old one for `left`)."""

    kind: ChangeKind
    node_id: str
    record: NodeRecord | None = None


class MembershipView:
    """Current members of one cluster, as seen by node `self_id`."""

    def __init__(self, prefix: str, self_id: str, stream_down_after: float = 5.0) -> None:
        self.prefix = prefix
        self.self_id = self_id
        self.stream_down_after = stream_down_after
        self._members: dict[str, NodeRecord] = {}
        self._highest: dict[str, int] = {}  # highest incarnation seen per id, kept after leave
        self._failing_since: dict[str, float] = {}
        self._down: set[str] = set()

    # -- queries ---------------------------------------------------------------------------
    def members(self) -> dict[str, NodeRecord]:
        """All registered nodes, this one included."""
        return dict(self._members)

    def peers(self) -> dict[str, str]:
        """Registered peers (not this node) -> gRPC address: feed to `PeerTransport.set_peers`."""
        return {n: r.grpc for n, r in self._members.items() if n != self.self_id}

    def up(self, now: float) -> set[str]:
        """Peers routing may use: registered and their stream not failing for too long."""
        return {n for n in self.peers() if not self._stream_down(n, now)}

    # -- etcd contents ---------------------------------------------------------------------
    def node_id_of(self, key: bytes | str) -> str | None:
        """The node id a key under the prefix names, or None for any other key."""
        k = key.decode() if isinstance(key, bytes) else key
        node = k[len(self.prefix):]
        if not k.startswith(self.prefix) or not node or "/" in node:
            return None
        return node

    def put(self, key: bytes | str, value: bytes | str) -> list[Change]:
        """A key was written (watch PUT)."""
        rec = self._parse(key, value)
        return [] if rec is None else self._apply(rec)

    def delete(self, key: bytes | str) -> list[Change]:
        """A key was deleted or its lease expired (watch DELETE) without a graceful leave
        first: `crashed` (the node may come back; keep what it needs meanwhile)."""
        node = self.node_id_of(key)
        old = self._members.pop(node, None) if node is not None else None
        if old is None:
            return []
        self._forget_stream(node)
        return [Change("crashed", node, old)]

    def snapshot(self, items: Iterable[tuple[bytes | str, bytes | str]]) -> list[Change]:
        """The whole prefix, (key, value) pairs (initial get, or after a watch was lost)."""
        seen: set[str] = set()
        changes: list[Change] = []
        for key, value in items:
            rec = self._parse(key, value)
            if rec is None:
                continue
            seen.add(rec.node_id)
            changes += self._apply(rec)
        for node in [n for n in self._members if n not in seen]:  # no leave seen: crashed
            changes.append(Change("crashed", node, self._members.pop(node)))
            self._forget_stream(node)
        return changes

    # -- stream health ---------------------------------------------------------------------
    def peer_stream_failed(self, node: str, now: float) -> None:
        """The stream to/from `node` went down (or a dial failed) at `now`."""
        self._failing_since.setdefault(node, now)

    def peer_stream_ok(self, node: str) -> list[Change]:
        """The stream to `node` is up again."""
        self._failing_since.pop(node, None)
        if node in self._down:
            self._down.discard(node)
            if node in self._members:
                return [Change("up", node, self._members[node])]
        return []

    def tick(self, now: float) -> list[Change]:
        """Call periodically: members whose stream failed for too long become `down`."""
        changes = []
        for node in list(self._failing_since):
            if node in self._members and node not in self._down and self._stream_down(node, now):
                self._down.add(node)
                changes.append(Change("down", node, self._members[node]))
        return changes

    # -- internals -------------------------------------------------------------------------
    def _stream_down(self, node: str, now: float) -> bool:
        since = self._failing_since.get(node)
        return since is not None and now - since >= self.stream_down_after

    def _forget_stream(self, node: str) -> None:
        self._failing_since.pop(node, None)
        self._down.discard(node)

    def _parse(self, key: bytes | str, value: bytes | str) -> NodeRecord | None:
        node = self.node_id_of(key)
        if node is None:
            log.warning("ignoring key outside the nodes prefix", extra={"key": str(key)})
            return None
        try:
            rec = NodeRecord.decode(value)
        except BadRecord as exc:
            log.warning("skipping bad node record", extra={"key": str(key), "error": str(exc)})
            return None
        if rec.node_id != node:
            log.warning("skipping node record filed under another id",
                        extra={"key": str(key), "node_id": rec.node_id})
            return None
        return rec

    def _apply(self, rec: NodeRecord) -> list[Change]:
        node = rec.node_id
        if rec.leaving:  # a graceful leave announces itself before deleting its key
            old = self._members.pop(node, None)
            if old is None:
                return []
            self._forget_stream(node)
            return [Change("left", node, rec)]
        if rec.incarnation < self._highest.get(node, rec.incarnation):
            log.info("ignoring stale node record", extra={
                "peer": node, "incarnation": rec.incarnation, "known": self._highest[node]})
            return []
        self._highest[node] = rec.incarnation
        old = self._members.get(node)
        self._members[node] = rec
        if old is None:
            return [Change("joined", node, rec)]
        if rec.incarnation > old.incarnation:
            self._forget_stream(node)
            return [Change("restarted", node, rec)]
        if rec != old:
            return [Change("updated", node, rec)]
        return []
