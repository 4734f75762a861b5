"""Kernel budgets for sandboxes: a cgroup per principal under one per runtime.

One runtime's tree (cgroup v1: the same tree in each of the pids, memory and cpu
hierarchies; v2: one tree with those controllers enabled)::

    <home>/ctxactors-<pid>-<n>/      every sandbox of the runtime: the server-wide budget
        anonymous/                   callers with no principal: the server-wide budget only
        p-<hash of the principal>/   one principal's budget, across all its sessions

``<home>`` is the server's own cgroup in each hierarchy, so the sandboxes still count
against whatever the host gives the server (here, a memory cgroup per job), or a delegated
directory the operator names. A sandbox's first process writes itself into its group's
``cgroup.procs`` before it execs bubblewrap (`join_argv`), so everything the command ever
starts is counted there from its first fork: processes (``pids.max``: a fork past it fails
with ``EAGAIN``), memory with the pages of its tmpfs ``/tmp`` and ``/dev/shm`` (charged to
the group of the process that touches them; past the limit the kernel reclaims, then the OOM
killer ends a process *of that group*), and CPU time by weight against the other groups.

CPU without cgroups is already shared per sandbox, not per process: each sandbox is a
session of its own (``--new-session``), and the kernel's autogroup weighs a session as one
task. The cpu weight makes that per principal; every sandbox together runs on the CPU time
the server's own threads leave (``cpu.idle`` on the server-wide group), or, where the kernel
lacks it or ``server_cpu_idle`` is off, at ``server_cpu_weight`` against those threads.

Idle only means "the server's threads first" if the server-wide group's siblings are the
server's: in a hierarchy's root group they are every process of the host, and idle
sandboxes starved behind any of them. So a server found in the root cpu group first gets a
group of its own, as systemd gives a service (`step_aside`)::

    <root>/ctxactors-<pid>/          this process's cpu group (one, whatever its runtimes)
        server/                      the process itself, all its threads
        ctxactors-<pid>-<n>/         a runtime's server-wide group, idle beside it

Later runtimes of the process find it in ``server/`` and go beside it too. A later server's
start sweeps a gone process's group and trees, but never a live process's inside them (a
server this one started is in its ``server/``, its tree there), and takes a tree or group
named with its own pid that it did not make for an earlier process's (pids are reused).

cgroup v2 forbids processes in a group whose controllers are enabled for its children, so
when ``<home>`` is the server's own group (systemd's ``Delegate=yes`` hands a service its
own group) the server first moves its processes into ``<home>/server``, as systemd's
delegation notes ask a service to do.

Measured on kernel 6.18, cgroup v1, as root: with ``pids.max`` 5 the sixth ``sleep &`` gets
``Cannot fork``; a sandbox writing 100 MiB into its tmpfs under a 32 MiB ``memory.limit_in_bytes``
is OOM-killed inside its group (``memory.oom_control``: ``oom_kill 1``) while others run;
a group can be removed (``rmdir``) only once the kernel has finished killing its processes,
which is asynchronous after the sandbox's init dies, so removal is retried (`remove`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

CONTROLLERS = ("pids", "memory", "cpu")
_V1_FILES = {"pids": "pids.max", "memory": "memory.limit_in_bytes", "cpu": "cpu.shares"}
_V2_FILES = {"pids": "pids.max", "memory": "memory.max", "cpu": "cpu.weight"}
_ANONYMOUS = "anonymous"
_SERVER_LEAF = "server"  # v2: where the server's own processes go in a delegated group
_OURS = re.compile(r"ctxactors-(\d+)(?:-\d+)?")  # a runtime's tree, or a process's group
_counter = itertools.count(1)
# (pid, root group) -> the group this process moved into: once per process and hierarchy,
# however many runtimes it holds (a forked child has a pid of its own, so it is asked anew).
_stepped: dict[tuple[int, str], str] = {}
_stepping = threading.Lock()
# The trees and groups this process made (or is making). One named with this process's pid
# but not here was left by an earlier process with the same pid (pids are reused: 32,768 of
# them on many hosts), and is swept as a gone process's: reused, a left idle group refused
# the weight a server without idle writes (EINVAL: no cgroups at all).
_made_here: set[str] = set()
_PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT: a larger number in a name is no pid of ours


def _new_lock_after_fork() -> None:
    # A fork while another thread held the lock (moving this process) left it held for good
    # in the child, whose own first runtime then hung forever in `step_aside`.
    global _stepping
    _stepping = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


@dataclass(frozen=True)
class Limits:
    """What one group may use; None: no limit of its own (its parents' still hold)."""

    processes: int | None = None
    memory_bytes: int | None = None
    cpu_weight: int | None = None  # cgroup v2 units, 1..10000 (100: a fair share)
    # The group runs only on CPU time its siblings leave (``cpu.idle``): for the server-wide
    # group, so that a waking server thread preempts the sandboxes at once. auto: only where
    # its siblings are the server's own (not in a hierarchy's root group: there they would be
    # every process of the host).
    cpu_idle: Literal["auto", "on", "off"] = "off"


class Unavailable(Exception):
    """Why this process can't make cgroups (one line, for the startup log)."""


class Stranded(OSError):
    """`step_aside` moved the process but could not finish, and the root group refused it
    back: it is left in its group's ``server/`` (the message says so, for the startup log)."""


def group_name(principal: str | None) -> str:
    """A principal's group: a hash (a principal may hold any character, a directory name
    can't); 128 bits, so two principals never share one."""
    if principal is None:
        return _ANONYMOUS
    return "p-" + hashlib.sha256(principal.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class Tree:
    """One runtime's groups. Not thread-safe: its owner (`SandboxBudgets`) locks."""

    def __init__(self, version: str, homes: Mapping[str, str]) -> None:
        self.version = version
        self.controllers = tuple(homes)
        # One directory per hierarchy (v2: the same one for every controller).
        self._homes = dict(homes)
        self.name = f"ctxactors-{os.getpid()}-{next(_counter)}"
        self._groups: set[str] = set()
        self._limits = Limits()  # the server-wide group's, once open
        # Whether ``cpu.idle`` holds for the server-wide group (None: not asked for).
        self.cpu_idle: bool | None = None
        self.parent: str | None = None  # the group the operator named, if any
        # The cpu home is its hierarchy's root group: its other groups are the whole host's.
        self.at_root = False
        self.stepped_aside: str | None = None  # the group this process moved into
        self._step_problem: str | None = None  # why it could not

    def describe(self) -> str:
        where = sorted({os.path.join(h, self.name) for h in self._homes.values()})
        text = f"cgroup {self.version} ({', '.join(self.controllers)}) at {', '.join(where)}"
        if self.cpu_idle and self.parent is not None:
            # Not beside the server's own group: they yield to the parent's other groups,
            # and the parent's weight sets their share against the server.
            text += f"; sandboxes yield the CPU to every other group in {self.parent} (cpu.idle)"
        elif self.cpu_idle and self.at_root:  # `on`, where the server could not step aside
            text += "; sandboxes yield the CPU to every process of the host (cpu.idle)"
        elif self.cpu_idle:
            text += "; sandboxes run on the CPU time the server's threads leave (cpu.idle)"
        note = self.step_note()
        if note is not None:
            text += f"; {note}"
        if self.cpu_idle is False:
            text += "; cpu.idle not available here (before Linux 5.15, or refused): by weight"
        if self.cpu_idle is None and self._limits.cpu_idle == "auto" and self.at_root:
            text += (
                "; sandboxes by cpu weight, not idle: idle sandboxes would yield to every "
                "process of the host (CTXACTORS_WORKSPACE_SERVER_CPU_IDLE=on forces it)"
            )
        return text

    def step_note(self) -> str | None:
        """Where `step_aside` put this process, or why it could not (None: not asked)."""
        if self.stepped_aside is not None:
            return (
                f"the server was in the root cpu group, so it moved into "
                f"{os.path.join(self.stepped_aside, _SERVER_LEAF)}"
            )
        return self._step_problem

    def _dirs(self, group: str | None) -> dict[str, str]:
        """Each controller's directory of `group` (None: the server-wide group)."""
        parts = [self.name] if group is None else [self.name, group]
        return {c: os.path.join(h, *parts) for c, h in self._homes.items()}

    def open(self, limits: Limits) -> None:
        """Make the server-wide group (sweeping groups a dead process of ours left)."""
        for home in set(self._homes.values()):
            _sweep(home)  # an earlier process's tree of this name too: not yet made here
        _made_here.add(self.name)
        self._limits = limits
        if limits.cpu_idle != "off" and self.at_root and self.parent is None:
            self._step_aside()
        self._make(None, limits)
        if self.version == "v2":
            enable = " ".join(f"+{c}" for c in self.controllers)
            _write(os.path.join(self._dirs(None)["pids"], "cgroup.subtree_control"), enable)

    def _step_aside(self) -> None:
        """Give this process a cpu group of its own (`step_aside`) and make the tree in it."""
        root = self._homes["cpu"]
        if self.version == "v1" and not os.path.exists(os.path.join(root, "cpu.idle")):
            # Before Linux 5.15: the move, for good, would buy nothing (v2's root has no
            # cpu.idle file, kernel or not: there the group's own tells, after the move).
            self._step_problem = "the server stays in the root cpu group: no cpu.idle here"
            return
        try:
            group = step_aside(root, self.version, self.controllers)
        except Stranded as exc:
            self._step_problem = str(exc)
            return
        except OSError as exc:
            hint = ""
            if exc.errno == errno.EINVAL:  # measured: a SCHED_FIFO thread, v1 (6.18)
                hint = (
                    " (a realtime thread? a new group has no cpu.rt_runtime_us, so no "
                    "SCHED_FIFO/SCHED_RR thread may join it)"
                )
            self._step_problem = (
                f"the server stays in the root cpu group: can't move it into a group of its "
                f"own: {exc}{hint}"
            )
            return
        moved = [c for c, h in self._homes.items() if h == root]  # v2: every controller
        self._homes.update(dict.fromkeys(moved, group))
        _sweep(group)  # trees of a forked child of ours that ended
        self.stepped_aside, self.at_root = group, False

    def make(self, group: str, limits: Limits) -> None:
        """Make (or find, left from before) a principal's group, with these limits."""
        if not all(os.path.isdir(d) for d in self._dirs(None).values()):
            # Gone: swept as a dead process's by a server in another PID namespace.
            self.open(self._limits)
        self._make(group, limits)
        self._groups.add(group)

    def _make(self, group: str | None, limits: Limits) -> None:
        idle = group is None and (
            limits.cpu_idle == "on" or (limits.cpu_idle == "auto" and not self.at_root)
        )
        for controller, path in self._dirs(group).items():
            try:
                os.mkdir(path)
            except FileExistsError:
                pass
            if controller == "cpu" and idle:
                # Idle first: the kernel refuses a weight for an idle group (EINVAL), as
                # when a swept tree is made again, and idle makes the weight moot anyway.
                self.cpu_idle = _set_idle(os.path.join(path, "cpu.idle"))
                if self.cpu_idle:
                    continue
            value = _limit(self.version, controller, limits)
            if value is not None:
                files = _V1_FILES if self.version == "v1" else _V2_FILES
                _write(os.path.join(path, files[controller]), value)
                if controller == "memory":  # swap is memory too: tmpfs pages may go there
                    swap = "memory.memsw.limit_in_bytes" if self.version == "v1" else None
                    _write_if_there(os.path.join(path, swap or "memory.swap.max"), value, "0")

    def directories(self, group: str | None = None) -> list[str]:
        """The directories of `group` (None: the server-wide group), one per hierarchy."""
        return sorted(set(self._dirs(group).values()))

    def procs_files(self, group: str) -> list[str]:
        """The ``cgroup.procs`` a sandbox's first process writes itself into."""
        return [os.path.join(d, "cgroup.procs") for d in self.directories(group)]

    def processes(self, group: str | None = None) -> int:
        """Processes (and threads) now in `group` (None: the whole server-wide group)."""
        if "pids" not in self._homes:
            return 0
        try:
            with open(os.path.join(self._dirs(group)["pids"], "pids.current")) as f:
                return int(f.read())
        except FileNotFoundError:
            return 0

    def groups(self) -> set[str]:
        """The principals' groups made and not yet removed."""
        return set(self._groups)

    def home_memory_limit(self) -> int | None:
        """The memory limit of the group this tree is made in, if it has one."""
        if "memory" not in self._homes:
            return None
        name = "memory.limit_in_bytes" if self.version == "v1" else "memory.max"
        try:
            with open(os.path.join(self._homes["memory"], name)) as f:
                text = f.read().strip()
        except OSError:
            return None
        # v1 says "no limit" with a huge number, v2 with "max".
        return int(text) if text.isdigit() and int(text) < 1 << 62 else None

    def remove(self, group: str) -> bool:
        """Remove an empty group; False while the kernel still holds its dying processes."""
        done = _rmdir_all(self._dirs(group).values())
        if done:
            self._groups.discard(group)
        return done

    def close(self, wait: float) -> list[str]:
        """Remove every group, waiting up to `wait` seconds for their processes to end;
        returns the directories that are still there."""
        deadline = time.monotonic() + wait
        while True:
            for group in list(self._groups):
                self.remove(group)
            if not self._groups and _rmdir_all(self._dirs(None).values()):
                return []
            if time.monotonic() >= deadline:
                left = [d for g in (*self._groups, None) for d in self._dirs(g).values()]
                return sorted(d for d in set(left) if os.path.isdir(d))
            time.sleep(0.05)


def _limit(version: str, controller: str, limits: Limits) -> str | None:
    if controller == "pids":
        return "max" if limits.processes is None else str(limits.processes)
    if controller == "memory":
        if limits.memory_bytes is None:
            return None if version == "v1" else "max"  # v1: -1, which a new group has
        return str(limits.memory_bytes)
    weight = 100 if limits.cpu_weight is None else limits.cpu_weight
    # v1 shares: 1024 is the default as 100 is v2's (at least 2, the kernel's floor).
    return str(max(2, weight * 1024 // 100)) if version == "v1" else str(weight)


def _set_idle(path: str) -> bool:
    """``cpu.idle`` on: a group of SCHED_IDLE weight whose entity any waking sibling
    preempts. Weight alone can't give that: on a 2-CPU host a server waking for each request
    beside 32 busy loops waited out their slices (a victim's p99 3.3x at weight 100, still
    3.3x at weight 10; 1.1x with the group idle: `scripts/bench_tenants.py --attacks cpu`).
    False where the kernel has no such file (before 5.15) or refuses it."""
    try:
        _write(path, "1")
    except OSError:
        return False
    return True


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        if exc.filename is not None:
            raise
        # The kernel refuses the write itself: name the file ("[Errno 22] Invalid argument"
        # alone, in a startup line, said nothing of which).
        raise OSError(exc.errno, exc.strerror, path) from None


def _write_if_there(path: str, value: str, v2_value: str) -> None:
    """The swap limit: v1's memsw counts memory + swap (so the same number), v2's swap.max
    swap alone (so none); absent when the kernel accounts no swap."""
    if not os.path.exists(path):
        return
    try:
        _write(path, value if path.endswith("memsw.limit_in_bytes") else v2_value)
    except OSError:
        pass  # an accounting the kernel turned off: memory alone still holds


def _rmdir_all(paths: Iterable[str]) -> bool:
    done = True
    for path in paths:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                raise
            done = False
    return done


def step_aside(root: str, version: str, controllers: Iterable[str]) -> str:
    """Move this process out of the hierarchy's root group `root` into
    ``<root>/ctxactors-<pid>/server`` (once per process) and return ``<root>/ctxactors-<pid>``,
    where its runtimes' trees then go, beside it.

    Every thread moves (``cgroup.procs`` takes the process). The group weighs as much as
    one process of the root group, as a systemd service does; processes the server starts
    later start in ``server/`` with it. It stays while the process lives (a process can't
    leave its own group for good without going back to the root), and a later server's
    `open` sweeps it once the process is gone."""
    key = (os.getpid(), root)
    with _stepping:
        if key in _stepped:
            return _stepped[key]
        name = f"ctxactors-{os.getpid()}"
        group, leaf = os.path.join(root, name), os.path.join(root, name, _SERVER_LEAF)
        if name not in _made_here and os.path.isdir(group):
            _remove_gone(group)  # an earlier process's with this pid, swept before it is ours
        _made_here.add(name)
        try:
            os.makedirs(leaf, exist_ok=True)
            _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
            if version == "v2":  # the group holds no process, so its children may have these
                enable = " ".join(f"+{c}" for c in controllers)
                _write(os.path.join(group, "cgroup.subtree_control"), enable)
        except OSError as exc:
            back: OSError | None = None
            try:  # back to the root, if it had moved
                _write(os.path.join(root, "cgroup.procs"), str(os.getpid()))
            except OSError as refused:
                back = refused
            with contextlib.suppress(OSError):  # a leaf we could not make: its group too
                _rmdir_all([leaf, group])
            if back is not None and _holds(leaf, os.getpid()):
                raise Stranded(
                    exc.errno,
                    f"the server moved into {leaf}, but {exc}, and the root group refused it "
                    f"back ({back}): it stays there, its sandboxes' group in the root group",
                ) from exc
            raise
        _stepped[key] = group
        return group


def _holds(group: str, pid: int) -> bool:
    """Whether process `pid` is in `group`."""
    try:
        with open(os.path.join(group, "cgroup.procs")) as f:
            return str(pid) in f.read().split()
    except OSError:
        return False


def _sweep(home: str) -> None:
    """Remove the trees and groups of processes of ours that are gone (a crash leaves them
    behind); a group a live process is still in stays (the kernel refuses its removal), and
    so does a live process's tree inside a gone one's group: a server it started, still in
    its ``server/``, has its tree there, and its groups are empty between sandboxes."""
    for name in _listdir(home):
        if _gone(name):
            _remove_gone(os.path.join(home, name))


def _remove_gone(top: str) -> None:
    """Remove `top` and the groups inside it, innermost first (a group goes only once it
    has none inside), but never a live process's tree or group, nor so what holds it.
    Iterative: no recursion limit however deep the groups."""
    order, pending = [], [top]
    while pending:
        path = pending.pop()
        order.append(path)
        for name in _listdir(path):
            inner = os.path.join(path, name)
            if os.path.isdir(inner) and (_OURS.fullmatch(name) is None or _gone(name)):
                pending.append(inner)
    for path in reversed(order):  # every group after the groups inside it
        # Best effort (a group we may not remove): a later server sweeps it again.
        with contextlib.suppress(OSError):
            _rmdir_all([path])


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _gone(name: str) -> bool:
    """Whether `name` is a tree or group of ours whose process is gone."""
    found = _OURS.fullmatch(name)
    if found is None:
        return False
    pid = int(found.group(1))
    if pid == os.getpid():  # not made here: an earlier process's with this pid
        return name not in _made_here
    # 0 or past the kernel's limit: no process of ours (os.kill would mean something else,
    # or raise OverflowError and fail every later server's start).
    return 0 < pid <= _PID_MAX and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- finding a hierarchy the server may use ------------------------------------------------


def find(parent: str | None = None) -> Tree:
    """A tree for this process, cgroup v2 if its pids and memory controllers are there,
    else v1; raises `Unavailable` saying why neither can be used."""
    mounts = _mounts()
    own = _own_groups()
    # A process that stepped aside before is in its group's ``server/``: a later runtime's
    # tree goes beside it too (not inside it: v2 would move the server down a level again).
    leaf = _stepped_leaf()
    stepped = {c: path for c, path in own.items() if leaf and path.endswith(leaf)}
    own.update({c: os.path.dirname(path) for c, path in stepped.items()})
    v2 = next((m for m in mounts if m[2] == "cgroup2"), None)
    problems = []
    tree = None
    if v2 is not None:
        try:
            tree = _v2_tree(v2[0], own.get("", "/"), parent)
        except Unavailable as exc:
            problems.append(f"v2: {exc}")
    if tree is None:
        try:
            tree = _v1_tree(mounts, own, parent)
        except Unavailable as exc:
            problems.append(f"v1: {exc}")
            raise Unavailable("; ".join(problems)) from None
    tree.parent = parent
    if parent is None and stepped:
        group = tree._homes.get("cpu")
        if group is not None and group in _stepped.values():
            tree.stepped_aside, tree.at_root = group, False
    return tree


def _stepped_leaf() -> str | None:
    """The end of this process's group's path in a hierarchy, once it stepped aside."""
    if not any(pid == os.getpid() for pid, _ in _stepped):
        return None
    return f"/ctxactors-{os.getpid()}/{_SERVER_LEAF}"


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, type, super options) of each cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, kind = left.split(), right.split()
            if kind and kind[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], fields[3], kind[0], set(kind[2].split(","))))
    return out


def _own_groups() -> dict[str, str]:
    """Controller -> this process's group in its hierarchy ("" for v2's)."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(",") if names else [""]:
                out[name] = path
    return out


def _inside(mount: str, root: str, path: str) -> str:
    """The directory of group `path` under a mount of the hierarchy's `root`."""
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        raise Unavailable(f"this process's group {path} is outside the mount of {root}")
    rel = path[len(root) :] if root != "/" else path
    return os.path.join(mount, rel.lstrip("/"))


def _v1_tree(
    mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str], parent: str | None
) -> Tree:
    homes: dict[str, str] = {}
    roots: dict[str, bool] = {}
    for controller in CONTROLLERS:
        mount = next((m for m in mounts if m[2] == "cgroup" and controller in m[3]), None)
        if mount is None or controller not in own:
            continue
        home = _inside(mount[0], mount[1], own[controller])
        if parent is not None:
            home = os.path.join(mount[0], parent.lstrip("/"))
        if os.access(home, os.W_OK):
            homes[controller] = home
            roots[controller] = home.rstrip("/") == mount[0].rstrip("/")
    missing = [c for c in ("pids", "memory") if c not in homes]
    if missing:
        raise Unavailable(f"no writable {' and '.join(missing)} hierarchy (needs root)")
    tree = Tree("v1", homes)
    tree.at_root = roots.get("cpu", False)
    return tree


