"""A command that writes past a disk budget is stopped while it runs (`ctxactors.sandbox_diskwatch`).

``RLIMIT_FSIZE`` caps each file, not what a command writes: these commands write many files,
each well under the budget, and would write far past it (64 MiB, 28 MiB) if nothing watched
them. Real bubblewrap, real files, a real store; the server-wide test needs loop-mounted
images (root here) and skips, saying why, where the server can't mount them.

Each writer writes 256 KiB, then sleeps 50 ms: it can't write faster than 5 MiB/s however
fast the disk is, so the overshoot the watch allows (one pause of at most 1 s, one pass and
the kill: under 2 s) is at most 10 MiB; the bounds below are that, not a measured figure.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_workspace_disk_budget import MIB, disk_runtime, disks_of, kernel, run
from workspace_support import WAIT, Leaks, call, start, unmount_under, wait_done

from ctxactors import Runtime, loop_images
from ctxactors.cli.loadtest.refusals import command_refusal
from ctxactors.sandbox_disk import MAX_DEPTH, MAX_ENTRIES, measure
from ctxactors.servers.workspace import Workspace
from ctxactors.state import SQLiteStore
from ctxactors.testing import wait_until

if TYPE_CHECKING:  # only: the module is new, and these tests must fail (not break) without it
    from ctxactors.sandbox_diskwatch import DiskWatch

pytestmark = pytest.mark.usefixtures("workspace_root")


OVERSHOOT = 10 * MIB  # 5 MiB/s at most (see the module docstring) for under 2 s
TAIL = (
    "{whose} workspace files take (?P<used>[0-9,]+) bytes of disk: the limit is {limit:,} "
    r"\({var}\); until some are deleted \(rm\) or sessions ended, commands can't write files"
)


def test_the_load_testers_count_a_command_stopped_at_a_disk_budget_by_its_variable() -> None:
    why = TAIL.replace("(?P<used>[0-9,]+)", "9").replace("\\", "")
    why = why.format(whose="the server's", limit=8, var="CTXACTORS_WORKSPACE_SERVER_DISK_BYTES")
    output = f"partial line\n[ctxactors: killed: {why}]\n"
    assert command_refusal(output, -9, "killed") == "CTXACTORS_WORKSPACE_SERVER_DISK_BYTES"
    assert command_refusal("x\n[ctxactors: killed: (CTXACTORS_X)]\n", 0, "exited") is None


def writer(files: int) -> str:
    """A command writing `files` files of 256 KiB, at most 5 MiB/s, and a dot for each (no
    newline: the server's note must still come on a line of its own); "wrote all" at the end."""
    return (
        f"i=0; while [ $i -lt {files} ]; do i=$((i+1)); "
        "head -c 256K /dev/zero > f$i || exit 1; printf .; sleep 0.05; done; echo wrote all"
    )


# Waits until the test removes its file `hold` (removing gives space back: it never grows).
HOLD = "while [ -e hold ]; do sleep 0.05; done; echo done"


def stopped(rt: Runtime, session: str, process_id: str, principal: str, tail: str) -> int:
    """Wait for the command to end, check it was stopped for the budget `tail` matches (its
    answer's warning and the last line of its output), and return the bytes it said."""
    done = wait_done(rt, session, process_id, principal=principal)
    assert done["status"] == "killed", done
    assert done["exitCode"] == -9
    why = re.fullmatch(tail, done["warning"])
    assert why is not None, done["warning"]
    assert re.fullmatch(r"\.+\n\[ctxactors: killed: [^\n]+\]\n", done["output"]), done["output"]
    assert done["output"].endswith(f"\n[ctxactors: killed: {done['warning']}]\n")
    assert "wrote all" not in done["output"]
    return int(why["used"].replace(",", ""))


def release(rt: Runtime, session: str, principal: str) -> None:
    """Let a `HOLD` command of the session end."""
    os.unlink(os.path.join(Workspace._kept[rt].path((principal, session)), "hold"))  # noqa: SLF001


def test_measured_a_loop_of_small_files_is_stopped_at_the_principals_budget(
    store: SQLiteStore, leaks: Leaks
) -> None:
    budget = 4 * MIB
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=budget) as rt:
        disks = disks_of(rt)
        assert disks.images is None
        run(rt, "a1", "echo x > hold", "alice")
        held = start(rt, "a1", HOLD, principal="alice")
        attack = start(rt, "m1", writer(256), principal="mallory")  # 64 MiB if not stopped
        tail = TAIL.format(
            whose="this principal's", limit=budget, var="CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES"
        )
        said = stopped(rt, "m1", attack, "mallory", tail)
        assert budget < said <= budget + OVERSHOOT
        # What it wrote stays, and is counted: near the budget.
        used, _ = disks.measure("mallory")
        area = disks.area("mallory")
        assert used == sum(measure(os.path.join(area, n))[0] for n in os.listdir(area))
        assert budget < used <= budget + OVERSHOOT
        # Alice's command ran all along (the same runtime, the same moment), and completes.
        polled = call(rt, "a1", "poll_process", processId=held, principal="alice")
        assert polled["status"] == "running"
        release(rt, "a1", "alice")
        done = wait_done(rt, "a1", held, principal="alice")
        assert (done["status"], done["output"], "warning" in done) == ("exited", "done\n", False)
        # Deleting works over the budget, and then the principal writes again.
        # (its note first: it starts at the budget, where no file may grow)
        deleted = run(rt, "m1", "rm f*; ls | wc -l", "mallory")["output"]
        assert deleted.startswith("[ctxactors: this principal's") and deleted.endswith("]\n0\n")
        assert run(rt, "m1", writer(4), "mallory")["output"] == "....wrote all\n"


