"""Issue 22: `mqfed load` draws a progress bar when its stderr is a terminal (a real pty), and
none when piped or given --json: what a script reads stays free of progress output. On a
real 2-node cluster."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.cluster.conftest import MQFED, REPO, detached_cluster

PROGRESS_MARKS = ("\r", "%|", "msg/s")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Path]:
    with detached_cluster("mqfed-progress-", nodes=2) as (path, _):
        yield path


def _load_args(cluster: Path, run: str, *extra: str) -> list[str]:
    return [*MQFED, "load", "--cluster", str(cluster), "--messages", "600", "--rate", "300",
            "--run", run, *extra]


def _on_a_terminal(argv: list[str], timeout: float = 120.0) -> tuple[int, str, str]:
    """Run `argv` with stderr on a pseudo-terminal (120 columns) and stdout on a pipe:
    (exit status, stdout, what the terminal showed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # "\n" stays "\n": a "\r" seen is the bar's own
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    shown: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed its end
                return
            if not chunk:
                return
            shown.append(chunk)

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, cwd=REPO, env=dict(os.environ))
    os.close(slave)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        os.close(master)
    return proc.returncode, out.decode(), b"".join(shown).decode(errors="replace")


def test_load_piped_prints_no_progress(cluster: Path) -> None:
    result = subprocess.run(_load_args(cluster, "piped"), capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "mqfed load: run piped, 600 messages sent" in result.stdout
    assert "run piped: publishing from n1" in result.stderr  # status lines stay
    for mark in PROGRESS_MARKS:
        assert mark not in result.stdout and mark not in result.stderr, mark


def test_load_on_a_terminal_draws_a_bar(cluster: Path) -> None:
    code, out, shown = _on_a_terminal(_load_args(cluster, "tty"))
    assert code == 0, shown
    assert "mqfed load: run tty, 600 messages sent" in out
    assert "run tty: publishing from n1" in shown
    # the bar: redrawn in place, the messages of both subscribers (2 x 600) as its total
    assert "\rload tty:" in shown and "/1200" in shown and "msg/s" in shown, shown
    assert "\r" not in out


def test_load_with_json_on_a_terminal_draws_no_bar(cluster: Path) -> None:
    code, out, shown = _on_a_terminal(_load_args(cluster, "json", "--json"))
    assert code == 0, shown
    assert json.loads(out)["sent"] == 600
    for mark in PROGRESS_MARKS:
        assert mark not in shown, mark
