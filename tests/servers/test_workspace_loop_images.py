"""The principals' loop-mounted disk images (`ctxactors.loop_images`) share the host fairly.

- one principal's mount (or fit) holds up no other principal's `area`/`usage`;
- an image is made or grown only if the host has room for it beside the others, and
  preallocation takes its blocks for good;
- the server-wide count doesn't stat every image on every command;
- the retention purge unmounts the images it mounted;
- ending a session works even when its principal's image can't be mounted.

Real ext4 images, real loop devices, a real tmpfs as a small host disk; the tests skip,
saying why, where this process may not mount them (not root, no loop devices).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs
from test_workspace_disk_budget import disk_runtime
from workspace_support import WAIT, Leaks, start, unmount_under, wait_done

from ctxactors import Runtime, cgroups, loop_images
from ctxactors.sandbox_disk import DiskBudgets
from ctxactors.servers.workspace import Workspace
from ctxactors.settings import Settings
from ctxactors.state import SQLiteStore
from ctxactors.testing import context_args, wait_until

MIB = 1 << 20


@pytest.fixture
def root(workspace_root: str) -> str:
    try:
        loop_images.check(workspace_root)
    except loop_images.Unavailable as exc:
        pytest.skip(f"no loop-mounted images here: {exc}")
    return workspace_root


@pytest.fixture
def small_root(root: str) -> Iterator[str]:
    """The workspace root on a 96 MiB tmpfs of its own: a host disk that can fill."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0711", "tmpfs", root], check=True)
    try:
        yield root
    finally:
        unmount_under(root)
        subprocess.run(["umount", "-l", root], check=True)


@pytest.fixture
def images(root: str) -> Iterator[loop_images.LoopImages]:
    made = loop_images.LoopImages(root, 16 * MIB)
    try:
        yield made
    finally:
        assert made.close() == []