def test_a_reader_over_the_budget_keeps_running(store: SQLiteStore, leaks: Leaks) -> None:
    """Only commands whose files grew are stopped: over its budget, a principal's command
    that only reads or deletes runs to its end."""
    budget = 4 * MIB
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=budget) as rt:
        run(rt, "m1", "echo x > hold", "mallory")
        held = start(rt, "m1", HOLD, principal="mallory")
        attack = start(rt, "m2", writer(256), principal="mallory")
        tail = TAIL.format(
            whose="this principal's", limit=budget, var="CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES"
        )
        stopped(rt, "m2", attack, "mallory", tail)
        tenants = Workspace.tenants(rt)
        assert tenants is not None
        watch: DiskWatch = tenants.watch
        passes = watch.passes
        # Over the budget for two more passes at least, the reader is left alone.
        wait_until(lambda: watch.passes >= passes + 2, WAIT)
        assert call(rt, "m1", "poll_process", processId=held, principal="mallory")["status"] == (
            "running"
        )
        release(rt, "m1", "mallory")
        done = wait_done(rt, "m1", held, principal="mallory")
        assert (done["status"], done["output"]) == ("exited", "done\n")


@pytest.fixture
def own_disk(workspace_root: str) -> Iterator[str]:
    """The workspace root on a 128 MiB tmpfs of its own: the images' room is counted on the
    root's free space, which other tests writing beside this one (xdist) would take."""
    try:
        loop_images.check(workspace_root)
    except loop_images.Unavailable as exc:
        pytest.skip(f"no loop-mounted images here: {exc}")
    cmd = ["mount", "-t", "tmpfs", "-o", "size=128m,mode=0711", "tmpfs", workspace_root]
    subprocess.run(cmd, check=True)
    try:
        yield workspace_root
    finally:
        unmount_under(workspace_root)
        subprocess.run(["umount", "-l", workspace_root], check=True)


@pytest.mark.usefixtures("own_disk")
def test_kernel_the_server_wide_budget_stops_a_caller_with_no_principal_not_a_principal(
    store: SQLiteStore, leaks: Leaks
) -> None:
    """An image is made only where it fits the server-wide budget beside the others, so no
    principal's writes cross it: callers with no principal (measured, in the root) can.
    Theirs is stopped; a principal's running command, which didn't grow, runs on."""
    server = 24 * MIB
    with disk_runtime(leaks, store, principal_disk_bytes=8 * MIB, server_disk_bytes=server) as rt:
        disks = kernel(rt)
        assert run(rt, "a1", "head -c 4M /dev/zero > f; echo x > hold", "alice")["output"] == ""
        held = start(rt, "a1", HOLD, principal="alice")
        attack = start(rt, "n1", writer(112), principal=None)  # 28 MiB if not stopped
        tail = TAIL.format(
            whose="the server's", limit=server, var="CTXACTORS_WORKSPACE_SERVER_DISK_BYTES"
        )
        done = wait_done(rt, "n1", attack)
        assert (done["status"], done["exitCode"]) == ("killed", -9), done
        why = re.fullmatch(tail, done["warning"])
        assert why is not None, done["warning"]
        assert server < int(why["used"].replace(",", "")) <= server + OVERSHOOT
        assert done["output"].endswith(f"\n[ctxactors: killed: {done['warning']}]\n")
        assert call(rt, "a1", "poll_process", processId=held, principal="alice")["status"] == (
            "running"
        )
        release(rt, "a1", "alice")
        done = wait_done(rt, "a1", held, principal="alice")
        assert (done["status"], done["output"], "warning" in done) == ("exited", "done\n", False)
        # The caller deletes (over the server's budget, deleting still runs), and writes again.
        deleted = run(rt, "n1", "rm f*; ls | wc -l", None)["output"]
        assert deleted.startswith("[ctxactors: the server's") and deleted.endswith("]\n0\n")
        assert run(rt, "n1", writer(4), None)["output"] == "....wrote all\n"
        assert disks.server_used() < server


