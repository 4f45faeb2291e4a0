"""`ThreadHandoff`: items put on another thread reach the loop in order, in runs."""

from __future__ import annotations

import asyncio
import threading

from sidecar.thread_handoff import ThreadHandoff


def test_items_from_another_thread_arrive_in_order_in_few_wake_ups():
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        got: list[int] = []
        runs = 0
        done = asyncio.Event()

        def take(items: list[int]) -> None:
            nonlocal runs
            runs += 1
            got.extend(items)
            if got and got[-1] == 19_999:
                done.set()
        handoff: ThreadHandoff[int] = ThreadHandoff(take)
        thread = threading.Thread(target=lambda: [handoff.put(loop, [i]) for i in range(20_000)])
        thread.start()
        await asyncio.wait_for(done.wait(), 30)
        thread.join()
        return got, runs

    got, runs = asyncio.run(main())
    assert got == list(range(20_000))
    assert runs < 2_000, runs  # in runs: one loop wake-up per item cost seconds


def test_nothing_put_wakes_nothing_and_a_closed_loop_takes_nothing():
    loop = asyncio.new_event_loop()
    taken: list[list[int]] = []
    handoff: ThreadHandoff[int] = ThreadHandoff(taken.append)
    handoff.put(loop, [])
    loop.run_until_complete(asyncio.sleep(0))
    assert taken == []
    handoff.put(loop, [1, 2])
    loop.run_until_complete(asyncio.sleep(0))
    assert taken == [[1, 2]]
    loop.close()
    handoff.put(loop, [3])  # no error: the loop is gone
    assert taken == [[1, 2]]
