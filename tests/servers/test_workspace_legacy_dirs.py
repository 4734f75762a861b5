"""A session directory kept by a version without principals' areas moves into its area.

Such a directory (``<root>/ws-<HMAC of the session's key>``, as the workspace kept it before
``principals/`` existed) is built here the way that version built it, then a server with
disk budgets serves its session: the files are the session's still, in its principal's
area (its loop-mounted image here, as root; the measured fallback with ``disk=off``), where
its budget holds them; no other principal sees them; and a ``kill -9`` of a real server in
the middle of the move loses nothing and leaves one directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from workspace_support import WAIT, Leaks, start, wait_done

from ctxactors import Runtime
from ctxactors.sandbox_disk import measure
from ctxactors.servers import workspace_legacy
from ctxactors.servers.workspace import Workspace
from ctxactors.servers.workspace_dirs import SessionDirs
from ctxactors.settings import Settings
from ctxactors.state import SessionRef, SQLiteStore, encode_ref
from ctxactors.testing import context_args, wait_until

pytestmark = pytest.mark.usefixtures("workspace_root")

MIB = 1 << 20
OLD_UID = 65534  # the single sandbox user of the version without areas ("nobody")
FILES = {"notes.txt": b"kept before the upgrade\n", "sub/deep.bin": bytes(range(256)) * 64}


def budgets(**budget: Any) -> Settings:
    """The environment's settings with these disk budget fields."""
    settings = Settings.from_env()
    changed = msgspec.structs.replace(settings.workspace.budget, **budget)
    workspace = msgspec.structs.replace(settings.workspace, budget=changed)
    return msgspec.structs.replace(settings, workspace=workspace)


@contextlib.contextmanager
def served(leaks: Leaks, store: SQLiteStore, **budget: Any) -> Iterator[Runtime]:
    rt = Runtime(servers=[Workspace], store=store, settings=budgets(**budget))
    try:
        yield rt
    finally:
        rt.close()
        leaks.assert_none()


def images_or_skip(rt: Runtime) -> None:
    tenants = Workspace.tenants(rt)
    assert tenants is not None
    if tenants.disks.images is None:
        pytest.skip(f"no loop-mounted images here: {tenants.disks.enforcement}")


def legacy_directory(root: str, session: SessionRef, extra: dict[str, bytes] | None = None) -> str:
    """What the workspace before areas (fdc5e63) kept for `session`: ``<root>/ws-`` and
    the first 48 hex digits of the HMAC-SHA256 of its encoded key under the root's key,
    mode 0700, given to the single sandbox user, its last use recorded in
    ``.ctxactors-last-use``; here holding `FILES`, a symlink, a hard link and `extra`."""
    SessionDirs(root, Settings.from_env().workspace.sandbox).path(session)  # the root's key
    key = Path(root, ".ctxactors-session-key").read_bytes()
    digest = hmac.new(key, encode_ref(session).encode(), hashlib.sha256).hexdigest()
    path = os.path.join(root, "ws-" + digest[:48])
    os.mkdir(path, 0o700)
    for name, data in {**FILES, **(extra or {})}.items():
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        Path(path, name).write_bytes(data)
    os.symlink("/etc/shadow", os.path.join(path, "link"))  # a link stays a link
    os.link(os.path.join(path, "notes.txt"), os.path.join(path, "hard"))
    for parent, dirs, names in os.walk(path):
        for name in [*dirs, *names]:
            os.chown(os.path.join(parent, name), OLD_UID, OLD_UID, follow_symlinks=False)
    os.chown(path, OLD_UID, OLD_UID)
    uses = os.path.join(root, ".ctxactors-last-use")  # its last use, as that version kept it
    os.makedirs(uses, mode=0o700, exist_ok=True)
    Path(uses, os.path.basename(path)).touch(0o600)
    return path


def run(rt: Runtime, session: str, command: str, principal: str) -> str:
    process = start(rt, session, command, principal=principal)
    done = wait_done(rt, session, process, principal=principal)
    assert done["status"] == "exited", done
    return str(done["output"])


