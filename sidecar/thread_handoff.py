"""Items from a foreign thread (paho's network loop) to an asyncio loop, in runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class ThreadHandoff(Generic[T]):
    """Items `put` on another thread reach `take` on the loop's thread, in order and in runs:
    one loop wake-up for all that came before it ran (one per item can cost more than the
    item: a moving session's queue, the plugin's events)."""

    def __init__(self, take: Callable[[list[T]], None]) -> None:
        self._take = take
        self._items: list[T] = []
        self._lock = threading.Lock()

    def put(self, loop: asyncio.AbstractEventLoop, items: Iterable[T]) -> None:
        """Queue `items` for `take` on `loop` (dropped once the loop is closed)."""
        with self._lock:
            wake = not self._items  # else a wake-up is already on its way
            self._items.extend(items)
            if not wake or not self._items:
                return
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        self._take(items)
