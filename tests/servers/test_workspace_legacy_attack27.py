"""Holes an attacker's pass found in the legacy-directory move and the tree removal (issue
27, findings 7, 8, 9 and 12), each shown on real files, real images and real programs.

- 7: `sandbox_disk.remove` left a deep tree in place, without a word, under an open-files
  limit (``shutil.rmtree`` ran out of descriptors, which ``ignore_errors`` swallowed);
- 8: handing a kept directory to its principal's uid recursed (``os.fwalk``) and failed on
  a deep tree, part-way;
- 9: a directory past the walk's bound was copied (under-measured) at every call of its
  session; and a session's calls queued on a move held the root-wide lock a purge needs,
  so no purge removed anything of the root;
- 12: the purge's sweep removed the root's ``lost+found`` (every image has one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_workspace_legacy_dirs import (
    budgets,
    images_or_skip,
    kept_directories,
    legacy_directory,
    served,
)
from workspace_support import Leaks

from ctxactors import Runtime
from ctxactors.sandbox_disk import MAX_DEPTH
from ctxactors.servers import workspace_legacy
from ctxactors.servers.workspace import Workspace
from ctxactors.servers.workspace_dirs import _hand_over
from ctxactors.state import SQLiteStore
from ctxactors.testing import context_args, wait_until

pytestmark = pytest.mark.usefixtures("workspace_root")

MIB = 1 << 20
DEEP = 1500  # levels: past any recursion limit, and past 1024 descriptors held a level
PAST_BOUND = "more than 200,000 files and directories, or nested more than 256 deep"


@pytest.fixture
def deep(tmp_path: Path) -> Iterator[Path]:
    """A directory for a tree too deep for pytest's own clean-up (``shutil.rmtree``, which
    recurses): removed here by ``rm``, whatever the test left."""
    place = tmp_path / "deep"
    place.mkdir()
    yield place
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(place)], check=True)


def nest(top: str, depth: int, *, leaf: bytes = b"") -> None:
    """`depth` directories ``d`` one in another under `top` (by descriptor: no path is
    that long), a file ``leaf`` of `leaf` at the bottom."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        with os.fdopen(out, "wb") as f:
            f.write(leaf)
    finally:
        os.close(fd)


def owners(path: str) -> set[str]:
    """Each entry's owner under `path` (``find`` walks any depth; never follows links)."""
    listed = subprocess.run(
        ["find", path, "-printf", "%U\\n"], capture_output=True, text=True, check=True
    )
    return set(listed.stdout.split())


REMOVE_UNDER_LIMIT = """
import json, os, resource, sys
from ctxactors.sandbox_disk import remove
sys.setrecursionlimit(100_000)  # descriptors run out first, as in a server given a deep stack
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(100)]  # a server's own sockets, files
remove(sys.argv[1])
print(json.dumps({"left": os.path.lexists(sys.argv[1]), "held": len(held)}))
"""


