"""Start real processes for tests, keep their logs, and always stop them by PID."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sidecar.procinfo import pid_alive

__all__ = ["ManagedProcess", "ProcessGroup", "free_port", "pid_alive", "port_open", "wait_for"]


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that this test process has not
    handed out before. Taken from 10000-19999: below the kernel's ephemeral range (32768+), so
    no outgoing connection takes it as its source port while a restarted process is about to
    bind it again (seen on CI: a sidecar restarted 0.6 s after a kill found its admin port in
    use), and below the cluster tests' base ports (20000+)."""
    while True:
        port = random.randrange(10000, 20000)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll `check` until it returns true; raise TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class ManagedProcess:
    """One child process with its output in a log file; `stop()` ends it by PID."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.popen = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, cwd=cwd, start_new_session=True,
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send_signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """Send `sig`, wait, then SIGKILL; returns the exit code."""
        if self.alive():
            try:
                os.kill(self.pid, sig)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(5)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.popen.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


class ProcessGroup:
    """Processes started by one test; dumps their logs if the test failed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[ManagedProcess] = []

    def start(self, name: str, argv: Sequence[str], **kw) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.root / f"{name}.log", **kw)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def dump_logs(self) -> str:
        return "\n".join(
            f"----- {p.name} (pid {p.pid}) log tail: {p.log_path}\n{p.tail()}" for p in self.procs
        )
