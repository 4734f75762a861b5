"""The seccomp filter every sandboxed command runs under: `program`.

bubblewrap applies a compiled BPF program (``--seccomp FD``) to the command before it
starts; it is built here once per process with libseccomp (``pyseccomp``, in the ``serve``
extra; Debian's ``libseccomp2``). Every system call is allowed but:

- those in `DENIED`, which fail with ``EPERM``: calls a tool command (a shell, a compiler,
  a test runner, git) never needs, that reach state shared with other tenants or the host,
  or that open the kernel's largest attack surfaces;
- ``fallocate`` in the modes that take disk blocks ``RLIMIT_FSIZE`` never sees (the disk
  budgets' cap on a file, `ctxactors.sandbox_disk`), which fail with ``EOPNOTSUPP`` (as on
  a filesystem without them: glibc's ``posix_fallocate`` then writes, under the limit).
  Linux checks the limit only when ``fallocate`` makes a file longer: ``KEEP_SIZE``
  allocates past the end without (measured: 300 MiB under a limit of 0), ``INSERT_RANGE``
  lengthens a file without the check, which mode 0 then fills (100 MiB under a 1 MiB
  limit). Allowed: mode 0 and ``ZERO_RANGE`` (checked when they lengthen; inside a file
  they fill what a write could), ``PUNCH_HOLE`` and ``COLLAPSE_RANGE`` (they free blocks).
  The ``ioctl`` calls that Linux turns into ``fallocate`` with ``KEEP_SIZE``
  (``FS_IOC_RESVSP``, ``FS_IOC_RESVSP64``, ``FS_IOC_ZERO_RANGE``) fail the same way.

`program(delete_only=True)` is the filter of a principal at a disk budget (or past what the
measured walk counts): ``RLIMIT_FSIZE`` 0 stops its writes, not what allocates with no
write. It denies besides, with ``EDQUOT`` ("Disk quota exceeded"), every call in
`CREATING` and ``open``/``openat`` with ``O_CREAT``, ``O_TMPFILE`` or a write access mode
(`OPEN_FLAGS`), and ``openat2`` with ``ENOSYS`` (its flags are behind a pointer the filter
can't read; glibc and Go fall back to ``openat``). ``rm``, ``ls``, ``cat`` and ``du`` work;
even ``> /dev/null`` fails (``O_CREAT``: the filter can't see that the file exists).

The same lists hold for the compat ABIs of the host (i386 and x32 on x86-64, arm on
aarch64), so a 32-bit binary can't go around them. ``setxattrat`` (Linux 6.13), which
libseccomp 2.5 doesn't know, is denied by a few instructions of our own before its program.
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
}

# fallocate(fd, mode, offset, len): the mode bits that don't take blocks past RLIMIT_FSIZE
# (linux/falloc.h); every other bit, and KEEP_SIZE without PUNCH_HOLE, is refused.
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02  # only with KEEP_SIZE
FALLOC_FL_COLLAPSE_RANGE = 0x08
FALLOC_FL_ZERO_RANGE = 0x10
_FALLOCATE_BITS = (
    FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_ZERO_RANGE
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
# mode) holds the flags, and the (mask, value) of those refused. Opening an existing file
# for writing stays allowed (choom, which the sandbox runs first, writes /proc; writes fail
# at RLIMIT_FSIZE 0).
OPEN_FLAGS: dict[str, int] = {"open": 1, "openat": 2}
_O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE (O_TMPFILE is it with O_DIRECTORY)
_DENIED_FLAGS = ((os.O_CREAT, os.O_CREAT), (_O_TMPFILE_BIT, _O_TMPFILE_BIT))

# Calls newer than libseccomp 2.5 that delete-only must deny: numbered the same on x86-64,
# i386, aarch64 and arm since Linux 5.1 (x32: with bit 30 set). Denied by a few BPF
# instructions before libseccomp's program when it can't name them.
_NEWER_CREATING = {"setxattrat": 463}
_X32_BIT = 0x40000000

INSTALL_HINT = (
    "install the serve extra (pip install 'ctxactors[serve]', which has pyseccomp) and the "
    "Debian package libseccomp2"
)


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
    return _build(seccomp, delete_only)


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

    def deny(errno_: int, name: str, *args: Any) -> None:
        try:
            allow_rest.add_rule(seccomp.ERRNO(errno_), name, *args)
        except (OSError, ValueError):
            pass  # a call this architecture (or this libseccomp) doesn't have

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
        mode = 1
        keep_alone = (FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, FALLOC_FL_KEEP_SIZE)
        denied_bits = [(1 << b, 1 << b) for b in range(32) if not (1 << b) & _FALLOCATE_BITS]
        for mask, value in [keep_alone, *denied_bits]:
            deny(errno.EOPNOTSUPP, "fallocate", seccomp.Arg(mode, seccomp.MASKED_EQ, mask, value))
    with tempfile.TemporaryFile() as f:
        allow_rest.export_bpf(f)
        f.seek(0)
        built = f.read()
    unnamed = [
        number
        for name, number in _NEWER_CREATING.items()
        if delete_only
        and native in (seccomp.Arch.X86_64, seccomp.Arch.AARCH64)
        and seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) < 0
    ]
    return _prefix(unnamed, errno.EDQUOT) + built


def _prefix(numbers: list[int], errno_: int) -> bytes:
    """Classic BPF that fails the system calls `numbers` with `errno_` and falls through to
    the program after it otherwise (its jumps are relative, and it loads what it tests)."""
    if not numbers:
        return b""

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter

    ld_nr, and_k, jeq_k, ret_k = 0x20, 0x54, 0x15, 0x06  # BPF_LD|W|ABS, ALU|AND|K, ...
    out = [op(ld_nr, 0), op(and_k, ~_X32_BIT & 0xFFFFFFFF)]  # seccomp_data.nr
    for i, number in enumerate(numbers):  # on a match, jump to the ret after the last test
        out.append(op(jeq_k, number, jt=len(numbers) - i))
    out.append(op(0x05, 1))  # BPF_JMP|JA: past the ret, to the program
    out.append(op(ret_k, 0x00050000 | errno_))  # SECCOMP_RET_ERRNO
    return b"".join(out)