def test_remove_deletes_a_deep_tree_under_an_open_files_limit(deep: Path) -> None:
    """Finding 7: 1500 levels under a 1024 descriptors limit with 100 in use: rmtree runs
    out of descriptors part-way; what it left goes with ``rm``, and nothing stays."""
    top = deep / "tree"
    top.mkdir()
    nest(str(top), DEEP, leaf=b"x" * 4096)
    done = subprocess.run(
        [sys.executable, "-c", REMOVE_UNDER_LIMIT, str(top)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert json.loads(done.stdout) == {"left": False, "held": 100}
    assert list(deep.iterdir()) == []


def test_a_deep_kept_directory_is_handed_over_whole_never_through_a_link(deep: Path) -> None:
    """Finding 8: a 1500-deep directory of the earlier version's sandbox user goes to the
    principal's uid entirely; a link in it is chowned itself, not what it points to."""
    if os.geteuid() != 0:
        pytest.skip("only root may give files away")
    outside = deep / "host-file"
    outside.write_bytes(b"the host's")
    kept = deep / "ws-kept"
    kept.mkdir()
    nest(str(kept), DEEP, leaf=b"deep")
    os.symlink(outside, kept / "link")
    (kept / "file").write_bytes(b"linked")
    os.link(kept / "file", kept / "hard")
    subprocess.run(["chown", "-R", "-h", "65534:65534", str(kept)], check=True)
    _hand_over(str(kept), (4242, 4243))
    assert owners(str(kept)) == {"4242"}
    assert {os.lstat(p).st_gid for p in (kept, kept / "link", kept / "hard")} == {4243}
    assert (os.stat(outside).st_uid, os.stat(outside).st_gid) == (0, 0)


def test_the_sweep_never_removes_lost_and_found(tmp_path: Path) -> None:
    """Finding 12: an area holds ``lost+found`` (every image does), as may the root: only
    session directories' names are swept, so the root's stays, with what it holds."""
    root, area = tmp_path / "root", tmp_path / "area"
    for where in (root, area):
        (where / "lost+found").mkdir(parents=True)
    (root / "lost+found" / "#12").write_bytes(b"recovered by fsck")
    name = "ws-" + "a" * 48
    (area / name).mkdir()  # a whole copy: the root's is stale, and goes
    (root / name).mkdir()
    workspace_legacy.sweep(str(root), [str(area)])
    assert sorted(os.listdir(root)) == ["lost+found"]
    assert (root / "lost+found" / "#12").read_bytes() == b"recovered by fsck"


def test_a_purge_with_images_keeps_the_roots_lost_and_found(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    """Finding 12, served: alice's image (its own ``lost+found``) mounted for the purge."""
    found = Path(workspace_root, "lost+found")
    found.mkdir()
    (found / "#12").write_bytes(b"recovered by fsck")
    with served(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        images_or_skip(rt)
        assert not rt.call(
            "execute_command", context_args("s1", command="true"), principal="alice"
        ).is_error
        rt.reap()  # a purge pass
        assert (found / "#12").read_bytes() == b"recovered by fsck"


class Counted:
    """Calls of one of `workspace_legacy`'s functions, counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls: list[tuple[Any, ...]] = []
        real = getattr(workspace_legacy, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(workspace_legacy, name, counted)


def refused(rt: Runtime, session: str, principal: str) -> str:
    result = rt.call("execute_command", context_args(session, command="true"), principal=principal)
    assert result.is_error
    return result.text


def test_a_directory_past_the_walks_bound_is_refused_before_any_copy_and_remembered(
    store: SQLiteStore, leaks: Leaks, workspace_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 9: 20 MiB below 300 levels, which the walk doesn't reach (its count is a
    floor), into a 16 MiB image: refused before ``cp`` runs, with the reason; the next
    calls neither walk nor copy it again, until the directory changes."""
    legacy = legacy_directory(workspace_root, ("alice", "s1"))
    nest(legacy, MAX_DEPTH + 44, leaf=os.urandom(20 * MIB))
    copies, walks = Counted(monkeypatch, "_run"), Counted(monkeypatch, "measure")
    with served(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        images_or_skip(rt)
        first = refused(rt, "s1", "alice")
        assert PAST_BOUND in first and "end this session to drop them" in first
        assert (len(walks.calls), copies.calls) == (1, [])
        assert refused(rt, "s1", "alice") == first
        assert (len(walks.calls), copies.calls) == (1, [])  # remembered: no walk, no copy
        os.utime(legacy, ns=(1, 1))  # changed (here: its time)
        assert refused(rt, "s1", "alice") == first
        assert (len(walks.calls), copies.calls) == (2, [])
        assert kept_directories(workspace_root) == [legacy]
        assert rt.end_session("s1", principal="alice") == 1  # its actor
        assert kept_directories(workspace_root) == []


def test_calls_queued_on_a_move_dont_keep_the_purge_from_the_root(
    tmp_path: Path, leaks: Leaks, workspace_root: str
) -> None:
    """Finding 9: while alice's directory moves (held here, as a long copy of another
    server would), two servers' calls of her session wait for it; a purge pass meanwhile
    still removes bob's root directory past its retention, and leaves alice's alone."""
    alice = legacy_directory(workspace_root, ("alice", "s1"))
    bob = legacy_directory(workspace_root, ("bob", "s1"))
    uses = Path(workspace_root, ".ctxactors-last-use")
    for path in (alice, bob):
        os.utime(uses / os.path.basename(path), (1, 1))  # last used in 1970
    stores = [SQLiteStore(tmp_path / f"state{i}.db", retention=3600) for i in range(2)]
    servers = [Runtime(servers=[Workspace], store=s, settings=budgets()) for s in stores]
    answers: list[bool] = []

    def call(rt: Runtime) -> None:
        args = context_args("s1", command="true")
        answers.append(rt.call("execute_command", args, principal="alice").is_error)

    try:
        with workspace_legacy.moving(workspace_root, os.path.basename(alice)):
            callers = [threading.Thread(target=call, args=(rt,)) for rt in servers]
            for caller in callers:
                caller.start()
            wait_until(lambda: len(waiting_on(workspace_root)) == 2)
            servers[0].reap()  # a purge pass
            assert kept_directories(workspace_root) == [alice]
        for caller in callers:
            caller.join()
        assert answers == [False, False]  # moved by one, found moved by the other
        moved = Workspace._kept[servers[0]].path(("alice", "s1"))  # noqa: SLF001
        assert kept_directories(workspace_root) == [moved]
    finally:
        for rt in servers:
            rt.close()
        for opened in stores:
            opened.close()
    leaks.assert_none()


def waiting_on(root: str) -> list[str]:
    """The ``flock`` waits on the root's move-lock files (``/proc/locks``: a ``->`` line
    is a waiter), by inode."""
    locks = os.path.join(root, ".ctxactors-move-locks")
    inodes = {str(os.stat(os.path.join(locks, n)).st_ino) for n in os.listdir(locks)}
    lines = Path("/proc/locks").read_text().splitlines()
    return [line for line in lines if "->" in line and line.split()[6].split(":")[-1] in inodes]


def test_a_purge_pass_runs_while_two_servers_call_a_refused_session_in_a_loop(
    tmp_path: Path, leaks: Leaks, workspace_root: str
) -> None:
    """Finding 9, as the attacker ran it: alice's root directory can't move (past the
    walk's bound, into her image), and two servers call her session in a loop; one purge
    pass meanwhile removes bob's root directory past its retention."""
    alice = legacy_directory(workspace_root, ("alice", "s1"))
    nest(alice, MAX_DEPTH + 44, leaf=os.urandom(20 * MIB))
    bob = legacy_directory(workspace_root, ("bob", "s1"))
    os.utime(Path(workspace_root, ".ctxactors-last-use", os.path.basename(bob)), (1, 1))
    stores = [SQLiteStore(tmp_path / f"state{i}.db", retention=3600) for i in range(2)]
    settings = budgets(principal_disk_bytes=16 * MIB)
    servers = [Runtime(servers=[Workspace], store=s, settings=settings) for s in stores]
    stop = threading.Event()
    calls = [0, 0]

    def loop(i: int) -> None:
        while not stop.is_set():
            refused(servers[i], "s1", "alice")  # why: the test above
            calls[i] += 1

    callers = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    try:
        images_or_skip(servers[0])
        for caller in callers:
            caller.start()
        wait_until(lambda: min(calls) >= 2)
        servers[0].reap()  # a purge pass
        assert kept_directories(workspace_root) == [alice]
        assert all(caller.is_alive() for caller in callers)  # calling still
    finally:
        stop.set()
        for caller in callers:
            if caller.ident is not None:
                caller.join()
        for rt in servers:
            rt.close()
        for opened in stores:
            opened.close()
    leaks.assert_none()