def _v2_tree(mount: str, own: str, parent: str | None) -> Tree:
    home = os.path.join(mount, (parent or own).lstrip("/"))
    try:
        with open(os.path.join(home, "cgroup.controllers")) as f:
            available = f.read().split()
    except OSError as exc:
        raise Unavailable(f"{home}: {exc.strerror}") from None
    controllers = [c for c in CONTROLLERS if c in available]
    if "pids" not in controllers or "memory" not in controllers:
        raise Unavailable(
            f"{home} has controllers {' '.join(available) or '(none)'}, not pids and memory"
        )
    if not os.access(os.path.join(home, "cgroup.subtree_control"), os.W_OK):
        raise Unavailable(f"{home} is not delegated to this user (Delegate=yes in systemd)")
    # Every group but the host's root has ``cgroup.type`` (a container's cgroup namespace
    # shows its own group at the mount, and that one has it too).
    at_root = not os.path.exists(os.path.join(home, "cgroup.type"))
    if not at_root:  # the root may hold processes and enable controllers: they stay
        _leave_for_leaf(home)
    try:
        _write(os.path.join(home, "cgroup.subtree_control"), " ".join(f"+{c}" for c in controllers))
    except OSError as exc:
        raise Unavailable(f"{home}: can't enable {' '.join(controllers)}: {exc}") from None
    tree = Tree("v2", dict.fromkeys(controllers, home))
    tree.at_root = at_root
    return tree


def _leave_for_leaf(home: str) -> None:
    """Move the processes of `home` (this server, when it is its own group) into a leaf:
    v2 enables controllers for the children of a group only if it holds no process."""
    with open(os.path.join(home, "cgroup.procs")) as f:
        pids = f.read().split()
    if not pids:
        return
    leaf = os.path.join(home, _SERVER_LEAF)
    os.makedirs(leaf, exist_ok=True)
    for pid in pids:
        try:
            _write(os.path.join(leaf, "cgroup.procs"), pid)
        except ProcessLookupError:
            pass  # ended meanwhile
        except OSError as exc:
            raise Unavailable(f"can't move process {pid} out of {home}: {exc}") from None


def join_argv(procs_files: list[str]) -> list[str]:
    """A shell that writes its own pid into each ``cgroup.procs``, then execs the rest of
    the command line (``[*join_argv(files), program, *args]``): the sandbox is in its group
    before its first instruction. Exit status 125 if a write fails."""
    script = (
        'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; '
        'n=$((n - 1)); done; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "sh", str(len(procs_files)), *procs_files]
