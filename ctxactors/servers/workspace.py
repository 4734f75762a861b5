"""Workspace: real shell commands for one session, each in its own sandbox.

`execute_command` starts ``/bin/sh -c <command>`` inside a bubblewrap sandbox (see
`ctxactors.sandbox`) whose only writable path is the session's own directory, at
``/workspace``, and returns at once with an unguessable `processId`; `poll_process` reads
the status and the output so far. The sandbox is the unit of process control: killing the
one process the server started (a timeout, `kill_process`, the end of the session) ends
everything the command started.

One watcher thread per process drains its output (stdout and stderr together) into a bounded
buffer that keeps the newest bytes, enforces the timeout, and reaps the child, so nothing is
left a zombie even if nobody polls. While any watcher runs, the server reports itself busy
and its actor is not reaped on TTL. `close()` (session end, reap, runtime close) kills every
sandbox, joins the watchers and removes the working directory.

Without a state store the directory is made on first use, per actor incarnation, with a
random name under the root, and removed when the actor stops: a key retired while its
close() still runs can't remove the next incarnation's directory. With a store it is the
session's own (`ctxactors.servers.workspace_dirs`): it survives the actor (reap, eviction,
restart) within the session's retention and goes with `end_session`. Processes never
survive their actor; the ids of those it started are saved, so polling one lost to a
restart says so instead of "not found".

Registering the server (`Runtime(...)`) probes bubblewrap once and refuses to start
(`SandboxUnavailableError`) when it can't sandbox, unless ``CTXACTORS_WORKSPACE_SANDBOX=none``,
which logs a warning at start and on every command.

Settings (`ctxactors.settings.WorkspaceSettings`, from the runtime's settings):

- ``CTXACTORS_WORKSPACE_ROOT``: where working directories go (default
  ``<tempdir>/ctxactors-workspaces``);
- ``CTXACTORS_WORKSPACE_MAX_OUTPUT_BYTES``: output kept per process (default 256 KiB);
- ``CTXACTORS_WORKSPACE_DEFAULT_TIMEOUT``: seconds, when a call gives none (default 600);
- ``CTXACTORS_WORKSPACE_MAX_TIMEOUT``: larger timeouts are clamped to this (default 3600);
- ``CTXACTORS_WORKSPACE_MAX_RUNNING``: sandboxes running at once per session (default 16);
- the sandbox's own (``sandbox``): see `ctxactors.sandbox`.
"""

from __future__ import annotations

import functools
import os
import secrets
import selectors
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from typing import Annotated, Any, ClassVar

import msgspec

from ctxactors import sandbox as sandboxes
from ctxactors._launcher import launch
from ctxactors.context import ToolContext
from ctxactors.errors import ToolError
from ctxactors.logs import get_logger
from ctxactors.sandbox_disk import remove as remove_tree
from ctxactors.sandbox_limits import Lease
from ctxactors.servers.workspace_dirs import SessionDirs
from ctxactors.servers.workspace_tenants import Tenants
from ctxactors.settings import DEFAULTS, WorkspaceSettings
from ctxactors.tools import Scope, Server, pick, tool

_TICK = 0.5  # seconds a watcher sleeps at most between checks of its deadline and stop flag
_DRAIN_GRACE = 1.0  # after a kill, seconds to keep reading what is still buffered
_JOIN_TIMEOUT = 5.0  # close() waits this long for each watcher
_KEPT_RECORDS = 200  # finished processes remembered per session (oldest forgotten first)
# What the operation history keeps of a poll or kill: never the output.
_PROCESS_OUTCOME = pick(process_id="processId", status="status", exit_code="exitCode")


Command = Annotated[str, msgspec.Meta(min_length=1, max_length=100_000)]
Timeout = Annotated[float, msgspec.Meta(gt=0)]
ProcessId = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]


_running = 0  # commands whose watcher runs, every session's (`running_processes`)
_running_lock = threading.Lock()


def running_processes() -> int:
    """Sandboxed commands running in this process now, all sessions (for the metrics)."""
    return _running


def _count_running(delta: int) -> None:
    global _running
    with _running_lock:
        _running += delta


