"""The audit's metric definitions, as DataFrame transforms (pure: no I/O, no driver collects).

A message is (run, pub, seq). Its *expected* subscribers are the subscriptions of the same run
whose filter matches its topic and that were in place when it was published (`sub` record
time <= publish time < `unsub` record time). The delivery QoS is min(publish QoS, granted
QoS), the highest over a subscriber's matching filters. `deliveries` joins expected with the
first copy each subscriber got; every metric below is computed from it.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

MS = 1e6  # ns per ms
QUANTILES = (0.5, 0.95, 0.99)
ACCURACY = 10000  # percentile_approx: relative rank error 1/ACCURACY (exact for small groups)


def filter_regex(filt: Column) -> Column:
    """The Java regex that matches exactly the topics an MQTT topic filter matches."""
    escaped = F.regexp_replace(filt, r"([\\.\[\]{}()*?^$|])", r"\\$1")
    plus = F.regexp_replace(escaped, r"\+", "[^/]*")
    body = F.when(plus == "#", F.lit(".*")).otherwise(
        F.regexp_replace(plus, "/#$", "(/.*)?"))
    # wildcards at the first level never match topics starting with '$'
    guard = F.when(filt.startswith("+") | filt.startswith("#"), F.lit("(?!\\$)")).otherwise("")
    return F.concat(F.lit("^"), guard, body, F.lit("$"))


def subscriptions(sub: DataFrame, unsub: DataFrame) -> DataFrame:
    """One row per (run, sub, filter): node, granted qos, since, until (null = still on)."""
    started = sub.groupBy("run", "sub", "filter").agg(
        F.first("node").alias("dest"), F.max("qos").alias("granted"), F.min("t").alias("since"))
    ended = unsub.groupBy("run", "sub", "filter").agg(F.max("t").alias("until"))
    return (started.join(ended, ["run", "sub", "filter"], "left")
            .withColumn("regex", filter_regex(F.col("filter"))))


def expected(pub: DataFrame, subs: DataFrame) -> DataFrame:
    """(message, subscriber) pairs that should be delivered, with the delivery QoS."""
    p, s = pub.alias("p"), F.broadcast(subs).alias("s")
    cond = ((F.col("p.run") == F.col("s.run")) & F.expr("p.topic rlike s.regex")
            & (F.col("p.t") >= F.col("s.since"))
            & (F.col("s.until").isNull() | (F.col("p.t") < F.col("s.until"))))
    return (p.join(s, cond)
            .groupBy("p.run", "p.pub", "p.seq", "s.sub")
            .agg(F.max(F.least(F.col("p.qos"), F.col("s.granted"))).alias("qos"),
                 F.first("s.dest").alias("dest")))


def first_copies(recv: DataFrame) -> DataFrame:
    """Per (run, sub, message): copies received, DUP-flagged copies, the first copy's time,
    arrival number, node, topic and QoS."""
    first = F.min(F.struct("i", "t", "node", "topic", "qos"))
    return (recv.groupBy("run", "sub", "pub", "seq")
            .agg(F.count(F.lit(1)).alias("copies"),
                 F.sum(F.col("dup").cast("long")).alias("dup_flagged"), first.alias("f"))
            .select("run", "sub", "pub", "seq", "copies", "dup_flagged",
                    F.col("f.i").alias("i_first"), F.col("f.t").alias("t_recv"),
                    F.col("f.node").alias("recv_node"), F.col("f.topic").alias("recv_topic"),
                    F.col("f.qos").alias("recv_qos")))


def deliveries(pub: DataFrame, exp: DataFrame, copies: DataFrame) -> DataFrame:
    """One row per expected or received (message, subscriber): `expected`, `received`,
    `copies`, origin and destination node, delivery QoS, latency (ms) and `out_of_order`."""
    key = ["run", "pub", "seq", "sub"]
    p = pub.select("run", "pub", "seq", F.col("topic").alias("pub_topic"),
                   F.col("node").alias("origin"), F.col("t").alias("t_pub"), "size")
    joined = (exp.withColumn("expected", F.lit(True))
              .join(copies.withColumn("received", F.lit(True)), key, "full")
              .join(p, ["run", "pub", "seq"], "left"))
    rows = joined.select(
        *key, F.coalesce("expected", F.lit(False)).alias("expected"),
        F.coalesce("received", F.lit(False)).alias("received"),
        F.coalesce("copies", F.lit(0)).alias("copies"),
        F.coalesce("dup_flagged", F.lit(0)).alias("dup_flagged"),
        F.coalesce("pub_topic", "recv_topic").alias("topic"), "origin",
        F.coalesce("dest", "recv_node").alias("dest"),
        F.coalesce(F.col("qos"), F.col("recv_qos")).alias("qos"),
        "t_pub", "t_recv", "i_first", "size",
        ((F.col("t_recv") - F.col("t_pub")) / MS).alias("latency_ms"))
    return ordering(rows)


def ordering(rows: DataFrame) -> DataFrame:
    """Adds `out_of_order`: a first copy that arrived after a higher seq of the same
    (run, subscriber, publisher, topic) had arrived."""
    w = (Window.partitionBy("run", "sub", "pub", "topic").orderBy("i_first")
         .rowsBetween(Window.unboundedPreceding, -1))
    before = F.max(F.when(F.col("received"), F.col("seq"))).over(w)
    flag = F.col("received") & before.isNotNull() & (F.col("seq") < before)
    return rows.withColumn("out_of_order", F.coalesce(flag, F.lit(False)))


def per_subscriber(d: DataFrame) -> DataFrame:
    """Per (run, subscriber, node, QoS): expected, delivered, lost, duplicates,
    out_of_order, unexpected (received but not expected), dup_flagged copies."""
    lng = lambda c: F.sum(c.cast("long"))  # noqa: E731
    return (d.groupBy("run", "sub", "dest", "qos")
            .agg(lng(F.col("expected")).alias("expected"),
                 lng(F.col("expected") & F.col("received")).alias("delivered"),
                 lng(F.col("expected") & ~F.col("received")).alias("lost"),
                 F.sum(F.greatest(F.col("copies") - 1, F.lit(0))).alias("duplicates"),
                 lng(F.col("out_of_order")).alias("out_of_order"),
                 lng(~F.col("expected") & F.col("received")).alias("unexpected"),
                 F.sum("dup_flagged").alias("dup_flagged"))
            .withColumnRenamed("dest", "node"))


def lost(d: DataFrame) -> DataFrame:
    """Every lost (message, subscriber)."""
    return (d.where(F.col("expected") & ~F.col("received"))
            .select("run", "sub", F.col("dest").alias("node"), "origin", "pub", "topic", "seq",
                    "qos", "t_pub"))


def lost_ranges(lost_rows: DataFrame) -> DataFrame:
    """Lost messages as runs of consecutive seqs per (run, sub, publisher, topic, QoS)."""
    part = ["run", "sub", "node", "origin", "pub", "topic", "qos"]
    w = Window.partitionBy(*part).orderBy("seq")
    return (lost_rows.withColumn("grp", F.col("seq") - F.row_number().over(w))
            .groupBy(*part, "grp")
            .agg(F.min("seq").alias("first_seq"), F.max("seq").alias("last_seq"),
                 F.count(F.lit(1)).alias("count"))
            .drop("grp"))


def violations(d: DataFrame) -> DataFrame:
    """Out-of-order first copies per (run, sub, publisher, topic, QoS)."""
    return (d.where(F.col("out_of_order"))
            .groupBy("run", "sub", F.col("dest").alias("node"), "origin", "pub", "topic", "qos")
            .agg(F.count(F.lit(1)).alias("out_of_order")))


def _timed(d: DataFrame) -> DataFrame:
    return d.where(F.col("received") & F.col("t_pub").isNotNull())


def latency_by_pair(d: DataFrame, points: int = 100) -> DataFrame:
    """Per (origin node, destination node): count, p50/p95/p99/max latency in ms (first
    copies of messages with a `pub` record), and `cdf`: the latency at the quantiles
    0, 1/points, ..., 1 (for charts), from the same aggregation."""
    cdf = [i / points for i in range(points + 1)]
    q = F.percentile_approx("latency_ms", [*QUANTILES, *cdf], ACCURACY)
    return (_timed(d).groupBy("origin", "dest")
            .agg(F.count(F.lit(1)).alias("count"), q.alias("q"),
                 F.max("latency_ms").alias("max_ms"))
            .select("origin", "dest", "count", F.col("q")[0].alias("p50_ms"),
                    F.col("q")[1].alias("p95_ms"), F.col("q")[2].alias("p99_ms"), "max_ms",
                    F.slice("q", len(QUANTILES) + 1, len(cdf)).alias("cdf")))


def bucket_width_ns(span_ns: int, buckets: int = 120) -> int:
    """A whole number of seconds (at least 1) that cuts `span_ns` into at most `buckets`."""
    seconds = max(1, -(-max(span_ns, 0) // (buckets * 1_000_000_000)))
    return seconds * 1_000_000_000


def _bucket(col: str, t0: int, width: int) -> Column:
    return F.floor((F.col(col) - F.lit(t0)) / F.lit(width)).cast("long")


def timeline(pub: DataFrame, d: DataFrame, t0: int, width: int) -> DataFrame:
    """Per time bucket (`bucket` = start in s from t0): messages published, deliveries
    expected and lost (by publish time), delivered (by receive time)."""
    published = pub.groupBy(_bucket("t", t0, width).alias("b")).agg(
        F.count(F.lit(1)).alias("published"))
    exp = d.where(F.col("expected") & F.col("t_pub").isNotNull()).groupBy(
        _bucket("t_pub", t0, width).alias("b")).agg(
        F.count(F.lit(1)).alias("expected"),
        F.sum((~F.col("received")).cast("long")).alias("lost"))
    got = d.where(F.col("received")).groupBy(_bucket("t_recv", t0, width).alias("b")).agg(
        F.count(F.lit(1)).alias("delivered"))
    return (published.join(exp, "b", "full").join(got, "b", "full").na.fill(0)
            .select((F.col("b") * (width / 1e9)).alias("bucket_s"), "published", "expected",
                    "lost", "delivered",
                    (F.col("delivered") / (width / 1e9)).alias("delivered_per_s")))


def latency_timeline(d: DataFrame, t0: int, width: int) -> DataFrame:
    """Per node pair and publish-time bucket: count, p50/p95/p99/max latency (ms)."""
    q = F.percentile_approx("latency_ms", list(QUANTILES), ACCURACY)
    return (_timed(d).groupBy("origin", "dest", _bucket("t_pub", t0, width).alias("b"))
            .agg(F.count(F.lit(1)).alias("count"), q.alias("q"),
                 F.max("latency_ms").alias("max_ms"))
            .select("origin", "dest", (F.col("b") * (width / 1e9)).alias("bucket_s"), "count",
                    F.col("q")[0].alias("p50_ms"), F.col("q")[1].alias("p95_ms"),
                    F.col("q")[2].alias("p99_ms"), "max_ms"))


def cross_node_bytes(d: DataFrame) -> DataFrame:
    """Per (origin, destination) with origin != destination: messages that had to cross
    to that node (each once, however many subscribers it has there) and their bytes
    (payload + topic), which is what the cluster forwards for them."""
    crossed = (d.where(F.col("received") & F.col("origin").isNotNull()
                       & (F.col("origin") != F.col("dest")))
               .select("run", "pub", "seq", "origin", "dest",
                       (F.col("size") + F.octet_length("topic")).alias("bytes"))
               .dropDuplicates(["run", "pub", "seq", "dest"]))
    return crossed.groupBy("origin", "dest").agg(F.count(F.lit(1)).alias("messages"),
                                                 F.sum("bytes").alias("bytes"))


# ---- sidecar hop records -----------------------------------------------------------------

HOP_EVENTS = ("forwarded", "received", "reinjected", "acked")
LOST_AT = {
    "same_node": "publisher and subscriber on one node: its broker",
    "origin": "the origin: never forwarded to the subscriber's node",
    "link": "between the nodes: forwarded, never received",
    "dest_sidecar": "the subscriber's node's sidecar: received, never re-injected",
    "dest_broker": "the subscriber's node's broker: re-injected, never acknowledged",
    "delivery": "the subscriber's node's broker: acknowledged, never delivered",
}
"""Where a lost message was lost: after the last hop its records reached."""
HOP_STAGES = ("origin", "link", "dest_sidecar", "dest_broker")
"""Delay stages: pub→forwarded (origin), forwarded→received (link), received→re-injected
(dest_sidecar), re-injected→the subscriber's first copy (dest_broker)."""


