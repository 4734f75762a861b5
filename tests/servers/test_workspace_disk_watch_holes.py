"""What the disk watch didn't see, or saw too slowly (an attacker's pass over issue 27).

Each test failed before its fix: space held in files a command deleted but keeps open; the
free space of the host under the reserve the server-wide budget keeps (taken by what no
count sees); a directory's own blocks (long names); a listing read whole however many names
it holds; one tenant's huge directories walked at every pass; a purge that dropped every
count; a command that exited just before the watch stopped it reported killed. Real
bubblewrap, real files, a real store, a real small filesystem for the floor.
"""

from __future__ import annotations

import os
import subprocess
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from test_workspace_disk_budget import MIB, disk_runtime, run
from test_workspace_disk_watch import HOLD, TAIL, release, stopped, writer
from workspace_support import WAIT, Leaks, call, start, wait_done

from ctxactors import cgroups, sandbox_disk, sandbox_diskwatch
from ctxactors.sandbox_disk import DiskBudgets, measure
from ctxactors.sandbox_diskwatch import DiskWatch
from ctxactors.servers.workspace import _Process
from ctxactors.settings import Settings
from ctxactors.state import SQLiteStore
from ctxactors.testing import wait_until

pytestmark = pytest.mark.usefixtures("workspace_root")

PRINCIPAL = "CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES"
SERVER = "CTXACTORS_WORKSPACE_SERVER_DISK_BYTES"


def test_files_deleted_but_held_open_count_against_the_budget(
    store: SQLiteStore, leaks: Leaks
) -> None:
    """7 files of 2 MiB, each unlinked once opened and kept open by the shell: 14 MiB held
    on the host against a 4 MiB budget, no name left for a walk to find."""
    budget = 4 * MIB
    hold = (
        'for i in 3 4 5 6 7 8 9; do eval "exec $i>f$i"; rm f$i; '
        'eval "head -c 2M /dev/zero >&$i" || exit 1; printf .; sleep 0.05; done; '
        "i=0; while [ $i -lt 200 ]; do i=$((i+1)); sleep 0.05; done; echo wrote all"
    )
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=budget) as rt:
        attack = start(rt, "m1", hold, principal="mallory")
        tail = TAIL.format(whose="this principal's", limit=budget, var=PRINCIPAL)
        said = stopped(rt, "m1", attack, "mallory", tail)
        assert budget < said <= 14 * MIB + MIB
        # Gone with its processes: no file holds a byte (one the shell had just made may be
        # left, empty, if the stop fell between its `exec` and its `rm`: an idle sandbox
        # is preempted anywhere), and the next command writes.
        assert run(rt, "m1", "find . -type f ! -empty | wc -l", "mallory")["output"] == "0\n"
        assert run(rt, "m1", writer(4), "mallory")["output"] == "....wrote all\n"


@pytest.fixture
def small_root(workspace_root: str) -> Iterator[str]:
    """The workspace root on a filesystem of its own, of 64 MiB (a tmpfs)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to mount a small filesystem as the root")
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,mode=755", "tmpfs", workspace_root], check=True
    )
    try:
        yield workspace_root
    finally:
        subprocess.run(["umount", "-l", workspace_root], check=True)


def free(path: str) -> int:
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


def test_under_the_hosts_reserve_every_command_that_grows_is_stopped(
    small_root: str, store: SQLiteStore, leaks: Leaks
) -> None:
    """Space taken where no count looks (here a file of the host's beside the workspaces)
    eats the quarter the server-wide budget keeps free: commands that grow stop, a command
    that doesn't grow runs on."""
    reserve = free(small_root) // 4  # what the server-wide budget's default leaves
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=32 * MIB) as rt:
        run(rt, "a1", "echo x > hold", "alice")
        held = start(rt, "a1", HOLD, principal="alice")
        filler = os.path.join(small_root, "filler")  # not a session's: no walk counts it
        with open(filler, "wb") as f:
            f.write(bytes(free(small_root) - reserve + 2 * MIB))
        attack = start(rt, "m1", writer(40), principal="mallory")  # 10 MiB
        floor = (
            r"the server's disk has (?P<used>[0-9,]+) bytes free, under the "
            f"{reserve:,} the server-wide budget keeps free \\({SERVER}\\); until some "
            r"are deleted \(rm\) or sessions ended, commands can't write files"
        )
        said = stopped(rt, "m1", attack, "mallory", floor)
        assert said < reserve
        assert call(rt, "a1", "poll_process", processId=held, principal="alice")["status"] == (
            "running"
        )
        release(rt, "a1", "alice")
        done = wait_done(rt, "a1", held, principal="alice")
        assert (done["status"], done["output"], "warning" in done) == ("exited", "done\n", False)
        os.unlink(filler)
        assert run(rt, "m1", "rm f*; " + writer(4), "mallory")["output"] == "....wrote all\n"


