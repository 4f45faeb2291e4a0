"""Every audit metric on small hand-made traces with known answers."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline import metrics
from tests.system.pipeline.handmade import MS, T0, Trace, rows

TOPIC = "load/r/n1/0"


FILTER_CASES = [
    ("a/b", "a/b", True), ("a/b", "a/b/c", False), ("a/+/c", "a/x/c", True),
    ("a/+/c", "a/x/y/c", False), ("a/+", "a/", True), ("a/#", "a", True),
    ("a/#", "a/b/c", True), ("a/#", "ab", False), ("#", "x/y", True), ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/x", True), ("a.b/+", "aXb/c", False),
    ("a.b/+", "a.b/c", True), ("a(b)/*", "a(b)/*", True), ("a(b)/*", "ab/x", False),
]


def test_filter_regex_matches_like_mqtt(spark: SparkSession) -> None:
    df = spark.createDataFrame(FILTER_CASES, "f string, t string, want boolean")
    got = rows(df.select("f", "t", "want", F.regexp_like("t", metrics.filter_regex(
        F.col("f"))).alias("m")))
    wrong = [(r["f"], r["t"], r["m"]) for r in got if r["m"] is not r["want"]]
    assert len(got) == len(FILTER_CASES) and not wrong


def test_expected_set_uses_filter_run_window_and_qos(spark: SparkSession) -> None:
    tr = (Trace().subscribe("s1", "n2", "load/r/#", qos=1, at=10, until=50)
          .subscribe("s1", "n2", "load/r/n1/+", qos=0, at=0)  # overlaps: QoS is the max
          .subscribe("s2", "n3", "load/r/n1/0", qos=0, at=0)
          .subscribe("s3", "n3", "other/#", qos=1, at=0))
    tr.publish(0, 0, TOPIC, "n1", at=5, qos=1)   # s1 only via the QoS 0 filter yet
    tr.publish(0, 1, TOPIC, "n1", at=20, qos=1)  # s1 at QoS 1, s2 at QoS 0
    tr.publish(1, 0, "load/r/n2/0", "n2", at=20, qos=1)  # s1 (load/r/#) only
    tr.publish(1, 1, "load/r/n2/0", "n2", at=60, qos=1)  # after the unsub: nobody
    other = Trace(run="q").publish(0, 5, TOPIC, "n1", at=20)  # another run: nobody
    tr.rows += other.rows
    got = rows(tr.deliveries(spark).select("pub", "seq", "sub", "qos", "dest", "expected"),
               "pub", "seq", "sub")
    assert [(r["pub"], r["seq"], r["sub"], r["qos"], r["dest"]) for r in got] == [
        (0, 0, "s1", 0, "n2"), (0, 0, "s2", 0, "n3"),
        (0, 1, "s1", 1, "n2"), (0, 1, "s2", 0, "n3"),
        (1, 0, "s1", 1, "n2")]
    assert all(r["expected"] for r in got)


def _lossy() -> Trace:
    """s1 (QoS 1, n2) misses seq 3, 4, 5 and 9 of 0..9; s2 (QoS 0, n1) misses seq 0."""
    tr = Trace().subscribe("s1", "n2", "load/#", 1).subscribe("s2", "n1", "load/#", 0)
    for seq in range(10):
        tr.publish(0, seq, TOPIC, "n1", at=1 + seq)
    for seq in (0, 1, 2, 6, 7, 8):
        tr.receive("s1", "n2", 0, seq, TOPIC, at=2 + seq)
    for seq in range(1, 10):
        tr.receive("s2", "n1", 0, seq, TOPIC, at=2 + seq, qos=0)
    return tr


def test_lost_per_subscriber_and_qos(spark: SparkSession) -> None:
    d = _lossy().deliveries(spark)
    per = {r["sub"]: r for r in rows(metrics.per_subscriber(d))}
    assert (per["s1"]["qos"], per["s1"]["expected"], per["s1"]["delivered"],
            per["s1"]["lost"]) == (1, 10, 6, 4)
    assert (per["s2"]["qos"], per["s2"]["expected"], per["s2"]["delivered"],
            per["s2"]["lost"]) == (0, 10, 9, 1)
    lost = rows(metrics.lost(d), "sub", "seq")
    assert [(r["sub"], r["seq"], r["node"], r["origin"]) for r in lost] == [
        ("s1", 3, "n2", "n1"), ("s1", 4, "n2", "n1"), ("s1", 5, "n2", "n1"),
        ("s1", 9, "n2", "n1"), ("s2", 0, "n1", "n1")]


def test_lost_ranges_group_consecutive_seqs(spark: SparkSession) -> None:
    d = _lossy().deliveries(spark)
    got = rows(metrics.lost_ranges(metrics.lost(d)), "sub", "first_seq")
    assert [(r["sub"], r["first_seq"], r["last_seq"], r["count"], r["qos"]) for r in got] == [
        ("s1", 3, 5, 3, 1), ("s1", 9, 9, 1, 1), ("s2", 0, 0, 1, 0)]


def test_duplicates_count_extra_copies(spark: SparkSession) -> None:
    tr = Trace().subscribe("s1", "n2", "load/#", 1)
    for seq in range(4):
        tr.publish(0, seq, TOPIC, "n1", at=seq)
    tr.receive("s1", "n2", 0, 0, TOPIC, at=5).receive("s1", "n2", 0, 0, TOPIC, at=6, dup=True)
    tr.receive("s1", "n2", 0, 1, TOPIC, at=7).receive("s1", "n2", 0, 2, TOPIC, at=8)
    tr.receive("s1", "n2", 0, 2, TOPIC, at=9).receive("s1", "n2", 0, 2, TOPIC, at=10, dup=True)
    tr.receive("s1", "n2", 0, 3, TOPIC, at=11)
    (per,) = rows(metrics.per_subscriber(tr.deliveries(spark)))
    assert (per["delivered"], per["lost"], per["duplicates"], per["dup_flagged"]) == (4, 0, 3, 2)
    assert per["out_of_order"] == 0  # a late duplicate is not a reordering


def test_ordering_violations_per_publisher_and_topic(spark: SparkSession) -> None:
    tr = Trace().subscribe("s1", "n2", "load/#", 1)
    for seq in range(6):
        tr.publish(0, seq, TOPIC, "n1", at=seq)
        tr.publish(1, seq, "load/r/n2/0", "n2", at=seq)
    # publisher 0 arrives 0 1 3 2 5 4 (2 and 4 are late); publisher 1 in order, interleaved
    for a, seq in enumerate((0, 1, 3, 2, 5, 4)):
        tr.receive("s1", "n2", 0, seq, TOPIC, at=10 + a)
        tr.receive("s1", "n2", 1, a, "load/r/n2/0", at=10 + a)
    d = tr.deliveries(spark)
    got = rows(metrics.violations(d))
    assert [(r["pub"], r["topic"], r["out_of_order"], r["qos"]) for r in got] == [
        (0, TOPIC, 2, 1)]
    (per,) = rows(metrics.per_subscriber(d))
    assert per["out_of_order"] == 2 and per["lost"] == 0


def test_ordering_follows_arrival_order_not_receive_time(spark: SparkSession) -> None:
    tr = Trace().subscribe("s1", "n2", "load/#", 1)
    for seq in range(3):
        tr.publish(0, seq, TOPIC, "n1", at=seq)
    # arrival numbers decide: seq 2 arrives before seq 1 although its clock reads later
    tr.receive("s1", "n2", 0, 0, TOPIC, at=5).receive("s1", "n2", 0, 2, TOPIC, at=9)
    tr.receive("s1", "n2", 0, 1, TOPIC, at=6)
    assert [r["out_of_order"] for r in rows(metrics.violations(tr.deliveries(spark)))] == [1]


def test_latency_quantiles_per_node_pair(spark: SparkSession) -> None:
    tr = Trace().subscribe("s2", "n2", "load/#", 1).subscribe("s1", "n1", "load/#", 1)
    for seq in range(100):  # n1 -> n2: latencies 1..100 ms; n1 -> n1: 0.5 ms
        tr.publish(0, seq, TOPIC, "n1", at=seq * 200)
        tr.receive("s2", "n2", 0, seq, TOPIC, at=seq * 200 + seq + 1)
        tr.receive("s1", "n1", 0, seq, TOPIC, at=seq * 200 + 0.5)
    got = {(r["origin"], r["dest"]): r for r in rows(metrics.latency_by_pair(tr.deliveries(
        spark)))}
    far, near = got[("n1", "n2")], got[("n1", "n1")]
    assert (far["count"], far["p50_ms"], far["p95_ms"], far["p99_ms"], far["max_ms"]) == (
        100, 50.0, 95.0, 99.0, 100.0)
    assert (near["p50_ms"], near["max_ms"]) == (0.5, 0.5)
    assert far["cdf"][0] == 1.0 and far["cdf"][-1] == 100.0 and len(far["cdf"]) == 101


def test_latency_counts_the_first_copy_only(spark: SparkSession) -> None:
    tr = Trace().subscribe("s2", "n2", "load/#", 1).publish(0, 0, TOPIC, "n1", at=0)
    tr.receive("s2", "n2", 0, 0, TOPIC, at=3).receive("s2", "n2", 0, 0, TOPIC, at=900)
    (r,) = rows(metrics.latency_by_pair(tr.deliveries(spark)))
    assert (r["count"], r["max_ms"]) == (1, 3.0)


def test_unexpected_copies_are_not_lost_or_delivered(spark: SparkSession) -> None:
    tr = Trace().subscribe("s1", "n2", "load/#", 1, at=10)
    tr.publish(0, 0, TOPIC, "n1", at=5).publish(0, 1, TOPIC, "n1", at=15)
    tr.receive("s1", "n2", 0, 0, TOPIC, at=6).receive("s1", "n2", 0, 1, TOPIC, at=16)
    tr.receive("s1", "n2", 7, 0, TOPIC, at=17)  # no pub record at all
    (per,) = rows(metrics.per_subscriber(tr.deliveries(spark)))
    assert (per["expected"], per["delivered"], per["lost"], per["unexpected"]) == (1, 1, 0, 2)


def test_cross_node_bytes_count_each_message_once_per_node(spark: SparkSession) -> None:
    tr = (Trace().subscribe("a", "n2", "load/#").subscribe("b", "n2", "load/#")
          .subscribe("c", "n1", "load/#").subscribe("d", "n3", "load/#"))
    for seq in range(3):
        tr.publish(0, seq, TOPIC, "n1", at=seq, size=50)
        for sub, node in (("a", "n2"), ("b", "n2"), ("c", "n1")):
            tr.receive(sub, node, 0, seq, TOPIC, at=seq + 1)
    tr.receive("d", "n3", 0, 0, TOPIC, at=1)  # n3 got only seq 0
    got = rows(metrics.cross_node_bytes(tr.deliveries(spark)), "dest")
    per_msg = 50 + len(TOPIC)
    assert [(r["origin"], r["dest"], r["messages"], r["bytes"]) for r in got] == [
        ("n1", "n2", 3, 3 * per_msg), ("n1", "n3", 1, per_msg)]


def test_timeline_buckets_published_expected_lost_and_delivered(spark: SparkSession) -> None:
    tr = Trace().subscribe("s1", "n2", "load/#", 1)
    # bucket 0 (0-1 s): seq 0, 1 published; 1 is lost. bucket 1: seq 2, delivered in bucket 2
    tr.publish(0, 0, TOPIC, "n1", at=100).publish(0, 1, TOPIC, "n1", at=900)
    tr.publish(0, 2, TOPIC, "n1", at=1500)
    tr.receive("s1", "n2", 0, 0, TOPIC, at=200).receive("s1", "n2", 0, 2, TOPIC, at=2100)
    d = tr.deliveries(spark)
    t0 = T0 + 100 * MS
    got = rows(metrics.timeline(tr.frame(spark).where("kind = 'pub'"), d, t0, 10**9),
               "bucket_s")
    assert [(r["bucket_s"], r["published"], r["expected"], r["lost"], r["delivered"])
            for r in got] == [(0.0, 2, 2, 1, 1), (1.0, 1, 1, 0, 0), (2.0, 0, 0, 0, 1)]
    lat = rows(metrics.latency_timeline(d, t0, 10**9), "bucket_s")
    assert [(r["bucket_s"], r["count"], r["p50_ms"], r["p99_ms"], r["max_ms"]) for r in lat] == [
        (0.0, 1, 100.0, 100.0, 100.0), (1.0, 1, 600.0, 600.0, 600.0)]


def test_latency_over_time_per_node_pair(spark: SparkSession) -> None:
    tr = Trace().subscribe("s2", "n2", "load/#", 1).subscribe("s1", "n1", "load/#", 1)
    for seq in range(10):  # bucket 0: n1 -> n2 latencies 1..10 ms, n1 -> n1 0.5 ms
        tr.publish(0, seq, TOPIC, "n1", at=seq * 50)
        tr.receive("s2", "n2", 0, seq, TOPIC, at=seq * 50 + seq + 1)
        tr.receive("s1", "n1", 0, seq, TOPIC, at=seq * 50 + 0.5)
    tr.publish(0, 10, TOPIC, "n1", at=1500)  # bucket 1: 20 ms; lost at n1
    tr.receive("s2", "n2", 0, 10, TOPIC, at=1520)
    got = rows(metrics.latency_timeline(tr.deliveries(spark), T0, 10**9), "dest", "bucket_s")
    assert [(r["dest"], r["bucket_s"], r["count"], r["p50_ms"], r["p95_ms"], r["p99_ms"],
             r["max_ms"]) for r in got] == [
        ("n1", 0.0, 10, 0.5, 0.5, 0.5, 0.5),
        ("n2", 0.0, 10, 5.0, 10.0, 10.0, 10.0), ("n2", 1.0, 1, 20.0, 20.0, 20.0, 20.0)]


def test_bucket_width_keeps_at_most_120_buckets() -> None:
    s = 1_000_000_000
    assert metrics.bucket_width_ns(0) == s
    assert metrics.bucket_width_ns(120 * s) == s
    assert metrics.bucket_width_ns(121 * s) == 2 * s
    assert metrics.bucket_width_ns(3600 * s) == 30 * s
