"""`RoutingService.start` dials the membership view as it is once the listener is up.

Regression: a node joins etcd before its routing exists, and the view can change while the
gRPC listener starts. Routing used to apply the view captured before that await, dropping a
peer that had joined meanwhile: that node then never dialled it (a 1-in-500 CI failure,
"timed out waiting for all peer streams up"). Real gRPC listener; the forwarding client is a
stand-in because this test never reaches Mosquitto.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sidecar.peering.handshake import Hello
from sidecar.routing.service import RoutingService
from sidecar.routing.table import SubscriptionTable


class _NoBroker:
    """The forwarding client's surface that `start`/`stop` touch."""

    receive_maximum = 16_384
    max_queued = 10_000

    def __init__(self, **_callbacks) -> None:
        self.connected = False

    async def connect(self) -> None:
        self.connected = True

    def close(self) -> None:
        self.connected = False


def test_a_peer_joining_while_the_listener_starts_is_dialled(tmp_path: Path) -> None:
    async def scenario() -> set[str]:
        routing = RoutingService(
            hello=Hello("c", "n1", 1), listen="127.0.0.1:0", run_dir=tmp_path,
            table=SubscriptionTable(), make_forward_client=_NoBroker,
            commands=None)  # type: ignore[arg-type]  # never asked here
        view = {"n2": "127.0.0.1:9"}
        real_start = routing.transport.start

        async def start_while_n3_joins() -> None:
            await real_start()
            view["n3"] = "127.0.0.1:10"  # the etcd watch, during the await

        routing.transport.start = start_while_n3_joins  # type: ignore[method-assign]
        await routing.start(lambda: dict(view))
        try:
            return set(routing.queues) & set(routing.transport.states())
        finally:
            await routing.stop()

    assert asyncio.run(scenario()) == {"n2", "n3"}
