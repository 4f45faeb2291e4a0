"""The sidecar's end of the capture socket for plugin tests: a threaded unix-socket listener
that decodes the plugin's hello and batches (sidecar.local.capture_wire) and answers with
resumes and acks the test chooses."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sidecar.local.batch import Record
from sidecar.local.capture_wire import (
    CapturedBatch,
    CaptureDecoder,
    CaptureWireError,
    Hello,
    encode_ack,
    encode_resume,
)


class CapturePeer:
    """Listens on `path`. Every connection's hello is answered by `resume(hello)` (default:
    the highest seq received so far with every one before it, for that epoch; None: no resume
    is sent, the test sends one itself)."""

    def __init__(self, path: str | Path,
                 resume: Callable[[Hello], int | None] | None = None) -> None:
        self.path = str(path)
        self.resume_with = resume if resume is not None else self._contiguous
        self.cond = threading.Condition()
        self.hellos: list[Hello] = []
        self.batches: list[CapturedBatch] = []
        self.records: list[Record] = []
        self.closed_conns = 0
        self.errors: list[str] = []
        self.conn: socket.socket | None = None
        self._stop = threading.Event()
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.srv.bind(self.path)
        os.chmod(self.path, 0o666)  # Mosquitto runs as its own user
        self.srv.listen(4)
        self.srv.settimeout(0.1)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _contiguous(self, hello: Hello) -> int:
        seqs = {r.seq for r in self.records}
        seq = 0
        while seq + 1 in seqs:
            seq += 1
        return seq

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.cond:
                if self.conn is not None:
                    self.conn.close()
                self.conn = conn
            self._read(conn)

    def _read(self, conn: socket.socket) -> None:
        dec = CaptureDecoder()
        conn.settimeout(0.1)
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                items = dec.feed(data)
            except CaptureWireError as exc:
                with self.cond:
                    self.errors.append(str(exc))
                break
            for item in items:
                with self.cond:
                    if isinstance(item, Hello):
                        self.hellos.append(item)
                        seq = self.resume_with(item)
                        if seq is not None:
                            conn.sendall(encode_resume(seq))
                    else:
                        self.batches.append(item)
                        self.records.extend(item.records)
                    self.cond.notify_all()
        with self.cond:
            self.closed_conns += 1
            if self.conn is conn:
                self.conn = None
            self.cond.notify_all()
        conn.close()

    # -- the test's side
    def send(self, data: bytes) -> None:
        with self.cond:
            assert self.conn is not None, "no plugin connection"
            self.conn.sendall(data)

    def resume(self, seq: int, listed: tuple[int, ...] = ()) -> None:
        self.send(encode_resume(seq, listed))

    def ack(self, seq: int, listed: tuple[int, ...] = ()) -> None:
        self.send(encode_ack(seq, listed))

    def drop_connection(self) -> None:
        """Close the plugin's connection (it reconnects within a second)."""
        with self.cond:
            if self.conn is not None:
                self.conn.shutdown(socket.SHUT_RDWR)

    def wait(self, pred: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"capture peer: {what} (hellos {self.hellos}, "
                                       f"records {[r.seq for r in self.records]})")
                self.cond.wait(left)

    def wait_records(self, n: int, timeout: float = 5.0) -> list[Record]:
        self.wait(lambda: len(self.records) >= n, timeout, f"{n} records")
        return list(self.records)

    def wait_hellos(self, n: int, timeout: float = 5.0) -> list[Hello]:
        self.wait(lambda: len(self.hellos) >= n, timeout, f"{n} hellos")
        return list(self.hellos)

    def close(self) -> None:
        self._stop.set()
        self.srv.close()
        self._thread.join(2)
        with self.cond:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
