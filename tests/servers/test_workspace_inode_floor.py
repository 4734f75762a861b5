"""The server-wide inode floor of the measured mode (issue 27, an attacker's third pass).

A measured area counts an empty file as a few bytes: one principal's 200,000 of them stay
far under a byte budget, and a few dozen principals would use every inode of the host.
Under a quarter of the root's free inodes at start, measured commands that make files are
stopped and the next ones are delete-only. Real bubblewrap, real files, a real store, a
real small filesystem (a tmpfs with few inodes) as the workspace root.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import pytest
from test_workspace_disk_budget import MIB, disk_runtime, run
from test_workspace_disk_watch import HOLD, release
from workspace_support import Leaks, call, start, wait_done

from ctxactors.servers.workspace import Workspace
from ctxactors.state import SQLiteStore

pytestmark = pytest.mark.usefixtures("workspace_root")

INODES = 2000  # the root's tmpfs: its floor is about 500 free

# Empty files until stopped; on a full filesystem it retries (a server with no floor lets
# it fill every inode), and gives up after 3 s of failures.
FLOOD = r"""python3 -c '
import os, time
os.mkdir("d")
i, failed = 0, None
while True:
    try:
        os.close(os.open("d/%x" % i, os.O_CREAT | os.O_WRONLY, 0o600))
        i, failed = i + 1, None
    except OSError:
        failed = failed or time.monotonic()
        if time.monotonic() - failed > 3:
            print("gave up at", i, "files", flush=True)
            raise SystemExit(1)
        time.sleep(0.01)
'"""

FLOOR = (
    r"the server's disk has (?P<free>[0-9,]+) inodes \(files and directories\) free, under "
    r"the {reserve:,} the server-wide budget keeps free \(a quarter of those free at its "
    r"start\); until some are deleted \(rm\) or sessions ended, commands can't write files"
)


@pytest.fixture
def few_inodes(workspace_root: str) -> Iterator[str]:
    """The workspace root on a tmpfs of its own with `INODES` inodes."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to mount a small filesystem as the root")
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size=64m,nr_inodes={INODES},mode=755", "tmpfs"]
        + [workspace_root],
        check=True,
    )
    try:
        yield workspace_root
    finally:
        subprocess.run(["umount", "-l", workspace_root], check=True)


def test_a_flood_of_empty_files_is_stopped_at_the_inode_floor_and_then_delete_only(
    few_inodes: str, store: SQLiteStore, leaks: Leaks
) -> None:
    reserve = os.statvfs(few_inodes).f_favail // 4
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=32 * MIB) as rt:
        floor = FLOOR.format(reserve=reserve)
        run(rt, "a1", "echo x > hold", "alice")
        held = start(rt, "a1", HOLD, principal="alice")  # another principal's, not growing
        flood = start(rt, "m1", FLOOD, principal="mallory")
        done = wait_done(rt, "m1", flood, principal="mallory")
        assert (done["status"], done["exitCode"]) == ("killed", -9), done
        said = re.fullmatch(floor, done["warning"])
        assert said is not None, done["warning"]
        assert int(said["free"].replace(",", "")) < reserve
        assert done["output"] == f"[ctxactors: killed: {done['warning']}]\n"
        top = Workspace._kept[rt].path(("mallory", "m1"))  # noqa: SLF001
        made = len(os.listdir(os.path.join(top, "d")))
        assert made > INODES // 2
        # The other principal's running command was not stopped.
        assert call(rt, "a1", "poll_process", processId=held, principal="alice")["status"] == (
            "running"
        )
        # Every measured command is now delete-only: it may create nothing.
        for session, principal in (("m1", "mallory"), ("a1", "alice")):
            answer = call(
                rt, session, "execute_command", command="touch x; echo rc=$?", principal=principal
            )
            assert re.fullmatch(floor, answer["warning"]), answer["warning"]
            done = wait_done(rt, session, answer["processId"], principal=principal)
            assert done["output"].endswith(
                "touch: cannot touch 'x': Disk quota exceeded\nrc=1\n"
            ), done["output"]
        release(rt, "a1", "alice")
        done = wait_done(rt, "a1", held, principal="alice")
        assert (done["status"], done["output"], "warning" in done) == ("exited", "done\n", False)
        # Deleting works, and gives the inodes back: both write again.
        assert run(rt, "m1", "rm -r d; echo rc=$?", "mallory")["output"].endswith("rc=0\n")
        for session, principal in (("m1", "mallory"), ("a1", "alice")):
            answer = call(
                rt, session, "execute_command", command="touch x; echo rc=$?", principal=principal
            )
            assert "warning" not in answer, answer
            done = wait_done(rt, session, answer["processId"], principal=principal)
            assert done["output"] == "rc=0\n"