READ = "cat notes.txt; sha256sum sub/deep.bin; readlink link; stat -c %h hard"
SEEN = (
    "kept before the upgrade\n"
    f"{hashlib.sha256(FILES['sub/deep.bin']).hexdigest()}  sub/deep.bin\n"
    "/etc/shadow\n2\n"
)


def kept_directories(root: str) -> list[str]:
    """Every session directory or move leftover under the root and its areas."""
    found = []
    for parent in [root, *(str(p) for p in Path(root, "principals").glob("*"))]:
        found += [
            os.path.join(parent, n)
            for n in os.listdir(parent)
            if n.startswith(("ws-", workspace_legacy.COPY, workspace_legacy.TRASH))
        ]
    return sorted(found)


def test_a_legacy_directory_moves_into_its_principals_image_where_its_budget_holds(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    legacy = legacy_directory(workspace_root, ("alice", "s1"))
    with served(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        images_or_skip(rt)
        assert run(rt, "s1", READ, "alice") == SEEN
        # Moved into alice's image, and handed to her uid: nothing left in the root.
        path = Workspace._kept[rt].path(("alice", "s1"))  # noqa: SLF001
        assert os.path.ismount(os.path.dirname(path))
        assert kept_directories(workspace_root) == [path]
        assert not os.path.exists(legacy)
        assert os.lstat(path).st_uid != OLD_UID
        # Its writes are charged to alice's image: past 16 MiB, ENOSPC (in place, on the
        # root's filesystem, 20 MiB were written).
        out = run(rt, "s1", "head -c 20M /dev/zero > big; echo rc=$?", "alice")
        assert out == "head: error writing 'standard output': No space left on device\nrc=1\n"
        # Another principal with the same session id has a directory of its own, empty.
        assert run(rt, "s1", "ls -A; echo end", "mallory") == "end\n"
    # A restart serves the moved directory, from the image.
    with served(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        assert run(rt, "s1", "rm big; echo rc=$?", "alice").endswith("rc=0\n")  # was full
        assert run(rt, "s1", READ, "alice") == SEEN
        assert kept_directories(workspace_root) == [path]


def test_with_measured_budgets_a_legacy_directory_is_renamed_into_the_area_and_counted(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    legacy_directory(workspace_root, ("alice", "s1"), {"two": b"\1" * 2 * MIB})
    with served(leaks, store, disk="off", principal_disk_bytes=3 * MIB) as rt:
        assert run(rt, "s1", READ, "alice") == SEEN
        path = Workspace._kept[rt].path(("alice", "s1"))  # noqa: SLF001
        assert kept_directories(workspace_root) == [path]
        assert run(rt, "s1", "ls -A; echo end", "mallory") == "end\n"
    # After a restart alice's first command is in another session: the walk of her area
    # finds the 2 MiB (in the root, only the server-wide count would), so less than 1 MiB
    # is left and no 1 MiB file fits.
    with served(leaks, store, disk="off", principal_disk_bytes=3 * MIB) as rt:
        out = run(rt, "s2", "head -c 1M /dev/zero > f; echo rc=$?", "alice")
        assert out == "File size limit exceeded\nrc=153\n"


def test_a_legacy_directory_larger_than_the_free_disk_stays_unused_until_the_session_ends(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    legacy = legacy_directory(workspace_root, ("alice", "s1"), {"big": b"\1" * 20 * MIB})
    with served(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        images_or_skip(rt)
        result = rt.call("execute_command", context_args("s1", command="ls"), principal="alice")
        assert result.is_error
        held, _ = measure(legacy)
        assert held > 20 * MIB
        assert result.text.startswith(
            f"this session's files, kept by an earlier version outside its principal's "
            f"workspace disk, take {held:,} bytes: more than that disk has free ("
        ), result.text
        assert result.text.endswith(
            "bytes; its size is CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES). They stay as "
            "they are, unused, until the session ends: free space in other sessions (rm) "
            "and call again, or end this session to drop them"
        )
        # Not used in place, and nothing of it copied into the image; the server-wide
        # budget counts it (the root's walk).
        assert kept_directories(workspace_root) == [legacy]
        tenants = Workspace.tenants(rt)
        assert tenants is not None and tenants.disks.server_used() >= held
        assert Path(legacy, "big").stat().st_size == 20 * MIB
        # Alice's other sessions work; ending this one drops it.
        assert run(rt, "s2", "echo ok", "alice") == "ok\n"
        rt.end_session("s1", principal="alice")
        assert not os.path.exists(legacy)


# A server that moves the legacy directory of alice's session s1 in a subprocess; `GATE`
# stops it at one step of the move (it then says so on stdout and waits to be killed).
SERVER = textwrap.dedent(
    """
    import sys, threading
    import msgspec
    from ctxactors import Runtime
    from ctxactors.servers import workspace_legacy
    from ctxactors.servers.workspace import Workspace
    from ctxactors.settings import Settings
    from ctxactors.state import SQLiteStore
    from ctxactors.testing import context_args

    gate = sys.argv[2]

    def stop_here():
        print("gate", flush=True)
        threading.Event().wait()

    if gate == "copied":  # the copy whole, not yet named as the session's
        copy = workspace_legacy._run
        def run(*argv):
            copy(*argv)
            if argv[0] == "sync":
                stop_here()
        workspace_legacy._run = run
    elif gate == "renamed":  # the copy is the session's, the root's not removed yet
        workspace_legacy.discard = lambda legacy: stop_here()
    settings = Settings.from_env()
    budget = msgspec.structs.replace(settings.workspace.budget, principal_disk_bytes=64 << 20)
    workspace = msgspec.structs.replace(settings.workspace, budget=budget)
    rt = Runtime(
        servers=[Workspace],
        store=SQLiteStore(sys.argv[1], retention=3600),
        settings=msgspec.structs.replace(settings, workspace=workspace),
    )
    print("ready", flush=True)
    rt.call("execute_command", context_args("s1", command="true"), principal="alice")
    """
)


@pytest.mark.parametrize("gate", ["copying", "copied", "renamed"])
def test_a_server_killed_during_a_move_loses_nothing_and_leaves_one_directory(
    tmp_path: Path, leaks: Leaks, workspace_root: str, gate: str
) -> None:
    many = {f"many/{i:04}": f"{i}\n".encode() * 64 for i in range(3000)}
    legacy = legacy_directory(workspace_root, ("alice", "s1"), many)
    before = tree(legacy)
    database = str(tmp_path / "state.db")
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, database, gate],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == "ready\n"
        if gate == "copying":  # cp frozen part-way, then the server killed
            copier = wait_until(copiers, WAIT, describe=lambda: kept_directories(workspace_root))
            copier[0].suspend()
        else:
            assert server.stdout.readline() == "gate\n"
        server.send_signal(signal.SIGKILL)
        server.wait(WAIT)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()
    # No copier outlives the server (it would write on into the next try's copy).
    wait_until(lambda: not copiers(), WAIT, describe=copiers)
    if os.path.lexists(legacy):
        assert tree(legacy) == before  # the source is whole whatever the copy got to
    store = SQLiteStore(database, retention=3600)
    rt = Runtime(servers=[Workspace], store=store, settings=budgets(principal_disk_bytes=64 * MIB))
    try:
        assert run(rt, "s1", READ + "; cat many/2999 | head -1", "alice") == SEEN + "2999\n"
        path = Workspace._kept[rt].path(("alice", "s1"))  # noqa: SLF001
        assert tree(path) == before
        assert kept_directories(workspace_root) == [path]
    finally:
        rt.close()
        store.close()
    leaks.assert_none()


def test_the_purge_removes_what_a_killed_move_left(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    """A root directory whose copy was whole, and a partial copy of another session, are
    removed by the next purge pass, not only by their sessions' next call."""
    with served(leaks, store) as rt:
        run(rt, "s1", "echo moved > f", "alice")  # alice's area (mounted), with s1
        path = Workspace._kept[rt].path(("alice", "s1"))  # noqa: SLF001
        area = os.path.dirname(path)
        legacy_directory(workspace_root, ("alice", "s1"))  # as if not removed
        partial = os.path.join(area, workspace_legacy.COPY + "ws-" + "0" * 48)
        os.mkdir(partial)
        trash = os.path.join(workspace_root, workspace_legacy.TRASH + "ws-" + "1" * 48)
        os.mkdir(trash)
        rt.reap()  # a purge pass
        assert kept_directories(workspace_root) == [path]
        assert run(rt, "s1", "cat f", "alice") == "moved\n"


def test_ending_a_session_removes_its_legacy_directory_and_a_copy_cut_short(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    legacy = legacy_directory(workspace_root, ("alice", "s2"))
    with served(leaks, store) as rt:
        run(rt, "s1", "true", "alice")  # alice's area, made (on a root server, mounted)
        s1 = Workspace._kept[rt].path(("alice", "s1"))  # noqa: SLF001
        name = os.path.basename(legacy)
        os.mkdir(os.path.join(os.path.dirname(s1), workspace_legacy.COPY + name))  # as a
        # server killed mid-copy left it
        assert rt.end_session("s2", principal="alice") == 0  # no actor: its files only
        assert kept_directories(workspace_root) == [s1]
        assert not os.path.exists(os.path.join(workspace_root, ".ctxactors-last-use", name))


def test_a_purge_leaves_the_roots_directories_alone_while_a_move_holds_the_lock(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    """Past its retention, a legacy directory goes with the next purge, but not while a
    move (of this server or another on the root) holds its name's lock: it may be copying
    it. Another name's move stops nothing."""
    legacy = legacy_directory(workspace_root, ("alice", "s1"))
    other = legacy_directory(workspace_root, ("bob", "s1"))
    for path in (legacy, other):
        record = os.path.join(workspace_root, ".ctxactors-last-use", os.path.basename(path))
        os.utime(record, (1, 1))  # last used in 1970
    with served(leaks, store) as rt:
        with workspace_legacy.moving(workspace_root, os.path.basename(legacy)):
            rt.reap()  # a purge pass
            assert kept_directories(workspace_root) == [legacy]
        rt.reap()
        assert kept_directories(workspace_root) == []


def test_one_principals_long_move_stalls_no_other_principals_move(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    mallory = legacy_directory(workspace_root, ("mallory", "s1"))
    legacy_directory(workspace_root, ("alice", "s1"))
    with served(leaks, store) as rt:
        # Mallory's directory moving (a long copy, here held for the test): alice's moves.
        with workspace_legacy.moving(workspace_root, os.path.basename(mallory)):
            assert run(rt, "s1", READ, "alice") == SEEN
        alice = Workspace._kept[rt].path(("alice", "s1"))  # noqa: SLF001
        assert kept_directories(workspace_root) == sorted([alice, mallory])


def copiers() -> list[psutil.Process]:
    """The processes copying a session's directory into an area (``cp`` of a move)."""
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(workspace_legacy.COPY in part for part in p.info["cmdline"] or [])
    ]


def tree(path: str) -> dict[str, tuple[int, int, bytes | str | None]]:
    """Each entry under `path`: (mode, links, contents or link target)."""
    found: dict[str, tuple[int, int, bytes | str | None]] = {}
    for parent, dirs, names in os.walk(path):
        for name in [*dirs, *names]:
            full = os.path.join(parent, name)
            st = os.lstat(full)
            if os.path.islink(full):
                what: bytes | str | None = os.readlink(full)
            elif os.path.isfile(full):
                what = Path(full).read_bytes()
            else:
                what = None
            found[os.path.relpath(full, path)] = (st.st_mode, st.st_nlink, what)
    return found