def mounted(point: str) -> str | None:
    """The mount options of `point`, None if nothing is mounted there."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == point:
                return fields[5]
    return None


def held(image: str) -> int:
    return os.stat(image).st_blocks * 512


# -- one lock per principal ------------------------------------------------------------------


def test_one_principals_slow_mount_holds_up_no_other_and_one_mount_serves_many(
    images: loop_images.LoopImages, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert images.area("alice") == images._paths(images_group("alice"))[1]  # noqa: SLF001
    real = loop_images._mount_image  # noqa: SLF001
    bobs = images._paths(images_group("bob"))[0]  # noqa: SLF001
    entered, gate = threading.Event(), threading.Event()
    mounts: Counter[str] = Counter()

    def gated(image: str, point: str, *options: str) -> None:
        if image == bobs:  # bob's mount takes as long as the test says (a slow e2fsck)
            entered.set()
            assert gate.wait(WAIT)
        real(image, point, *options)

    monkeypatch.setattr(loop_images, "_mount_image", gated)
    mount = images._mount  # noqa: SLF001

    def counted(group: str) -> Any:
        mounts[group] += 1
        return mount(group)

    monkeypatch.setattr(images, "_mount", counted)
    got: dict[str, Any] = {}

    def ask(name: str, principal: str) -> None:
        got[name] = images.area(principal)

    bob1 = threading.Thread(target=ask, args=("bob1", "bob"))
    bob2 = threading.Thread(target=ask, args=("bob2", "bob"))
    others = threading.Thread(
        target=lambda: got.update(
            alice=images.usage("alice"),
            carol=images.area("carol"),  # a new mount, too
        )
    )
    try:
        bob1.start()
        assert entered.wait(WAIT)
        bob2.start()
        others.start()
        # Served while bob's mount is held: alice's (mounted) and carol's (new) disks.
        wait_until(lambda: "carol" in got, WAIT, describe=lambda: sorted(got))
        assert got["alice"].capacity >= 16 * MIB
        assert mounted(got["carol"]) is not None
        assert "bob1" not in got and "bob2" not in got
    finally:
        gate.set()
        for thread in (bob1, bob2, others):
            thread.join(WAIT)
    assert got["bob1"] == got["bob2"] == images._paths(images_group("bob"))[1]  # noqa: SLF001
    assert mounted(got["bob1"]) is not None
    assert mounts == {images_group("bob"): 1, images_group("carol"): 1}  # bob: asked twice


def images_group(principal: str) -> str:
    return cgroups.group_name(principal)


# -- room on the host ------------------------------------------------------------------------


def test_an_image_is_made_or_grown_only_if_the_host_has_room_beside_the_others(
    small_root: str,
) -> None:
    images = loop_images.LoopImages(small_root, 32 * MIB, reserve=8 * MIB)
    try:
        alice, bob = images.area("alice"), images.area("bob")
        assert images.notes == [] and images.usage("bob").capacity >= 32 * MIB
        # 96 MiB: the reserve (8), and alice's and bob's images (41 MiB each for 32 of
        # files), which their sparse images may still take: no room for carol's 32;
        # nothing of hers is left behind.
        with pytest.raises(loop_images.NoRoom, match="no room for 33,554,432 bytes"):
            images.area("carol")
        carols = images._paths(images_group("carol"))  # noqa: SLF001
        assert not os.path.exists(carols[0]) and mounted(carols[1]) is None
        # The others keep writing up to their budgets.
        for area in (alice, bob):
            with open(os.path.join(area, "f"), "wb") as f:
                f.write(b"x" * (24 * MIB))
        assert images.usage("alice").used >= 24 * MIB
    finally:
        assert images.close() == []
    # A raised budget doesn't fit either: alice's image stays as it is, mounted.
    grown = loop_images.LoopImages(small_root, 48 * MIB, reserve=8 * MIB)
    try:
        capacity = grown.usage("alice").capacity
        assert 32 * MIB <= capacity < 33 * MIB
        [note] = grown.notes
        assert "kept at" in note and "no room for" in note
    finally:
        assert grown.close() == []


def test_preallocated_images_take_their_blocks_for_good(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXACTORS_WORKSPACE_DISK_PREALLOCATE", "1")
    monkeypatch.setenv("CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES", str(16 * MIB))
    images = DiskBudgets.open(Settings.from_env().workspace).images
    assert images is not None and images.preallocate
    try:
        area = images.area("alice")
        image = images._paths(images_group("alice"))[0]  # noqa: SLF001
        size = os.stat(image).st_size
        assert held(image) >= size
        options = mounted(area)
        assert options is not None and "discard" not in options.split(",")
        with open(os.path.join(area, "f"), "wb") as f:
            f.write(b"x" * (8 * MIB))
        os.unlink(os.path.join(area, "f"))
        os.sync()
        assert held(image) >= size  # deleting gives nothing back to the host
    finally:
        assert images.close() == []


def test_a_principal_with_no_room_is_told_so_and_the_others_are_served(
    small_root: str, store: SQLiteStore, leaks: Leaks
) -> None:
    with disk_runtime(leaks, store, principal_disk_bytes=24 * MIB) as rt:
        # Room for two images (about 31 MiB each for 24 of files) beside the reserve.
        run(rt, "a1", "true", "alice")
        run(rt, "b1", "true", "bob")
        result = rt.call("execute_command", ctx("c1", command="true"), principal="carol")
        assert result.is_error
        assert result.text == (
            "the server has no disk space left for this principal's workspace disk "
            "(25,165,824 bytes: CTXACTORS_WORKSPACE_PRINCIPAL_DISK_BYTES); try again "
            "later, or ask the server's operator"
        )
        assert run(rt, "a1", "head -c 8M /dev/zero > f; echo rc=$?", "alice") == "rc=0\n"
        images = Workspace.tenants(rt).disks.images  # type: ignore[union-attr]
        assert images is not None
        # The server-wide budget is 3/4 of the 96 MiB: a quarter is the reserve.
        assert 23 * MIB <= images.reserve <= 24 * MIB
        assert images.notes == []  # alice's and bob's fitted to the whole budget


def ctx(session: str, **args: Any) -> dict[str, Any]:
    return context_args(session, **args)


def run(rt: Runtime, session: str, command: str, principal: str | None) -> str:
    process = start(rt, session, command, principal=principal)
    done = wait_done(rt, session, process, principal=principal)
    assert done["status"] == "exited", done
    return str(done["output"])


# -- the server-wide count -------------------------------------------------------------------


def test_the_server_wide_count_stats_only_the_images_asked_for(
    images: loop_images.LoopImages, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`allocated` runs before every command: it reads again the images of the principals
    asked for since (their commands), and every image only once a `rescan` period."""
    os.makedirs(images.disks, mode=0o700, exist_ok=True)
    others = [os.path.join(images.disks, f"p-{i:032x}.img") for i in range(50)]
    for i, path in enumerate(others):  # principals of earlier runs, not mounted in this one
        with open(path, "wb") as f:
            f.truncate(16 * MIB)
            f.write(b"x" * 4096 * (i + 1))
    alice = images._paths(images_group("alice"))[0]  # noqa: SLF001
    area = images.area("alice")
    images.rescan = 3600.0
    expected = sum(held(p) for p in others)
    assert images.allocated() == expected + held(alice)
    reads: Counter[str] = Counter()
    stat, scandir = os.stat, os.scandir

    def counted_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        reads[os.path.basename(str(path))] += 1
        return stat(path, *args, **kwargs)

    def counted_scandir(path: Any) -> Any:
        reads["scandir " + os.path.basename(str(path))] += 1
        return scandir(path)

    monkeypatch.setattr(os, "stat", counted_stat)
    monkeypatch.setattr(os, "scandir", counted_scandir)
    assert images.allocated() == expected + held(alice)
    assert reads == {os.path.basename(alice): 1}  # held() above; allocated read nothing
    reads.clear()
    with open(os.path.join(area, "f"), "wb") as f:  # alice's command writes
        f.write(b"y" * (4 * MIB))
        os.fsync(f.fileno())
    assert images.usage("alice").used >= 4 * MIB  # as after her command: asked for
    reads.clear()
    now = images.allocated()
    assert reads == {os.path.basename(alice): 1}
    assert now == expected + held(alice) and held(alice) > 4 * MIB
    # Every image again once the period is over (an image of another server grew).
    with open(others[0], "r+b") as f:
        f.write(b"z" * MIB)
    images.rescan = 0.0
    assert images.allocated() == sum(held(p) for p in others) + held(alice)


