"""How bench and load code shows progress without knowing about terminals.

A `Watch` is called as `watch(desc, poll, total, unit)` around a long block and returns a
context manager: `poll()` is a count so far (or seconds elapsed), `total` where it ends (None:
unknown). The command line passes `sidecar.cli.progress.Progress.watch`, which draws a bar on
a terminal only; the default, `no_watch`, does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

Poll = Callable[[], float]
Watch = Callable[..., AbstractContextManager[object]]

__all__ = ["Poll", "Watch", "no_watch", "amount"]


def no_watch(*_args: object, **_kwargs: object) -> AbstractContextManager[object]:
    return nullcontext()


def amount(records: Sequence[Sequence[object]], messages: int | None,
           seconds: float | None) -> tuple[Poll, float | None, str]:
    """What to watch while messages arrive: the records of every subscriber against the
    messages expected, or, for a timed run, the seconds elapsed against its length."""
    if messages:
        return (lambda: sum(len(r) for r in records)), messages * len(records), " msg"
    t0 = time.monotonic()
    return (lambda: round(time.monotonic() - t0, 1)), seconds, "s"
