"""`SubscriptionTable`: this node's client sessions and subscriptions, built from plugin events.

Interest is what peers need to know: the set of `InterestKey` (share group, topic filter) held by
at least one local session, reference-counted by sessions. `apply` and `load_snapshot` return
only the keys whose count went 0→1 (`InterestAdded`) or 1→0 (`InterestRemoved`).
Persistent sessions keep their subscriptions (and so their interest) while offline.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sidecar.local.events import (
    Connect,
    Disconnect,
    Event,
    SessionExpired,
    Snapshot,
    SnapshotClient,
    SnapshotSubscription,
    Subscribe,
    Unsubscribe,
)
from sidecar.local.protocol import SIDECAR_USERNAME
from sidecar.topics import TopicError, parse_filter

__all__ = [
    "InterestAdded",
    "InterestChange",
    "InterestKey",
    "InterestRemoved",
    "SessionInfo",
    "SubscriptionTable",
]


@dataclass(frozen=True, slots=True)
class InterestKey:
    """A filter some local session subscribes to; `group` is its ``$share`` group or None."""

    group: str | None
    filter: str

    @classmethod
    def parse(cls, filter: str) -> InterestKey:
        """The key of a verbatim subscription filter; `TopicError` if it is not valid."""
        group, inner = parse_filter(filter)
        return cls(group, inner)

    @property
    def verbatim(self) -> str:
        """The filter as a client would subscribe to it (``$share/g/f`` or ``f``)."""
        return self.filter if self.group is None else f"$share/{self.group}/{self.filter}"


@dataclass(frozen=True)
class InterestAdded:
    """The first local session subscribed to `key`; `at_ms`: when (the plugin's wall clock, at
    the ACL check before its SUBACK), None if unknown or made by the sidecar itself (a shadow)."""

    key: InterestKey
    at_ms: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class InterestRemoved:
    """The last local session holding `key` dropped it."""

    key: InterestKey


InterestChange = InterestAdded | InterestRemoved


@dataclass(frozen=True)
class SessionInfo:
    """What the table knows about one client session."""

    online: bool
    clean_start: bool = True
    session_expiry: int | None = None
    username: str | None = None
    protocol: str = "mqtt5"

    @property
    def persistent(self) -> bool:
        """Whether the session outlives its connection (expiry > 0; unknown: not clean start)."""
        if self.session_expiry is None:
            return not self.clean_start
        return self.session_expiry > 0


@dataclass
class _Session:
    info: SessionInfo
    subs: dict[str, tuple[InterestKey, int]] = field(default_factory=dict)  # verbatim → key, qos


class SubscriptionTable:
    """Sessions, subscriptions and reference-counted interest of one node (sans-IO).

    `ignored_filters` counts subscribe events whose filter is not valid MQTT (Mosquitto refuses
    those before the plugin sees them; such a filter is never turned into interest).
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._qos_counts: dict[InterestKey, list[int]] = {}  # key -> holders per granted qos
        self.ignored_filters = 0

    # ---- updates -------------------------------------------------------------------------

    def apply(self, event: Event) -> list[InterestChange]:
        """Apply one plugin event; return the interest changes it causes."""
        changes: list[InterestChange] = []
        if isinstance(event, Connect):
            session = self._sessions.get(event.client)
            if session is not None and event.clean_start:
                self._drop_subs(session, changes)
            info = SessionInfo(
                online=True,
                clean_start=event.clean_start,
                session_expiry=event.session_expiry,
                username=event.username,
                protocol=event.protocol,
            )
            if session is None:
                self._sessions[event.client] = _Session(info)
            else:
                session.info = info
        elif isinstance(event, Disconnect):
            session = self._sessions.get(event.client)
            if session is None:
                return changes
            if event.taken_over or event.session_kept:
                # taken over: the session goes on with the next connect, which decides
                expiry = session.info.session_expiry
                if event.session_expiry is not None:
                    expiry = event.session_expiry
                session.info = replace(session.info, online=False, session_expiry=expiry)
            else:
                self._drop_client(event.client, changes)
        elif isinstance(event, Subscribe):
            self._subscribe(event.client, event.filter, event.qos, changes, event.t_ms)
        elif isinstance(event, Unsubscribe):
            session = self._sessions.get(event.client)
            if session is not None and event.filter in session.subs:
                key, qos = session.subs.pop(event.filter)
                self._release(key, qos, changes)
        elif isinstance(event, SessionExpired):
            self._drop_client(event.client, changes)
        return changes

    def load_snapshot(self, snapshot: Snapshot) -> list[InterestChange]:
        """Replace all state with the snapshot's; return the interest difference.

        Removals come first, then additions, each sorted by key.
        """
        before = set(self._qos_counts)
        self._sessions = {}
        self._qos_counts = {}
        for client in snapshot.clients:
            self._sessions[client.client] = _Session(
                SessionInfo(
                    online=client.online,
                    clean_start=client.clean_start,
                    session_expiry=client.session_expiry,
                    username=client.username,
                    protocol=client.protocol,
                )
            )
            for sub in client.subscriptions:
                self._subscribe(client.client, sub.filter, sub.qos, [])
        after = set(self._qos_counts)
        return [InterestRemoved(k) for k in sorted(before - after, key=_sort_key)] + [
            InterestAdded(k) for k in sorted(after - before, key=_sort_key)
        ]

    # ---- queries -------------------------------------------------------------------------

    def interest(self) -> dict[InterestKey, int]:
        """Every key held by a session, with the number of sessions holding it."""
        return {key: sum(counts) for key, counts in self._qos_counts.items()}

    def holds(self, key: InterestKey) -> bool:
        """Whether a local session holds `key` (O(1))."""
        return key in self._qos_counts

    def interest_count(self) -> int:
        """How many keys are held (O(1))."""
        return len(self._qos_counts)

    def max_qos(self, key: InterestKey) -> int:
        """The highest granted QoS among the sessions holding `key`; KeyError if none does."""
        counts = self._qos_counts[key]
        return max(q for q in range(3) if counts[q])

    def subscriptions(self, client: str) -> dict[str, int]:
        """The client's subscriptions, verbatim filter → granted QoS (empty if unknown)."""
        session = self._sessions.get(client)
        return {} if session is None else {f: qos for f, (_, qos) in session.subs.items()}

    def sessions(self) -> dict[str, SessionInfo]:
        """Every known session (online, or offline and kept) by client id."""
        return {client: s.info for client, s in self._sessions.items()}

    def sessions_status(self) -> dict[str, Any]:
        """JSON-able counts for status files: online, offline, subscriptions, interest keys."""
        online = sum(1 for s in self._sessions.values() if s.info.online)
        return {
            "online": online,
            "offline": len(self._sessions) - online,
            "subscriptions": sum(len(s.subs) for s in self._sessions.values()),
            "interest": len(self._qos_counts),
        }

    def to_snapshot(self, epoch: str = "", seq: int = 0) -> Snapshot:
        """The table's state as a `Snapshot` (sessions and subscriptions sorted)."""
        return Snapshot(
            epoch=epoch,
            seq=seq,
            clients=tuple(
                SnapshotClient(
                    client=client,
                    username=s.info.username,
                    protocol=s.info.protocol,
                    clean_start=s.info.clean_start,
                    session_expiry=s.info.session_expiry,
                    online=s.info.online,
                    subscriptions=tuple(
                        SnapshotSubscription(f, qos) for f, (_, qos) in sorted(s.subs.items())
                    ),
                )
                for client, s in sorted(self._sessions.items())
            ),
        )

    def __len__(self) -> int:
        """Number of known sessions."""
        return len(self._sessions)

    # ---- internals -----------------------------------------------------------------------

    def _subscribe(self, client: str, filter: str, qos: int, changes: list[InterestChange],
                   at_ms: int | None = None) -> None:
        session = self._sessions.get(client)
        if session is None:  # no connect seen (should not happen after a snapshot)
            session = self._sessions[client] = _Session(SessionInfo(online=True))
        old = session.subs.get(filter)
        if old is not None:
            key, old_qos = old
            counts = self._qos_counts[key]
            counts[old_qos] -= 1
            counts[qos] += 1
            session.subs[filter] = (key, qos)
            return
        try:
            key = InterestKey.parse(filter)
        except TopicError:
            self.ignored_filters += 1
            return
        session.subs[filter] = (key, qos)
        counts = self._qos_counts.get(key)
        if counts is None:
            counts = self._qos_counts[key] = [0, 0, 0]
            shadow = session.info.username == SIDECAR_USERNAME  # (catch-up is its client's)
            changes.append(InterestAdded(key, None if shadow else at_ms))
        counts[qos] += 1

    def _release(self, key: InterestKey, qos: int, changes: list[InterestChange]) -> None:
        counts = self._qos_counts[key]
        counts[qos] -= 1
        if not any(counts):
            del self._qos_counts[key]
            changes.append(InterestRemoved(key))

    def _drop_subs(self, session: _Session, changes: list[InterestChange]) -> None:
        for key, qos in session.subs.values():
            self._release(key, qos, changes)
        session.subs.clear()

    def _drop_client(self, client: str, changes: list[InterestChange]) -> None:
        session = self._sessions.pop(client, None)
        if session is not None:
            self._drop_subs(session, changes)


def _sort_key(key: InterestKey) -> tuple[str, str]:
    return (key.group or "", key.filter)
