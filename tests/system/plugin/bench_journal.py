"""What the journal costs Mosquitto (not part of the default test run).

    .venv/bin/python -m tests.system.plugin.bench_journal --messages 50000 --runs 3

One Mosquitto with the plugin, with and without `journal_dir` (alternating runs): a fake
sidecar, the forwarding connection subscribed to the topic (it acknowledges every copy; the
fake sidecar confirms each copy to the journal every 50 ms, as the real one does), and one
paho publisher sending QoS 1 messages flat out (100 in flight). Prints Mosquitto's CPU time
per message (user + system, from /proc: stable on a busy machine, unlike throughput), the
publisher's throughput, and the journal's file size at the end. Then the sidecar's own part:
the fingerprint and bookkeeping per copy (`Confirmations`), timed in a loop. Every process
is stopped by PID.
"""

from __future__ import annotations

import argparse
import base64
import shutil
import tempfile
import threading
import time
import timeit
from pathlib import Path

from sidecar.journal.confirmations import Confirmations
from sidecar.journal.record import fingerprint, pack_fingerprints
from tests.harness.procs import ProcessGroup
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

TOPIC = "bench/journal"


def _confirmer(sc: FakeSidecar, fwd: RawClient, stop: threading.Event) -> None:
    done = 0
    while not stop.wait(0.05):
        got = fwd.received()
        fps = [fingerprint(m.topic, m.payload) for m in got[done:]]
        done = len(got)
        for i in range(0, len(fps), 8192):
            sc.send({"v": 1, "cmd": "confirm",
                     "fps": base64.b64encode(pack_fingerprints(fps[i:i + 8192])).decode()})


def run(messages: int, journal: bool, size: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqfed-bench-journal-"))
    jdir = mosquitto_dir()
    procs = ProcessGroup(root)
    clients = []
    try:
        broker = Broker(procs, "mosquitto-bench",  # (no copy dropped for a slow .fwd)
                        opts={"journal_dir": str(jdir)} if journal else None,
                        extra="max_queued_messages 1000000").start()
        sc = FakeSidecar(broker.sock).start()
        clients.append(sc)
        fwd = RawClient(SIDECAR_ID + ".fwd", sock=broker.sock, username=SIDECAR_USER,
                        password=SECRET, clean_start=False, session_expiry=3600)
        clients.append(fwd)
        fwd.connect()
        fwd.subscribe(TOPIC, 1, no_local=True, sub_id=1)
        stop = threading.Event()
        confirmer = threading.Thread(target=_confirmer, args=(sc, fwd, stop), daemon=True)
        confirmer.start()
        cpu0 = cpu_seconds(broker.proc.pid)
        t0 = time.monotonic()
        pub, elapsed = publish_windowed(broker.port, "bench-journal-pub", TOPIC, messages,
                                        size)
        cpu = cpu_seconds(broker.proc.pid) - cpu0
        while len(fwd.received()) < messages and time.monotonic() - t0 < elapsed + 30:
            time.sleep(0.05)
        time.sleep(1.2)  # the last confirmations and the plugin's truncation
        stop.set()
        confirmer.join(2)
        live = sc.call("stats")["journal"]
        pub.disconnect()
        pub.loop_stop()
        return {"journal": journal, "msgs_per_s": messages / elapsed,
                "mosquitto_us_per_msg": cpu / messages * 1e6, "live_after": live["live"],
                "file_bytes_after": live["file_bytes"], "written": live["written"],
                "compactions": live["compactions"], "errors": live["errors"]}
    finally:
        for c in clients:
            c.close()
        procs.stop_all()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(jdir, ignore_errors=True)


def sidecar_cost(copies: int = 200_000, size: int = 100) -> float:
    """Microseconds per copy for the forwarding client's part (fingerprint on receipt,
    bookkeeping on ack, `take`)."""
    payload = b"x" * size

    def loop() -> None:
        c = Confirmations()
        for mid in range(copies):
            c.on_copy(mid, TOPIC, payload)
            c.on_ack(mid)
        c.take()

    return min(timeit.repeat(loop, number=1, repeat=3)) / copies * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    args = parser.parse_args()
    for i in range(args.runs):
        for journal in (False, True):
            r = run(args.messages, journal, args.size)
            print(f"run {i + 1} journal {'on ' if journal else 'off'}: "
                  f"{r['msgs_per_s']:8.0f} msgs/s, Mosquitto {r['mosquitto_us_per_msg']:5.1f} "
                  f"µs CPU/msg, after: {r['live_after']} live, {r['file_bytes_after']} bytes, "
                  f"{r['compactions']} compactions, {r['errors']} errors", flush=True)
    print(f"sidecar: {sidecar_cost(size=args.size):.2f} µs per copy (fingerprint + "
          "bookkeeping)")


if __name__ == "__main__":
    main()
