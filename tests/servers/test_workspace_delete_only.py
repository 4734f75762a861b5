"""No sandbox command takes disk blocks its disk budget doesn't see, and a principal at a
budget (or past what the measured walk counts) runs delete-only: it can remove files and
read them, and create none, until it is under again.

Real bubblewrap, real files, a real SQLite store; the measured budgets are forced with
``disk=off``, the kernel ones (loop images) run where the server may mount them.
"""

from __future__ import annotations

import os

import pytest
from test_workspace_disk_budget import FULL, MIB, disk_runtime, disks_of, kernel, run
from workspace_support import Leaks, call, start, wait_done

from ctxactors import Runtime, sandbox_seccomp
from ctxactors.sandbox_disk import MAX_DEPTH, MAX_ENTRIES, Admission
from ctxactors.servers.workspace import Workspace
from ctxactors.state import SQLiteStore

pytestmark = pytest.mark.usefixtures("workspace_root")


# Linux checks RLIMIT_FSIZE only when fallocate lengthens a file: --keep-size (-n) allocated
# 300 MiB under a limit of 0, --insert-range (-i) lengthens a file unchecked, and mode 0 or
# --zero-range (-z) inside a sparse file's size allocate with no write, at metadata speed.
# Only --punch-hole (-p) works; --posix (-x: glibc's posix_fallocate) falls back to writing.
# The ioctls Linux serves as fallocate with KEEP_SIZE, for every filesystem (a cmd with
# high bits set too: the kernel reads 32 bits): each asks for 50 MiB of "r".
PREALLOCATE = r"""
import ctypes, errno, os, struct
libc = ctypes.CDLL(None, use_errno=True)
space_resv = struct.pack("=hh4xqqiI4i", 0, 0, 0, 50 << 20, 0, 0, 0, 0, 0, 0)
fd = os.open("r", os.O_RDWR | os.O_CREAT)
for name, cmd in [
    ("resvsp", 0x40305828), ("resvsp64", 0x4030582A), ("zero_range", 0x40305839),
    ("resvsp64_32", 0x402C582A), ("resvsp64_high", 0x4030582A | 1 << 32),
]:
    done = libc.ioctl(fd, ctypes.c_ulong(cmd), space_resv)
    print(name, "ok" if done == 0 else errno.errorcode[ctypes.get_errno()])
print("blocks", os.fstat(fd).st_blocks)
"""
FALLOCATE = (
    "cat > resv.py <<'EOF'\n" + PREALLOCATE + "EOF\npython3 resv.py; "
    "touch k; fallocate -n -l 300M k; echo keep_size=$?; "
    "fallocate -z -n -l 300M k; echo zero_keep_size=$?; "
    "head -c 64K /dev/zero > i; fallocate -i -o 0 -l 100M i; echo insert=$?; "
    "truncate -s 1M s; fallocate -l 1M s; echo plain=$?; fallocate -z -l 1M s; echo zero=$?; "
    "fallocate -x -l 256K z; echo posix=$?; fallocate -p -o 0 -l 64K i; echo punch=$?; "
    "du -k k i z s; stat -c '%n %s' k i z s"
)
FALLOCATED = (
    "resvsp ENOTSUP\nresvsp64 ENOTSUP\nzero_range ENOTSUP\nresvsp64_32 ENOTSUP\n"
    "resvsp64_high ENOTSUP\nblocks 0\n"
    "fallocate: fallocate failed: keep size mode is unsupported\nkeep_size=1\n"
    "fallocate: fallocate failed: keep size mode is unsupported\nzero_keep_size=1\n"
    "fallocate: fallocate failed: Operation not supported\ninsert=1\n"
    "fallocate: fallocate failed: Operation not supported\nplain=1\n"
    "fallocate: fallocate failed: Operation not supported\nzero=1\n"
    "posix=0\npunch=0\n0\tk\n0\ti\n256\tz\n0\ts\nk 0\ni 65536\nz 262144\ns 1048576\n"
)


def chain_past_the_bound(rt: Runtime, principal: str, session: str) -> tuple[str, str]:
    """A chain of directories deeper than the walk goes, in the session's directory and
    owned by the principal's uid, as a command of its own would have made it: (the session's
    directory, the chain's path under it)."""
    top = Workspace._kept[rt].path((principal, session))  # noqa: SLF001
    uid, gid = Workspace.tenants(rt).ids(principal)  # type: ignore[union-attr]
    deep = "/".join(["n"] * (MAX_DEPTH + 44))
    os.makedirs(os.path.join(top, deep))
    for level in range(1, MAX_DEPTH + 45):
        os.chown(os.path.join(top, *["n"] * level), uid, gid)
    return top, deep


