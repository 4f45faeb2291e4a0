"""Progress bars for long commands (`bench`, `load`, `audit`, `chaos`, `up` with many nodes).

One adapter over tqdm: a command makes one `Progress` (`Progress.for_command(args.json)`),
which draws on stderr only when stderr is a terminal and --json was not given; otherwise
every call does nothing, so piped output, logs and JSON stay free of progress output.
Status lines go through `say`, which prints them above a bar instead of through it.

The rest of `sidecar` does not import this module: long-running code takes a `watch`
callable (`Progress.watch`) or a step callback and calls it without knowing about terminals.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

__all__ = ["Progress", "elapsed_since"]

REFRESH_S = 0.25  # how often a watched count is polled and the bar redrawn
# no monitor thread of tqdm's own in our processes (a bench measures its CPU): `watch` redraws
tqdm.monitor_interval = 0


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def _seconds_format(total: float | None) -> str:
    """Time watched: no rate (it would be 1 s/s); without a total, just the time so far."""
    if total is None:
        return "{desc}: {elapsed}{postfix}"
    return "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} s [{elapsed}{postfix}]"


class Progress:
    """A progress bar on `file` (stderr) when `enabled`; a no-op otherwise."""

    def __init__(self, enabled: bool, file: TextIO | None = None) -> None:
        self.enabled = enabled
        self.file = file if file is not None else sys.stderr
        self._bar: tqdm | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_command(cls, json_output: bool = False, file: TextIO | None = None,
                    wanted: bool = True) -> Progress:
        """Enabled only on a terminal, without --json, and if `wanted` (a long run)."""
        stream = file if file is not None else sys.stderr
        return cls(wanted and not json_output and _is_terminal(stream), stream)

    # ---- status lines ------------------------------------------------------------------
    def say(self, text: str) -> None:
        """A status line on the stream (always), above the bar if one is drawn."""
        with self._lock:
            if self._bar is not None:
                self._bar.write(text, file=self.file)
            else:
                print(text, file=self.file, flush=True)

    # ---- the bar -------------------------------------------------------------------------
    def stage(self, desc: str, total: float | None = None, unit: str = "it") -> None:
        """Start a new bar (closing the current one): `total` None draws a counter."""
        if not self.enabled:
            return
        with self._lock:
            self._close()
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.file, leave=False,
                             dynamic_ncols=True, mininterval=0.1,
                             bar_format=_seconds_format(total) if unit == "s" else None)

    def set(self, done: float, note: str | None = None) -> None:
        """Move the bar to `done` (and show `note` after it)."""
        with self._lock:
            if self._bar is None:
                return
            if note is not None:
                self._bar.set_postfix_str(note, refresh=False)
            done = int(done) if float(done).is_integer() else done
            # update() feeds tqdm's rate and draws unless it drew < 0.1 s ago; then refresh
            if done == self._bar.n or not self._bar.update(done - self._bar.n):
                self._bar.refresh()

    def note(self, text: str) -> None:
        """Show `text` after the bar (the current phase)."""
        with self._lock:
            if self._bar is not None:
                self._bar.set_postfix_str(text)

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---- watched counts --------------------------------------------------------------
    @contextmanager
    def watch(self, desc: str, poll: Callable[[], float], total: float | None = None,
              unit: str = "it") -> Iterator[None]:
        """A bar for the block: `poll()` (a count, or seconds elapsed) read every 0.25 s on
        a thread. Errors in `poll` leave the bar where it was."""
        if not self.enabled:
            yield
            return
        self.stage(desc, total, unit)
        done = threading.Event()

        def tick() -> None:
            while not done.wait(REFRESH_S):
                try:
                    value = poll()
                except Exception:  # the watched thing went away: keep the last value
                    continue
                self.set(min(value, total) if total is not None else value)

        ticker = threading.Thread(target=tick, name="progress", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
            self.close()


def elapsed_since(started: float | None = None) -> Callable[[], float]:
    """A `poll` for Progress.watch: seconds since `started` (monotonic; default: now)."""
    t0 = time.monotonic() if started is None else started
    return lambda: round(time.monotonic() - t0, 1)
