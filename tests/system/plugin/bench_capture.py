"""What capture costs Mosquitto against today's MQTT copies to `.fwd` (not part of the default
test run).

    .venv/bin/python -m tests.system.plugin.bench_capture --messages 50000 --runs 3

One Mosquitto with the plugin, without and with `capture_socket` (alternating runs): a fake
sidecar, the forwarding connection subscribed to the topic, and one paho publisher sending
QoS 1 messages flat out (100 in flight). Off: Mosquitto queues `.fwd` a copy of each, which it
reads and acknowledges. On: each message becomes a record on the capture socket, read by a
listener thread that acknowledges every 50 ms. Prints Mosquitto's CPU time per message (user +
system, from /proc) and the publisher's throughput. Every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

from tests.harness.procs import ProcessGroup
from tests.system.plugin.capture_peer import CapturePeer
from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Broker,
    FakeSidecar,
    RawClient,
    cpu_seconds,
    mosquitto_dir,
    publish_windowed,
)

TOPIC = "bench/capture"


def _acker(peer: CapturePeer, stop: threading.Event) -> None:
    acked = 0
    while not stop.wait(0.05):
        with peer.cond:
            top = peer.records[-1].seq if peer.records else 0
        if top > acked and peer.conn is not None:
            try:
                peer.ack(top)
                acked = top
            except (OSError, AssertionError):
                pass


def run(messages: int, capture: bool, size: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqfed-bench-capture-"))
    sdir = mosquitto_dir()
    procs = ProcessGroup(root)
    clients = []
    peer = CapturePeer(sdir / "capture.sock") if capture else None
    stop = threading.Event()
    try:
        broker = Broker(procs, "mosquitto-bench",
                        opts={"capture_socket": str(sdir / "capture.sock")} if capture else None,
                        extra="max_queued_messages 1000000").start()
        sc = FakeSidecar(broker.sock).start()
        clients.append(sc)
        fwd = RawClient(SIDECAR_ID + ".fwd", sock=broker.sock, username=SIDECAR_USER,
                        password=SECRET, clean_start=False, session_expiry=3600)
        clients.append(fwd)
        fwd.connect()
        fwd.subscribe(TOPIC, 1, no_local=True, sub_id=1)
        if peer:
            peer.wait_hellos(1)
            threading.Thread(target=_acker, args=(peer, stop), daemon=True).start()
        cpu0 = cpu_seconds(broker.proc.pid)
        t0 = time.monotonic()
        pub, elapsed = publish_windowed(broker.port, "bench-capture-pub", TOPIC, messages,
                                        size)

        def got() -> int:
            return len(peer.records) if peer else len(fwd.received())

        while got() < messages and time.monotonic() - t0 < elapsed + 60:
            time.sleep(0.05)
        time.sleep(0.3)
        cpu = cpu_seconds(broker.proc.pid) - cpu0   # the deliveries to .fwd included
        received = got()
        st = sc.call("stats")["capture"]
        pub.disconnect()
        pub.loop_stop()
        return {"msgs_per_s": messages / elapsed, "mosquitto_us_per_msg": cpu / messages * 1e6,
                "received": received, "records": st["records"],
                "mqtt_copies": len(fwd.received())}
    finally:
        stop.set()
        for c in clients:
            c.close()
        procs.stop_all()
        if peer:
            peer.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(sdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    args = parser.parse_args()
    for i in range(args.runs):
        for capture in (False, True):
            r = run(args.messages, capture, args.size)
            print(f"run {i + 1} capture {'on ' if capture else 'off'}: "
                  f"{r['msgs_per_s']:8.0f} msgs/s, Mosquitto {r['mosquitto_us_per_msg']:5.1f} "
                  f"µs CPU/msg, .fwd got {r['mqtt_copies']} MQTT copies, {r['records']} records",
                  flush=True)


if __name__ == "__main__":
    main()