def hop_times(hop: DataFrame) -> DataFrame:
    """Per (topic, pub, seq, node the message went to): the first time of each hop event
    (a column per event; null when no record says so). Records without (pub, seq) are not
    the load generator's and are left out."""
    dest = F.when(F.col("event") == "forwarded", F.col("peer")).otherwise(F.col("node"))
    return (hop.where(F.col("pub").isNotNull() & F.col("event").isin(*HOP_EVENTS))
            .groupBy("topic", "pub", "seq", dest.alias("node"))
            .pivot("event", list(HOP_EVENTS)).agg(F.min("t")))


def lost_at(lost_rows: DataFrame, times: DataFrame) -> DataFrame:
    """Every lost (message, subscriber) with `lost_at` (a key of `LOST_AT`)."""
    j = lost_rows.join(times, ["topic", "pub", "seq", "node"], "left")
    stage = (F.when(F.col("origin") == F.col("node"), "same_node")
             .when(F.col("acked").isNotNull(), "delivery")
             .when(F.col("reinjected").isNotNull(), "dest_broker")
             .when(F.col("received").isNotNull(), "dest_sidecar")
             .when(F.col("forwarded").isNotNull(), "link")
             .otherwise("origin"))
    return j.select(*lost_rows.columns, stage.alias("lost_at"))


