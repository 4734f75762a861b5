"""The WAL checkpointer: what the store commits reaches the database file itself, off the
commit path, and a checkpoint that can't run now is tried again, not given up for good."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path

from ctxactors.state import SQLiteStore, Write
from ctxactors.state._checkpoint import Checkpointer
from ctxactors.testing import wait_until


def wal_database(path: Path) -> sqlite3.Connection:
    """A WAL database with rows committed to its WAL only (no autocheckpoint)."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE t (v TEXT)")
    db.executemany("INSERT INTO t VALUES (?)", [(f"row {i}",) for i in range(50)])
    return db


def rows_in_database_file(path: Path, tmp: Path) -> int:
    """The rows the database file holds by itself, its WAL left aside."""
    alone = tmp / "alone.db"
    shutil.copyfile(path, alone)
    db = sqlite3.connect(alone)
    try:
        tables = db.execute("SELECT count(*) FROM sqlite_master WHERE name = 't'").fetchone()[0]
        return int(db.execute("SELECT count(*) FROM t").fetchone()[0]) if tables else 0
    finally:
        db.close()


def checkpoint_threads(others: set[threading.Thread]) -> set[threading.Thread]:
    """The checkpoint threads alive now but for `others` (other tests' stores' own)."""
    return {t for t in threading.enumerate() if t.name == "ctxactors-checkpoint"} - others


def running_now() -> set[threading.Thread]:
    return checkpoint_threads(set())


def test_committed_rows_reach_the_database_file_and_close_ends_the_thread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    writer = wal_database(path)
    assert rows_in_database_file(path, tmp_path) == 0  # all of it in the WAL so far
    others = running_now()
    checkpointer = Checkpointer(path, interval=0.01)
    try:
        ours = checkpoint_threads(others)
        assert len(ours) == 1 and all(t.daemon for t in ours)
        wait_until(lambda: checkpointer.checkpoints >= 2)
        assert rows_in_database_file(path, tmp_path) == 50
        # Every pass is counted once: no pass runs between two reads a whole pass apart.
        before = checkpointer.checkpoints
        writer.execute("INSERT INTO t VALUES ('late')")
        wait_until(lambda: rows_in_database_file(path, tmp_path) == 51)
        assert checkpointer.checkpoints >= before + 1
    finally:
        checkpointer.close()
    assert checkpoint_threads(others) == set()
    writer.close()


def test_close_before_the_first_pass_checkpoints_nothing_and_returns_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    writer = wal_database(path)
    others = running_now()
    checkpointer = Checkpointer(path, interval=3600)  # close must not wait an interval out
    checkpointer.close()
    assert checkpointer.checkpoints == 0
    assert checkpoint_threads(others) == set()
    assert rows_in_database_file(path, tmp_path) == 0
    writer.close()


def test_a_pass_refused_by_a_locked_database_is_tried_again(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    writer = wal_database(path)
    # An exclusive-mode connection keeps every other connection out of the file once it
    # has written: each pass fails ("database is locked") until it closes.
    writer.execute("PRAGMA locking_mode=EXCLUSIVE")
    writer.execute("INSERT INTO t VALUES ('held')")
    others = running_now()
    checkpointer = Checkpointer(path, interval=0.01)
    try:
        # Let a few passes fail: the checkpointer's connection waits 1 s for the lock each.
        wait_until(lambda: checkpoint_threads(others) != set())
        assert checkpointer.checkpoints == 0
        writer.close()  # the lock given up: the next pass succeeds
        wait_until(lambda: checkpointer.checkpoints >= 1)
        assert rows_in_database_file(path, tmp_path) == 51
    finally:
        checkpointer.close()
    assert checkpoint_threads(others) == set()


def test_each_pass_adds_one_to_the_count(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    writer = wal_database(path)
    checkpointer = Checkpointer(path, interval=0.01)
    try:
        # Counted one by one from 0, the count is odd after every other pass.
        wait_until(lambda: checkpointer.checkpoints % 2 == 1)
    finally:
        checkpointer.close()
    writer.close()


def test_what_a_sqlite_store_commits_reaches_its_database_file(tmp_path: Path) -> None:
    """The store's own checkpointer copies its WAL into the database file: far below the
    writer's backstop, nothing else would."""
    path = tmp_path / "state.db"
    store = SQLiteStore(path)
    try:
        sessions = [(None, f"s{i}") for i in range(20)]
        assert store.write([Write(s, ("k",), b"x", 0) for s in sessions]) == [1] * 20

        def rows_alone() -> int:
            alone = tmp_path / "alone.db"
            shutil.copyfile(path, alone)
            db = sqlite3.connect(alone)
            try:
                tables = db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'state'")
                if not tables.fetchone()[0]:
                    return 0
                return int(db.execute("SELECT count(*) FROM state").fetchone()[0])
            finally:
                db.close()
                alone.unlink()

        wait_until(lambda: rows_alone() == 20)
    finally:
        store.close()


def test_a_pass_runs_every_half_second_by_default(tmp_path: Path) -> None:
    # A store's commits reach its database file within about that (the store makes its
    # checkpointer with the default): the interval, not a clock reading a loaded machine
    # could stretch.
    checkpointer = Checkpointer(tmp_path / "state.db")
    try:
        assert checkpointer._interval == 0.5  # noqa: SLF001
    finally:
        checkpointer.close()
