"""Start, adopt, supervise and stop the node's Mosquitto process (adapter)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from sidecar.procinfo import pid_alive, runs

log = logging.getLogger("mqfed.broker")


class BrokerStartError(RuntimeError):
    """Mosquitto did not come up; the message carries the tail of its log."""


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def socket_accepts(path: Path) -> bool:
    """True if a unix-socket listener accepts connections at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


class MosquittoProcess:
    """One Mosquitto, in its own session so that it outlives a crashed sidecar.

    A sidecar that finds a live Mosquitto started with its config (pid file) adopts it
    instead of starting another: the plugin's state and every client stay intact.
    """

    def __init__(self, binary: str, conf_path: Path, socket_path: Path, run_dir: Path) -> None:
        self.binary = binary
        self.conf_path = conf_path
        self.socket_path = socket_path
        self.pid_path = run_dir / "mosquitto.pid"
        self.log_path = run_dir / "mosquitto.log"
        self.pid: int | None = None
        self.adopted = False
        self._popen: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def _recorded_pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def _spawn(self) -> None:
        with open(self.log_path, "ab") as logf:
            self._popen = subprocess.Popen(
                [self.binary, "-c", str(self.conf_path)], stdout=logf, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.pid = self._popen.pid
        self.adopted = False
        tmp = self.pid_path.with_suffix(".tmp")
        tmp.write_text(f"{self.pid}\n")
        tmp.replace(self.pid_path)

    async def start(self, timeout: float = 10.0) -> None:
        """Adopt the recorded Mosquitto if it still runs with our config, else start one."""
        recorded = self._recorded_pid()
        if runs(recorded, "mosquitto", str(self.conf_path)):
            self.pid, self.adopted, self._popen = recorded, True, None
            log.info("adopted running mosquitto", extra={"pid": recorded})
        else:
            if not Path(self.binary).exists():
                raise BrokerStartError(f"Mosquitto binary {self.binary} not found: install the "
                                       "Debian package (make install) or set mqtt.mosquitto")
            if self.socket_path.exists():
                self.socket_path.unlink()
            self._spawn()
        deadline = time.monotonic() + timeout
        while not socket_accepts(self.socket_path):
            if not self.alive():
                raise BrokerStartError(f"mosquitto exited during start-up; its log "
                                       f"{self.log_path} ends with:\n{_tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise BrokerStartError(f"mosquitto did not open {self.socket_path} within "
                                       f"{timeout:.0f}s; log tail:\n{_tail(self.log_path)}")
            await asyncio.sleep(0.05)

    async def supervise(self, on_restart) -> None:
        """Restart Mosquitto whenever it dies, with backoff; `on_restart()` after each."""
        backoff = 0.2
        while True:
            await asyncio.sleep(0.2)
            if self.alive():
                backoff = 0.2
                continue
            log.warning("mosquitto exited; restarting",
                        extra={"pid": self.pid, "log": str(self.log_path)})
            self._popen = None
            try:
                await self.start()
            except BrokerStartError as exc:
                log.error("mosquitto restart failed: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            self.restarts += 1
            await on_restart()

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM our Mosquitto (by PID), then SIGKILL after `timeout`."""
        pid = self.pid
        if pid is None or not self.alive():
            return
        if not runs(pid, "mosquitto"):
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.alive():
            os.kill(pid, signal.SIGKILL)
            while self.alive():
                await asyncio.sleep(0.05)
        try:
            self.pid_path.unlink()
        except FileNotFoundError:
            pass
