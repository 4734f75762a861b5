"""The space a SQLite store holds back for deletes on a full disk (`Reserve`): real blocks,
taken only when the disk has room for it twice over, given back whole, and never written
through a link someone put in its place.

On real small file systems: tmpfs mounts of this test's own (root only).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from tmpfs_support import own_tmpfs

from ctxactors.state._reserve import Reserve

SIZE = 256 << 10


@pytest.fixture
def one_mib_disk() -> Iterator[Path]:
    """A 1 MiB file system: room for a 256 KiB reserve twice over, not for a 600 KiB one."""
    with own_tmpfs("1m", "ctxactors-test-reserve-") as where:
        yield where


def free(where: Path) -> int:
    s = os.statvfs(where)
    return s.f_bavail * s.f_frsize


def test_a_held_reserve_is_allocated_blocks_readable_by_the_owner_only(tmp_path: Path) -> None:
    reserve = Reserve(tmp_path / "state.db-reserve", SIZE)
    assert reserve.held is False and not reserve.path.exists()
    assert reserve.hold() is True and reserve.held is True
    info = reserve.path.stat()
    assert info.st_size == SIZE
    assert info.st_blocks * 512 >= SIZE  # allocated, not a sparse file that frees nothing
    assert stat.S_IMODE(info.st_mode) == 0o600
    # Held already: a second hold keeps the same file (and says it is held).
    assert reserve.hold() is True and reserve.path.stat().st_ino == info.st_ino
    assert reserve.release() is True and reserve.held is False


def test_a_reserve_of_size_zero_is_never_held(tmp_path: Path) -> None:
    reserve = Reserve(tmp_path / "state.db-reserve", 0)
    assert reserve.hold() is False and reserve.held is False
    assert not reserve.path.exists()
    assert reserve.release() is False


def test_releasing_gives_the_space_back_to_the_file_system(one_mib_disk: Path) -> None:
    reserve = Reserve(one_mib_disk / "state.db-reserve", SIZE)
    empty = free(one_mib_disk)
    assert reserve.hold() is True
    assert free(one_mib_disk) == empty - SIZE
    assert reserve.release() is True
    assert free(one_mib_disk) == empty and not reserve.path.exists()


def test_no_reserve_is_taken_from_a_disk_without_room_for_it_twice(one_mib_disk: Path) -> None:
    # 600 KiB fits in 1 MiB once, not twice: taking it would leave saves less than it.
    reserve = Reserve(one_mib_disk / "state.db-reserve", 600 << 10)
    assert reserve.hold() is False and reserve.held is False
    assert not reserve.path.exists()
    # Room for it exactly twice over is enough.
    exact = Reserve(one_mib_disk / "exact-reserve", free(one_mib_disk) // 2)
    assert exact.hold() is True and exact.path.stat().st_size == exact.size


def test_a_reserve_left_by_the_last_run_is_held_again_on_a_fuller_disk(
    one_mib_disk: Path,
) -> None:
    """A restart finds its own file: the space is the reserve's already, so it is kept
    even though the disk no longer has room for it twice over."""
    path = one_mib_disk / "state.db-reserve"
    assert Reserve(path, 400 << 10).hold() is True  # 1 MiB free then: room twice over
    again = Reserve(path, 400 << 10)  # now 624 KiB free: not twice over
    assert free(one_mib_disk) < 2 * again.size
    assert again.hold() is True and again.held is True
    assert path.stat().st_size == again.size


def test_a_reserve_that_does_not_fit_meanwhile_leaves_no_partial_file(
    one_mib_disk: Path,
) -> None:
    """Room at the check, none at the allocation (another writer came in between): the
    partial file is removed and the reserve is tried again later."""
    path = one_mib_disk / "state.db-reserve"
    # The disk's own room passes the check, then the file can't be made that large: a
    # file already there (so the check lets it through) bigger than the disk.
    path.write_bytes(b"")
    reserve = Reserve(path, 2 << 20)
    assert reserve.hold() is False and reserve.held is False
    assert not path.exists()
    assert free(one_mib_disk) > 1000 << 10  # nothing of it left taking space
    assert reserve.release() is False


def test_a_link_in_the_reserves_place_is_not_followed(tmp_path: Path) -> None:
    """Someone who can write the store's directory links the reserve's name to a file of
    theirs choosing: the reserve neither grows nor truncates it."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    path = tmp_path / "state.db-reserve"
    path.symlink_to(victim)
    reserve = Reserve(path, SIZE)
    assert reserve.hold() is False and reserve.held is False
    assert victim.read_bytes() == b"precious"
    assert not path.is_symlink()  # the link is removed: the next hold makes the real file
    assert reserve.hold() is True and path.stat().st_size == SIZE
    assert victim.read_bytes() == b"precious"


def test_a_reserve_whose_directory_is_gone_is_not_held_and_raises_nothing(
    tmp_path: Path,
) -> None:
    """The data directory removed under a running store: each save's try to hold the
    reserve again says no (and the next one tries again), it never fails the save."""
    reserve = Reserve(tmp_path / "gone" / "state.db-reserve", SIZE)
    assert reserve.hold() is False and reserve.held is False
    (tmp_path / "gone").mkdir()
    assert reserve.hold() is True and reserve.path.stat().st_size == SIZE
