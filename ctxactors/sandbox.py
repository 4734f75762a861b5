"""The bubblewrap sandbox that every workspace command runs in.

One command, one sandbox: ``bwrap`` gives it new user, PID, IPC, UTS, cgroup and network
namespaces, no capabilities, a read-only root made of system directories, a private
size-capped ``/tmp`` and ``/dev/shm``, a minimal ``/proc`` and ``/dev``, and the session's
own directory as the only writable host path, at ``/workspace``. Nothing else of the host
is there: no other session's directory, no workspace root, no project, no ``/root``, no ``/home``. ``/etc`` holds only the loader
cache, ``alternatives``, the time zone and a generated ``passwd``/``group`` (plus the
resolver files when the network is on).

Under ``--unshare-pid`` the sandbox's init dies with the outer ``bwrap`` process
(``--die-with-parent``), and the kernel kills every process of a PID namespace whose init
is gone: killing the one process the server started ends everything the command started,
backgrounded, daemonized or re-``setsid`` children included.

Limits are set inside the sandbox with ``prlimit`` (util-linux) on the command's shell, so
they are inherited by everything it starts and can't be raised (that needs
``CAP_SYS_RESOURCE`` on the host; the sandbox has no capabilities). Sums over a
principal's sandboxes (processes, memory with the tmpfs pages, CPU) are cgroups', where
the server may make them (`ctxactors.sandbox_limits`); ``choom``, run on ``bwrap`` outside,
gives sandboxed processes the highest ``oom_score_adj`` either way: if memory runs out, the OOM killer ends a
sandboxed process, not the server. ``RLIMIT_NPROC`` needs care, measured here (kernel 6.18):

- the kernel counts it per (user namespace, real uid) since 5.14, so set *inside* the
  sandbox's fresh user namespace it caps the processes (and threads) of that one sandbox;
  set outside, it would count every process of the server's user, the server's own
  threads included;
- it is never enforced for real uid 0 (``copy_process`` exempts ``INIT_USER``): a server
  running as root whose sandbox maps to root saw 200 of 200 forks succeed with
  ``--nproc=30``. So a root server starts ``bwrap`` as an unprivileged user, the
  principal's own (`ctxactors.sandbox_uids`); then 28 forks succeed and the 29th gets
  ``EAGAIN``, in each of two sandboxes running at once;
- the count is kept at every level of the user namespace chain and checked against the
  limit each namespace's creator had, so ``RLIMIT_NPROC`` set on ``bwrap`` itself (outside)
  caps the uid's processes in *all* its sandboxes: a principal's process budget the kernel
  enforces even without cgroups (`Tenant.nproc`).

A seccomp filter (`ctxactors.sandbox_seccomp`) denies the system calls a command never
needs, the kernel keyrings first, and the ``fallocate`` modes that take disk blocks past
``RLIMIT_FSIZE``; a tenant at a disk budget runs under one that denies creating files too
(`Tenant.delete_only`). ``/proc/keys`` and the other host-wide ``/proc`` files Docker hides
are hidden too.

Settings (`ctxactors.settings.SandboxSettings`, the runtime's ``settings.workspace.sandbox``;
defaults from these variables, read when a runtime is made; a bad value fails loudly,
naming it):

- ``CTXACTORS_WORKSPACE_SANDBOX``: ``bwrap`` (default) or ``none`` (no sandbox, loud warnings);
- ``CTXACTORS_WORKSPACE_BWRAP``: the bwrap program (default: ``bwrap`` on ``PATH``);
- ``CTXACTORS_WORKSPACE_NETWORK``: ``1``/``true``/``on`` shares the host network (default off);
- ``CTXACTORS_WORKSPACE_SECCOMP``: ``require`` (default: no sandbox starts when the seccomp
  filter can't be built here, `SandboxUnavailableError`) or ``auto`` (then unfiltered);
- ``CTXACTORS_WORKSPACE_ENV``: comma-separated names copied from the server's environment;
- ``CTXACTORS_WORKSPACE_CPU_SECONDS`` (600), ``CTXACTORS_WORKSPACE_MAX_MEMORY_BYTES``
  (address space per process, 4 GiB), ``CTXACTORS_WORKSPACE_MAX_FILE_BYTES`` (1 GiB),
  ``CTXACTORS_WORKSPACE_MAX_PROCESSES`` (256 per sandbox), ``CTXACTORS_WORKSPACE_TMP_BYTES``
  (size of the private ``/tmp`` and of ``/dev/shm``, 256 MiB each);
- ``CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST`` (2,000,000,000 when root, ``none``: the server's
  own user) and ``CTXACTORS_WORKSPACE_SANDBOX_UID_COUNT`` (1,000,000): the uids a root server
  gives principals, one each.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from ctxactors import cgroups, sandbox_seccomp
from ctxactors.errors import SandboxUnavailableError
from ctxactors.settings import SandboxSettings

WORKDIR = "/workspace"  # where the session's directory appears inside the sandbox
PATH = "/usr/local/bin:/usr/bin:/bin"
_SETPRIV = "/usr/bin/setpriv"  # util-linux, as prlimit and choom
_PRLIMIT = "/usr/bin/prlimit"
_PROBE_TIMEOUT = 30.0
# Always there; the resolver files only with the network on.
_ETC = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")
_ETC_NET = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)
INSTALL_HINT = (
    "install the Debian package `bubblewrap` (0.8 or later: apt-get install bubblewrap) on a "
    "kernel that allows user namespaces, or set CTXACTORS_WORKSPACE_SANDBOX=none to run commands "
    "unsandboxed (unsafe: they then see the server's files and processes)"
)


def clean_env(settings: SandboxSettings, home: str) -> dict[str, str]:
    """The whole environment of a command: never the server's own variables."""
    env = {"PATH": PATH, "HOME": home, "LANG": os.environ.get("LANG") or "C.UTF-8"}
    for name in settings.env:
        if name in os.environ:
            env[name] = os.environ[name]
    env["HOME"] = home  # the workspace, whatever the operator listed
    return env