class _Process:
    """One started command: its child, its bounded output, and the watcher thread."""

    def __init__(
        self,
        process_id: str,
        command: str,
        proc: subprocess.Popen[bytes],
        timeout: float,
        max_output: int,
        on_done: Any,
        lease: Lease | None = None,
    ) -> None:
        self.process_id = process_id
        self.lease = lease  # its place in the principal's budget, released once reaped
        self.command = command
        self.proc = proc
        self.deadline = time.monotonic() + timeout
        self.max_output = max_output
        self.end_reason: str | None = None  # "killed" or "timeout", set once
        self.warning: str | None = None  # why a disk budget stopped it, if one did
        self.stopping = False
        self._lock = threading.Lock()
        self._output = bytearray()
        self._dropped = 0
        self._on_done = on_done
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._watch, name=f"ctxactors-workspace-{process_id[:10]}", daemon=True
        )

    # -- the watcher thread --------------------------------------------------------------

    def _watch(self) -> None:
        _count_running(1)
        try:
            self._drain()
            self._reap()
            with self._lock:
                if self.warning is not None and self.proc.returncode >= 0:
                    # It exited on its own before the disk watch's kill came (a kill
                    # reads as -9): not killed.
                    self.warning = self.end_reason = None
        finally:
            _count_running(-1)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            if self.lease is not None:
                self.lease.release()
            # Not busy before "done": whoever saw the process finish (kill_process, a
            # poll) must also see the server idle, or a reap right after could skip it.
            self._on_done()
            self.done.set()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        give_up: float | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                if now >= self.deadline:
                    self.kill("timeout")
                if self.end_reason is not None or self.stopping:
                    # Killed: keep what is still buffered, but don't wait for a process
                    # that escaped the group (setsid) and still holds the pipe.
                    give_up = give_up if give_up is not None else now + _DRAIN_GRACE
                    if now >= give_up:
                        return
                wait = min(_TICK, max(self.deadline - now, 0.0))
                for _ in selector.select(wait):
                    data = os.read(fd, 65536)
                    if not data:
                        return
                    self._append(data)

    def _reap(self) -> None:
        """Wait for the shell itself (it may have closed its output and kept running)."""
        while True:
            try:
                self.proc.wait(timeout=_TICK)
                return
            except subprocess.TimeoutExpired:
                if time.monotonic() >= self.deadline:
                    self.kill("timeout")
                elif self.stopping:
                    self.kill("killed")

    def note(self, text: str) -> None:
        """A line of the server's, first in the output (before the command writes any)."""
        self._append(f"[ctxactors: {text}]\n".encode())

    def _append(self, data: bytes) -> None:
        with self._lock:
            self._output += data
            over = len(self._output) - self.max_output
            if over > 0:
                del self._output[:over]
                self._dropped += over

    # -- called from the actor thread (and kill from the watcher on timeout) --------------

    def kill(self, reason: str) -> None:
        """Kill the sandbox (its PID namespace goes with its first process) or, unsandboxed,
        the process group; the first reason given is the one reported."""
        with self._lock:
            if self.done.is_set():
                return
            if self.end_reason is None and self.proc.returncode is None:
                self.end_reason = reason
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is already gone

    def stop_for_disk(self, why: str) -> None:
        """Kill it for a disk budget it pushed over (`ctxactors.sandbox_diskwatch`),
        saying so last in its output and in its poll's answer."""
        with self._lock:
            if self.done.is_set() or self.end_reason is not None:
                return
            # Exited already (its watcher not done yet): it ended on its own, not killed.
            # poll() reaps it here if need be, so the kill below can't come first.
            if self.proc.poll() is not None:
                return
            self.warning = why  # `output` ends with it: after what is still drained
            self.end_reason = "killed"
        self.kill("killed")

    def stop(self) -> None:
        """For close(): kill, and make the watcher give up soon whatever happens."""
        self.stopping = True
        self.kill("killed")

    @property
    def status(self) -> str:
        if not self.done.is_set():
            return "running"
        return self.end_reason or "exited"

    def output(self) -> str:
        with self._lock:
            data, dropped = bytes(self._output), self._dropped
        text = data.decode("utf-8", "replace")
        if dropped:
            # Don't start in the middle of a UTF-8 character.
            cut = 0
            while cut < min(len(data), 3) and 0x80 <= data[cut] <= 0xBF:
                cut += 1
            note = f"[... {dropped + cut} bytes of earlier output dropped ...]\n"
            text = note + data[cut:].decode("utf-8", "replace")
        if self.warning is not None:  # stopped for a disk budget: said last, on its own line
            text += ("\n" if text and not text.endswith("\n") else "") + (
                f"[ctxactors: killed: {self.warning}]\n"
            )
        return text

    def summary(self) -> dict[str, Any]:
        status = self.status
        return {
            "processId": self.process_id,
            "command": self.command,
            "status": status,
            "exitCode": self.proc.returncode if status != "running" else None,
        }