# -- the retention purge ---------------------------------------------------------------------


def test_the_purge_unmounts_what_it_mounted_and_keeps_what_is_in_use(
    root: str, store: SQLiteStore, leaks: Leaks
) -> None:
    with disk_runtime(leaks, store) as rt:
        run(rt, "a1", "echo kept > note", "alice")
        run(rt, "b1", "echo kept > note", "bob")
    alices, bobs = (os.path.join(root, "principals", images_group(p)) for p in ("alice", "bob"))
    assert mounted(alices) is None and mounted(bobs) is None
    with disk_runtime(leaks, store) as rt:
        run(rt, "b1", "cat note", "bob")  # bob is back; alice isn't
        rt.reap()  # a purge pass: both sessions are within the retention
        assert mounted(alices) is None  # mounted for the purge, unmounted after it
        assert mounted(bobs) is not None  # in use: stays
        assert run(rt, "a1", "cat note", "alice") == "kept\n"
        rt.reap()
        assert mounted(alices) is not None  # in use now: the purge leaves it


# -- ending a session ------------------------------------------------------------------------


def test_a_session_ends_even_when_its_principals_disk_cant_be_mounted(
    root: str, store: SQLiteStore, leaks: Leaks
) -> None:
    with disk_runtime(leaks, store) as rt:
        run(rt, "a1", "echo old > note", "alice")
        path = Workspace._kept[rt].path(("alice", "a1"))  # noqa: SLF001
        record = Workspace._kept[rt]._use_file(path)  # noqa: SLF001
    image = os.path.join(root, loop_images.DISKS, images_group("alice") + ".img")
    with open(image, "r+b") as f:  # its superblock damaged: it can't be mounted
        f.seek(1024)
        superblock = f.read(1024)
        f.seek(1024)
        f.write(bytes(1024))
    with capture_logs() as logs, disk_runtime(leaks, store) as rt:
        assert rt.end_session("a1", principal="alice") == 0
        [deferred] = [e for e in logs if e["event"] == "workspace_delete_deferred"]
        assert deferred["directory"] == path
        assert os.stat(record).st_mtime == 0  # the next purge takes what is left
        assert run(rt, "b1", "echo hi", "bob") == "hi\n"  # the others go on
    with open(image, "r+b") as f:  # repaired
        f.seek(1024)
        f.write(superblock)
    with disk_runtime(leaks, store) as rt:
        # The session is back before a purge: a new, empty directory, not the ended one's.
        assert run(rt, "a1", "ls", "alice") == ""
