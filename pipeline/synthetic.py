"""A synthetic trace with known faults, for sizing the audit (`docs/performance.md`).

    python -m pipeline.synthetic --out DIR [--records 1000000]

Four publishers (n1, n1, n2, n3), one QoS 1 subscriber on each of n1, n2, n3 for every
message. Faults injected, printed as JSON: sub-n3 misses every LOSS_EVERY-th message,
sub-n2 gets every DUP_EVERY-th twice, sub-n1 gets every REORDER_EVERY-th after its
successor. Latencies stay below each publisher's interval, so nothing else is reordered.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from sidecar.bench.traces import TraceWriter, pub_line, recv_line, sub_line

RUN = "synthetic"
PUBLISHERS = ("n1", "n1", "n2", "n3")
SUBSCRIBERS = ("n1", "n2", "n3")
INTERVAL_NS = 4_000_000  # per publisher
LOSS_EVERY, DUP_EVERY, REORDER_EVERY = 10_007, 5_003, 20_011
T0 = 1_700_000_000_000_000_000


def _latency(rng: random.Random, origin: str, dest: str) -> int:
    base = 300_000 if origin == dest else 1_200_000
    return base + int(rng.random() * 2_000_000)  # < INTERVAL_NS - base: no natural reorder


def generate(out: Path, records: int, seed: int = 1) -> dict[str, int]:
    """Write about `records` records into `out`; returns the faults injected."""
    rng = random.Random(seed)
    per_pub = max(2, (records - 2 * len(SUBSCRIBERS)) // (1 + len(SUBSCRIBERS))
                  // len(PUBLISHERS))
    topics = [f"load/{RUN}/{node}/{k}" for k, node in enumerate(PUBLISHERS)]
    pubs, recvs = TraceWriter(out, f"pub-{RUN}"), TraceWriter(out, f"recv-{RUN}")
    for node in SUBSCRIBERS:
        recvs.write(sub_line("sub", RUN, f"sub-{node}", node, f"load/{RUN}/#", 1, T0 - 1))
    arrivals: dict[str, list[tuple[int, int, int, bool]]] = {n: [] for n in SUBSCRIBERS}
    faults = {"lost": 0, "duplicates": 0, "out_of_order": 0}
    n = 0
    for seq in range(per_pub):
        for k, origin in enumerate(PUBLISHERS):
            t = T0 + seq * INTERVAL_NS + k * 1000
            pubs.write(pub_line(RUN, k, seq, topics[k], 1, origin, t, 100))
            n += 1
            for dest in SUBSCRIBERS:
                t_recv = t + _latency(rng, origin, dest)
                if dest == "n3" and n % LOSS_EVERY == 0:
                    faults["lost"] += 1
                    continue
                if dest == "n1" and n % REORDER_EVERY == 0 and seq + 1 < per_pub:
                    t_recv += INTERVAL_NS + 2_500_000  # after seq + 1 has arrived
                    faults["out_of_order"] += 1
                arrivals[dest].append((t_recv, k, seq, False))
                if dest == "n2" and n % DUP_EVERY == 0:
                    arrivals[dest].append((t_recv + 5_000_000, k, seq, True))
                    faults["duplicates"] += 1
    for dest, rows in arrivals.items():
        rows.sort()
        for i, (t_recv, k, seq, dup) in enumerate(rows):
            recvs.write(recv_line(RUN, f"sub-{dest}", dest, k, seq, topics[k], 1, dup,
                                  t_recv, i))
    end = T0 + per_pub * INTERVAL_NS + 60 * 10**9
    for node in SUBSCRIBERS:
        recvs.write(sub_line("unsub", RUN, f"sub-{node}", node, f"load/{RUN}/#", 1, end))
    pubs.close()
    recvs.close()
    total = n + sum(len(r) for r in arrivals.values()) + 2 * len(SUBSCRIBERS)
    return {"records": total, "published": n, **faults}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.synthetic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    print(json.dumps(generate(args.out, args.records, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
