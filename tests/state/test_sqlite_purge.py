"""The SQLite store's retention purge in batches: saves and touches go between two of its
transactions, it deletes exactly the expired sessions, and never one used meanwhile.

The purge is gated at its batches (a subclass holds its first batch until the callers the
test starts are waiting for the store), so what is asserted is the order of events, never
a timing."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ctxactors.state import Record, SessionRef, SQLiteStore, Write
from ctxactors.testing import ManualClock, wait_until

PLAN = ("planning", "a1", None)
DOCS = ("content",)
RETENTION = 100.0


class GatedStore(SQLiteStore):
    """Runs `at_first_batch` inside the purge's first batch (the store's lock held), and
    reads `probe` (an SQL query) at the start of every batch into `seen`."""

    def __init__(self, path: Path, clock: ManualClock) -> None:
        super().__init__(path, retention=RETENTION, clock=clock, purge_batch=2)
        self.at_first_batch: Callable[[], None] = lambda: None
        self.probe = "SELECT 1"
        self.seen: list[list[tuple[object, ...]]] = []

    def _purge(self, cutoff: float) -> int:
        if not self.seen:
            self.at_first_batch()
        self.seen.append(self._db.execute(self.probe).fetchall())
        return super()._purge(cutoff)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0.0)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[GatedStore]:
    made = GatedStore(tmp_path / "state.db", clock)
    yield made
    made.close()


def session(i: int) -> SessionRef:
    return ("p", f"s{i}")


def save_sessions(store: SQLiteStore, clock: ManualClock, numbers: range) -> None:
    """A key with two parts and a second key in each session, one second apart (so the
    purge takes them oldest first, in this order)."""
    for i in numbers:
        parts = (("c1", f"one {i}".encode()), ("c2", f"two {i}".encode()))
        store.write([Write(session(i), DOCS, b"docs", 0, parts), Write(session(i), PLAN, b"p", 0)])
        clock.advance(1)


def start(work: Callable[[], object], results: list[object]) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.append(work()), daemon=True)
    thread.start()
    return thread


def wait_for_callers(store: SQLiteStore, count: int) -> None:
    waiting = lambda: store._lock.waiting == count  # noqa: E731, SLF001 - blocked on the store
    wait_until(waiting, 30, 0.001, describe=lambda: store._lock.waiting)  # noqa: SLF001


def stored_sessions(path: Path) -> dict[str, set[str]]:
    """Which sessions each table still holds, read from the file by another connection."""
    db = sqlite3.connect(path)
    try:
        return {
            table: {row[0] for row in db.execute(f"SELECT DISTINCT session FROM {table}")}
            for table in ("sessions", "state", "parts")
        }
    finally:
        db.close()


def test_a_save_waiting_for_the_store_goes_between_two_batches_of_the_purge(
    store: GatedStore, clock: ManualClock
) -> None:
    save_sessions(store, clock, range(10))  # touched at 0..9
    clock.advance(RETENTION - 5)
    live = ("p", "live")
    assert store.write([Write(live, PLAN, b"v1", 0)]) == [1]  # touched at 105
    clock.advance(5)  # now 110: the ten are past their retention (or at it), `live` is not
    results: list[object] = []

    def save_once_the_purge_runs() -> None:
        start(lambda: store.write([Write(live, PLAN, b"v2", 1)]), results)
        wait_for_callers(store, 1)  # blocked on the store, which the first batch holds

    store.at_first_batch = save_once_the_purge_runs
    store.probe = """SELECT revision FROM state WHERE session = '["p","live"]'"""
    assert store.purge() == 10
    # Five full batches and one that found none left; the save went right after the first.
    assert store.seen == [[(1,)]] + [[(2,)]] * 5
    assert results == [[2]]
    assert store.load(live, PLAN) == Record(2, b"v2")
    kept = {'["p","live"]'}
    assert stored_sessions(store.path) == {"sessions": kept, "state": kept, "parts": set()}


def test_a_purge_deletes_exactly_the_sessions_past_their_retention(
    tmp_path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(tmp_path / "state.db", retention=RETENTION, clock=clock, purge_batch=3)
    save_sessions(store, clock, range(7))  # touched at 0..6
    clock.advance(RETENTION - 7)
    save_sessions(store, clock, range(7, 11))  # touched at 100..103
    clock.advance(2)  # now 106: s6 exactly at its retention, s0..s5 past it, s7..s10 not
    assert store.purge() == 7
    assert store.purge() == 0
    kept = {f'["p","s{i}"]' for i in range(7, 11)}
    assert stored_sessions(store.path) == {"sessions": kept, "state": kept, "parts": kept}
    for i in range(11):
        expected = None if i < 7 else Record(1, b"docs", {"c1": b"one %d" % i, "c2": b"two %d" % i})
        assert store.load(session(i), DOCS) == expected
    store.close()


def test_a_session_used_while_the_purge_runs_is_not_deleted(
    store: GatedStore, clock: ManualClock
) -> None:
    save_sessions(store, clock, range(6))  # touched at 0..5: two batches of two go first
    clock.advance(RETENTION)  # all six past their retention when the purge starts
    results: list[object] = []

    def use_two_sessions_once_the_purge_runs() -> None:
        # s5 touched (by a live actor reading it), s4 saved anew (expired: it starts empty)
        start(lambda: store.touch([session(5)]), results)
        start(lambda: store.write([Write(session(4), PLAN, b"new", 0)]), results)
        wait_for_callers(store, 2)

    store.at_first_batch = use_two_sessions_once_the_purge_runs
    store.probe = """SELECT touched FROM sessions WHERE session IN ('["p","s4"]', '["p","s5"]')"""
    assert store.purge() == 4
    # Both used right after the first batch (now is 106), so the third batch found no more.
    assert store.seen == [[(4.0,), (5.0,)], [(106.0,), (106.0,)], [(106.0,), (106.0,)]]
    assert sorted(results, key=repr) == [None, [1]]
    assert store.load(session(4), PLAN) == Record(1, b"new")
    assert store.load(session(4), DOCS) is None  # its expired state went at the save
    assert store.load(session(5), DOCS) == Record(1, b"docs", {"c1": b"one 5", "c2": b"two 5"})
    kept = {'["p","s4"]', '["p","s5"]'}
    assert stored_sessions(store.path) == {"sessions": kept, "state": kept, "parts": {'["p","s5"]'}}


def test_purge_batch_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^purge_batch must be at least 1, got 0$"):
        SQLiteStore(tmp_path / "state.db", purge_batch=0)
