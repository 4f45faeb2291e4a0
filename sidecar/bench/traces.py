"""Trace records of the load generator: JSON lines, schema version 1 (docs/traces.md).

Four kinds: `pub` (one per publish), `recv` (one per copy a subscriber got), `sub` (a
subscription is in place and routed) and `unsub` (it ended). A message is identified by
(run, pub, seq). Files are rotated every `max_records` lines; each writer owns its files, so
publisher processes and the subscribing process never share one.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TextIO

from sidecar.bench import payload

SCHEMA_VERSION = 1
MAX_RECORDS = 500_000  # lines per file before rotating
_Q = json.dumps  # JSON string quoting for topics and ids


def pub_line(run: str, pub: int, seq: int, topic: str, qos: int, node: str, t: int,
             size: int) -> str:
    """One `pub` record: publisher `pub` of `run` sent `seq` on `topic` at `t` (ns)."""
    return (f'{{"v":1,"kind":"pub","run":{_Q(run)},"pub":{pub},"seq":{seq},'
            f'"topic":{_Q(topic)},"qos":{qos},"node":{_Q(node)},"t":{t},"size":{size}}}\n')


def recv_line(run: str, sub: str, node: str, pub: int, seq: int, topic: str, qos: int,
              dup: bool, t: int, i: int) -> str:
    """One `recv` record: subscriber `sub` on `node` got a copy, the `i`-th it got."""
    return (f'{{"v":1,"kind":"recv","run":{_Q(run)},"sub":{_Q(sub)},"node":{_Q(node)},'
            f'"pub":{pub},"seq":{seq},"topic":{_Q(topic)},"qos":{qos},'
            f'"dup":{"true" if dup else "false"},"t":{t},"i":{i}}}\n')


def sub_line(kind: str, run: str, sub: str, node: str, topic_filter: str, qos: int,
             t: int) -> str:
    """A `sub` (subscribed and routed) or `unsub` (ended) record."""
    return (f'{{"v":1,"kind":"{kind}","run":{_Q(run)},"sub":{_Q(sub)},"node":{_Q(node)},'
            f'"filter":{_Q(topic_filter)},"qos":{qos},"t":{t}}}\n')


class TraceWriter:
    """Appends lines to `<dir>/<name>-NNNN.jsonl`, starting a new file every `max_records`."""

    def __init__(self, directory: str | Path, name: str, max_records: int = MAX_RECORDS) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.max_records = max_records
        self.files: list[Path] = []
        self._count = 0
        self._file: TextIO | None = None
        self._lock = threading.Lock()

    def _rotate(self) -> TextIO:
        if self._file is not None:
            self._file.close()
        path = self.dir / f"{self.name}-{len(self.files):04d}.jsonl"
        self.files.append(path)
        self._count = 0
        self._file = open(path, "w", buffering=1 << 20)  # noqa: SIM115 (closed in close())
        return self._file

    def write(self, line: str) -> None:
        """Write one record line (as made by the `*_line` functions)."""
        with self._lock:
            f = self._file
            if f is None or self._count >= self.max_records:
                f = self._rotate()
            f.write(line)
            self._count += 1

    def flush(self) -> None:
        """Hand what is buffered to the OS (a killed process then loses none of it)."""
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class ReceivedTracer:
    """Writes a traced `Subscriber`'s records as `recv` lines from a background thread, so the
    paho callback only appends a tuple (see `Subscriber(trace=True)`)."""

    def __init__(self, writer: TraceWriter, run: str, sub: str, node: str,
                 records: list, interval: float = 0.2) -> None:
        self.writer, self.run, self.sub, self.node = writer, run, sub, node
        self.records = records
        self.interval = interval
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"trace-{sub}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> None:
        """Write the records that arrived since the last flush (decoding their headers)."""
        end = len(self.records)
        for i in range(self.done, end):
            header, t, dup, topic, qos = self.records[i]
            stamp = payload.decode(header)
            if stamp is not None:
                self.writer.write(recv_line(self.run, self.sub, self.node, stamp.publisher,
                                            stamp.seq, topic, qos, dup, t, i))
        self.done = end

    def stop(self) -> None:
        """Stop the thread and write whatever is left."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()
