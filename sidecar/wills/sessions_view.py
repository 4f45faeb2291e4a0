"""What the will table reads of the session registry (a read-only view, sans-IO).

The registry knows every client id's latest connection cluster-wide (its connect HLC); a will
whose connection is older than that is not published: the client reconnected meanwhile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sidecar.sessions.registry import SessionRegistry


class Connections(Protocol):
    def latest_connect(self, client: str) -> int | None:
        """The connect HLC of the client's latest connection known anywhere (None: none)."""


class RegistryView:
    """`Connections` over a `SessionRegistry` (reads its records, changes nothing)."""

    def __init__(self, registry: SessionRegistry | None) -> None:
        self._registry = registry

    def latest_connect(self, client: str) -> int | None:
        if self._registry is None:
            return None
        record = self._registry.records.get(client)
        return None if record is None else record.connect_hlc
