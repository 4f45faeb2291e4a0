"""Interest persistence: a delta costs O(delta) rows and journal ops, whatever the state held."""

from __future__ import annotations

import json
from pathlib import Path

from sidecar.routing.interest import (
    InterestDelta,
    InterestSnapshot,
    LocalInterest,
    LocalSubscribe,
    RemoteInterest,
)
from sidecar.routing.interest_store import SqliteInterestStore, open_store
from sidecar.routing.table import InterestAdded, InterestKey


def K(verbatim: str) -> InterestKey:
    return InterestKey.parse(verbatim)


def _held(tmp_path: Path, n: int) -> tuple[RemoteInterest, SqliteInterestStore]:
    """A peer holding `n` filters (literal and wildcard), all persisted."""
    ri = RemoteInterest(journal=True)
    store = SqliteInterestStore(tmp_path / f"state-{n}.sqlite")
    keys = {K(f"dev/{i}/t") for i in range(n)} | {K(f"w/{i}/+") for i in range(n // 10)}
    ri.apply_snapshot("p1", InterestSnapshot(1, frozenset(keys)))
    store.write(ri.take_journal())
    return ri, store


def _one_delta(ri: RemoteInterest, store: SqliteInterestStore) -> tuple[int, int, int]:
    """(actions, journal ops, rows written) of a delta adding 3 filters and removing 2."""
    delta = InterestDelta(1, 2, frozenset({K("new/a"), K("new/b"), K("new/+/c")}),
                          frozenset({K("dev/0/t"), K("w/0/+")}))
    actions = ri.apply_delta("p1", delta)
    ops = ri.take_journal()
    return len(actions), len(ops), store.write(ops)


def test_a_delta_costs_the_same_with_100_or_20000_filters_held(tmp_path):
    small = _one_delta(*_held(tmp_path, 100))
    large = _one_delta(*_held(tmp_path, 20_000))
    assert small == large
    actions, ops, rows = large
    assert actions == 5 and ops == 7  # 5 interest rows, 2 identifiers released
    assert rows == 3 * 2 + 2 + 2  # 3 added (interest + id), 2 removed, 2 ids released


def test_local_deltas_do_not_grow_with_the_interest_held():
    li = LocalInterest()
    li.apply_chunked([InterestAdded(K(f"a/{i}")) for i in range(20_000)])
    [delta] = li.apply_chunked([InterestAdded(K("b"))])
    assert delta.added == {K("b")} and not delta.removed


def test_rows_restore_identifiers_and_decisions(tmp_path):
    ri, store = _held(tmp_path, 300)
    _one_delta(ri, store)
    store.close()
    again_store, state = open_store(tmp_path / "state-300.sqlite", tmp_path / "none.json")
    again = RemoteInterest()
    again.restore(state)
    assert again.local_subscriptions() == ri.local_subscriptions()
    sid = ri.local_subscriptions()["new/a"]
    assert again.forward_targets("new/a", [sid]).peers == {"p1"}
    again_store.close()


def test_a_batch_keeps_the_last_op_per_row(tmp_path):
    ri = RemoteInterest(journal=True)
    store = SqliteInterestStore(tmp_path / "s.sqlite")
    ri.apply_snapshot("p1", InterestSnapshot(1, frozenset({K("a")})))
    ri.apply_delta("p1", InterestDelta(1, 2, removed=frozenset({K("a")})))
    ri.apply_delta("p1", InterestDelta(2, 3, added=frozenset({K("b")})))
    store.write(ri.take_journal())  # a: added, removed, released in one batch
    assert store.load() == {"peers": {"p1": ["b"]}, "sids": {"b": ri.local_subscriptions()["b"]}}


def test_a_batch_is_written_in_order_as_runs_of_one_kind(tmp_path):
    """Ops go in order (runs of one kind, one statement each): a row added, removed and added
    again in one batch is held, one removed last is not, whatever the runs in between."""
    from sidecar.routing.interest import JOURNAL_ADD, JOURNAL_FREE, JOURNAL_REMOVE

    store = SqliteInterestStore(tmp_path / "s.sqlite")
    ops = [(JOURNAL_ADD, "p1", "a", 1), (JOURNAL_ADD, "p1", "b", 1),
           (JOURNAL_REMOVE, "p1", "a", 0), (JOURNAL_FREE, "", "a", 1),
           (JOURNAL_ADD, "p1", "a", 2), (JOURNAL_REMOVE, "p1", "b", 0),
           (JOURNAL_FREE, "", "b", 1), (JOURNAL_ADD, "p2", "c", 3)]
    store.write(ops)
    assert store.load() == {"peers": {"p1": ["a"], "p2": ["c"]}, "sids": {"a": 2, "c": 3}}
    store.close()


def test_an_old_json_state_is_moved_into_the_store(tmp_path):
    legacy = tmp_path / "routing-state.json"
    legacy.write_text(json.dumps({"peers": {"n2": ["a/#"]}, "sids": {"a/#": 7}}))
    store, state = open_store(tmp_path / "routing-state.sqlite", legacy)
    assert state == {"peers": {"n2": ["a/#"]}, "sids": {"a/#": 7}}
    assert not legacy.exists()
    ri = RemoteInterest()
    ri.restore(state)
    assert ri.subscriptions() == [LocalSubscribe("a/#", 7)]
    store.close()
