"""A TCP proxy on loopback that can cut one process off from a service (a partition)."""

from __future__ import annotations

import socket
import struct
import threading

from tests.harness.procs import free_port

__all__ = ["CuttableProxy"]


class CuttableProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target`. `cut()` black-holes it (nothing is
    forwarded, new connections hang unanswered, like a partition); `hold_answers()` stops only
    what the target sends back (its acknowledgements are held while requests still reach it);
    `restore()` heals both and the stalled data flows again; `drop()` resets the connections it
    holds, losing what they carried (a crashed machine's unsent bytes). Threads only: `close()`
    stops it all."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self._open = threading.Event()
        self._open.set()
        self._answers = threading.Event()   # what the target sends back may pass
        self._answers.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        threading.Thread(target=self._accept_loop, daemon=True, name="proxy-accept").start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._open.clear()

    def hold_answers(self) -> None:
        self._answers.clear()

    def restore(self) -> None:
        self._open.set()
        self._answers.set()

    def drop(self) -> None:
        """Reset every current connection (RST both ways); bytes held in the proxy or its
        socket buffers are lost. New connections are served as before (once restored)."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed = True
        self._open.set()
        self._answers.set()
        with self._lock:
            for sock in self._sockets:
                sock.close()
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            if not self._open.wait(0.2):
                continue  # cut: leave new connections unanswered in the backlog
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst, gate in ((client, upstream, self._open),
                                   (upstream, client, self._answers)):
                threading.Thread(target=self._pump, args=(src, dst, gate), daemon=True,
                                 name="proxy-pump").start()

    def _pump(self, src: socket.socket, dst: socket.socket, gate: threading.Event) -> None:
        src.settimeout(0.2)
        while not self._closed:
            if not self._open.wait(0.2) or not gate.wait(0.2):
                continue  # cut (or answers held): stop reading, so nothing passes
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            self._open.wait()
            gate.wait()
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
