"""The seccomp filter every sandboxed command runs under: `program`.

bubblewrap applies a compiled BPF program (``--seccomp FD``) to the command before it
starts; it is built here once per process with libseccomp (``pyseccomp``, a dependency;
Debian's ``libseccomp2``). Every system call is allowed but:

- those in `DENIED`, which fail with ``EPERM``: calls a tool command (a shell, a compiler,
  a test runner, git) never needs, that reach state shared with other tenants or the host,
  or that open the kernel's largest attack surfaces;
- ``fallocate`` in every mode but the two that free blocks (``PUNCH_HOLE`` with
  ``KEEP_SIZE``, and ``COLLAPSE_RANGE``), which fails with ``EOPNOTSUPP`` (as on a
  filesystem without it: glibc's ``posix_fallocate`` then writes, at disk speed and under
  ``RLIMIT_FSIZE``, the disk budgets' cap on a file, `ctxactors.sandbox_disk`). Linux
  checks the limit only when ``fallocate`` makes a file longer, and it allocates at
  metadata speed: ``KEEP_SIZE`` allocates past the end (measured: 300 MiB under a limit of
  0), ``INSERT_RANGE`` lengthens a file unchecked, and mode 0 or ``ZERO_RANGE`` inside a
  sparse file's own size take its blocks with no write (measured: 3 GiB in 4 ms under a
  1 GiB budget, faster than any watch). The ``ioctl`` calls that Linux turns into
  ``fallocate`` with ``KEEP_SIZE`` (``FS_IOC_RESVSP``, ``FS_IOC_RESVSP64``,
  ``FS_IOC_ZERO_RANGE``) fail the same way.

`program(delete_only=True)` is the filter of a principal at a disk budget (or past what the
measured walk counts): ``RLIMIT_FSIZE`` 0 stops its writes, not what allocates with no
write. It denies besides, with ``EDQUOT`` ("Disk quota exceeded"), every call in
`CREATING` and ``open``/``openat`` with ``O_CREAT``, ``O_TMPFILE`` or a write access mode
(`OPEN_FLAGS`), and ``openat2`` with ``ENOSYS`` (its flags are behind a pointer the filter
can't read; glibc and Go fall back to ``openat``). No file is open for writing, so none
has a shared writable mapping either: a page fault never checks ``RLIMIT_FSIZE``, and
filled the holes of an earlier command's sparse files (512 MiB under a 64 MiB budget).
``rm``, ``ls``, ``cat`` and ``du`` work; even ``> /dev/null`` fails (``O_CREAT``: the
filter can't see that the file exists).

The same lists hold for the compat ABIs of the host (i386 and x32 on x86-64, arm on
aarch64), so a 32-bit binary can't go around them. A call newer than the libseccomp here
(``setxattrat``, Linux 6.13, and ``open_tree_attr``, 6.15, for libseccomp 2.5) is denied by
its number, in a few instructions of our own before libseccomp's program; a call neither
knows makes `program` fail (nothing is left out silently), and the workspace then refuses
to sandbox (``workspace.sandbox.seccomp``, `ctxactors.sandbox`).
"""

from __future__ import annotations

import errno
import functools
import os
import struct
import tempfile
from typing import Any

DENIED: dict[str, str] = {
    # The kernel's keyrings are per uid: a command could list, read or clear another
    # sandbox's keys (measured: one session cleared another's keyring).
    "add_key": "keyrings",
    "request_key": "keyrings",
    "keyctl": "keyrings",
    # The host's own: modules, the running kernel, the clock, swap, the kernel log, accounting,
    # quotas, I/O ports. Refused without capabilities anyway; denied before the kernel looks.
    "init_module": "host",
    "finit_module": "host",
    "delete_module": "host",
    "kexec_load": "host",
    "kexec_file_load": "host",
    "reboot": "host",
    "swapon": "host",
    "swapoff": "host",
    "syslog": "host",
    "acct": "host",
    "quotactl": "host",
    "quotactl_fd": "host",
    "settimeofday": "host",
    "clock_settime": "host",
    "clock_adjtime": "host",
    "iopl": "host",
    "ioperm": "host",
    "vhangup": "host",
    # Mounts and namespaces: the sandbox is made by bwrap, never by the command.
    "mount": "mounts",
    "umount2": "mounts",
    "pivot_root": "mounts",
    "move_mount": "mounts",
    "open_tree": "mounts",
    "fsopen": "mounts",
    "fsconfig": "mounts",
    "fsmount": "mounts",
    "fspick": "mounts",
    "mount_setattr": "mounts",
    "unshare": "namespaces",
    "setns": "namespaces",
    # File handles: open_by_handle_at opens any file of a mounted filesystem by number
    # (the "shocker" container escape).
    "open_by_handle_at": "handles",
    "name_to_handle_at": "handles",
    "fanotify_init": "handles",
    # Large kernel attack surfaces that tools don't use: BPF programs, performance counters
    # (also a side channel on other tenants), userfaultfd (an exploit primitive), io_uring
    # (which Docker's default profile blocks too).
    "bpf": "attack surface",
    "perf_event_open": "attack surface",
    "userfaultfd": "attack surface",
    "io_uring_setup": "attack surface",
    "io_uring_enter": "attack surface",
    "io_uring_register": "attack surface",
    "open_tree_attr": "mounts",
}