def nest(root: Path, depth: int) -> Path:
    root.mkdir()
    path = root
    for _ in range(depth):
        path = path / "a"
        path.mkdir()
    return path


def test_a_tree_nested_too_deep_counts_as_past_the_bound_and_leaks_no_descriptor(
    tmp_path: Path,
) -> None:
    """A recursive walk (os.fwalk) ended in RecursionError on a few thousand levels, which
    left the count as it was: the principal's writes went uncounted."""
    fds = len(os.listdir("/proc/self/fd"))
    try:
        (nest(tmp_path / "deep", 1500) / "f").write_bytes(b"x" * 8192)
        assert measure(str(tmp_path / "deep"))[1] == MAX_ENTRIES + 1
    finally:  # shutil.rmtree (pytest's clean-up) recurses too: rm doesn't
        subprocess.run(["rm", "-rf", str(tmp_path / "deep")], check=True)
    nest(tmp_path / "shallow", MAX_DEPTH)
    assert measure(str(tmp_path / "shallow"))[1] == MAX_DEPTH
    assert len(os.listdir("/proc/self/fd")) == fds


def test_measured_a_command_writing_in_a_tree_too_deep_to_count_is_stopped(
    store: SQLiteStore, leaks: Leaks
) -> None:
    with (
        contextlib.ExitStack() as cleanup,  # if it fails: shutil.rmtree can't remove the tree
        disk_runtime(leaks, store, disk="off", principal_disk_bytes=64 * MIB) as rt,
    ):
        deep = "d=$(printf 'a/%.0s' $(seq 1500)); mkdir -p $d && cd $d && "
        attack = start(rt, "m1", deep + writer(64), principal="mallory")
        session = Workspace._kept[rt].path(("mallory", "m1"))  # noqa: SLF001
        cleanup.callback(subprocess.run, ["rm", "-rf", os.path.join(session, "a")], check=True)
        done = wait_done(rt, "m1", attack, principal="mallory")
        assert (done["status"], done["warning"]) == ("killed", disks_of(rt).too_many()), done
        assert done["output"].endswith(f"[ctxactors: killed: {done['warning']}]\n")
        assert "wrote all" not in done["output"]
        # Its next command starts with no file able to grow, and deleting the tree works.
        deleted = run(rt, "m1", "rm -rf a f*; ls | wc -l", "mallory")["output"]
        assert deleted == f"[ctxactors: {disks_of(rt).too_many()}]\n0\n"
        assert run(rt, "m1", writer(4), "mallory")["output"] == "....wrote all\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: to hand the tree to another uid")
def test_a_directory_the_server_may_not_read_counts_as_past_the_bound(tmp_path: Path) -> None:
    """A non-root server runs its sandboxes as its own uid: a sandbox may ``chmod 100`` a
    directory and write in it by name, where the server's walk can't list it. The walk ran
    as root here would read it, so it runs as the tree's owner, as such a server would."""
    base = Path(tempfile.mkdtemp(prefix="ctxactors-test-perm-"))  # tmp_path's parents: 0700
    try:
        base.chmod(0o755)
        hidden = base / "top" / "hidden"
        hidden.mkdir(parents=True)
        (hidden / "f").write_bytes(b"x" * 65536)
        subprocess.run(["chown", "-R", "65534:65534", str(base / "top")], check=True)
        hidden.chmod(0o100)
        # Started as root (the checkout's venv may sit in a directory that uid can't enter:
        # a fresh clone under a 0700 mktemp -d), it drops to the tree's owner once imported.
        walk = (
            "import os; from ctxactors.sandbox_disk import measure; os.setgroups([]); "
            f"os.setgid(65534); os.setuid(65534); print(measure({str(base / 'top')!r}))"
        )
        said = subprocess.run(
            [sys.executable, "-c", walk],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        ).stdout.strip()
        blocks = (os.stat(base / "top").st_blocks + os.stat(hidden).st_blocks) * 512
        assert said == f"({blocks}, {MAX_ENTRIES + 1})"
    finally:
        shutil.rmtree(base)
