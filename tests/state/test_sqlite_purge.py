"""The SQLite store's retention purge in batches: saves and touches go between two of its
transactions, it deletes exactly the expired sessions, and never one used meanwhile; each
by age (a few expired) and in key order (many: `PURGE_SCAN` batches' worth or more).

The purge is gated at its batches (a subclass holds its first batch until the callers the
test starts are waiting for the store), so what is asserted is the order of events, never
a timing."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from ctxactors.state import Record, SessionRef, SQLiteStore, Write
from ctxactors.state._base import encode_ref
from ctxactors.state._sqlite import PURGE_SCAN
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

    def _purge(self, cutoff: float, after: str | None) -> tuple[int, str | None, bool]:
        if not self.seen:
            self.at_first_batch()
        self.seen.append(self._db.execute(self.probe).fetchall())
        return super()._purge(cutoff, after)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0.0)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[GatedStore]:
    made = GatedStore(tmp_path / "state.db", clock)
    yield made
    made.close()


def session(name: str | int) -> SessionRef:
    return ("p", name if isinstance(name, str) else f"s{name:02d}")


def sid(name: str | int) -> str:
    """How the file names the session."""
    return encode_ref(session(name))


def save_sessions(store: SQLiteStore, clock: ManualClock, names: Iterable[str | int]) -> None:
    """A key with two parts and a second key in each session, one second apart (so the
    purge takes them oldest first, in this order)."""
    for name in names:
        parts = (("c1", f"one {name}".encode()), ("c2", f"two {name}".encode()))
        ref = session(name)
        store.write([Write(ref, DOCS, b"docs", 0, parts), Write(ref, PLAN, b"p", 0)])
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


# Sessions expired, with a purge batch of 2: by age (under 2 * PURGE_SCAN), in key order.
SIZES = [pytest.param(10, id="by-age"), pytest.param(40, id="in-key-order")]


def test_the_sizes_take_each_way() -> None:
    assert 10 < 2 * PURGE_SCAN <= 40


@pytest.mark.parametrize("expired", SIZES)
def test_a_save_waiting_for_the_store_goes_between_two_batches_of_the_purge(
    store: GatedStore, clock: ManualClock, expired: int
) -> None:
    save_sessions(store, clock, range(expired))  # touched at 0, 1, ...
    clock.advance(RETENTION - 5)
    live = session("live")  # first in key order
    assert store.write([Write(live, PLAN, b"v1", 0)]) == [1]
    clock.advance(5)  # the others are past their retention (or at it), `live` is not
    results: list[object] = []

    def save_once_the_purge_runs() -> None:
        start(lambda: store.write([Write(live, PLAN, b"v2", 1)]), results)
        wait_for_callers(store, 1)  # blocked on the store, which the first batch holds

    store.at_first_batch = save_once_the_purge_runs
    store.probe = f"SELECT revision FROM state WHERE session = '{sid('live')}'"
    assert store.purge() == expired
    # Full batches, then one that found none left; the save went right after the first.
    assert store.seen == [[(1,)]] + [[(2,)]] * (expired // 2)
    assert results == [[2]]
    assert store.load(live, PLAN) == Record(2, b"v2")
    kept = {sid("live")}
    assert stored_sessions(store.path) == {"sessions": kept, "state": kept, "parts": set()}


@pytest.mark.parametrize("expired", SIZES)
def test_a_purge_deletes_exactly_the_sessions_past_their_retention(
    tmp_path: Path, clock: ManualClock, expired: int
) -> None:
    store = SQLiteStore(tmp_path / "state.db", retention=RETENTION, clock=clock, purge_batch=2)
    save_sessions(store, clock, range(expired))  # touched at 0, 1, ..., expired - 1
    # Then touched at `expired`, ...: in key order, one right after each of s00, s03, s06,
    # s09, and 2 * PURGE_SCAN between s05 and s06 (more than a scan's window, none expired).
    live = [f"s{3 * i:02d}+" for i in range(4)] + [f"s05+{i:02d}" for i in range(2 * PURGE_SCAN)]
    save_sessions(store, clock, live)
    clock.advance(RETENTION - 1 - len(live))  # the last expired exactly at its retention
    assert store.purge() == expired
    assert store.purge() == 0
    kept = {sid(name) for name in live}
    assert stored_sessions(store.path) == {"sessions": kept, "state": kept, "parts": kept}
    for name in [*range(expired), *live]:
        parts = {"c1": f"one {name}".encode(), "c2": f"two {name}".encode()}
        assert store.load(session(name), DOCS) == (
            Record(1, b"docs", parts) if name in live else None
        )
    store.close()


@pytest.mark.parametrize("expired", SIZES)
def test_a_session_used_while_the_purge_runs_is_not_deleted(
    store: GatedStore, clock: ManualClock, expired: int
) -> None:
    save_sessions(store, clock, range(expired))  # the last two are the last by age and by key
    clock.advance(RETENTION)  # all of them past their retention when the purge starts
    results: list[object] = []
    last, before = expired - 1, expired - 2

    def use_two_sessions_once_the_purge_runs() -> None:
        # the last touched (by a live actor reading it), the one before saved anew (expired:
        # it starts empty)
        start(lambda: store.touch([session(last)]), results)
        start(lambda: store.write([Write(session(before), PLAN, b"new", 0)]), results)
        wait_for_callers(store, 2)

    store.at_first_batch = use_two_sessions_once_the_purge_runs
    store.probe = (
        f"SELECT touched FROM sessions WHERE session IN ('{sid(before)}', '{sid(last)}')"
        " ORDER BY session"
    )
    assert store.purge() == expired - 2
    # Both used right after the first batch (now is expired + 100): the last batch, which
    # would have taken them, found no more.
    now = expired + RETENTION
    assert store.seen == [[(before,), (last,)]] + [[(now,), (now,)]] * ((expired - 2) // 2)
    assert sorted(results, key=repr) == [None, [1]]
    assert store.load(session(before), PLAN) == Record(1, b"new")
    assert store.load(session(before), DOCS) is None  # its expired state went at the save
    parts = {"c1": f"one {last}".encode(), "c2": f"two {last}".encode()}
    assert store.load(session(last), DOCS) == Record(1, b"docs", parts)
    kept = {sid(before), sid(last)}
    assert stored_sessions(store.path) == {"sessions": kept, "state": kept, "parts": {sid(last)}}


def test_purge_batch_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^purge_batch must be at least 1, got 0$"):
        SQLiteStore(tmp_path / "state.db", purge_batch=0)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_purge_in_key_order_works_with_any_batch_size(
    tmp_path: Path, clock: ManualClock, batch: int
) -> None:
    """Enough expired sessions for the key-order way (`PURGE_SCAN` batches' worth and one
    more), with batches of one and of a size `PURGE_SCAN` is no multiple of."""
    store = SQLiteStore(tmp_path / "state.db", retention=RETENTION, clock=clock, purge_batch=batch)
    expired = batch * PURGE_SCAN + 1
    save_sessions(store, clock, range(expired))
    live = [f"s{i:02d}+" for i in range(0, expired, 7)]  # between them in key order
    save_sessions(store, clock, live)
    clock.advance(RETENTION - 1 - len(live))  # the last expired exactly at its retention
    assert store.purge() == expired
    kept = {sid(name) for name in live}
    assert stored_sessions(store.path) == {"sessions": kept, "state": kept, "parts": kept}
    store.close()


def test_a_use_restarts_a_sessions_retention_once_a_hundredth_of_it_has_passed(
    tmp_path: Path,
) -> None:
    """A load or save touches its session (restarts its retention) only when the store last
    touched it a hundredth of the retention ago or more: up to that much early, never late."""
    clock = ManualClock(1_000_000.0)
    store = SQLiteStore(tmp_path / "state.db", retention=RETENTION, clock=clock)
    try:
        sessions = [(None, name) for name in ("early", "almost", "due")]
        assert store.write([Write(s, PLAN, b"x", 0) for s in sessions]) == [1, 1, 1]
        # A hundredth of the retention (1 s): used before it, a session keeps its touch.
        clock.advance(0.5)
        assert store.load((None, "early"), PLAN) == Record(1, b"x", {})
        clock.advance(0.495)
        assert store.load((None, "almost"), PLAN) == Record(1, b"x", {})
        clock.advance(0.005)  # exactly a hundredth since the writes: touched now
        assert store.load((None, "due"), PLAN) == Record(1, b"x", {})
        clock.advance(RETENTION - 1.0)  # the writes' retention has passed, not the touch's
        assert store.purge() == 2
        assert [store.load(s, PLAN) for s in sessions] == [None, None, Record(1, b"x", {})]
    finally:
        store.close()
