"""`Confirmations`: the copies the forwarding client settled, for the plugin's journal
(sans-IO).

Every QoS > 0 copy Mosquitto hands the forwarding client is remembered by its packet id with
its fingerprint; when the copy is acknowledged to Mosquitto (every peer it goes to has it, or
it went nowhere) the fingerprint joins the next `confirm` command. A lost session (a new
Mosquitto) forgets everything: those packet ids name nothing any more.
"""

from __future__ import annotations

from sidecar.journal.record import fingerprint


class Confirmations:
    """Packet id -> fingerprint of copies taken; fingerprints of copies acked since `take`."""

    def __init__(self) -> None:
        self._by_mid: dict[int, int] = {}
        self._done: list[int] = []
        self.confirmed = 0

    def on_copy(self, mid: int, topic: str, payload: bytes) -> None:
        """A QoS > 0 copy was taken."""
        self._by_mid[mid] = fingerprint(topic, payload)

    def on_ack(self, mid: int) -> None:
        """The copy `mid` was acknowledged to Mosquitto."""
        fp = self._by_mid.pop(mid, None)
        if fp is not None:
            self._done.append(fp)
            self.confirmed += 1

    def reset(self, mids: range | None = None) -> None:
        """A forwarding connection's session is new: nothing it took before will be acked
        (`mids`: the packet ids of that connection, sidecar.local.shards; None: all)."""
        if mids is None:
            self._by_mid.clear()
        else:
            for mid in [m for m in self._by_mid if m in mids]:
                del self._by_mid[mid]
        self._done.clear()

    def take(self) -> list[int]:
        """The fingerprints to confirm now (each once)."""
        done, self._done = self._done, []
        return done

    @property
    def waiting(self) -> int:
        """Copies taken and not acknowledged yet."""
        return len(self._by_mid)