@functools.cache
def _system_dirs(root: str = "/") -> tuple[str, ...]:
    """The sandbox's system directories, each read-only, as the host under `root` has them:
    ``/usr``, and /bin, /lib...: symlinks into /usr on merged-/usr systems (Debian 12), made
    the same symlinks in the sandbox, else directories bound read-only."""
    out = ["--ro-bind", os.path.join(root, "usr"), "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = os.path.join(root, name)
        if os.path.islink(path):
            out += ["--symlink", os.readlink(path), "/" + name]
        elif os.path.isdir(path):
            out += ["--ro-bind", path, "/" + name]
    return tuple(out)


def bwrap_args(
    settings: SandboxSettings,
    workdir_fd: int,
    passwd_fd: int,
    group_fd: int,
    seccomp_fd: int | None = None,
    *,
    root: str = "/",
) -> list[str]:
    """The bwrap command line up to and including ``--``: one sandbox around `workdir_fd`,
    under the seccomp program readable from `seccomp_fd` (`ctxactors.sandbox_seccomp`).

    `root` is where the host's system directories and /proc files are looked up (a test
    passes a fake root to run the branch of a host whose /bin and /lib are not merged into
    /usr, or whose kernel has other /proc files)."""
    args = [settings.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    if settings.network:
        args.append("--share-net")
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "workspace"]
    args += _system_dirs(root)
    for path in _ETC + (_ETC_NET if settings.network else ()):
        args += ["--ro-bind-try", path, path]
    args += ["--ro-bind-data", str(passwd_fd), "/etc/passwd"]
    args += ["--ro-bind-data", str(group_fd), "/etc/group"]
    args += ["--proc", "/proc", *_proc_masks(root), "--dev", "/dev"]
    for tmpfs in ("/tmp", "/dev/shm"):
        args += ["--size", str(settings.tmp_bytes), "--tmpfs", tmpfs]
    args += ["--bind-fd", str(workdir_fd), WORKDIR, "--chdir", WORKDIR]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    # bwrap builds / and /dev on tmpfs with no size cap: left writable, they would be memory
    # no limit counts. Only /workspace, /tmp and /dev/shm stay writable.
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--"]
    return args


@functools.cache
def _proc_masks(root: str = "/") -> tuple[str, ...]:
    """/proc files that show host-wide state, hidden as Docker hides them: every uid's keys
    and key quotas, every CPU's timers and tasks (only those the kernel under `root` has:
    bwrap can't make a file in /proc)."""
    out: list[str] = []
    for name in ("keys", "key-users", "timer_list", "sched_debug"):
        if os.path.exists(os.path.join(root, "proc", name)):
            out += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    return tuple(out)


def limit_args(
    settings: SandboxSettings, nproc: int | None = None, file_bytes: int | None = None
) -> list[str]:
    """prlimit inside the sandbox (soft = hard, so the command can't raise them back).
    `nproc`:
    the tenant's own RLIMIT_NPROC outside, which the one inside can't exceed; `file_bytes`:
    what is left of its disk budget (`ctxactors.sandbox_disk`), if less than the setting."""
    processes = settings.processes if nproc is None else min(settings.processes, nproc)
    fsize = settings.file_bytes if file_bytes is None else min(settings.file_bytes, file_bytes)
    return [
        _PRLIMIT,
        f"--cpu={settings.cpu_seconds}",
        f"--as={settings.memory_bytes}",
        f"--fsize={fsize}",
        f"--nproc={processes}",
        "--",
    ]


# Run on bwrap, outside the sandbox: the score is inherited by everything inside, and no
# command's filter has to let it write /proc (a delete-only one opens nothing for writing).
# Raising one's own score needs no privilege.
CHOOM = ("/usr/bin/choom", "-n", "1000", "--")


def _data_fd(data: bytes) -> int:
    """A pipe's read end holding `data` (small: it fits the pipe buffer, no writer thread)."""
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


def seccomp_problem(settings: SandboxSettings) -> str | None:
    """Why this server may not sandbox, as `settings` require the seccomp filter and it
    can't be built here (one line, with the way out); None: it may."""
    if settings.seccomp != "require":
        return None
    for delete_only in (False, True):
        program = sandbox_seccomp.program(delete_only)
        if isinstance(program, str):
            return (
                f"the workspace sandbox's seccomp filter can't be built: {program}; or set "
                "CTXACTORS_WORKSPACE_SECCOMP=auto to run sandboxes without it"
            )
    return None


def filters_delete_only(settings: SandboxSettings) -> bool:
    """True when a delete-only command runs under its filter here (sandboxed, and the filter
    built): then it can't take blocks, and the disk watch never stops it."""
    return settings.enabled and isinstance(sandbox_seccomp.program(delete_only=True), bytes)


@contextmanager
def _sandbox_fds(
    settings: SandboxSettings, workdir: str, uid: int, gid: int, delete_only: bool = False
) -> Iterator[list[int]]:
    """The session directory (bound by descriptor: the directory this server made, whatever
    its path points to later), the generated passwd and group, and the seccomp program if
    there is one (`delete_only`: the one that denies creating files too; none only where
    `settings` allow it, else `SandboxUnavailableError`); closed once bwrap has inherited
    them."""
    program = sandbox_seccomp.program(delete_only)
    if isinstance(program, str) and settings.seccomp == "require":
        raise SandboxUnavailableError(seccomp_problem(settings) or program)
    fds: list[int] = []
    try:
        fds.append(os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        fds.append(_data_fd(f"sandbox:x:{uid}:{gid}:sandbox:{WORKDIR}:/bin/sh\n".encode()))
        fds.append(_data_fd(f"sandbox:x:{gid}:\n".encode()))
        if isinstance(program, bytes):
            fds.append(_data_fd(program))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


class Tenant(NamedTuple):
    """Whose sandbox it is: the principal's (uid, gid) on a root server that switches users
    (None: the server's own), the ``cgroup.procs`` files its first process joins (see
    `ctxactors.cgroups`), and the ``RLIMIT_NPROC`` of that uid's processes in every
    sandbox together (the kernel counts a uid's processes across user namespaces)."""

    ids: tuple[int, int] | None = None
    join: tuple[str, ...] = ()
    nproc: int | None = None
    file_bytes: int | None = None  # the largest file its disk budget leaves (RLIMIT_FSIZE)
    delete_only: bool = False  # at a disk budget: the seccomp filter denies creating files


_SERVERS = Tenant()  # the server's own uid, no cgroup, no RLIMIT_NPROC outside


def start(
    settings: SandboxSettings, workdir: str, command: str, tenant: Tenant = _SERVERS
) -> subprocess.Popen[bytes]:
    """Start ``/bin/sh -c command`` (sandboxed unless the mode is ``none``) in its own
    process group, stdout and stderr on one pipe, as `tenant`'s: its first process joins the
    tenant's cgroups before it execs anything, as the server's user (who may write them),
    and only then drops to the tenant's uid."""
    join = cgroups.join_argv(list(tenant.join)) if tenant.join else []
    if not settings.enabled:
        return subprocess.Popen(
            [*join, "/bin/sh", "-c", command],
            cwd=workdir,
            env=clean_env(settings, workdir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    switch = settings.switch_user and tenant.ids is not None
    uid, gid = tenant.ids if switch and tenant.ids else (os.getuid(), os.getgid())
    with _sandbox_fds(settings, workdir, uid, gid, tenant.delete_only) as fds:
        nproc = tenant.nproc if switch else None
        limits = limit_args(settings, nproc, tenant.file_bytes)
        argv = [*CHOOM, *bwrap_args(settings, *fds), *limits, "/bin/sh", "-c", command]
        if nproc is not None:
            argv = [_PRLIMIT, f"--nproc={nproc}", "--", *argv]
        if switch and join:  # setpriv switches, after the join
            drop = [_SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
            argv, switch = [*drop, *argv], False
        return subprocess.Popen(
            [*join, *argv],
            cwd="/",
            env=clean_env(settings, WORKDIR),  # bwrap passes its environment on, nothing else
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            pass_fds=fds,
            # Switched in the child before exec, with no preexec_fn (unsafe with threads).
            user=uid if switch else None,
            group=gid if switch else None,
            extra_groups=[] if switch else None,
        )


def make_root(settings: SandboxSettings, root: str) -> None:
    """Create the workspace root, or make sure the one there may hold sessions' directories.

    Its mode becomes 700, or 711 with another user running bwrap (that user must traverse
    it, bwrap resolving the directory's path, but not list it; 711 is kept without one too):
    a root that others could list is tightened. A root that is a symlink, not ours, or
    writable by its group or others is refused (`SandboxUnavailableError`): whoever owns it
    or may write in it could have swapped, planted or removed entries already (the default
    root is under the shared ``/tmp``, where another user can make it first). Checked
    through one descriptor opened without following a link, so the path can't change
    between check and chmod.
    """
    path = os.path.normpath(root)  # a trailing slash would follow a link
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR or EEXIST: not a directory
        if os.path.islink(path):
            what = "it is a symlink"
        elif os.path.lexists(path) and not os.path.isdir(path):
            what = "it is not a directory"
        else:
            what = exc.strerror or str(exc)
        raise SandboxUnavailableError(f"{_ROOT_FIX % root}: {what}") from None
    try:
        status = os.fstat(fd)
        problem = _root_problem(status)
        if problem is not None:
            raise SandboxUnavailableError(f"{_ROOT_FIX % root}: {problem}")
        switch = settings.switch_user
        # 711 is fine without a switch too: another runtime on this root may need it.
        if stat.S_IMODE(status.st_mode) not in ((0o711,) if switch else (0o700, 0o711)):
            os.fchmod(fd, 0o711 if switch else 0o700)
    finally:
        os.close(fd)


_ROOT_FIX = (
    "the workspace root %s (CTXACTORS_WORKSPACE_ROOT) must be a directory of this user that "
    "no one else may write in"
)


def _root_problem(status: os.stat_result) -> str | None:
    if status.st_uid != os.geteuid():
        return f"it belongs to uid {status.st_uid}"
    if status.st_mode & 0o022:
        return (
            f"its mode is {stat.S_IMODE(status.st_mode):o}, writable by its group or others; "
            "remove it, or chmod go-w once you know nothing in it was put there by another user"
        )
    return None


def prepare_directory(settings: SandboxSettings, path: str, ids: tuple[int, int]) -> None:
    """Hand a new session directory to the principal's uid (`ids`) that runs its sandboxes."""
    if settings.switch_user:
        os.chown(path, *ids)


def probe_ids(settings: SandboxSettings) -> tuple[int, int]:
    """The uid the probe sandbox runs as: the range's first."""
    first = settings.uid_first if settings.uid_first is not None else os.getuid()
    return (first, first)


_probed: dict[tuple[SandboxSettings, str], str | None] = {}
_probe_lock = threading.Lock()


def check(settings: SandboxSettings, root: str) -> None:
    """Raise `SandboxUnavailableError` unless a probe sandbox runs here, under `root`.

    Probed once per settings and root, then cached: the answer doesn't change while the
    process runs, and every runtime that registers the workspace asks.
    """
    key = (settings, root)
    with _probe_lock:
        if key not in _probed:
            _probed[key] = _probe(settings, root)
        problem = _probed[key]
    if problem is not None:
        raise SandboxUnavailableError(problem)


def _probe(settings: SandboxSettings, root: str) -> str | None:
    if not os.access(settings.bwrap, os.X_OK):
        return (
            f"the workspace sandbox needs bubblewrap, not found at {settings.bwrap!r} "
            f"(CTXACTORS_WORKSPACE_BWRAP): {INSTALL_HINT}"
        )
    seccomp = seccomp_problem(settings)
    if seccomp is not None:
        return seccomp
    make_root(settings, root)
    workdir = tempfile.mkdtemp(prefix="probe-", dir=root)
    try:
        # Exec'd directly first: choom, which starts the sandboxes, would hand a file that
        # isn't a program to /bin/sh (execvp), hiding the system's words for what is wrong.
        subprocess.run(
            [settings.bwrap, "--version"], capture_output=True, timeout=_PROBE_TIMEOUT, check=False
        )
        prepare_directory(settings, workdir, probe_ids(settings))
        proc = start(settings, workdir, "exit 0", Tenant(probe_ids(settings)))
        try:
            output, _ = proc.communicate(timeout=_PROBE_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        detail = output.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"
    except OSError as exc:
        detail = str(exc)
    else:
        if proc.returncode == 0:
            return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    message = f"bubblewrap ({settings.bwrap}) could not start a sandbox: {detail}"
    if settings.switch_user:
        message += (
            f"; the sandbox users (uids from {settings.uid_first}, "
            "CTXACTORS_WORKSPACE_SANDBOX_UID_FIRST) must be able to enter every parent "
            f"directory of the workspace root {root}"
        )
    return f"{message}. Otherwise {INSTALL_HINT}"
