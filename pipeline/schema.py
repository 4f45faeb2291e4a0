"""The trace record schema (version 1): one Spark schema for every kind of record."""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

SCHEMA_VERSION = 1
KINDS = ("pub", "recv", "sub", "unsub", "hop")
CORRUPT = "_corrupt"  # the raw line of a record that could not be parsed

RECORD = StructType([
    StructField("v", IntegerType()),  # schema version
    StructField("kind", StringType()),  # pub | recv | sub | unsub | hop
    StructField("run", StringType()),  # load run id
    StructField("pub", IntegerType()),  # publisher index within the run
    StructField("seq", LongType()),  # message number of that publisher
    StructField("sub", StringType()),  # subscriber id within the run
    StructField("node", StringType()),  # node the publisher/subscriber is connected to
    StructField("topic", StringType()),
    StructField("filter", StringType()),  # sub/unsub: the topic filter
    StructField("qos", IntegerType()),  # pub: sent QoS; recv: received; sub: granted
    StructField("t", LongType()),  # wall clock, ns since the epoch
    StructField("size", IntegerType()),  # pub: payload bytes
    StructField("dup", BooleanType()),  # recv: the DUP flag
    StructField("i", LongType()),  # recv: arrival number at this subscriber
    StructField("event", StringType()),  # hop: forwarded | received | reinjected | acked
    StructField("peer", StringType()),  # hop: forwarded: the target; else: the sender
    StructField("id", StringType()),  # hop: the origin's message id (node/incarnation/seq)
    StructField("hlc", LongType()),  # hop: the node's hybrid logical clock (packed)
    StructField(CORRUPT, StringType()),
])

PUB_COLUMNS = ("run", "pub", "seq", "topic", "qos", "node", "t", "size")
RECV_COLUMNS = ("run", "sub", "node", "pub", "seq", "topic", "qos", "dup", "t", "i")
SUB_COLUMNS = ("run", "sub", "node", "filter", "qos", "t")
HOP_COLUMNS = ("event", "node", "peer", "topic", "pub", "seq", "qos", "id", "hlc", "t")
