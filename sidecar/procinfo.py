"""Small facts about processes, read from /proc (Linux)."""

from __future__ import annotations

from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] != "Z"


def cmdline(pid: int) -> list[str]:
    """The argv of `pid`, or [] if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def runs(pid: int | None, *needles: str) -> bool:
    """True if `pid` is alive and its argv contains every one of `needles`."""
    if not pid or not pid_alive(pid):
        return False
    argv = " ".join(cmdline(pid))
    return all(n in argv for n in needles)
