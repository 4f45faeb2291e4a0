"""`Replicator`: local writes, remote writes and the local Mosquitto kept in step (sans-IO).

The index is the truth; the local Mosquitto must hold the index's value for every topic.
Mosquitto changes its retained store from two sources the sidecar sees in no common order:
clients (reported by plugin events) and the sidecar's own re-injections (`.fwd`). So per topic
the replicator serialises them:

- a local write (plugin event) is not trusted blindly: once every re-injection on that topic is
  confirmed stored, Mosquitto's current value is read back (`ReadBack`). If Mosquitto still holds
  the write (or a later local one), it is accepted: stamped with the HLC, merged, sent to every
  peer (`Broadcast`), and its Message Expiry is taken from the read. If Mosquitto holds the value
  the sidecar re-injected, that re-injection came after the write: the write was overwritten
  and is dropped;
- while a topic has local writes waiting, remote entries for it are held back, then merged;
- a remote entry that wins is re-injected with retain=1 (`Reinject`), which stores it and
  delivers it once to the node's live subscribers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from sidecar.hlc import ClockDriftError, HybridClock, Timestamp
from sidecar.message import MessageProperties, publish_problem
from sidecar.retained.entry import RetainedEntry
from sidecar.retained.index import RetainedIndex


@dataclass(frozen=True)
class LocalWrite:
    """A client's retained publish on this node (an empty payload deletes)."""

    topic: str
    payload: bytes
    qos: int
    properties: MessageProperties = MessageProperties()
    seen_ms: int = 0  # when the event was processed (set by `on_local`)


@dataclass(frozen=True)
class ReadValue:
    """What the local Mosquitto holds for a topic; `expiry`: remaining seconds or None."""

    payload: bytes
    properties: MessageProperties = MessageProperties()
    expiry: int | None = None


@dataclass(frozen=True)
class ReadBack:
    """Read the local Mosquitto's retained message of these topics; answer with `on_read`."""

    topics: tuple[str, ...]


@dataclass(frozen=True)
class RetryRead:
    """Call `on_retry(topics)` after `delay` seconds."""

    topics: tuple[str, ...]
    delay: float


@dataclass(frozen=True)
class Reinject:
    """Publish `entry` with retain=1 through the forwarding client (a deleted or expired entry
    as an empty payload); call `on_reinjected([token])` once Mosquitto has stored it."""

    entry: RetainedEntry
    token: int


@dataclass(frozen=True)
class Broadcast:
    """Send these locally accepted entries to every peer."""

    entries: tuple[RetainedEntry, ...]


@dataclass(frozen=True)
class Persist:
    """Write these entries to the durable index."""

    entries: tuple[RetainedEntry, ...]


Action = ReadBack | RetryRead | Reinject | Broadcast | Persist

QOS2_WAIT_MS = 10_000
"""How long later reads (0.1 s .. 1.6 s apart) look for a QoS 2 write not stored yet (its
PUBREL is late) before it counts as overwritten."""


def _bare(props: MessageProperties) -> MessageProperties:
    return replace(props, message_expiry=None) if props.message_expiry is not None else props


MAX_HLC = (1 << 63) - 1
"""The highest HLC a node stores (SQLite integers are signed 64-bit; wall_ms << 16 reaches it
in the year 4400)."""


def invalid(entry: RetainedEntry) -> str | None:
    """Why an entry from a peer is refused (no node makes one like it); None if it is not."""
    if not 0 < entry.hlc <= MAX_HLC:
        return f"HLC {entry.hlc} outside 1..{MAX_HLC}"
    if not entry.origin:
        return "no origin node"
    return publish_problem(entry.topic, entry.qos, entry.properties)


@dataclass
class _Topic:
    """Per-topic serialisation state."""

    writes: list[LocalWrite] = field(default_factory=list)
    reading: int = 0  # how many of `writes` the read in flight covers
    unconfirmed: set[int] = field(default_factory=set)
    held: list[tuple[RetainedEntry, bool]] = field(default_factory=list)
    queue: list[RetainedEntry] = field(default_factory=list)  # re-injections in turn
    retries: int = 0  # reads that did not find a QoS 2 write stored yet

    def idle(self) -> bool:
        return not (self.writes or self.reading or self.unconfirmed or self.held or self.queue)


