"""Start processes and signal them by PID, only while they are still the process we mean.

A `ProcRef` names a process by PID, its start time (clock ticks after boot, from
/proc/<pid>/stat) and words its argv must contain; a recycled PID fails those checks and is
never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.devcluster.errors import ClusterError
from sidecar.procinfo import cmdline, pid_alive


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 of stat; fields here start at field 3
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ProcRef:
    """One process we started (or adopted): PID + start time + argv words."""

    pid: int
    start: int
    markers: tuple[str, ...]

    def running(self) -> bool:
        """True if the PID is alive, started when recorded and still runs the same argv."""
        if not pid_alive(self.pid) or start_time(self.pid) != self.start:
            return False
        argv = " ".join(cmdline(self.pid))
        return all(m in argv for m in self.markers)

    def exited(self) -> bool:
        """True once the process is gone (a zombie counts as gone)."""
        reap()
        return not pid_alive(self.pid) or start_time(self.pid) != self.start

    def signal(self, sig: int) -> bool:
        """Send `sig` if this is still our process; False if it is gone."""
        if not self.running():
            return False
        try:
            os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):  # gone, or another user's
            return False
        return True

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "markers": list(self.markers)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ProcRef | None:
        if not data:
            return None
        return cls(int(data["pid"]), int(data["start"]), tuple(data["markers"]))


def identify(pid: int | None, *markers: str) -> ProcRef | None:
    """A ProcRef for a live `pid` whose argv contains every marker, else None."""
    if not pid or not pid_alive(pid):
        return None
    started = start_time(pid)
    ref = ProcRef(pid, started, tuple(markers)) if started is not None else None
    return ref if ref and ref.running() else None


def find(*markers: str) -> list[ProcRef]:
    """Every live process whose argv contains every marker (other than this one)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            ref = identify(int(entry.name), *markers)
            if ref:
                out.append(ref)
    return out


def spawn(argv: Sequence[str], log_path: Path, markers: Sequence[str],
          env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> tuple[subprocess.Popen[bytes], ProcRef]:
    """Start `argv` in its own session, output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        try:
            popen = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=dict(env) if env else None,
                                     cwd=cwd, start_new_session=True)
        except OSError as exc:
            raise ClusterError(f"cannot run {argv[0]} as user {os.getuid()}: {exc.strerror}; "
                               "it must be executable (with every parent folder) by this "
                               "user") from None
    _children.append(popen)
    started = start_time(popen.pid)
    if started is None:  # exited already; a ref that never matches a later process
        popen.wait()
        started = -1
    ref = ProcRef(popen.pid, started, tuple(markers))
    _await_argv(popen, ref)
    return popen, ref


def _await_argv(popen: subprocess.Popen[bytes], ref: ProcRef, timeout: float = 5.0) -> None:
    """Wait until the new program's argv is readable in /proc.

    Popen returns once exec has begun, but the kernel fills /proc/<pid>/cmdline a moment
    later; until then `ref.running()` would wrongly say the process is not ours.
    """
    deadline = time.monotonic() + timeout
    while not ref.running() and popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)


_children: list[subprocess.Popen[bytes]] = []


def reap() -> None:
    """Collect the exited processes this process started (no zombies left behind)."""
    _children[:] = [p for p in _children if p.poll() is None]


def wait_gone(refs: Iterable[ProcRef], timeout: float) -> list[ProcRef]:
    """Wait until none of `refs` runs; return those still running after `timeout`."""
    pending = [r for r in refs if r.running()]
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        reap()
        pending = [r for r in pending if r.running()]
    return pending


def stop(refs: Iterable[ProcRef], timeout: float = 10.0) -> None:
    """SIGTERM every ref, wait up to `timeout`, then SIGKILL what is left."""
    refs = [r for r in refs if r.signal(signal.SIGTERM)]
    kill(wait_gone(refs, timeout))


def kill(refs: Iterable[ProcRef]) -> None:
    """SIGKILL every ref and wait until they are gone."""
    refs = [r for r in refs if r.signal(signal.SIGKILL)]
    left = wait_gone(refs, 10.0)
    if left:
        raise ClusterError("processes survived SIGKILL: " + ", ".join(str(r.pid) for r in left))


def tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a log file, indented, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"    ({path} does not exist)"
    return "\n".join("    " + line for line in text) or f"    ({path} is empty)"
