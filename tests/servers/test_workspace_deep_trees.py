"""A tree a sandbox nests thousands of levels deep still goes when its session ends or expires.

``shutil.rmtree`` recurses (Python 3.11), and its RecursionError gets through
``ignore_errors``: ``end_session`` raised and kept the directory, and one such directory
ended the retention purge's pass for every tenant. Real bubblewrap, real files.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_workspace_disk_budget import disk_runtime, disks_of, run
from workspace_support import WAIT, Leaks

from ctxactors.sandbox_disk import remove
from ctxactors.servers.workspace import Workspace
from ctxactors.state import SQLiteStore
from ctxactors.testing import wait_until

pytestmark = pytest.mark.usefixtures("workspace_root")

DEEP = "d=$(printf 'a/%.0s' $(seq 1500)); mkdir -p $d && echo made"  # 3,000 of PATH_MAX's 4,096


@pytest.fixture
def short_store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """Sessions kept one second after their last use."""
    opened = SQLiteStore(tmp_path / "short.db", retention=1.0)
    yield opened
    opened.close()


def test_remove_takes_a_tree_too_deep_for_a_recursive_walk(tmp_path: Path) -> None:
    path = tmp_path / "deep"
    subprocess.run(["mkdir", "-p", str(path / ("a/" * 1500))], check=True)
    (path / "a" / "f").write_text("x")
    (tmp_path / "outside").write_text("kept")
    (path / "link").symlink_to(tmp_path / "outside")
    remove(str(path))
    assert sorted(os.listdir(tmp_path)) == ["outside"]  # the link went, not what it names
    assert (tmp_path / "outside").read_text() == "kept"


def test_ending_a_session_removes_its_deep_tree(short_store: SQLiteStore, leaks: Leaks) -> None:
    with disk_runtime(leaks, short_store) as rt:
        assert run(rt, "d1", DEEP, "mallory")["output"] == "made\n"
        path = Workspace._kept[rt].path(("mallory", "d1"))  # noqa: SLF001
        assert os.path.isdir(os.path.join(path, "a"))
        assert rt.end_session("d1", principal="mallory") == 1
        assert not os.path.exists(path)


def test_a_deep_tree_does_not_stop_the_purge_for_other_sessions(
    short_store: SQLiteStore, leaks: Leaks
) -> None:
    sessions = [("mallory", "d1"), ("alice", "s1"), ("mallory", "s2")]
    with disk_runtime(leaks, short_store) as rt:
        assert run(rt, "d1", DEEP, "mallory")["output"] == "made\n"
        assert run(rt, "s1", "echo note > n && echo made", "alice")["output"] == "made\n"
        assert run(rt, "s2", "echo note > n && echo made", "mallory")["output"] == "made\n"
        dirs = Workspace._kept[rt]  # noqa: SLF001
        records = [dirs._use_file(dirs.path(key)) for key in sessions]  # noqa: SLF001
        assert rt.durability is not None
        rt.durability.flush()
    with disk_runtime(leaks, short_store) as rt:
        dirs = Workspace._kept[rt]  # noqa: SLF001
        paths = [dirs.path(key) for key in sessions]

        def purged() -> bool:
            rt.reap()  # a purge pass now (each session's last use was >= 1 s ago)
            return not any(os.path.exists(r) for r in records)

        wait_until(purged, WAIT, describe=lambda: [os.path.exists(r) for r in records])
        for (principal, _), path in zip(sessions, paths, strict=True):
            assert disks_of(rt).area(principal) == os.path.dirname(path)  # mounted again
            assert not os.path.exists(path), path
