"""A principal's workspace files have a disk budget: past it its writes fail, alone.

With real bubblewrap, a real SQLite store (the directories outlive a restart) and, where the
server may mount loop devices (root here), a real ext4 image per principal; the kernel tests
skip, saying why, where it can't. The measured fallback is forced with ``disk=off`` and runs
everywhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs
from workspace_support import WAIT, Leaks, call, start, wait_done

from ctxactors import Runtime
from ctxactors.cli.loadtest.refusals import command_refusal
from ctxactors.sandbox_disk import DiskBudgets, measure
from ctxactors.servers.workspace import Workspace
from ctxactors.settings import Settings
from ctxactors.state import SQLiteStore
from ctxactors.testing import wait_until

pytestmark = pytest.mark.usefixtures("workspace_root")

MIB = 1 << 20
FULL = (
    "this principal's workspace files take {used:,} bytes of disk: the limit is {limit:,} "
    "(CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES); until some are deleted (rm) or sessions "
    "ended, commands can't write files"
)


@contextlib.contextmanager
def disk_runtime(leaks: Leaks, store: SQLiteStore, **budget: Any) -> Iterator[Runtime]:
    """A workspace runtime on `store` with these budget settings, closed after, leaving
    nothing (no process, no thread, no mount)."""
    settings = Settings.from_env()
    changed = msgspec.structs.replace(settings.workspace.budget, **budget)
    workspace = msgspec.structs.replace(settings.workspace, budget=changed)
    rt = Runtime(
        servers=[Workspace],
        store=store,
        settings=msgspec.structs.replace(settings, workspace=workspace),
    )
    mounts: list[str] = []
    try:
        disks = disks_of(rt)
        yield rt
        if disks.images is not None:
            mounts = [disks.images.areas]
    finally:
        rt.close()
        leaks.assert_none()
    assert [m for m in mounted() if any(m.startswith(p) for p in mounts)] == []


def mounted() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f]


def disks_of(rt: Runtime) -> DiskBudgets:
    tenants = Workspace.tenants(rt)
    assert tenants is not None
    return tenants.disks


def kernel(rt: Runtime) -> DiskBudgets:
    disks = disks_of(rt)
    if disks.images is None:
        pytest.skip(f"no loop-mounted images here: {disks.enforcement}")
    return disks


def run(rt: Runtime, session: str, command: str, principal: str | None) -> dict[str, Any]:
    process = start(rt, session, command, principal=principal)
    done = wait_done(rt, session, process, principal=principal)
    assert done["status"] == "exited", done
    return done


def write(rt: Runtime, session: str, size: str, name: str, principal: str | None) -> str:
    """The output of a command writing `size` bytes (``head -c`` units) to `name`."""
    return str(
        run(rt, session, f"head -c {size} /dev/zero > {name}; echo rc=$?", principal)["output"]
    )


def started(rt: Runtime, session: str, command: str, principal: str) -> dict[str, Any]:
    """The answer of execute_command (with its warning, if any), once the command ended."""
    answer = call(rt, session, "execute_command", command=command, principal=principal)
    wait_done(rt, session, answer["processId"], principal=principal)
    return dict(answer)


def test_past_its_budget_a_principal_gets_enospc_and_another_writes(
    store: SQLiteStore, leaks: Leaks
) -> None:
    with disk_runtime(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        disks = kernel(rt)
        filled = run(rt, "m1", "head -c 20M /dev/zero > big; echo rc=$?", "mallory")
        assert filled["output"] == (
            "head: error writing 'standard output': No space left on device\nrc=1\n"
        )
        used = disks.images.usage("mallory").used  # type: ignore[union-attr]
        assert 16 * MIB <= used <= 16 * MIB + disks.images.budget // 32 + 2 * MIB  # type: ignore[union-attr]
        # Full: its next command (another session: the budget is the principal's) is told
        # so, and can't write, nor create a file (delete-only); the answer and the output say
        # which budget and what to do.
        answer = started(rt, "m2", "echo x > small; echo rc=$?", "mallory")
        used = disks.images.usage("mallory").used  # type: ignore[union-attr]  # m2's directory too
        assert answer["warning"] == FULL.format(used=used, limit=16 * MIB)
        note = f"[ctxactors: {answer['warning']}]\n"
        missing = "cat: small: No such file or directory\n"
        assert run(rt, "m2", "cat small; ls", "mallory")["output"] == note + missing
        # Another principal writes as ever, on its own filesystem.
        assert write(rt, "a1", "12M", "f", "alice") == ("rc=0\n")
        # Deleting always works when full, and gives the budget back.
        assert run(rt, "m1", "rm big; echo rc=$?", "mallory")["output"].endswith("rc=0\n")
        again = started(rt, "m1", "head -c 8M /dev/zero > f; echo rc=$?", "mallory")
        assert "warning" not in again
        assert run(rt, "m1", "ls -s --block-size=M f", "mallory")["output"] == "8M f\n"
    # A restart: the image is mounted again, holding what it held (8 MiB), so 12 MiB more
    # don't fit.
    with disk_runtime(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        kernel(rt)
        out = run(rt, "m1", "head -c 12M /dev/zero > g; echo rc=$?; ls f", "mallory")["output"]
        assert out == "head: error writing 'standard output': No space left on device\nrc=1\nf\n"
        # Ending the sessions needs no space, and empties the principal's filesystem.
        assert rt.end_session("m1", principal="mallory") == 1
        assert rt.end_session("m2", principal="mallory") == 0  # no live actor: files only
        assert write(rt, "m3", "12M", "g", "mallory") == ("rc=0\n")


def test_a_raised_budget_grows_the_filesystem_and_a_lowered_one_below_use_refuses_writes(
    store: SQLiteStore, leaks: Leaks
) -> None:
    with disk_runtime(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        kernel(rt)
        run(rt, "m1", "head -c 12M /dev/zero > f", "mallory")
    with disk_runtime(leaks, store, principal_disk_bytes=32 * MIB) as rt:
        disks = kernel(rt)
        assert write(rt, "m1", "16M", "g", "mallory") == ("rc=0\n")
        capacity = disks.images.usage("mallory").capacity  # type: ignore[union-attr]
        assert 32 * MIB <= capacity <= 32 * MIB + MIB + 2 * MIB
    with disk_runtime(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        disks = kernel(rt)
        answer = started(rt, "m1", "echo x > h; echo rc=$?", "mallory")
        assert disks.images is not None
        [note] = disks.images.notes  # 28 MiB held: the filesystem can't shrink to 16
        assert "kept at" in note
        used = disks.images.usage("mallory").used
        assert answer["warning"] == FULL.format(used=used, limit=16 * MIB)
        assert run(rt, "m1", "rm g; echo rc=$?", "mallory")["output"].endswith("rc=0\n")
        assert "warning" not in started(rt, "m1", "echo x > h", "mallory")
    # Mounted again with 12 MiB held, it shrinks to the lowered budget.
    with disk_runtime(leaks, store, principal_disk_bytes=16 * MIB) as rt:
        disks = kernel(rt)
        assert run(rt, "m1", "cat h", "mallory")["output"] == "x\n"
        assert disks.images is not None and disks.images.notes == []
        capacity = disks.images.usage("mallory").capacity
        assert 16 * MIB <= capacity <= 16 * MIB + (16 * MIB) // 32 + 2 * MIB


def test_the_measured_fallback_caps_files_to_what_is_left_and_refuses_writes_past_it(
    store: SQLiteStore, leaks: Leaks
) -> None:
    with (
        capture_logs() as logs,
        disk_runtime(leaks, store, disk="off", principal_disk_bytes=8 * MIB) as rt,
    ):
        disks = disks_of(rt)
        assert disks.images is None
        [line] = [e for e in logs if e["event"] == "workspace_budgets"]
        assert line["disk_enforcement"].startswith(
            "measured: each principal's directories walked after its commands, RLIMIT_FSIZE "
            "to what is left (CTXACTORS_WORKSPACE_DISK=off); server-wide "
        )
        assert run(rt, "m2", "true", "mallory")["output"] == ""  # its directory made
        assert write(rt, "m1", "6M", "a", "mallory") == ("rc=0\n")
        # 2 MiB are left (less the directories' blocks): no one file may be larger.
        out = write(rt, "m2", "6M", "b", "mallory")
        assert out == "File size limit exceeded\nrc=153\n"
        used, _ = disks.measure("mallory")  # every directory: walked at its first command
        assert used == 8 * MIB
        # At its budget: told so, and no file can grow at all.
        answer = started(rt, "m1", "echo x > c; echo rc=$?", "mallory")
        assert answer["warning"] == FULL.format(used=used, limit=8 * MIB)
        # Another principal writes as ever.
        assert write(rt, "a1", "6M", "a", "alice") == ("rc=0\n")
        # Deleting works, and gives the budget back once counted.
        assert run(rt, "m2", "rm b; echo rc=$?", "mallory")["output"].endswith("rc=0\n")
        assert run(rt, "m1", "rm a; echo rc=$?", "mallory")["output"] == "rc=0\n"
        assert write(rt, "m1", "6M", "a", "mallory") == ("rc=0\n")
    # A restart walks the principal's directories again: 6 MiB held, 2 left.
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=8 * MIB) as rt:
        out = write(rt, "m1", "6M", "b", "mallory")
        assert out == "File size limit exceeded\nrc=153\n"
        assert rt.end_session("m1", principal="mallory") == 1
        assert write(rt, "m3", "6M", "b", "mallory") == ("rc=0\n")


def test_callers_with_no_principal_are_held_by_the_server_wide_budget(
    store: SQLiteStore, leaks: Leaks
) -> None:
    with disk_runtime(leaks, store, server_disk_bytes=4 * MIB) as rt:
        assert write(rt, "s1", "6M", "a", None) == ("File size limit exceeded\nrc=153\n")
        answer = call(rt, "s1", "execute_command", command="echo x > b")
        used = disks_of(rt).server_used()
        assert answer["warning"] == (
            f"the server's workspace files take {used:,} bytes of disk: the limit is 4,194,304 "
            "(CTXACTORS_WORKSPACE_SERVER_DISK_BYTES); until some are deleted (rm) or "
            "sessions ended, commands can't write files"
        )
        wait_done(rt, "s1", answer["processId"])
        assert run(rt, "s1", "rm a; echo rc=$?", None)["output"].endswith("rc=0\n")
        assert write(rt, "s1", "1M", "a", None) == "rc=0\n"


def test_a_session_directory_is_in_its_principals_own_area(
    store: SQLiteStore, leaks: Leaks, workspace_root: str
) -> None:
    with disk_runtime(leaks, store) as rt:
        run(rt, "s1", "echo hi > f", "alice")
        dirs = Workspace._kept[rt]  # noqa: SLF001
        path = dirs.path(("alice", "s1"))
        assert os.path.dirname(os.path.dirname(path)) == os.path.join(workspace_root, "principals")
        with open(os.path.join(path, "f")) as f:
            assert f.read() == "hi\n"
        assert disks_of(rt).area("alice") == os.path.dirname(path)


def test_the_load_testers_count_a_command_started_at_a_disk_budget_by_its_variable() -> None:
    note = "[ctxactors: " + FULL.format(used=9, limit=8) + "]\n"
    assert command_refusal(note + "File size limit exceeded\n", 153, "exited") == (
        "CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES"
    )
    assert command_refusal("head: error writing 'f': No space left on device\n", 1, "exited") == (
        "kernel: no space (a tmpfs: CTXACTORS_WORKSPACE_TMP_BYTES, or the principal's disk: "
        "CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES)"
    )


@pytest.fixture
def short_store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """A store whose sessions are kept one second after their last use."""
    opened = SQLiteStore(tmp_path / "short.db", retention=1.0)
    yield opened
    opened.close()


def test_the_purge_reaches_a_principals_directories_on_a_disk_not_mounted_yet(
    short_store: SQLiteStore, leaks: Leaks
) -> None:
    """After a restart a principal's image is mounted on its first use, or by the purge:
    a session past its retention goes even if its principal never came back (and the purge
    unmounts the image after it: no loop device held for a principal that isn't here)."""
    with disk_runtime(leaks, short_store) as rt:
        kernel(rt)
        run(rt, "s1", "echo kept > note", "alice")
        path = Workspace._kept[rt].path(("alice", "s1"))  # noqa: SLF001
        assert rt.durability is not None
        rt.durability.flush()
    assert not os.path.exists(path)  # its filesystem was unmounted with the runtime
    with disk_runtime(leaks, short_store) as rt:
        dirs = Workspace._kept[rt]  # noqa: SLF001
        record = dirs._use_file(path)  # noqa: SLF001

        def purged() -> bool:
            rt.reap()  # a purge pass now (the session's last use was >= 1 s ago)
            return not os.path.exists(record)

        wait_until(purged, WAIT, describe=lambda: os.listdir(os.path.dirname(record)))
        assert not os.path.ismount(os.path.dirname(path))  # mounted for the purge only
        assert disks_of(rt).area("alice") == os.path.dirname(path)
        assert os.listdir(os.path.dirname(path)) == ["lost+found"]


def test_the_walk_counts_each_inode_once_and_never_follows_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * (1 << 20))
    area = tmp_path / "area"
    (area / "d").mkdir(parents=True)
    (area / "d" / "f").write_bytes(b"y" * 8192)
    os.link(area / "d" / "f", area / "d" / "g")  # the same blocks: counted once
    os.symlink(outside, area / "d" / "out")  # not followed
    os.symlink(outside / "big", area / "big")
    blocks = sum(
        os.stat(p, follow_symlinks=False).st_blocks * 512
        for p in (area / "d", area / "d" / "f", area / "d" / "out", area / "big")
    )
    assert measure(str(area)) == (blocks + os.stat(area).st_blocks * 512, 5)  # its own too
    assert measure(str(area), names="d") == (blocks - os.lstat(area / "big").st_blocks * 512, 4)
    assert measure(str(tmp_path / "missing")) == (0, 0)