def test_no_sandbox_may_fallocate_blocks_past_its_file_limit(
    store: SQLiteStore, leaks: Leaks
) -> None:
    # Measured: with 4 MiB left, the file limit is 4 MiB, and -n would have taken 300 MiB.
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=4 * MIB) as rt:
        assert run(rt, "m1", FALLOCATE, "mallory")["output"] == FALLOCATED
        assert disks_of(rt).measure("mallory")[0] < MIB
    # Kernel mode: a caller with no principal is measured, in the root (no image under it);
    # a principal's image holds its own, but it may not overcommit it either.
    with disk_runtime(leaks, store) as rt:
        kernel(rt)
        assert run(rt, "s1", FALLOCATE, None)["output"] == FALLOCATED
        assert run(rt, "a1", FALLOCATE, "alice")["output"] == FALLOCATED


# Each way to make an inode, a name or blocks without a write, tried in the sandbox (with
# "old" there): its errno's name, or "ok".
CREATE = r"""
import ctypes, errno, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, fn):
    try:
        fn()
        print(name, "ok")
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
def checked(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), "")
    return result
def openat2():
    how = (ctypes.c_uint64 * 3)(os.O_RDONLY, 0, 0)
    os.close(checked(libc.syscall(437, -100, b"old", how, 24)))
def fallocate():
    fd = os.open("old", os.O_RDWR)
    try:
        checked(libc.fallocate(fd, 0, ctypes.c_long(0), ctypes.c_long(1 << 16)))
    finally:
        os.close(fd)
def setxattrat():  # Linux 6.13: its flags and value in a struct xattr_args
    value = ctypes.create_string_buffer(b"y" * 2000)
    args = struct.pack("=QII", ctypes.addressof(value), 2000, 0)
    checked(libc.syscall(463, -100, b"old", 0, b"user.y", args, len(args)))
def resvsp64():  # FS_IOC_RESVSP64: fallocate with KEEP_SIZE
    fd = os.open("old", os.O_RDWR)
    try:
        space_resv = struct.pack("=hh4xqqiI4i", 0, 0, 0, 1 << 20, 0, 0, 0, 0, 0, 0)
        checked(libc.ioctl(fd, ctypes.c_ulong(0x4030582A), space_resv))
    finally:
        os.close(fd)
def bind():
    with socket.socket(socket.AF_UNIX) as s:
        s.bind("sock")
attempt("read", lambda: os.close(os.open("old", os.O_RDONLY)))
attempt("write", lambda: os.close(os.open("old", os.O_WRONLY)))  # mmap(MAP_SHARED) needs it
attempt("rdwr", lambda: os.close(os.open("old", os.O_RDWR)))
attempt("ioctl_only", lambda: os.close(os.open("old", 3)))  # O_ACCMODE 3: for ioctls
attempt("creat", lambda: os.close(os.open("new", os.O_RDONLY | os.O_CREAT)))
attempt("tmpfile", lambda: os.close(os.open(".", os.O_TMPFILE | os.O_RDWR)))
attempt("openat2", openat2)
attempt("mkdir", lambda: os.mkdir("dir"))
attempt("symlink", lambda: os.symlink("old", "sym"))
attempt("link", lambda: os.link("old", "hard"))
attempt("mkfifo", lambda: os.mkfifo("fifo"))
attempt("setxattr", lambda: os.setxattr("old", "user.x", b"x" * 2000))
attempt("setxattrat", setxattrat)
attempt("fallocate", fallocate)
attempt("resvsp64", resvsp64)
attempt("bind", bind)
attempt("rename", lambda: os.rename("old", "renamed"))
"""
# Written while the principal may: in delete-only even a here-document can't be made.
SCRIPT = "echo old > old; cat > create.py <<'EOF'\n" + CREATE + "EOF\n"
REFUSED = (
    "read ok\nwrite EDQUOT\nrdwr EDQUOT\nioctl_only EDQUOT\ncreat EDQUOT\ntmpfile EDQUOT\n"
    "openat2 ENOSYS\nmkdir EDQUOT\nsymlink EDQUOT\nlink EDQUOT\nmkfifo EDQUOT\n"
    "setxattr EDQUOT\nsetxattrat EDQUOT\nfallocate EDQUOT\nresvsp64 EDQUOT\nbind EDQUOT\n"
    "rename EDQUOT\n"
)
ALLOWED = (
    "read ok\nwrite ok\nrdwr ok\nioctl_only ok\ncreat ok\ntmpfile ok\nopenat2 ok\nmkdir ok\n"
    "symlink ok\nlink ok\nmkfifo ok\nsetxattr ok\nsetxattrat ok\nfallocate ENOTSUP\n"
    "resvsp64 ENOTSUP\nbind ok\nrename ok\n"
)


