"""`Claims`: at most one node at a time admits a client whose session another node owns
(sans-IO core; docs/architecture.md §5, "Claims").

A connect that would resume a session owned elsewhere is closed (the deny list) while the
session is made here; meanwhile this node *claims* the client from its peers. A peer grants a
claim unless a claim for that client is in force there that orders before it (its own not yet
granted, or another node's it granted), or its own claim was already granted; it then keeps
the client out (its deny list) until the claimant's record of the client's connect comes, the
claimant withdraws the claim, or the claim lapses. The claimant admits the client once every
peer it asked granted, and only until its claim lapses. So no two nodes admit one client
within the milliseconds a record takes to travel (each would take the client's connect for
its own), and a node that admits it knows every connect before: a peer sends the records it
has before its answer.

Claims order by (HLC, node); a node observes the HLC of every claim it sees, so a claim made
after granting another orders after it. A client that tries a node its claim keeps it out of
(or the claimant, before it may admit), other than its owner, *renews* the claim on every
node: a client retrying through a round-robin front comes back to the claimant however long
its cycle of retries, as long as each retry elsewhere comes within `CLAIM_MS` of the one
before. A lapsed claim frees the client again: the next node it tries admits it (its owner)
or claims it anew; a client that tries only its owner (a direct connection) gets in there
once the claim lapsed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

CLAIM_MS = 10_000
"""A claimant admits its client this long after the client last tried a node the claim kept
it out of, at most, and gives a claim up when not every answer came this long after it
claimed. Long enough for paho's default back-off (1, 2, 4 s) through a round-robin front over
3 nodes: its 4th attempt, 7 s after the first, is the one that comes back to the claimant."""
CLAIM_MAX_MS = 30_000
"""However often it is renewed, a claim lapses this long after it was made (a client that
keeps trying only nodes it keeps the client out of, e.g. its owner, is admitted then)."""
CLAIM_MARGIN_MS = 500
"""A peer that granted a claim keeps the client out this much longer than the claim lasts
(the claimant's withdrawal or record normally ends it first)."""


@dataclass(slots=True)
class OwnClaim:
    """This node's claim of one client."""

    hlc: int
    started_ms: int
    asked: frozenset[str]
    waiting: set[str]  # peers whose answers have not come
    renewed_ms: int = 0  # the client's last try anywhere the claim kept it out

    @property
    def granted(self) -> bool:
        return not self.waiting


@dataclass
class Claims:
    """This node's claims, and the other nodes' claims it granted."""

    node_id: str
    own: dict[str, OwnClaim] = field(default_factory=dict)
    # client -> claimant -> (claim HLC, until when the client is kept out here, when the
    # claim came: renewals keep it out until CLAIM_MAX_MS after that; ms)
    others: dict[str, dict[str, tuple[int, int, int]]] = field(default_factory=dict)

    def start(self, client: str, hlc: int, peers: Iterable[str], now_ms: int
              ) -> OwnClaim | None:
        """Claim `client` from `peers` (granted at once when there are none); None when a
        claim of it is in force here already (this node's, or another's it granted)."""
        if client in self.own or self.keeps_out(client, now_ms):
            return None
        asked = frozenset(peers)
        claim = OwnClaim(hlc, now_ms, asked, set(asked), now_ms)
        self.own[client] = claim
        return claim

    def answer(self, client: str, claimant: str, hlc: int, lasts_ms: int, now_ms: int
               ) -> tuple[bool, OwnClaim | None]:
        """A peer claims `client`: whether this node grants it, and this node's own claim it
        beat (dropped here; its other peers must be told)."""
        key = (hlc, claimant)
        mine = self.own.get(client)
        if mine is not None and (mine.granted or (mine.hlc, self.node_id) < key):
            return False, None
        if any((h, c) < key for c, (h, until, _) in self.others.get(client, {}).items()
               if c != claimant and until >= now_ms):
            return False, None
        self.others.setdefault(client, {})[claimant] = (
            hlc, now_ms + min(lasts_ms, CLAIM_MS) + CLAIM_MARGIN_MS, now_ms)
        return True, self.own.pop(client, None)

    def answered(self, client: str, peer: str, hlc: int, granted: bool) -> str:
        """A peer's answer to this node's claim: "granted" (every answer is in now),
        "refused" (the claim is dropped here: its other peers must be told), or ""."""
        mine = self.own.get(client)
        if mine is None or mine.hlc != hlc or peer not in mine.waiting:
            return ""
        if not granted:
            del self.own[client]
            return "refused"
        mine.waiting.discard(peer)
        return "granted" if mine.granted else ""

    def withdrawn(self, client: str, claimant: str, hlc: int) -> None:
        """`claimant` gave its claim of `client` up (or connected the client: its record)."""
        held = self.others.get(client, {})
        if claimant in held and held[claimant][0] <= hlc:
            self._end(client, [claimant])

    def in_force(self, client: str, now_ms: int) -> list[tuple[str, int]]:
        """The claims of `client` that keep it out here: (claimant, HLC); this node's own
        among them while it may not admit yet."""
        out = [(c, h) for c, (h, until, _) in self.others.get(client, {}).items()
               if until >= now_ms]
        mine = self.own.get(client)
        if mine is not None:
            out.append((self.node_id, mine.hlc))
        return out

    def renew(self, client: str, claimant: str, hlc: int, now_ms: int) -> None:
        """`client` tried a node that `claimant`'s claim (`hlc`) kept it out of: the claim
        goes on from now."""
        if claimant == self.node_id:
            mine = self.own.get(client)
            if mine is not None and mine.hlc == hlc:
                mine.renewed_ms = now_ms
            return
        held = self.others.get(client, {})
        if claimant in held and held[claimant][0] == hlc:
            _, until, came = held[claimant]
            held[claimant] = (hlc, max(until, min(now_ms + CLAIM_MS, came + CLAIM_MAX_MS)
                                       + CLAIM_MARGIN_MS), came)

    def drop_from(self, up: set[str]) -> list[str]:
        """Peers not in `up` (their streams went down) hold no claim here any more: the
        clients they kept out."""
        return [client for client, held in list(self.others.items())
                if any(c not in up for c in held)
                and self._end(client, [c for c in held if c not in up])]

    def used(self, client: str) -> None:
        """`client` connected here: this node's claim of it did its work."""
        self.own.pop(client, None)

    def passed_over(self, up: set[str]) -> list[str]:
        """Peers not in `up` will not answer: the clients whose claims that grants."""
        done = []
        for client, mine in self.own.items():
            if mine.waiting and not mine.waiting & up:
                mine.waiting.clear()
                done.append(client)
            else:
                mine.waiting &= up
        return done

    def lapse(self, now_ms: int) -> tuple[list[tuple[str, OwnClaim]], list[str]]:
        """Claims past their time: this node's (to withdraw) and the others' granted here."""
        mine = [(c, m) for c, m in self.own.items() if not self._mine_in_force(m, now_ms)]
        for client, _ in mine:
            del self.own[client]
        theirs = [client for client, held in list(self.others.items())
                  if any(until < now_ms for _, until, _ in held.values())
                  and self._end(client, [c for c, (_, u, _) in held.items() if u < now_ms])]
        return mine, theirs

    def _end(self, client: str, claimants: list[str]) -> bool:
        """Forget these claimants' claims of `client`; whether none is left."""
        held = self.others.get(client, {})
        for claimant in claimants:
            held.pop(claimant, None)
        if held:
            return False
        self.others.pop(client, None)
        return True

    def admits(self, client: str, now_ms: int) -> bool:
        """Whether this node's claim of `client` is granted and in force."""
        mine = self.own.get(client)
        return mine is not None and mine.granted and self._mine_in_force(mine, now_ms)

    @staticmethod
    def _mine_in_force(mine: OwnClaim, now_ms: int) -> bool:
        if now_ms - mine.started_ms > (CLAIM_MAX_MS if mine.granted else CLAIM_MS):
            return False
        return not mine.granted or now_ms - mine.renewed_ms <= CLAIM_MS

    def keeps_out(self, client: str, now_ms: int) -> bool:
        """Whether another node's claim of `client` granted here is in force."""
        return any(until >= now_ms for _, until, _ in self.others.get(client, {}).values())
