"""One local SparkSession for the whole test session (a JVM start costs seconds)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the pipeline extra is not installed (make install)")

from pyspark.errors import PySparkRuntimeError  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from pipeline import session  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    conf = json.loads(os.environ.get("MQFED_TEST_SPARK_CONF", "{}"))
    try:
        s = session.build("local[2]", app="mqfed-audit-tests", shuffle_partitions=2, conf=conf)
    except PySparkRuntimeError as exc:  # the JVM launcher died before exec (see tests/conftest)
        print(f"the Spark JVM did not start ({exc}); trying once more")
        s = session.build("local[2]", app="mqfed-audit-tests", shuffle_partitions=2, conf=conf)
    try:
        yield s
    finally:
        s.stop()
