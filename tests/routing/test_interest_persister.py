"""InterestPersister: a churn delta's rows are committed on the loop (no worker-thread round
trip: two thread wake-ups per delta, tens of ms of the interest lag on a loaded machine), larger
batches and write-ahead-log checkpoints go to the worker, and follow-ups run in submission
order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sidecar.routing.interest import JOURNAL_ADD, JOURNAL_REMOVE, JournalOp
from sidecar.routing.interest_store import InterestPersister, SqliteInterestStore


def _ops(start: int, n: int, kind: str = JOURNAL_ADD) -> list[JournalOp]:
    return [(kind, "p1", f"dev/{i}", i + 1) for i in range(start, start + n)]


def _rows(store: SqliteInterestStore) -> set[str]:
    return set(store.load()["peers"].get("p1", []))


def test_a_small_batch_is_committed_at_once_without_the_worker(tmp_path: Path) -> None:
    async def main() -> None:
        persister = InterestPersister(SqliteInterestStore(tmp_path / "s.sqlite"), inline_ops=8)
        done: list[int] = []
        for i in range(100):  # 100 deltas of 5 ops, as a churn sends them
            persister.submit(_ops(i * 5, 5), lambda i=i: done.append(i))
            assert done[-1] == i  # followed up before submit returned: rows already committed
        persister.submit([], lambda: done.append(-1))
        assert done[-1] == -1
        assert persister.handoffs == 0 and persister.inline == 100 and persister.batches == 100
        assert persister.pending == 0 and len(_rows(persister.store)) == 500
        persister.close()

    asyncio.run(main())


def test_a_large_batch_goes_to_the_worker_and_later_ones_wait_their_turn(tmp_path: Path) -> None:
    async def main() -> None:
        persister = InterestPersister(SqliteInterestStore(tmp_path / "s.sqlite"), inline_ops=8)
        done: list[str] = []
        persister.submit(_ops(0, 50), lambda: done.append("large"))
        persister.submit(_ops(50, 2), lambda: done.append("small"))  # small, but behind it
        persister.submit(_ops(0, 1, JOURNAL_REMOVE), lambda: done.append("remove"))
        persister.submit([], lambda: done.append("empty"))
        assert done == [] and persister.pending == 53
        await persister.flush()
        assert done == ["large", "small", "remove", "empty"]
        assert persister.handoffs == 2  # the large batch, then the three queued in one
        assert persister.inline == 0 and persister.pending == 0
        assert _rows(persister.store) == {f"dev/{i}" for i in range(1, 52)}
        persister.submit(_ops(60, 3), lambda: done.append("after"))  # idle again: inline
        assert done[-1] == "after" and persister.handoffs == 2 and persister.inline == 1
        persister.close()

    asyncio.run(main())


def test_the_log_is_checkpointed_on_the_worker_every_checkpoint_ops(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteInterestStore(tmp_path / "s.sqlite")
        checkpoints: list[int] = []
        checkpoint = store.checkpoint
        store.checkpoint = lambda: (checkpoints.append(store.rows_written), checkpoint())
        persister = InterestPersister(store, inline_ops=8, checkpoint_ops=20)
        for i in range(10):  # 50 ops inline: a checkpoint job after the 20th and the 40th
            persister.submit(_ops(i * 5, 5), lambda: None)
            await persister.flush()
        assert persister.inline == 10 and persister.handoffs == 2
        assert checkpoints == [40, 80]  # rows written by then: 2 per added filter (interest, sids)
        persister.close()

    asyncio.run(main())
