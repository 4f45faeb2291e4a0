"""Messages above the peer frame limit. In process (routing with its real gRPC listener and
spill store, a stand-in forwarding client): an oversized copy is settled at once and never
queued. On a real 2-node cluster (`grpc.max_message_bytes` set
to 1 MiB so that the messages stay small; Mosquitto's own size limit is left open here, as if
it were missing): each oversized message is refused once, counted and logged, never queued,
spilled or retried; the messages around it flow; retained replication goes on, and the nodes'
retained indexes agree (peers hold the oversized write's version as deleted)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sidecar.peering.handshake import Hello
from sidecar.routing.forwarder import LocalCopy
from sidecar.routing.interest import LocalSubscribe
from sidecar.routing.local_interest import InterestSnapshot
from sidecar.routing.service import RoutingService
from sidecar.routing.table import InterestKey, SubscriptionTable
from tests.harness.procs import wait_for
from tests.system.node.mqtt import Client
from tests.system.retained.helpers import read_retained, retained_status

pytestmark = pytest.mark.timeout(180)

LIMIT = 1 << 20
BIG = b"x" * (LIMIT + (256 << 10))
TOO_LARGE = ("mqfed_dropped_total", (("reason", "too_large"),))


class _ForwardClient:
    """What routing touches of the forwarding client here; records the local acks."""

    receive_maximum = 16_384
    max_queued = 10_000

    def __init__(self, **_callbacks) -> None:
        self.acks: list[int] = []
        self.connected = False

    async def connect(self) -> None:
        self.connected = True

    def close(self) -> None:
        self.connected = False

    def ack(self, mid: int, qos: int) -> None:
        self.acks.append(mid)


def test_an_oversized_copy_is_settled_at_once_and_never_queued(tmp_path: Path) -> None:
    async def scenario() -> None:
        routing = RoutingService(
            hello=Hello("c", "n1", 1), listen="127.0.0.1:0", run_dir=tmp_path,
            table=SubscriptionTable(), make_forward_client=_ForwardClient,
            commands=None, max_message_bytes=64 << 10)  # type: ignore[arg-type]
        await routing.start(lambda: {"n2": "127.0.0.1:9"})  # n2 is down: copies are spilled
        try:
            actions = routing.remote.apply_snapshot("n2", InterestSnapshot(
                1, frozenset({InterestKey(None, "t/#")})))
            sub = next(a.subscription_id for a in actions if isinstance(a, LocalSubscribe))
            big = b"x" * (100 << 10)
            routing._on_copies([LocalCopy(1, "t/big", big, 1, False, subscription_ids=(sub,)),
                                LocalCopy(2, "t/small", b"ok", 1, False, subscription_ids=(sub,)),
                                LocalCopy(3, "t/big0", big, 0, False, subscription_ids=(sub,))])
            queue = routing.queues["n2"]
            assert queue.count() == 1 and queue.bytes() < 1024  # only the small one
            assert routing.counters["too_large"] == 2
            fwd = routing.forward_client
            assert sorted(fwd.acks) == [1, 2, 3]  # all settled: none held by Mosquitto forever
        finally:
            await routing.stop()

    asyncio.run(scenario())


def test_oversized_messages_are_refused_once_and_everything_else_flows(cluster_factory):
    cluster = cluster_factory(2, env={"MQFED_GRPC_MAX_MESSAGE_BYTES": str(LIMIT)})
    sub = Client(cluster.ports["n2"], "big-sub")
    pub = Client(cluster.ports["n1"], "big-pub")
    try:
        assert sub.wait_connected() and pub.wait_connected()
        sub.subscribe("big/#", qos=1)
        cluster.wait_interest("n2", "big/#")
        pub.publish("big/a", b"before", qos=1)
        pub.publish("big/a", BIG, qos=1)  # acknowledged by Mosquitto, then not forwarded
        pub.publish("big/a", BIG, qos=0)
        pub.publish("big/a", b"after", qos=1)
        got = sub.wait_count(2, timeout=20)
        assert [m.payload for m in got] == [b"before", b"after"]
        time.sleep(1.0)
        assert [m.payload for m in sub.messages] == [b"before", b"after"]
        wait_for(lambda: cluster.metrics("n1").get(TOO_LARGE, 0) == 2, 10, "2 counted")
        peer = cluster.routing("n1")["peers"]["n2"]
        assert peer["outbound"]["state"] == "up" and peer["reconnects"] == 0
        assert cluster.routing("n1")["queues"]["n2"]["count"] == 0  # nothing left to resend
        spill = cluster.run_dir / "nodes" / "n1" / "spill"
        assert sum(f.stat().st_size for f in spill.glob("*")) < LIMIT
        # retained: the oversized value stays on n1, n2 holds its version as deleted, and
        # replication goes on (the read loop survived)
        pub.publish("big/r", b"small-old", qos=1, retain=True)
        wait_for(lambda: read_retained(cluster.ports["n2"], "big/r").get("big/r")
                 == b"small-old", 20, "the small retained value on n2")
        pub.publish("big/r", BIG, qos=1, retain=True)
        wait_for(lambda: "big/r" not in read_retained(cluster.ports["n2"], "big/r"), 20,
                 "n2 drops the older value")
        pub.publish("big/s", b"later", qos=1, retain=True)
        wait_for(lambda: read_retained(cluster.ports["n2"], "big/s").get("big/s") == b"later",
                 20, "a later retained write replicates")
        assert read_retained(cluster.ports["n1"], "big/r")["big/r"] == BIG

        def agreed() -> bool:
            one, two = retained_status(cluster, "n1"), retained_status(cluster, "n2")
            return bool(one.get("digest")) and one.get("digest") == two.get("digest")

        wait_for(agreed, 20, "the retained digests agree")
        assert retained_status(cluster, "n1")["too_large"] >= 1
        log = (cluster.run_dir / "nodes" / "n1" / "node.log").read_text()
        assert "larger than a peer frame may be" in log
        assert "Task exception was never retrieved" not in log
    finally:
        sub.close()
        pub.close()