def _warn_unsandboxed(log: Any, event: str, **fields: Any) -> None:
    log.warning(
        event,
        warning="CTXACTORS_WORKSPACE_SANDBOX=none: commands run unsandboxed, as the server's "
        "user, with its files, processes and network",
        **fields,
    )


class WorkspaceState(msgspec.Struct):
    """What a session's workspace key saves: the ids of the processes it started (the
    processes themselves end with their actor; the directory stays)."""

    processes: list[str]


class Workspace(Server):
    """Run shell commands in a session's own sandbox and read their output."""

    name = "workspace"
    scope = Scope.SESSION
    State = WorkspaceState

    # Per runtime with a store: its kept session directories.
    _kept: ClassVar[weakref.WeakKeyDictionary[Any, SessionDirs]] = weakref.WeakKeyDictionary()
    # Per runtime: what holds across its principals' sessions (budgets, uids).
    _tenants: ClassVar[weakref.WeakKeyDictionary[Any, Tenants]] = weakref.WeakKeyDictionary()

    @classmethod
    def attach(cls, runtime: Any) -> None:
        """Refuse to serve commands that can't be sandboxed (probed once, cached) or from an
        unsafe root; log how tenants are kept apart."""
        settings: WorkspaceSettings = runtime.settings.workspace
        log = get_logger("ctxactors.workspace")
        sandboxes.make_root(settings.sandbox, settings.root)  # an unsafe root: refused now
        if settings.sandbox.enabled:
            sandboxes.check(settings.sandbox, settings.root)
        else:
            _warn_unsandboxed(log, "workspace_unsandboxed")
        tenants = cls._tenants[runtime] = Tenants(settings)
        durability = getattr(runtime, "durability", None)
        if durability is not None:
            dirs = cls._kept[runtime] = SessionDirs(settings.root, settings.sandbox, tenants.disks)
            durability.listen(dirs)
        log.info(
            "workspace_budgets", **tenants.describe(), **msgspec.structs.asdict(settings.budget)
        )

    @classmethod
    def detach(cls, runtime: Any) -> None:
        """Remove the runtime's cgroups (its sandboxes are killed by now)."""
        tenants = cls._tenants.pop(runtime, None)
        left = tenants.close() if tenants is not None else []
        if left:
            get_logger("ctxactors.workspace").warning("workspace_cgroups_left", paths=left)

    @classmethod
    def tenants(cls, runtime: Any) -> Tenants | None:
        """What holds across `runtime`'s sessions (None before attach or after close)."""
        return cls._tenants.get(runtime)

    @classmethod
    def create(cls, runtime: Any) -> Workspace:
        workspace = cls(runtime.settings.workspace)
        workspace._dirs = cls._kept.get(runtime)
        workspace._host = cls._tenants.get(runtime)
        return workspace

    def __init__(self, settings: WorkspaceSettings = DEFAULTS.workspace) -> None:
        self.settings = settings
        self.sandbox = settings.sandbox
        self.root = settings.root
        self.max_output_bytes = settings.max_output_bytes
        self.default_timeout = settings.default_timeout
        self.max_timeout = settings.max_timeout
        self.max_running = settings.max_running
        self._procs: dict[str, _Process] = {}
        self._lost: set[str] = set()  # started by an earlier incarnation: gone with it
        self._dirs: SessionDirs | None = None  # with a store: the session's kept directory
        self._host: Tenants | None = None  # the runtime's, across sessions
        self._ids: tuple[int, int] | None = None  # the uid and gid of its principal
        self._dir: str | None = None
        self._active = 0  # watchers still running; read by is_busy() from another thread
        self._active_lock = threading.Lock()
        self._log: Any = None

    @property
    def directory(self) -> str | None:
        """This incarnation's working directory, or None before the first command."""
        return self._dir

    def snapshot(self) -> WorkspaceState:
        return WorkspaceState([*sorted(self._lost), *self._procs][-_KEPT_RECORDS:])

    def restore(self, state: WorkspaceState) -> None:
        """Processes started since `state` was saved (by a call whose save failed) are
        killed: the call was refused, so it must leave nothing running."""
        kept = set(state.processes)
        for process_id in [p for p in self._procs if p not in kept]:
            proc = self._procs[process_id]
            proc.kill("killed")
            if proc.done.wait(_JOIN_TIMEOUT):  # else close() must still find it
                del self._procs[process_id]
        self._lost = kept - self._procs.keys()

    def _workdir(self, ctx: ToolContext) -> str:
        if self._dir is None:
            sandboxes.make_root(self.sandbox, self.root)
            ids = self._principal_ids(ctx)
            if self._dirs is not None:
                self._dir = self._dirs.open(ctx.session_key, ids)
            else:
                area = self._host.disks.area(ctx.principal) if self._host is not None else self.root
                self._dir = tempfile.mkdtemp(prefix="ws-", dir=area)
                sandboxes.prepare_directory(self.sandbox, self._dir, ids)
            self._log = get_logger("ctxactors.workspace", session_id=ctx.session_id)
            self._log.info("workspace_created", directory=self._dir, uid=ids[0])
        return self._dir

    def _principal_ids(self, ctx: ToolContext) -> tuple[int, int]:
        if self._ids is None:
            host = self._host
            self._ids = (
                host.ids(ctx.principal) if host is not None else sandboxes.probe_ids(self.sandbox)
            )
        return self._ids

    def _finished(self, principal: str | None, process_id: str) -> None:
        """From a command's watcher once it ended: count what it left on disk (before the
        process reads as done, so the next command is admitted on the new count)."""
        try:
            if self._host is not None:
                self._host.watch.remove(process_id)
                self._host.disks.measure(principal, self._dir)
        except Exception as exc:  # never in the way of "done": the last count stays
            get_logger("ctxactors.workspace").warning("disk_measure_failed", error=str(exc))
        finally:
            with self._active_lock:
                self._active -= 1

    def is_busy(self) -> bool:
        return self._active > 0

    def _get(self, process_id: str) -> _Process:
        proc = self._procs.get(process_id)
        if proc is None and process_id in self._lost:
            raise ToolError(
                f"process {process_id!r} was stopped when this session's workspace was "
                "restarted (a server restart, or its end); its output is gone, the files it "
                "wrote in /workspace are kept"
            )
        if proc is None:
            # The same words whether the id is made up or another session's: reveal nothing.
            raise ToolError(f"process {process_id!r} not found in this session")
        return proc

    def _undo_execute(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        """Undo for transactional batches: kill the process (and its group), forget it."""
        proc = self._procs.get(result["processId"])
        if proc is not None:
            proc.kill("killed")
            if proc.done.wait(_JOIN_TIMEOUT):  # else close() must still find it
                del self._procs[result["processId"]]

    @tool(
        open_world=True,
        blocking=True,  # starts a sandbox (fork, exec, namespaces: milliseconds)
        compensate=_undo_execute,
        extract=pick(process_id="processId", status="status"),
    )
    def execute_command(
        self, ctx: ToolContext, command: Command, timeout: Timeout | None = None
    ) -> dict[str, Any]:
        """Start a shell command (/bin/sh -c) in this session's sandbox without waiting for
        it; its working directory, /workspace, is the session's own and the only place it
        can write. Returns a processId to poll for status and output. The command and
        everything it starts are killed after `timeout` seconds (a default applies when it
        is omitted; values above the server's maximum are lowered to it)."""
        running = sum(1 for p in self._procs.values() if not p.done.is_set())
        if running >= self.max_running:
            raise ToolError(
                f"{running} processes are already running in this session (the limit is "
                f"{self.max_running}); wait for one to finish or kill one"
            )
        seconds = min(timeout if timeout is not None else self.default_timeout, self.max_timeout)
        workdir = self._workdir(ctx)
        self._forget_old()
        process_id = "p_" + secrets.token_urlsafe(12)
        if not self.sandbox.enabled:
            _warn_unsandboxed(self._log, "command_unsandboxed", process_id=process_id)
        tenant, lease, admission = (
            self._host.enter(ctx.principal, self._principal_ids(ctx))
            if self._host is not None
            else (sandboxes.Tenant(self._principal_ids(ctx)), None, None)
        )
        try:
            # From the launcher's thread: this one may end before the command does (see there).
            popen = launch(
                functools.partial(sandboxes.start, self.sandbox, workdir, command, tenant)
            )
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        done = functools.partial(self._finished, ctx.principal, process_id)
        proc = _Process(process_id, command, popen, seconds, self.max_output_bytes, done, lease)
        full = admission.full if admission is not None else None
        if full is not None:  # said first in its output too: the model reads that
            proc.note(full)
        with self._active_lock:
            self._active += 1
        try:
            if self._host is not None:  # watched until its watcher ends (`_finished`)
                watch = self._host.watch
                watch.add(
                    process_id,
                    ctx.principal,
                    workdir,
                    proc.stop_for_disk,
                    popen.pid,
                    # never stopped (rm must work), where its filter holds it
                    delete_only=tenant.delete_only and sandboxes.filters_delete_only(self.sandbox),
                )
            proc.thread.start()
        except BaseException:  # no thread, no watcher: don't leave the child behind
            if self._host is not None:
                self._host.watch.remove(process_id)
            with self._active_lock:
                self._active -= 1
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            if popen.stdout is not None:
                popen.stdout.close()
            if lease is not None:
                lease.release()
            raise
        self._procs[process_id] = proc
        self._log.info("process_started", process_id=process_id, pid=popen.pid, timeout_s=seconds)
        if full is not None:
            return {"processId": process_id, "status": "running", "warning": full}
        return {"processId": process_id, "status": "running"}

    def _forget_old(self) -> None:
        finished = [pid for pid, p in self._procs.items() if p.done.is_set()]
        for pid in finished[: max(len(self._procs) - _KEPT_RECORDS + 1, 0)]:
            del self._procs[pid]

    @tool(read_only=True, extract=_PROCESS_OUTCOME)
    def poll_process(self, ctx: ToolContext, processId: ProcessId) -> dict[str, Any]:  # noqa: N803 - the public argument name
        """Status (running, exited, killed, timeout), exit code and output so far of a
        process this session started. Old output beyond the cap is dropped (newest kept);
        a `warning` says which disk budget it pushed over, when one stopped it."""
        proc = self._get(processId)
        status = proc.status  # read before the output: "exited" means the output is whole
        polled = {
            "processId": processId,
            "status": status,
            "exitCode": proc.proc.returncode if status != "running" else None,
            "output": proc.output(),
        }
        if proc.warning is not None:  # a disk budget stopped it: which, and what to do
            polled["warning"] = proc.warning
        return polled

    @tool(destructive=True, idempotent=True, blocking=True, extract=_PROCESS_OUTCOME)
    def kill_process(self, ctx: ToolContext, processId: ProcessId) -> dict[str, Any]:  # noqa: N803 - the public argument name
        """Kill a running process of this session and everything it started."""
        proc = self._get(processId)
        proc.kill("killed")
        proc.done.wait(_JOIN_TIMEOUT)
        if self._log is not None:
            self._log.info("process_killed", process_id=processId, status=proc.status)
        summary = proc.summary()
        del summary["command"]
        return summary

    @tool(read_only=True)
    def list_processes(self, ctx: ToolContext) -> dict[str, Any]:
        """The processes this session started (most recent last), with their status."""
        processes = [p.summary() for p in self._procs.values()]
        return {"processes": processes, "count": len(processes)}

    def close(self) -> None:
        """Kill every process group, join the watchers (they reap the children), and
        remove the working directory."""
        procs = list(self._procs.values())
        for proc in procs:
            proc.stop()
        deadline = time.monotonic() + _JOIN_TIMEOUT
        for proc in procs:
            proc.thread.join(max(deadline - time.monotonic(), 0.0))
        stuck = [p.process_id for p in procs if p.thread.is_alive()]
        if self._dir is not None and self._dirs is not None:
            self._log.info("workspace_kept", directory=self._dir, processes=len(procs))
        elif self._dir is not None:
            remove_tree(self._dir)
            if self._host is not None:
                self._host.disks.forget(self._dir)
            self._log.info(
                "workspace_removed", directory=self._dir, processes=len(procs), stuck=stuck
            )
        self._procs.clear()