def lost_by_hop(located: DataFrame) -> DataFrame:
    """Per (origin, subscriber's node, lost_at): how many deliveries were lost there."""
    return (located.groupBy("origin", F.col("node").alias("dest"), "lost_at")
            .agg(F.count(F.lit(1)).alias("lost")))


def hop_latency(d: DataFrame, times: DataFrame) -> DataFrame:
    """Per (origin, destination, stage of `HOP_STAGES`): count, p50/p99/max ms, over the
    cross-node deliveries whose hop records are all there (each node's wall clock: skew
    between machines shows here)."""
    got = (d.where(F.col("received") & F.col("t_pub").isNotNull()
                   & (F.col("origin") != F.col("dest")))
           .select("topic", "pub", "seq", F.col("dest").alias("node"), "origin", "t_pub",
                   "t_recv")
           .join(times, ["topic", "pub", "seq", "node"]))
    spans = {"origin": (F.col("forwarded") - F.col("t_pub")),
             "link": (F.col("received") - F.col("forwarded")),
             "dest_sidecar": (F.col("reinjected") - F.col("received")),
             "dest_broker": (F.col("t_recv") - F.col("reinjected"))}
    parts = [got.select("origin", F.col("node").alias("dest"), F.lit(name).alias("stage"),
                        (span / MS).alias("ms")).where(F.col("ms").isNotNull())
             for name, span in spans.items()]
    stacked = parts[0]
    for part in parts[1:]:
        stacked = stacked.unionByName(part)
    q = F.percentile_approx("ms", [0.5, 0.99], ACCURACY)
    return (stacked.groupBy("origin", "dest", "stage")
            .agg(F.count(F.lit(1)).alias("count"), q.alias("q"), F.max("ms").alias("max_ms"))
            .select("origin", "dest", "stage", "count", F.col("q")[0].alias("p50_ms"),
                    F.col("q")[1].alias("p99_ms"), "max_ms"))
