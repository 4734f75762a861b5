"""What one runtime's workspace keeps per principal: `Tenants`.

Every session's workspace asks the same object, so that what holds *across* a principal's
sessions holds: its sandboxes' budgets (`ctxactors.sandbox_limits`) and its own host uid
(`ctxactors.sandbox_uids`, on a root server), and the watch of their running commands'
disk use (`ctxactors.sandbox_diskwatch`). A session asks once for its uid (its
directory belongs to it) and once per command for a place in the budgets.
"""

from __future__ import annotations

import os

from ctxactors import sandbox as sandboxes
from ctxactors import sandbox_seccomp
from ctxactors.sandbox_disk import Admission, DiskBudgets
from ctxactors.sandbox_diskwatch import DiskWatch
from ctxactors.sandbox_limits import Lease, SandboxBudgets
from ctxactors.sandbox_uids import SandboxUids
from ctxactors.settings import WorkspaceSettings


class Tenants:
    """The budgets and uids of one runtime's principals; thread-safe."""

    def __init__(self, settings: WorkspaceSettings) -> None:
        self.settings = settings
        sandbox = settings.sandbox
        self.budgets = SandboxBudgets.open(settings.budget)
        self.disks = DiskBudgets.open(settings)
        self.watch = DiskWatch(self.disks)  # stops commands that write past a disk budget
        self.uids = (
            SandboxUids(settings.root, sandbox.uid_first, sandbox.uid_count)
            if sandbox.switch_user and sandbox.uid_first is not None
            else None
        )

    def describe(self) -> dict[str, str]:
        """How tenants are kept apart here, for the startup log."""
        program = sandbox_seccomp.program()
        sandbox = self.settings.sandbox
        return {
            "enforcement": self.budgets.enforcement,
            "disk_enforcement": self.disks.describe(),
            "uids": (
                f"one per principal from {sandbox.uid_first} ({sandbox.uid_count:,})"
                if self.uids is not None
                else f"every sandbox as the server's uid {os.getuid()} (not root, or no range)"
            ),
            "seccomp": (
                f"{len(sandbox_seccomp.DENIED)} system calls denied, and fallocate but to "
                "free blocks; at a disk budget, creating files and opening them for writing "
                "too (delete-only)"
                if isinstance(program, bytes)
                else f"none: {program}"
            ),
        }

    def ids(self, principal: str | None) -> tuple[int, int]:
        """The principal's (uid, gid): its own on a root server, else the server's;
        `ToolError` when no uid is left for a new principal."""
        if self.uids is None:
            return (os.getuid(), os.getgid())
        uid = self.uids.uid(principal)
        return (uid, uid)

    def enter(
        self, principal: str | None, ids: tuple[int, int]
    ) -> tuple[sandboxes.Tenant, Lease, Admission]:
        """A place in the budgets for one more sandbox (`ToolError` if none), how to start
        it there, and what its disk budget lets it write; release the lease once it ended."""
        admission = self.disks.admit(principal)
        lease = self.budgets.enter(principal)
        budget = self.settings.budget
        nproc = budget.server_processes if principal is None else budget.principal_processes
        tenant = sandboxes.Tenant(
            ids, tuple(lease.procs_files), nproc, admission.file_bytes, admission.delete_only
        )
        return tenant, lease, admission

    def close(self) -> list[str]:
        """Remove the cgroups and unmount the disks (returns any left behind), and close the
        uid table."""
        self.watch.close()
        if self.uids is not None:
            self.uids.close()
        return self.budgets.close() + self.disks.close()
