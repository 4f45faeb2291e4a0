"""Reading trace records (adapter) and splitting them by kind (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.schema import (
    CORRUPT,
    HOP_COLUMNS,
    KINDS,
    PUB_COLUMNS,
    RECORD,
    RECV_COLUMNS,
    SCHEMA_VERSION,
    SUB_COLUMNS,
)


@dataclass(frozen=True)
class Traces:
    """The records of one trace folder, by kind (only valid version-1 records)."""

    pub: DataFrame
    recv: DataFrame
    sub: DataFrame
    unsub: DataFrame
    hop: DataFrame  # sidecar hop records (none unless the cluster wrote them)
    raw: DataFrame  # every line, parsed (may be cached: see `load`)


def read_raw(spark: SparkSession, path: str) -> DataFrame:
    """Every line of every `*.jsonl*` file under `path` (gzip is read transparently)."""
    return (spark.read.schema(RECORD)
            .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
            .option("recursiveFileLookup", "true").option("pathGlobFilter", "*.jsonl*")
            .json(path))


def split(raw: DataFrame) -> Traces:
    """The valid records of each kind; see `check` for the others."""
    ok = raw.where(F.col(CORRUPT).isNull() & (F.col("v") == SCHEMA_VERSION))

    def kind(name: str, cols: tuple[str, ...]) -> DataFrame:
        return ok.where(F.col("kind") == name).select(*cols)

    return Traces(kind("pub", PUB_COLUMNS), kind("recv", RECV_COLUMNS),
                  kind("sub", SUB_COLUMNS), kind("unsub", SUB_COLUMNS),
                  kind("hop", HOP_COLUMNS), raw)


def check(raw: DataFrame) -> dict[str, int]:
    """Counts of records per kind and of the ones skipped: unparsable lines, other schema
    versions, unknown kinds (one aggregation; nothing record-level leaves the executors)."""
    valid = F.col(CORRUPT).isNull() & (F.col("v") == SCHEMA_VERSION)
    known = F.col("kind").isin(*KINDS)
    row = raw.agg(
        *[F.sum((valid & (F.col("kind") == k)).cast("long")).alias(k) for k in KINDS],
        F.sum(F.col(CORRUPT).isNotNull().cast("long")).alias("unparsable"),
        F.sum((F.col(CORRUPT).isNull() & (F.col("v") != SCHEMA_VERSION)).cast("long"))
        .alias("other_version"),
        F.max(F.when(F.col(CORRUPT).isNull(), F.col("v"))).alias("max_version"),
        F.sum((valid & ~known).cast("long")).alias("unknown_kind"),
    ).first()
    return {k: int(row[k] or 0) for k in row.asDict()}


def load(spark: SparkSession, path: str) -> tuple[Traces, dict[str, int]]:
    """Read, cache and check the traces under `path` (unpersist `raw` when done)."""
    raw = read_raw(spark, path).persist(StorageLevel.MEMORY_AND_DISK)
    return split(raw), check(raw)