# fallocate(fd, mode, offset, len): the modes allowed (linux/falloc.h), exactly; they only
# free blocks. Every other mode fails, mode 0 included.
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02  # only with KEEP_SIZE
FALLOC_FL_COLLAPSE_RANGE = 0x08  # only alone
FALLOC_FL_ZERO_RANGE = 0x10
FALLOCATE_MODES = (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, FALLOC_FL_COLLAPSE_RANGE)
# The (mask, value) pairs of the mode's low 32 bits that fail: every mode not in the above.
_FREEING_BITS = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_COLLAPSE_RANGE
_DENIED_MODES = (
    (0xFFFFFFFF, 0),  # mode 0: allocates
    (FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, FALLOC_FL_KEEP_SIZE),
    (FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, FALLOC_FL_PUNCH_HOLE),
    (
        FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_KEEP_SIZE,
        FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_KEEP_SIZE,
    ),
    *((1 << b, 1 << b) for b in range(32) if not (1 << b) & _FREEING_BITS),  # ZERO_RANGE, ...
)
# ioctl(fd, cmd, ...): the old XFS preallocation calls, which Linux serves for every
# filesystem as fallocate with KEEP_SIZE (measured: 50 MiB under a 4 KiB limit, size 0).
# _IOW('X', nr, struct space_resv): 48 bytes, 44 in the 32-bit ABI (compat takes both).
_PREALLOCATE_IOCTLS: dict[str, tuple[int, ...]] = {
    "FS_IOC_RESVSP": (0x40305828, 0x402C5828),
    "FS_IOC_RESVSP64": (0x4030582A, 0x402C582A),
    "FS_IOC_ZERO_RANGE": (0x40305839, 0x402C5839),
}

# Delete-only (EDQUOT): what makes an inode, a name or blocks with no write, which is all
# that RLIMIT_FSIZE 0 stops.
CREATING: dict[str, str] = {
    "creat": "a file",
    "mkdir": "a directory",
    "mkdirat": "a directory",
    "mknod": "a fifo or device node",
    "mknodat": "a fifo or device node",
    "link": "a name (a directory's blocks grow with its names)",
    "linkat": "a name (also gives an O_TMPFILE file a name)",
    "symlink": "a link (an inode)",
    "symlinkat": "a link (an inode)",
    # A rename adds a name to a directory that may not have held it: its blocks grow, and
    # a directory's blocks are not given back when names leave it.
    "rename": "a name",
    "renameat": "a name",
    "renameat2": "a name (RENAME_WHITEOUT: an inode)",
    # Extended attributes take a block per inode on ext4 (not shared when they differ).
    "setxattr": "an attribute block",
    "lsetxattr": "an attribute block",
    "fsetxattr": "an attribute block",
    "setxattrat": "an attribute block",
    "fallocate": "blocks (mode 0 fills a sparse file, with no write)",
    "bind": "a socket file (a Unix socket's path is an inode)",
}
# Delete-only: which argument of open(path, flags, mode) and openat(dirfd, path, flags,
# mode) holds the flags, and the (mask, value) of those refused: creating, and any write
# access (O_WRONLY, O_RDWR, and 3, which opens for ioctls). A writable shared mapping needs
# a file open for writing, and its page faults take blocks RLIMIT_FSIZE 0 never sees (choom
# writes /proc: it runs outside the sandbox, `ctxactors.sandbox.start`).
OPEN_FLAGS: dict[str, int] = {"open": 1, "openat": 2}
_O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE (O_TMPFILE is it with O_DIRECTORY)
_DENIED_FLAGS = (
    (os.O_CREAT, os.O_CREAT),
    (_O_TMPFILE_BIT, _O_TMPFILE_BIT),
    (os.O_WRONLY, os.O_WRONLY),
    (os.O_RDWR, os.O_RDWR),
)

