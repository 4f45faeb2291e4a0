"""The control link's retained reads repair their end marker themselves (issue 16): with the
sentinel deleted, or published with a message expiry that ran out, a read still answers
within its caller's timeout (`RetainedService` waits READ_TIMEOUT), and the sentinel is back
for the next read. Only the sidecar's identities may touch the sentinel now; this is what
happens if it is disturbed anyway (a restarted Mosquitto, an operator)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar.local.link import SENTINEL_TOPIC, LocalLink
from sidecar.retained.service import READ_TIMEOUT
from tests.system.plugin.helpers import SECRET, SIDECAR_ID, SIDECAR_USER, Client


def test_reads_repair_a_deleted_or_expired_sentinel(broker, clients):
    fwd = clients(Client(SIDECAR_ID + ".fwd", sock=broker.sock, username=SIDECAR_USER,
                         password=SECRET))
    fwd.connect()
    fwd.publish("cfg/a", b"1", retain=True)
    expiring = Properties(PacketTypes.PUBLISH)
    expiring.MessageExpiryInterval = 1

    def delete() -> None:
        fwd.publish(SENTINEL_TOPIC, b"", retain=True)

    def expire() -> None:
        fwd.publish(SENTINEL_TOPIC, b"1", retain=True, properties=expiring)
        time.sleep(1.5)

    async def body() -> list[dict[str, bytes]]:
        link = LocalLink(Path(broker.sock), SECRET, client_id=SIDECAR_ID)
        await link.connect()
        answers = []
        try:
            for disturb in (None, delete, expire, None):
                if disturb is not None:
                    await asyncio.to_thread(disturb)
                got = await asyncio.wait_for(link.read_retained(["cfg/a", "cfg/none"]),
                                             READ_TIMEOUT)
                answers.append({t: m.payload for t, m in got.items()})
        finally:
            link.close()
        return answers

    assert asyncio.run(body()) == [{"cfg/a": b"1"}] * 4
