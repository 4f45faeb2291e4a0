"""`RoundRobin`: the one choice among holders of a shared subscription (pure).

Both sides of a shared-subscription delivery use it: the origin picks one peer among the nodes
holding ``$share/<group>/<filter>`` (`RemoteInterest`), and the receiving node picks one of its
local members (`sidecar.routing.receiver`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class RoundRobin(Generic[T]):
    """Round robin per key over the candidates given at each pick, starting at `seed` (give
    each node a different seed, e.g. a hash of its id, so nodes do not all start alike)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._turns: dict[Hashable, int] = {}

    def pick(self, key: Hashable, candidates: Sequence[T]) -> T | None:
        """The next candidate for `key` (None: there is none)."""
        if not candidates:
            return None
        turn = self._turns.get(key, 0)
        self._turns[key] = turn + 1
        return candidates[(self.seed + turn) % len(candidates)]

    def forget(self, key: Hashable) -> None:
        """`key` has no holders any more."""
        self._turns.pop(key, None)