def test_a_directorys_own_blocks_count_and_its_names_each_count_as_an_entry(
    tmp_path: Path,
) -> None:
    """20,000 hard links with 240-character names to one empty file: about 5 MiB of
    directory, one inode."""
    top = tmp_path / "top"
    top.mkdir()
    (top / "t").touch()
    for i in range(20_000):
        os.link(top / "t", top / (f"{i:07d}" + "y" * 233))
    own = os.stat(top).st_blocks * 512
    assert own > 4 * MIB
    assert measure(str(top)) == (own, 20_001)
    # A shared parent (`names`): only its entries', not its own.
    assert measure(str(tmp_path), names="to") == (own, 20_002)


def test_a_listing_is_read_only_up_to_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory of many long names is never read whole (10 million names: gigabytes)."""
    top = tmp_path / "top"
    top.mkdir()
    (top / "t").touch()
    for i in range(20_000):
        os.link(top / "t", top / (f"{i:07d}" + "y" * 233))
    monkeypatch.setattr(sandbox_disk, "MAX_ENTRIES", 100)
    tracemalloc.start()
    try:
        found = measure(str(top))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 512 << 10  # the 20,000 names: 5 MiB
    assert found == (os.stat(top).st_blocks * 512, 101)


def budgets(root: str) -> DiskBudgets:
    settings = Settings.from_env().workspace
    budget = msgspec.structs.replace(settings.budget, disk="off")
    return DiskBudgets.open(msgspec.structs.replace(settings, root=root, budget=budget))


def directory(root: str, name: str, files: int) -> str:
    path = os.path.join(root, name)
    os.mkdir(path)
    for i in range(files):
        Path(path, f"f{i}").touch()
    return path


def test_a_pass_walks_a_bounded_number_of_a_principals_entries(
    workspace_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mallory's 4 directories of 3,000 entries (and one past the bound) are walked a few
    at a pass (1,000 entries a pass, on average), the one past the bound once until a
    command of it ends; alice's directory is walked at every pass."""
    monkeypatch.setattr(sandbox_diskwatch, "PASS_ENTRIES", 1000, raising=False)  # (main: none)
    monkeypatch.setattr(sandbox_diskwatch, "MAX_ENTRIES", 5000)
    monkeypatch.setattr(sandbox_disk, "MAX_ENTRIES", 5000)
    walks: list[tuple[str, int]] = []
    lock = threading.Lock()

    def counted(path: str, *, names: str | None = None) -> tuple[int, int]:
        found = measure(path, names=names)
        with lock:
            walks.append((path, found[1]))
        return found

    monkeypatch.setattr(sandbox_diskwatch, "measure", counted)
    disks = budgets(workspace_root)
    area = sandbox_disk.plain_area(workspace_root, "mallory")
    mallory = [directory(area, f"ws-{i}", 3000) for i in range(4)]
    huge = directory(area, "ws-huge", 6000)
    alice = directory(sandbox_disk.plain_area(workspace_root, "alice"), "ws-a", 10)
    disks.measure("mallory")  # as each command's admission does: counted when it starts
    disks.measure("alice")
    stops: list[str] = []
    watch = DiskWatch(disks)
    try:
        for i, path in enumerate(mallory):
            watch.add(f"m{i}", "mallory", path, stops.append)
        watch.add("huge", "mallory", huge, stops.append)
        watch.add("huge-2", "mallory", huge, stops.append)
        watch.add("a", "alice", alice, stops.append)
        wait_until(lambda: watch.passes >= 20, WAIT)
        with lock:
            assert [path for path, _ in walks].count(huge) == 1
        watch.remove("huge")  # a command of it ended: walked again, when its turn comes

        def again() -> bool:
            with lock:
                return [path for path, _ in walks].count(huge) == 2

        wait_until(again, WAIT)
    finally:
        watch.close()
    with lock:
        seen = list(walks)
    assert stops == []  # none grew
    walked = sum(n for path, n in seen if path != alice)
    assert walked <= watch.passes * 1000 + 5001  # what a pass may walk ahead: one walk
    assert 0 < sum(1 for path, _ in seen if path == mallory[0]) < watch.passes // 2
    assert [path for path, _ in seen].count(huge) == 2
    # (the first pass may come before alice's command is added)
    assert watch.passes - 1 <= [path for path, _ in seen].count(alice) <= watch.passes


