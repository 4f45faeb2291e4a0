"""Kill -9 of the publisher's node under QoS 1 load, N times (not part of the default run).

    .venv/bin/python -m tests.system.routing.bench_node_kill --runs 10 --rate 500

Starts a 2-node cluster (`mqfed up`; set MQFED_MQTT_JOURNAL=false to measure without the
journal). Each run: a subscriber on n2 (persistent session), a QoS 1 publisher on n1 at
`--rate`, `mqfed stop-node n1 --kill` after `--kill-after` seconds, `mqfed start-node n1`;
then it waits (up to 30 s) until every message the publisher got a PUBACK for has arrived and
prints, per run: sent, acknowledged, received, duplicates and the acknowledged ones missing.
Every process is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import time

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.node.mqtt import Client
from tests.system.routing.conftest import _finish, _new_run_dir, _start
from tests.system.routing.test_journal import AckedPublisher


def one(cluster, run: int, rate: float, kill_after: float) -> dict:
    topic = f"nodekill/{run}"
    sub = Client(cluster.ports["n2"], f"nodekill-sub-{run}", clean=False, session_expiry=600)
    try:
        assert sub.wait_connected()
        sub.subscribe(topic, qos=1)
        cluster.wait_interest("n2", topic)
        pub = AckedPublisher(cluster.ports["n1"], topic, rate)
        time.sleep(kill_after)
        result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n1", "--kill")
        assert result.returncode == 0, result.stderr
        acked = pub.stop()
        result = mqfed("start-node", "--run-dir", str(cluster.run_dir), "n1")
        assert result.returncode == 0, result.stderr
        try:
            wait_for(lambda: acked <= {int(m.payload) for m in list(sub.messages)}, 30,
                     "every acknowledged message")
        except TimeoutError:
            pass
        got = [int(m.payload) for m in list(sub.messages)]
        missing = sorted(acked - set(got))
        return {"run": run, "sent": len(pub.infos), "acked": len(acked), "received": len(got),
                "duplicates": len(got) - len(set(got)), "missing": len(missing),
                "first_missing": missing[:10],
                "replayed": (cluster.state("n1").get("journal") or {}).get("replayed")}
    finally:
        sub.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--kill-after", type=float, default=4.0)
    args = parser.parse_args()
    path = _new_run_dir()
    failed = True
    try:
        cluster = _start(path, 2)
        lost = 0
        for run in range(1, args.runs + 1):
            row = one(cluster, run, args.rate, args.kill_after)
            lost += row["missing"]
            print(row, flush=True)
            cluster.wait_meshed()
        print(f"{args.runs} kills at {args.rate:.0f} msgs/s: {lost} acknowledged messages lost")
        failed = False
    finally:
        _finish(path, failed)


if __name__ == "__main__":
    main()