# Calls an older libseccomp may not know, by number: the same on every architecture but MIPS
# (and alpha, ia64) since Linux 5.1 (x32: with bit 30 set). Denied by a few BPF instructions before
# libseccomp's program when it can't name them.
NUMBERS = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "openat2": 437,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "setxattrat": 463,
    "open_tree_attr": 467,
}
_X32_BIT = 0x40000000

INSTALL_HINT = "install pyseccomp (a dependency of ctxactors) and the Debian package libseccomp2"


class UnknownCall(Exception):
    """A call to deny that neither libseccomp nor `NUMBERS` knows: no filter is built."""


@functools.cache
def program(delete_only: bool = False) -> bytes | str:
    """The compiled filter (BPF), or why it can't be built here (one line); `delete_only`:
    the filter of a principal at a disk budget (see the module docstring)."""
    try:
        import pyseccomp as seccomp
    except ImportError:
        return f"pyseccomp is not installed: {INSTALL_HINT}"
    except RuntimeError as exc:  # pyseccomp raises this when libseccomp is missing
        return f"{exc}: {INSTALL_HINT}"
    try:
        return _build(seccomp, delete_only)
    except UnknownCall as exc:
        return f"libseccomp doesn't know the system call {exc} (nor this server): update both"


def _build(seccomp: Any, delete_only: bool) -> bytes:
    allow_rest = seccomp.SyscallFilter(seccomp.ALLOW)
    native = seccomp.system_arch()
    compat = {
        seccomp.Arch.X86_64: (seccomp.Arch.X86, seccomp.Arch.X32),
        seccomp.Arch.AARCH64: (seccomp.Arch.ARM,),
    }
    for arch in compat.get(native, ()):
        try:
            allow_rest.add_arch(arch)
        except OSError:
            pass  # a libseccomp without that ABI: the kernel's default (kill) holds for it
    by_number: list[tuple[int, int]] = []  # (number, errno) libseccomp can't name

    def deny(errno_: int, name: str, *args: Any) -> None:
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) == -1:  # __NR_SCMP_ERROR
            mips = ("MIPS", "MIPS64", "MIPS64N32", "MIPSEL", "MIPSEL64", "MIPSEL64N32")
            unified = native not in {getattr(seccomp.Arch, a) for a in mips}  # MIPS: offsets
            if name not in NUMBERS or not unified or args:
                raise UnknownCall(name)
            by_number.append((NUMBERS[name], errno_))
            return
        try:
            allow_rest.add_rule(seccomp.ERRNO(errno_), name, *args)
        except (OSError, ValueError):
            pass  # a call libseccomp knows but this architecture doesn't have (iopl on arm)

    for name in DENIED:
        deny(errno.EPERM, name)
    # cmd is an unsigned int: compared on its low 32 bits only, as the kernel reads it (an
    # EQ on the register would miss a cmd with high bits set).
    for cmd in (c for cmds in _PREALLOCATE_IOCTLS.values() for c in cmds):
        deny(errno.EOPNOTSUPP, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, cmd))
    if delete_only:
        for name in CREATING:
            deny(errno.EDQUOT, name)
        deny(errno.ENOSYS, "openat2")
        for name, arg in OPEN_FLAGS.items():
            for mask, value in _DENIED_FLAGS:
                deny(errno.EDQUOT, name, seccomp.Arg(arg, seccomp.MASKED_EQ, mask, value))
    else:
        # The mode is an int: only its low 32 bits are compared (the kernel ignores the rest).
        for mask, value in _DENIED_MODES:
            deny(errno.EOPNOTSUPP, "fallocate", seccomp.Arg(1, seccomp.MASKED_EQ, mask, value))
    with tempfile.TemporaryFile() as f:
        allow_rest.export_bpf(f)
        f.seek(0)
        built = f.read()
    return _prefix(by_number) + built


def _prefix(denied: list[tuple[int, int]]) -> bytes:
    """Classic BPF that fails each system call of `denied` (number, errno) with its errno
    and falls through to the program after it otherwise (its jumps are relative, and it
    loads what it tests)."""
    if not denied:
        return b""

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter

    ld_nr, and_k, jeq_k, ret_k = 0x20, 0x54, 0x15, 0x06  # BPF_LD|W|ABS, ALU|AND|K, ...
    out = [op(ld_nr, 0), op(and_k, ~_X32_BIT & 0xFFFFFFFF)]  # seccomp_data.nr
    for number, errno_ in denied:  # a match falls to its ret; a miss jumps over it
        out.append(op(jeq_k, number, jt=0, jf=1))
        out.append(op(ret_k, 0x00050000 | errno_))  # SECCOMP_RET_ERRNO
    return b"".join(out)