def delete_only(rt: Runtime, principal: str, command: str, warning: str) -> str:
    """The output of `command` in the principal's next command, which is delete-only and
    says why (in the call's answer and the output)."""
    answer = call(rt, "m1", "execute_command", command=command, principal=principal)
    assert answer["warning"] == warning
    done = wait_done(rt, "m1", answer["processId"], principal=principal)
    assert done["status"] == "exited", done
    head = f"[ctxactors: {warning}]\n"
    assert done["output"].startswith(head), done
    return str(done["output"][len(head) :])


def test_a_principal_past_the_walks_bound_creates_nothing_until_it_deletes(
    store: SQLiteStore, leaks: Leaks
) -> None:
    """The attacker's repro: a chain deeper than the walk goes, then a command making
    directories at its bottom (under RLIMIT_FSIZE 0 it made 95 MiB of them in 2 s)."""
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=4 * MIB) as rt:
        disks = disks_of(rt)
        assert run(rt, "m1", SCRIPT + "echo made", "mallory")["output"] == "made\n"
        # The chain is made here, owned by the sandbox's uid as if it had: a command making
        # it may be stopped part way by the watch, once it passes the bound.
        _, deep = chain_past_the_bound(rt, "mallory", "m1")
        # Counted after its next command ends (the watch may stop that one: past the bound).
        wait_done(rt, "m1", start(rt, "m1", "true", principal="mallory"), principal="mallory")
        assert disks.measure("mallory")[1] == MAX_ENTRIES + 1
        grow = (
            f"cd {deep} && python3 -c 'import os\n"
            'for i in range(100000): os.mkdir("d%07d" % i + "x" * 200)\'; echo rc=$?; ls | wc -l'
        )
        out = delete_only(rt, "mallory", grow, disks.too_many())
        assert out == (
            'Traceback (most recent call last):\n  File "<string>", line 2, in <module>\n'
            f"OSError: [Errno 122] Disk quota exceeded: 'd0000000{'x' * 200}'\nrc=1\n0\n"
        )
        assert delete_only(rt, "mallory", "python3 create.py", disks.too_many()) == REFUSED
        # Reading, listing, counting and deleting work; then it creates again.
        out = delete_only(rt, "mallory", "cat old; ls; rm -rf n; echo rc=$?", disks.too_many())
        assert out == "old\ncreate.py\nn\nold\nrc=0\n"
        assert run(rt, "m1", "python3 create.py", "mallory")["output"] == ALLOWED
        listed = run(rt, "m1", "ls; head -c 1M /dev/zero > f; echo rc=$?", "mallory")["output"]
        assert listed == "create.py\ndir\nfifo\nhard\nnew\nrenamed\nsock\nsym\nrc=0\n"


def test_a_principal_at_its_byte_budget_creates_nothing_until_it_deletes(
    store: SQLiteStore, leaks: Leaks
) -> None:
    with disk_runtime(leaks, store, disk="off", principal_disk_bytes=4 * MIB) as rt:
        disks = disks_of(rt)
        assert run(rt, "m1", f"{SCRIPT}head -c 3M /dev/zero > big", "mallory")["output"] == ""
        fill = "head -c 2M /dev/zero > big2; echo rc=$?"
        assert run(rt, "m1", fill, "mallory")["output"] == "File size limit exceeded\nrc=153\n"
        used, _ = disks.measure("mallory")
        assert used == 4 * MIB
        full = FULL.format(used=used, limit=4 * MIB)
        assert delete_only(rt, "mallory", "python3 create.py", full) == REFUSED
        out = delete_only(rt, "mallory", "du -k big | cut -f1; rm big; echo rc=$?", full)
        assert out == "3072\nrc=0\n"
        assert run(rt, "m1", "python3 create.py", "mallory")["output"] == ALLOWED
        # Another principal was never delete-only.
        assert run(rt, "a1", SCRIPT + "python3 create.py", "alice")["output"] == ALLOWED


def test_both_filters_build_and_only_a_command_that_may_write_nothing_is_delete_only() -> None:
    normal, strict = sandbox_seccomp.program(), sandbox_seccomp.program(delete_only=True)
    assert isinstance(normal, bytes)
    assert isinstance(strict, bytes)
    assert normal != strict
    assert Admission(0, "full").delete_only
    assert not Admission(1 << 20).delete_only
