"""What the sandboxes of one principal, and of the whole server, may use: `SandboxBudgets`.

A session's own caps (`workspace.max_running` sandboxes, each under its rlimits) don't stop
a principal that opens many sessions, so one tenant could fill the server's task budget
and every other tenant's calls failed. Two layers hold across sessions:

- counted by the server, always: sandboxes running at once per principal
  (``principal_running``) and in all (``server_running``). With the per-sandbox rlimits
  (``RLIMIT_NPROC``, ``RLIMIT_AS``, the tmpfs sizes) this bounds what a principal can hold
  wherever the kernel can't help: the fallback, measured and named in the startup log;
- enforced by the kernel where the server may make cgroups (root, or a delegated v2
  subtree; `ctxactors.cgroups`): processes, memory with the sandboxes' tmpfs pages and CPU
  weight per principal (``principal_*``) and for every sandbox together (``server_*``), so
  the server's own threads and memory stay outside every tenant's reach.

Going over a budget is a `ToolError` for that principal's call only; before starting a
sandbox the server reads its group's process count, so a principal at its limit gets a
clear refusal instead of a sandbox that can't fork. Callers with no principal (embedded,
HTTP without authentication) are one tenant under the server's budget alone. Ending a
session needs no budget: it only kills processes and removes files.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from ctxactors import cgroups
from ctxactors.errors import SandboxUnavailableError, ToolError
from ctxactors.settings import BudgetSettings

# A sandbox's own processes before its command forks anything: bwrap, its init in the
# new PID namespace, the command's shell; one more so that the command can run something.
_SANDBOX_TASKS = 4
_CLOSE_WAIT = 10.0  # seconds close() waits for the kernel to finish killing sandboxes


@dataclass
class Lease:
    """One running sandbox's place in its principal's budget; `release` once it ended."""

    principal: str | None
    # The cgroup.procs files the sandbox's first process joins ([] in the fallback).
    procs_files: list[str]
    _budgets: SandboxBudgets | None = field(repr=False)

    def release(self) -> None:
        budgets, self._budgets = self._budgets, None
        if budgets is not None:
            budgets._release(self.principal)


class SandboxBudgets:
    """The budgets of one runtime's sandboxes; thread-safe (every session's actor asks)."""

    def __init__(self, settings: BudgetSettings, tree: cgroups.Tree | None, enforcement: str):
        self.settings = settings
        self.tree = tree
        # How the budgets are enforced, for the startup log.
        self.enforcement = enforcement
        self._lock = threading.Lock()
        self._running: dict[str | None, int] = {}
        self._total = 0

    @classmethod
    def open(cls, settings: BudgetSettings) -> SandboxBudgets:
        """The kernel's cgroups when this process may make them, else the fallback; with
        ``cgroups=require`` no cgroups is `SandboxUnavailableError`."""
        fallback = (
            "fallback: per sandbox RLIMIT_NPROC/RLIMIT_AS/tmpfs sizes, and running "
            "sandboxes counted per principal and per server"
        )
        if settings.cgroups == "off":
            return cls(settings, None, f"{fallback} (CTXACTORS_WORKSPACE_CGROUPS=off)")
        tree: cgroups.Tree | None = None
        try:
            tree = cgroups.find(settings.cgroup_parent)
            tree.open(
                cgroups.Limits(
                    settings.server_processes,
                    settings.server_memory_bytes or _three_quarters(tree),
                    settings.server_cpu_weight,
                    settings.server_cpu_idle,
                )
            )
        except (cgroups.Unavailable, OSError) as exc:
            # The process may have moved before the failure, and it stays moved: say so.
            moved = tree.step_note() if tree is not None else None
            problem = f"{exc}; {moved}" if moved is not None else str(exc)
            if settings.cgroups == "require":
                raise SandboxUnavailableError(
                    f"CTXACTORS_WORKSPACE_CGROUPS=require, but no cgroup can be made: {problem}"
                ) from None
            return cls(settings, None, f"{fallback} (no cgroups: {problem})")
        return cls(settings, tree, f"kernel: {tree.describe()}")

    def enter(self, principal: str | None) -> Lease:
        """A place for one more sandbox of `principal`, or `ToolError` saying which budget
        is spent."""
        with self._lock:
            self._check_counts(principal)
            files: list[str] = []
            if self.tree is not None:
                group = cgroups.group_name(principal)
                if not self._running.get(principal):
                    self.tree.make(group, self._limits(principal))
                self._check_processes(group, principal)
                files = self.tree.procs_files(group)
            self._running[principal] = self._running.get(principal, 0) + 1
            self._total += 1
            return Lease(principal, files, self)

    def _limits(self, principal: str | None) -> cgroups.Limits:
        if principal is None:
            return cgroups.Limits()  # the server-wide group's limits hold
        s = self.settings
        return cgroups.Limits(
            s.principal_processes, s.principal_memory_bytes, s.principal_cpu_weight
        )

    def _check_counts(self, principal: str | None) -> None:
        running = self._running.get(principal, 0)
        if principal is not None and running >= self.settings.principal_running:
            raise ToolError(
                self.settings.cap("principal_running").exceeded(
                    f"{running} sandboxes of this principal are running across its sessions"
                )
                + "; wait for one to finish or kill one"
            )
        if self._total >= self.settings.server_running:
            raise ToolError(
                self.settings.cap("server_running").exceeded(
                    f"{self._total} sandboxes are running on this server"
                )
                + "; try again later"
            )

    def _check_processes(self, group: str, principal: str | None) -> None:
        assert self.tree is not None
        if principal is not None:
            held = self.tree.processes(group)
            if held + _SANDBOX_TASKS > self.settings.principal_processes:
                raise ToolError(
                    self.settings.cap("principal_processes").exceeded(
                        f"this principal's commands hold {held} processes across its sessions"
                    )
                    + "; kill some or wait for them to finish"
                )
        held = self.tree.processes()
        if held + _SANDBOX_TASKS > self.settings.server_processes:
            raise ToolError(
                self.settings.cap("server_processes").exceeded(
                    f"the server's sandboxes hold {held} processes"
                )
                + "; try again later"
            )

    def _release(self, principal: str | None) -> None:
        with self._lock:
            self._total -= 1
            left = self._running[principal] = self._running[principal] - 1
            if left == 0:
                del self._running[principal]
            if self.tree is None:
                return
            # Remove the groups no sandbox uses: this one, and any whose dying processes
            # made an earlier removal fail (the kernel ends them soon after their init).
            busy = {cgroups.group_name(p) for p in self._running}
            for group in self.tree.groups() - busy:
                self.tree.remove(group)

    def close(self) -> list[str]:
        """Remove the cgroups (after the sandboxes are killed); returns any left behind."""
        if self.tree is None:
            return []
        with self._lock:
            return self.tree.close(_CLOSE_WAIT)


def _three_quarters(tree: cgroups.Tree) -> int:
    """The default server-wide memory: 3/4 of what the server may use, so the sandboxes
    together can never take the memory the server itself needs."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    own = tree.home_memory_limit()
    return min(total, own if own is not None else total) * 3 // 4
