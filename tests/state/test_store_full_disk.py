"""The SQLite store on a full disk: saves refused clearly, reads served, deletes always
possible, saves back by themselves once there is room; nothing acknowledged lost.

On a real small file system: a 4 MiB tmpfs mounted for the test (root only).
"""

from __future__ import annotations

import os
import random
import sqlite3
import string
from collections.abc import Iterator
from pathlib import Path

import pytest
from tmpfs_support import own_tmpfs

from ctxactors import Runtime
from ctxactors.servers.content import Content
from ctxactors.state import Record, SQLiteStore, StoreUnavailableError, Write
from ctxactors.state._reserve import Reserve
from ctxactors.testing import ManualClock, context_args

KEY = ("k",)


def full(path: Path) -> str:
    return (
        f"the disk of {path} is full: nothing of this write was kept; saves resume by "
        "themselves once sessions are ended or expire, or the disk has room"
    )


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 4 MiB file system of this test's own."""
    with own_tmpfs("4m", "ctxactors-test-disk-") as where:
        yield where


def text(size: int, seed: int) -> str:
    return "".join(random.Random(seed).choices(string.ascii_letters + " ", k=size))


def call(rt: Runtime, principal: str, session: str, tool: str, **args: object) -> object:
    result = rt.call(tool, context_args(session, **args), principal=principal)
    return result.text if result.is_error else result.structured


def test_one_tenant_fills_the_disk_the_others_read_and_ending_its_sessions_frees_it(
    small_disk: Path,
) -> None:
    path = small_disk / "state.db"
    # max_actors=1: bob's actor is passivated while alice writes, so his read is a load.
    with Runtime(
        servers=[Content], store=SQLiteStore(path, reserve_bytes=512 << 10), max_actors=1
    ) as rt:
        assert call(rt, "bob", "b1", "add_content", filename="bob.txt", content="notes") == {
            "id": "c1",
            "filename": "bob.txt",
        }
        acknowledged = 0
        while True:
            got = call(
                rt,
                "alice",
                f"a{acknowledged % 3}",
                "add_content",
                filename=f"f{acknowledged}",
                content=text(100_000, acknowledged),
            )
            if isinstance(got, str):
                break
            acknowledged += 1
        assert acknowledged >= 20  # 4 MiB of disk, less the reserve, in 100 kB documents
        assert got == (
            f"the state store is unavailable ({full(path)}); nothing was changed, retry the "
            "call later"
        )
        # Reads keep working (bob's comes from the store); a save that needs room is
        # refused to everyone (a small one may still fit in the WAL's own file).
        assert call(rt, "bob", "b1", "read_content", id="c1") == {
            "id": "c1",
            "filename": "bob.txt",
            "content": "notes",
        }
        assert call(rt, "bob", "b1", "add_content", filename="big", content=text(100_000, 7)) == got
        # Ending alice's sessions works on the full disk (the reserve is for it)...
        for session in ("a0", "a1", "a2"):
            rt.end_session(session, principal="alice")
        # ... and then saves go on, nobody restarted anything.
        assert call(rt, "bob", "b1", "add_content", filename="two", content="more") == {
            "id": "c2",
            "filename": "two",
        }
        again = call(rt, "alice", "a3", "add_content", filename="x", content=text(100_000, 1))
        assert again == {"id": "c1", "filename": "x"}
    # Nothing acknowledged was lost: a restarted server has every one of bob's documents.
    with Runtime(servers=[Content], store=SQLiteStore(path, reserve_bytes=512 << 10)) as rt:
        listed = call(rt, "bob", "b1", "list_content")
        assert isinstance(listed, dict)
        assert [(i["id"], i["filename"]) for i in listed["items"]] == [
            ("c1", "bob.txt"),
            ("c2", "two"),
        ]
        for session in ("a0", "a1", "a2"):  # each of the sessions ended on the full disk
            assert call(rt, "alice", session, "read_content", id="c1") == "content 'c1' not found"