def test_a_purge_leaves_every_count_until_walked_again(workspace_root: str) -> None:
    """`forget()` (a purge, a legacy move) dropped every count: until each area's next
    command, the server-wide total (the watch's) lost the directories with none running."""
    disks = budgets(workspace_root)
    alice = directory(sandbox_disk.plain_area(workspace_root, "alice"), "ws-a", 0)
    Path(alice, "f").write_bytes(b"x" * (6 * MIB))
    held = disks.measure("alice")[0]
    assert held >= 6 * MIB
    disks.forget()
    assert disks.counted({}) == ({cgroups.group_name("alice"): (held, 1)}, held)
    # Walked again at alice's next count: the same.
    assert disks.measure("alice") == (held, 1)


def test_a_command_that_exited_before_the_watch_stopped_it_is_not_killed() -> None:
    """Its process exited (not reaped yet) when the watch's stop came: it exited."""
    popen = subprocess.Popen(
        ["/bin/sh", "-c", "echo ran"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_until(lambda: _state(popen.pid) == "Z", WAIT)  # exited, not reaped
    proc = _Process("p_1", "echo ran", popen, 60.0, 1000, lambda: None)
    proc.stop_for_disk("over")
    proc.thread.start()
    assert proc.done.wait(WAIT)
    assert (proc.summary()["status"], proc.summary()["exitCode"]) == ("exited", 0)
    assert (proc.warning, proc.output()) == (None, "ran\n")


def test_a_command_that_exits_as_the_watch_stops_it_is_not_killed() -> None:
    """It exited after the watch looked and before its kill landed: it exited."""
    popen = subprocess.Popen(
        ["/bin/sh", "-c", "echo ran"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_until(lambda: _state(popen.pid) == "Z", WAIT)
    proc = _Process("p_1", "echo ran", popen, 60.0, 1000, lambda: None)
    looked = popen.poll
    popen.poll = lambda: None  # type: ignore[method-assign]  # as if it exited just after
    proc.stop_for_disk("over")
    popen.poll = looked  # type: ignore[method-assign]
    proc.thread.start()
    assert proc.done.wait(WAIT)
    assert (proc.summary()["status"], proc.summary()["exitCode"]) == ("exited", 0)
    assert (proc.warning, proc.output()) == (None, "ran\n")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        line = f.read()
    return line[line.rfind(b")") + 2 :].split()[0].decode()


def test_the_open_deleted_files_of_a_process_tree_each_once(tmp_path: Path) -> None:
    """Read from ``/proc``: a child's deleted file, open twice, counts once; a file with a
    name doesn't; past the limit the count says it is short."""
    from ctxactors.sandbox_held import Processes, held  # new: the other tests run without it

    child = subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            "exec 3>gone 4>kept; head -c 1M /dev/zero >&3; exec 5<gone; rm gone;"
            " exec 6</proc/self/stat; echo ready; read line",
        ],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # pytest's capture: a deleted file of its own
        start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        device = os.stat(tmp_path).st_dev
        pids = Processes().of(child.pid)
        assert child.pid in pids and os.getpid() not in pids
        found, looked = held(pids, device, 100)
        ((key, blocks),) = found.items()
        assert blocks == 1 << 20 and key[0] == device and looked <= 100
        assert held(pids, device, 2)[1] == 3  # stopped at the limit: short
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
