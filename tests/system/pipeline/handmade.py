"""Hand-made traces: records built in Python, as DataFrames or as JSON-lines files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pipeline import metrics, source
from pipeline.schema import RECORD
from sidecar.bench.traces import TraceWriter, pub_line, recv_line, sub_line

T0 = 1_700_000_000_000_000_000  # ns
MS = 1_000_000


@dataclass
class Trace:
    """Records of one run; times are ms after T0."""

    run: str = "r"
    rows: list[dict[str, Any]] = field(default_factory=list)
    arrivals: dict[str, int] = field(default_factory=dict)

    def subscribe(self, sub: str, node: str, filt: str, qos: int = 1, at: float = 0,
                  until: float | None = None) -> Trace:
        base = {"v": 1, "run": self.run, "sub": sub, "node": node, "filter": filt, "qos": qos}
        self.rows.append({**base, "kind": "sub", "t": T0 + int(at * MS)})
        if until is not None:
            self.rows.append({**base, "kind": "unsub", "t": T0 + int(until * MS)})
        return self

    def publish(self, pub: int, seq: int, topic: str, node: str, at: float, qos: int = 1,
                size: int = 100) -> Trace:
        self.rows.append({"v": 1, "kind": "pub", "run": self.run, "pub": pub, "seq": seq,
                          "topic": topic, "qos": qos, "node": node, "t": T0 + int(at * MS),
                          "size": size})
        return self

    def receive(self, sub: str, node: str, pub: int, seq: int, topic: str, at: float,
                qos: int = 1, dup: bool = False) -> Trace:
        i = self.arrivals.get(sub, 0)
        self.arrivals[sub] = i + 1
        self.rows.append({"v": 1, "kind": "recv", "run": self.run, "sub": sub, "node": node,
                          "pub": pub, "seq": seq, "topic": topic, "qos": qos, "dup": dup,
                          "t": T0 + int(at * MS), "i": i})
        return self

    def frame(self, spark: SparkSession) -> DataFrame:
        names = RECORD.fieldNames()
        return spark.createDataFrame([tuple(r.get(n) for n in names) for r in self.rows],
                                     RECORD)

    def deliveries(self, spark: SparkSession) -> DataFrame:
        data = source.split(self.frame(spark))
        subs = metrics.subscriptions(data.sub, data.unsub)
        exp = metrics.expected(data.pub, subs)
        return metrics.deliveries(data.pub, exp, metrics.first_copies(data.recv))

    def write(self, folder: Path, max_records: int = 1000) -> None:
        """The same records as JSON-lines files, through the load generator's writer."""
        w = TraceWriter(folder, f"hand-{self.run}", max_records=max_records)
        for r in self.rows:
            if r["kind"] == "pub":
                w.write(pub_line(r["run"], r["pub"], r["seq"], r["topic"], r["qos"], r["node"],
                                 r["t"], r["size"]))
            elif r["kind"] == "recv":
                w.write(recv_line(r["run"], r["sub"], r["node"], r["pub"], r["seq"], r["topic"],
                                  r["qos"], r["dup"], r["t"], r["i"]))
            else:
                w.write(sub_line(r["kind"], r["run"], r["sub"], r["node"], r["filter"],
                                 r["qos"], r["t"]))
        w.close()


def rows(df: DataFrame, *order: str) -> list[dict[str, Any]]:
    """Collect a small test result as dicts (tests only)."""
    return [r.asDict() for r in (df.orderBy(*order) if order else df).collect()]