class Replicator:
    """See the module docstring. Every method returns the actions to carry out, in order."""

    def __init__(self, node_id: str, clock: HybridClock, index: RetainedIndex) -> None:
        self.node_id = node_id
        self.clock = clock
        self.index = index
        self._topics: dict[str, _Topic] = {}
        self._token = 0
        self.counters = {"local_accepted": 0, "local_overwritten": 0, "remote_applied": 0,
                         "remote_stale": 0, "reinjected": 0, "clock_drift": 0,
                         "remote_invalid": 0}
        if index.max_hlc():
            self._observe(index.max_hlc(), 0)

    # ---- local writes --------------------------------------------------------------------
    def on_local(self, writes: Sequence[LocalWrite], wall_ms: int) -> list[Action]:
        ready: list[str] = []
        for write in writes:
            state = self._topics.setdefault(write.topic, _Topic())
            state.writes.append(replace(write, seen_ms=wall_ms))
            if self._can_read(state) and write.topic not in ready:
                ready.append(write.topic)
        return self._read(ready)

    def on_read(self, topics: Sequence[str], results: Mapping[str, ReadValue],
                wall_ms: int) -> list[Action]:
        """Mosquitto's values for `topics` (read together; a topic missing from `results`
        has no retained message).

        The write Mosquitto holds was stored last: it is accepted last (the newest HLC), the
        other QoS 0/1 writes before it in event order. A QoS 2 write Mosquitto does not hold
        may not be stored yet (Mosquitto stores it at the client's PUBREL, after the event): it
        waits for a later read (`RetryRead`), and is accepted when a read finds it. If
        Mosquitto holds what the sidecar re-injected, the QoS 0/1 writes were overwritten."""
        actions: list[Action] = []
        accepted: list[RetainedEntry] = []
        ready: list[str] = []
        retry: list[str] = []
        for topic in topics:
            state = self._topics.get(topic)
            if state is None or not state.reading:
                continue
            covered, state.writes = state.writes[:state.reading], state.writes[state.reading:]
            state.reading = 0
            value = results.get(topic)
            current = self.index.get(topic)
            match = max((i for i, w in enumerate(covered) if self._matches(w, value)),
                        default=None)
            others = [w for i, w in enumerate(covered) if i != match]
            waiting = [w for w in others if w.qos == 2 and wall_ms - w.seen_ms < QOS2_WAIT_MS]
            self.counters["local_overwritten"] += sum(1 for w in others if w.qos == 2) - len(
                waiting)
            if match is None and self._holds(current, value, wall_ms):
                resolved: list[LocalWrite] = []
                self.counters["local_overwritten"] += sum(1 for w in others if w.qos < 2)
            else:
                resolved = [w for w in others if w.qos < 2]
                if match is not None:
                    resolved.append(covered[match])
            for i, write in enumerate(resolved):
                expiry = value.expiry if value is not None and i == len(resolved) - 1 \
                    and match is not None else None
                entry = self._accept(write, expiry, wall_ms)
                if self.index.merge(entry):
                    accepted.append(entry)
                    self.counters["local_accepted"] += 1
                elif current is not None:  # a peer's clock is far ahead: its value stays
                    actions += self._reinject(self.index.get(topic) or current)
            if waiting:
                state.retries += 1
                state.writes[:0] = waiting
                retry.append(topic)
            else:
                state.retries = 0
            held, state.held = state.held, []
            for entry, live in held:
                actions += self._apply_remote(entry, live, wall_ms)
            if self._can_read(state) and topic not in retry:
                ready.append(topic)
            self._forget_if_idle(topic)
        if accepted:
            actions[:0] = [Persist(tuple(accepted)), Broadcast(tuple(accepted))]
        for topic in retry:
            delay = 0.05 * 2 ** min(self._topics[topic].retries, 5)
            actions.append(RetryRead((topic,), delay))
        return actions + self._read(ready)

    def on_retry(self, topics: Sequence[str]) -> list[Action]:
        """A `RetryRead`'s delay passed."""
        return self._read([t for t in topics if (s := self._topics.get(t)) is not None
                           and self._can_read(s)])

    def on_read_failed(self, topics: Sequence[str]) -> list[Action]:
        """The read of `topics` did not complete (link down): read them again."""
        ready = []
        for topic in topics:
            state = self._topics.get(topic)
            if state is not None and state.reading:
                state.reading = 0
                if self._can_read(state):
                    ready.append(topic)
        return self._read(ready)

    # ---- remote writes -------------------------------------------------------------------
    def on_remote(self, entries: Sequence[RetainedEntry], wall_ms: int,
                  live: bool = True) -> list[Action]:
        """Entries from a peer: `live` replication (always delivered to live subscribers when
        they win) or anti-entropy (re-injected only if Mosquitto's content changes). Entries
        no node makes (`invalid`) are dropped and counted (`remote_invalid`)."""
        actions: list[Action] = []
        stored: list[RetainedEntry] = []
        for entry in entries:
            if invalid(entry) is not None:
                self.counters["remote_invalid"] += 1
                continue
            self._observe(entry.hlc, wall_ms)
            state = self._topics.get(entry.topic)
            if state is not None and (state.writes or state.reading):
                state.held.append((entry, live))
                continue
            for action in self._apply_remote(entry, live, wall_ms):
                if isinstance(action, Persist):
                    stored += action.entries
                else:
                    actions.append(action)
        if stored:
            actions.insert(0, Persist(tuple(stored)))
        return actions

    def _apply_remote(self, entry: RetainedEntry, live: bool, wall_ms: int) -> list[Action]:
        previous = self.index.get(entry.topic)
        if not self.index.merge(entry):
            self.counters["remote_stale"] += 1
            return []
        self.counters["remote_applied"] += 1
        actions: list[Action] = [Persist((entry,))]
        was_live = previous is not None and previous.live(wall_ms)
        if entry.live(wall_ms) or was_live or (live and entry.deleted):
            actions += self._reinject(entry)
        return actions

    # ---- the local Mosquitto -------------------------------------------------------------
    def on_reinjected(self, tokens: Sequence[int]) -> list[Action]:
        """Mosquitto stored these re-injections."""
        wanted = set(tokens)
        actions: list[Action] = []
        ready: list[str] = []
        for topic, state in list(self._topics.items()):
            if state.unconfirmed & wanted:
                state.unconfirmed -= wanted
                if not state.unconfirmed and state.queue:
                    actions += self._reinject(state.queue.pop(0))
                if self._can_read(state):
                    ready.append(topic)
                self._forget_if_idle(topic)
        return actions + self._read(ready)

    def on_broker_reset(self, wall_ms: int) -> list[Action]:
        """The local Mosquitto lost its retained store (restarted): put back every live entry."""
        for state in self._topics.values():
            state.unconfirmed.clear()
        for state in self._topics.values():
            state.queue.clear()
        actions: list[Action] = [a for e in self.index if e.live(wall_ms)
                                 for a in self._reinject(e)]
        for topic in [t for t, s in self._topics.items() if s.idle()]:
            del self._topics[topic]
        ready = [t for t, s in self._topics.items() if self._can_read(s)]
        return actions + self._read(ready)

    def busy_topics(self) -> int:
        return len(self._topics)

    def busy(self, topic: str) -> bool:
        """Whether a write, read or re-injection of `topic` is in flight."""
        return topic in self._topics

    # ---- helpers -------------------------------------------------------------------------
    def _observe(self, hlc: int, wall_ms: int) -> None:
        try:
            self.clock.update(Timestamp.unpack(hlc), wall_ms)
        except ClockDriftError:
            self.counters["clock_drift"] += 1

    def _accept(self, write: LocalWrite, expiry: int | None, wall_ms: int) -> RetainedEntry:
        hlc = self.clock.now(wall_ms).pack()
        deleted = not write.payload
        return RetainedEntry(
            write.topic, hlc, self.node_id, write.payload, write.qos, _bare(write.properties),
            deleted=deleted,
            expires_at_ms=None if deleted or expiry is None else wall_ms + expiry * 1000)

    def _reinject(self, entry: RetainedEntry) -> list[Action]:
        """One re-injection per topic at a time: Mosquitto stores a QoS 2 publish at its
        PUBREL, so a later publish could otherwise be stored first."""
        state = self._topics.setdefault(entry.topic, _Topic())
        if state.unconfirmed:
            state.queue.append(entry)
            return []
        self._token += 1
        state.unconfirmed.add(self._token)
        self.counters["reinjected"] += 1
        return [Reinject(entry, self._token)]

    @staticmethod
    def _can_read(state: _Topic) -> bool:
        return bool(state.writes) and not state.reading and not state.unconfirmed

    def _read(self, topics: list[str]) -> list[Action]:
        for topic in topics:
            state = self._topics[topic]
            state.reading = len(state.writes)
        return [ReadBack(tuple(topics))] if topics else []

    def _forget_if_idle(self, topic: str) -> None:
        state = self._topics.get(topic)
        if state is not None and state.idle():
            del self._topics[topic]

    @staticmethod
    def _matches(write: LocalWrite, value: ReadValue | None) -> bool:
        if not write.payload:
            return value is None
        return (value is not None and value.payload == write.payload
                and _bare(value.properties) == _bare(write.properties))

    @staticmethod
    def _holds(entry: RetainedEntry | None, value: ReadValue | None, wall_ms: int) -> bool:
        """Whether Mosquitto's value is the index's entry (i.e. our re-injection)."""
        if entry is None or not entry.live(wall_ms):
            return value is None
        return (value is not None and value.payload == entry.payload
                and _bare(value.properties) == entry.properties)
