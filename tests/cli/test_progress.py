"""The progress adapter (sidecar/cli/progress.py): draws a bar only on a terminal and without
--json; status lines always print."""

from __future__ import annotations

import io
import threading

from sidecar.cli import progress
from sidecar.cli.progress import Progress


class FakeTerminal(io.StringIO):
    """A text stream that says it is a terminal (as stderr on a console does)."""

    def isatty(self) -> bool:
        return True


def _run_a_long_command(p: Progress) -> None:
    p.stage("case b", total=200, unit="msg")
    p.set(50, "publishing")
    p.say("case b: done")
    p.close()


def test_silent_when_not_a_terminal():
    out = io.StringIO()  # a pipe or a file: isatty() is False
    p = Progress.for_command(json_output=False, file=out)
    assert not p.enabled
    _run_a_long_command(p)
    assert out.getvalue() == "case b: done\n"  # the status line only


def test_silent_with_json_even_on_a_terminal():
    out = FakeTerminal()
    p = Progress.for_command(json_output=True, file=out)
    assert not p.enabled
    _run_a_long_command(p)
    assert out.getvalue() == "case b: done\n"


def test_silent_when_not_wanted_on_a_terminal():
    """`mqfed up` with few nodes: no bar although stderr is a terminal."""
    out = FakeTerminal()
    p = Progress.for_command(json_output=False, file=out, wanted=False)
    _run_a_long_command(p)
    assert out.getvalue() == "case b: done\n"


def test_draws_a_bar_on_a_terminal():
    out = FakeTerminal()
    p = Progress.for_command(json_output=False, file=out)
    assert p.enabled
    _run_a_long_command(p)
    text = out.getvalue()
    assert "\r" in text  # redrawn in place
    assert "case b:  25%" in text and "50/200" in text and "publishing" in text
    assert "case b: done\n" in text  # the status line, printed above the bar


def test_watch_polls_while_the_block_runs(monkeypatch):
    monkeypatch.setattr(progress, "REFRESH_S", 0.01)
    out = FakeTerminal()
    p = Progress(True, out)
    count = [0]
    polled = threading.Event()

    def poll() -> float:
        count[0] += 10
        if count[0] >= 30:
            polled.set()
        return count[0]

    with p.watch("load r1", poll, total=100, unit="msg"):
        assert polled.wait(5)
    assert "load r1" in out.getvalue() and "30/100" in out.getvalue()
    size = len(out.getvalue())
    polled.clear()
    assert not polled.wait(0.1)  # the ticker stopped with the block
    assert len(out.getvalue()) == size


def test_watch_does_nothing_when_disabled():
    out = io.StringIO()
    called = []
    with Progress(False, out).watch("audit", lambda: called.append(1) or 1.0, total=None):
        pass
    assert out.getvalue() == "" and called == []
