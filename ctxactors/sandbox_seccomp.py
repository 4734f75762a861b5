"""The seccomp filter every sandboxed command runs under: `program`.

bubblewrap applies a compiled BPF program (``--seccomp FD``) to the command before it
starts; it is built here once per process with libseccomp (``pyseccomp``, in the ``serve``
extra; Debian's ``libseccomp2``). Every system call is allowed but those in `DENIED`, which
fail with ``EPERM``: calls a tool command (a shell, a compiler, a test runner, git) never
needs, that reach state shared with other tenants or the host, or that open the kernel's
largest attack surfaces. The same list holds for the compat ABIs of the host (i386 and x32
on x86-64, arm on aarch64), so a 32-bit binary can't go around it.
"""

from __future__ import annotations

import errno
import functools
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

INSTALL_HINT = (
    "install the serve extra (pip install 'ctxactors[serve]', which has pyseccomp) and the "
    "Debian package libseccomp2"
)


@functools.cache
def program() -> bytes | str:
    """The compiled filter (BPF), or why it can't be built here (one line)."""
    try:
        import pyseccomp as seccomp
    except ImportError:
        return f"pyseccomp is not installed: {INSTALL_HINT}"
    except RuntimeError as exc:  # pyseccomp raises this when libseccomp is missing
        return f"{exc}: {INSTALL_HINT}"
    return _build(seccomp)


def _build(seccomp: Any) -> bytes:
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
    for name in DENIED:
        try:
            allow_rest.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (OSError, ValueError):
            pass  # a call this architecture doesn't have
    with tempfile.TemporaryFile() as f:
        allow_rest.export_bpf(f)
        f.seek(0)
        return f.read()