def test_the_purge_deletes_on_a_full_disk_and_saves_resume_once_there_is_room(
    small_disk: Path,
) -> None:
    clock = ManualClock(1_000_000.0)
    path = small_disk / "state.db"
    store = SQLiteStore(path, retention=3600, clock=clock, reserve_bytes=512 << 10)
    reserve = Path(f"{path}-reserve")
    try:
        assert reserve.stat().st_size == 512 << 10
        for i in range(10):
            assert store.write([Write(("alice", f"a{i}"), KEY, os.urandom(100_000), 0)]) == [1]
        clock.advance(3000)
        assert store.write([Write(("bob", "b1"), KEY, b"bob 1", 0)]) == [1]
        # Something else fills the disk (a workspace on the same file system, say).
        filler = small_disk / "filler"
        with open(filler, "wb") as f:
            with pytest.raises(OSError):
                while True:
                    f.write(os.urandom(64 << 10))
                    f.flush()
        big = os.urandom(200_000)
        with pytest.raises(StoreUnavailableError) as refused:
            store.write([Write(("bob", "b1"), KEY, big, 1)])
        assert str(refused.value) == full(path)
        assert store.load(("bob", "b1"), KEY).data == b"bob 1"  # type: ignore[union-attr]
        # Alice's sessions expire, bob's not: the purge deletes them on the full disk.
        clock.advance(700)
        assert store.purge() == 10
        assert store.load(("alice", "a0"), KEY) is None
        # Small saves fit again (the WAL's own file), the filler still there...
        assert store.write([Write(("bob", "b2"), KEY, b"bob 2", 0)]) == [1]
        # ... and once the filler is gone, any: the reserve is held again too.
        filler.unlink()
        assert store.write([Write(("bob", "b1"), KEY, big, 1)]) == [2]
        assert reserve.stat().st_size == 512 << 10
        assert store.load(("bob", "b1"), KEY).data == big  # type: ignore[union-attr]
        assert store.load(("bob", "b2"), KEY).data == b"bob 2"  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_load_on_a_full_disk_reads_without_its_touch_and_an_expired_session_as_gone(
    small_disk: Path,
) -> None:
    clock = ManualClock(1_000_000.0)
    path = small_disk / "state.db"
    store = SQLiteStore(path, retention=3600, clock=clock, reserve_bytes=0)
    try:
        assert store.write([Write(("alice", "old"), KEY, b"old", 0)]) == [1]
        clock.advance(1000)
        assert store.write([Write(("alice", "live"), KEY, b"live", 0)]) == [1]
        clock.advance(2600)  # "old" was used exactly its retention ago; both touches due
        # The WAL emptied into the database (no frames left to write over), then the disk
        # filled: a touch can't be written any more.
        with sqlite3.connect(path) as other:
            other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        with open(small_disk / "filler", "wb") as f:
            with pytest.raises(OSError):
                while True:
                    f.write(os.urandom(64 << 10))
                    f.flush()
        with pytest.raises(StoreUnavailableError) as refused:
            store.touch([("alice", "live")])
        assert str(refused.value) == full(path)
        # The loads are served still, as the purge would have left the sessions.
        assert store.load(("alice", "live"), KEY) == Record(1, b"live", {})
        assert store.load(("alice", "old"), KEY) is None
        assert store.load(("alice", "never"), KEY) is None
    finally:
        store.close()


def test_a_delete_on_a_full_disk_leaves_no_wal_behind(small_disk: Path) -> None:
    """The room a delete on a full disk frees goes back to the file system: its WAL frames
    are checkpointed into the database and the WAL file truncated."""
    path = small_disk / "state.db"
    wal = Path(f"{path}-wal")
    store = SQLiteStore(path, reserve_bytes=512 << 10)
    try:
        for i in range(5):
            assert store.write([Write(("alice", f"a{i}"), KEY, os.urandom(100_000), 0)]) == [1]
        # The WAL emptied into the database (no frames left to write over), then the disk
        # filled: the delete's first try finds no room for its WAL.
        with sqlite3.connect(path) as other:
            other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        assert wal.stat().st_size == 0
        with open(small_disk / "filler", "wb") as f:
            with pytest.raises(OSError):
                while True:
                    f.write(os.urandom(64 << 10))
                    f.flush()
        assert store.delete_session(("alice", "a0")) == 1
        assert wal.stat().st_size == 0
        assert store.load(("alice", "a0"), KEY) is None
        assert store.load(("alice", "a1"), KEY) is not None
    finally:
        store.close()


def test_the_reserve_is_given_back_once_and_made_again(tmp_path: Path) -> None:
    reserve = Reserve(tmp_path / "reserve", 64 << 10)
    assert reserve.release() is False  # nothing held: nothing to give
    assert reserve.hold() is True and reserve.path.stat().st_size == 64 << 10
    assert reserve.release() is True and not reserve.path.exists()
    assert reserve.release() is False
    assert reserve.hold() is True and reserve.path.stat().st_size == 64 << 10
    reserve.path.unlink()  # removed by someone else meanwhile
    assert reserve.release() is True
    assert reserve.hold() is True and reserve.path.stat().st_size == 64 << 10


def test_a_reserve_of_no_bytes_is_never_made_and_a_held_one_costs_no_system_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hold` runs after every write: while the reserve is held (or there is none) it
    answers at once."""
    asked: list[object] = []
    statvfs = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: asked.append(p) or statvfs(p))
    none = Reserve(tmp_path / "none", 0)
    assert none.hold() is False
    assert (none.path.exists(), asked) == (False, [])
    tiny = Reserve(tmp_path / "tiny", 1)
    assert tiny.hold() is True
    assert (tiny.path.stat().st_size, asked) == (1, [tmp_path])
    assert tiny.hold() is True
    assert asked == [tmp_path]
