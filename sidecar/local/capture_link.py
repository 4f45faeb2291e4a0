"""The capture socket, sidecar side (asyncio adapter; issue 25, slice 2).

The plugin (`capture_socket` option) connects to a unix stream socket the sidecar listens on,
writes a hello, then MQFB batches of the messages `.fwd` would have received over MQTT
(sidecar/local/capture_wire.py has the format). This adapter listens, accepts the plugin's
connection (one at a time: a new one replaces the old), and hands what it reads to two
callbacks:

    on_hello(hello) -> int      the seq the sidecar already has every record up to (0: none,
                                e.g. for an epoch it has not seen); sent as the resume
    on_batch(hello, batch)      a CapturedBatch (records decoded, and the raw bytes)

and `ack(seq, listed)` settles records. Records not acknowledged are sent again after the
next resume, so a record is settled only once its owner no longer needs the plugin's copy.
Bad bytes from the plugin close the connection (it reconnects within a second).

Whoever can connect to the socket can hand the sidecar records as if it were the plugin: put
it in a folder only Mosquitto's user and the sidecar can reach (the private listener's folder,
`sidecar.node.layout` `socket_dir`: owned by that user, mode 0700), which is why the socket
file itself may be 0666.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from sidecar.local.capture_wire import (
    CapturedBatch,
    CaptureDecoder,
    CaptureWireError,
    Hello,
    encode_ack,
    encode_resume,
)

log = logging.getLogger("mqfed.capture")

READ_SIZE = 1 << 16


class CaptureLink:
    """Listens on `path` for the plugin's capture connection."""

    def __init__(self, path: str | Path, on_hello: Callable[[Hello], int],
                 on_batch: Callable[[Hello, CapturedBatch], None],
                 mode: int | None = 0o666) -> None:
        """`mode`: the socket file's permissions after binding (Mosquitto, which connects,
        may run as another user); None leaves them to the umask."""
        self.path = Path(path)
        self._on_hello = on_hello
        self._on_batch = on_batch
        self._mode = mode
        self._server: asyncio.AbstractServer | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._hello: Hello | None = None
        self.connections = 0
        self.batches = 0
        self.records = 0
        self.errors = 0

    @property
    def hello(self) -> Hello | None:
        """The current connection's hello (None: no connection, or no hello yet)."""
        return self._hello

    @property
    def connected(self) -> bool:
        """A plugin connection whose hello was answered with a resume."""
        return self._writer is not None and self._hello is not None

    async def start(self) -> None:
        """Listen (a stale socket file at `path` is removed first)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        if self._mode is not None:
            os.chmod(self.path, self._mode)

    async def close(self) -> None:
        """Stop listening and close the connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self._drop()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def ack(self, seq: int, listed: Iterable[int] = ()) -> bool:
        """Settle every record <= seq and the listed ones above it; False (nothing sent)
        without a connection that got its resume."""
        if not self.connected:
            return False
        assert self._writer is not None
        self._writer.write(encode_ack(seq, listed))
        return True

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        self._hello = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._writer is not None:
            log.warning("capture: a new plugin connection replaces the current one")
            self._drop()
        self._writer = writer
        self.connections += 1
        decoder = CaptureDecoder()
        try:
            while data := await reader.read(READ_SIZE):
                for item in decoder.feed(data):
                    if writer is not self._writer:
                        return
                    self._handle(item, writer)
        except (CaptureWireError, ValueError) as exc:
            self.errors += 1
            log.error("capture: closing the plugin's connection: %s", exc)
        except (ConnectionError, OSError) as exc:
            log.warning("capture: the plugin's connection failed: %s", exc)
        finally:
            if writer is self._writer:
                self._drop()
            else:
                writer.close()

    def _handle(self, item: Hello | CapturedBatch, writer: asyncio.StreamWriter) -> None:
        if isinstance(item, Hello):
            seq = self._on_hello(item)
            self._hello = item
            writer.write(encode_resume(seq))
            log.info("capture: plugin epoch %016x connected (next seq %d), resuming after %d",
                     item.epoch, item.next_seq, seq)
            return
        assert self._hello is not None
        self.batches += 1
        self.records += len(item.records)
        self._on_batch(self._hello, item)
