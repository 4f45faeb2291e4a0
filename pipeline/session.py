"""The SparkSession of the audit: local on loopback by default, any cluster with a master."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

LOCAL = "local[*]"


def under_spark_submit() -> bool:
    """True when this Python was started by `spark-submit` (which sets the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build(master: str | None = None, app: str = "mqfed-audit",
          shuffle_partitions: int | None = None,
          conf: dict[str, str] | None = None) -> SparkSession:
    """A session for `master`; without one, `local[*]` unless spark-submit chose it.

    Local masters bind to 127.0.0.1 with the UI off, so nothing listens beyond loopback.
    """
    if master is None and not under_spark_submit():
        master = LOCAL
    builder = (SparkSession.builder.appName(app).config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 8)))
    elif shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
