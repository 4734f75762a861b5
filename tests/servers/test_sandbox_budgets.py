"""Budgets across a principal's sessions: one tenant's sandboxes can't starve another's.

With real bubblewrap and the kernel's cgroups where the server may make them (root here,
cgroup v1); the kernel tests skip, saying why, where it can't. The fallback (sandboxes
counted by the server) runs everywhere.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp_support import pids_of
from structlog.testing import capture_logs
from workspace_support import WAIT, Leaks, call, grouped_runtime, start, wait_done, wait_output

from ctxactors import Runtime, cgroups
from ctxactors.sandbox_limits import SandboxBudgets
from ctxactors.servers.workspace import Workspace
from ctxactors.settings import FIRST_UID, BudgetSettings
from ctxactors.testing import context_args, wait_until

pytestmark = pytest.mark.usefixtures("workspace_root")


def budget_runtime(leaks: Leaks, **budget: Any) -> contextlib.AbstractContextManager[Runtime]:
    """A workspace runtime with these budget settings (the rest from the environment)."""
    return grouped_runtime(leaks, budget=budget)


def budgets_of(rt: Runtime) -> SandboxBudgets:
    tenants = Workspace.tenants(rt)
    assert tenants is not None
    return tenants.budgets


def kernel_tree(rt: Runtime, controller: str) -> cgroups.Tree:
    budgets = budgets_of(rt)
    if budgets.tree is None or controller not in budgets.tree.controllers:
        pytest.skip(f"the kernel's {controller} controller can't be used: {budgets.enforcement}")
    return budgets.tree


def refusal(rt: Runtime, session: str, principal: str) -> str:
    result = rt.call(
        "execute_command", context_args(session, command="echo hi"), principal=principal
    )
    assert result.is_error
    return result.text


def run(rt: Runtime, session: str, command: str, principal: str) -> dict[str, Any]:
    return wait_done(
        rt, session, start(rt, session, command, principal=principal), principal=principal
    )


def sleepers(rt: Runtime, session: str, count: int, marker: str, principal: str) -> None:
    """A sandbox of `count` sleeping processes, once they are all started."""
    command = f"for i in $(seq {count}); do sleep {marker} & done; echo started; wait"
    started = start(rt, session, command, principal=principal)
    assert "started" in wait_output(rt, session, started, "started", principal=principal)["output"]


def test_a_principal_at_its_process_budget_is_refused_while_another_is_served(
    leaks: Leaks,
) -> None:
    marker = f"1000.{os.getpid()}7"
    sleeping = ["sleep", marker]
    # Uids of this test's own: the process budget is also mallory's uid's RLIMIT_NPROC,
    # which counts that uid's processes across the machine (another pytest-xdist worker's).
    with grouped_runtime(
        leaks, budget={"principal_processes": 64}, sandbox={"uid_first": FIRST_UID + 2000}
    ) as rt:
        tree = kernel_tree(rt, "pids")
        mallory = cgroups.group_name("mallory")
        # 40 sleepers in one session: with bwrap, its init and the shell, 43 processes.
        sleepers(rt, "m1", 40, marker, "mallory")
        assert wait_until(lambda: tree.processes(mallory) == 43, WAIT), tree.processes(mallory)
        # A fork bomb in another session stops at the kernel's limit, inside its own group.
        bomb = run(
            rt, "m2", f"for i in $(seq 100); do sleep {marker} & done; echo never", "mallory"
        )
        assert (bomb["status"], bomb["exitCode"]) == ("exited", 2)
        assert "Cannot fork" in bomb["output"] and "never" not in bomb["output"]
        assert wait_until(lambda: tree.processes(mallory) == 43, WAIT), tree.processes(mallory)
        # 16 more in a third sandbox: 62 of 64, too few for another sandbox.
        sleepers(rt, "m2", 16, marker, "mallory")
        assert wait_until(lambda: len(pids_of(sleeping)) == 56, WAIT), len(pids_of(sleeping))
        assert tree.processes(mallory) == 62
        assert refusal(rt, "m1", "mallory") == (
            "this principal's commands hold 62 processes across its sessions: the limit is 64 "
            "(CTXACTORS_WORKSPACE_PRINCIPAL_PROCESSES); kill some or wait for them to finish"
        )
        # Another principal's command runs as ever.
        ok = run(rt, "v1", "echo ok", "alice")
        assert (ok["status"], ok["exitCode"], ok["output"]) == ("exited", 0, "ok\n")
        # Ending the attacker's sessions needs no budget, and gives the budget back.
        assert rt.end_session("m1", principal="mallory") == 1
        assert rt.end_session("m2", principal="mallory") == 1
        assert wait_until(lambda: not pids_of(sleeping), WAIT), pids_of(sleeping)
        back = run(rt, "m3", "echo back", "mallory")
        assert (back["status"], back["exitCode"], back["output"]) == ("exited", 0, "back\n")
        server = tree.directories()
    assert [d for d in server if os.path.exists(d)] == []  # close removed every group


def test_a_principal_filling_its_tmpfs_past_its_memory_budget_fails_alone(leaks: Leaks) -> None:
    """Mallory's tmpfs pages count against mallory's 64 MiB: her commands are killed in her
    group, while alice's 32 MiB in her own /tmp fits (the server's 192 MiB would not hold
    mallory's 140 MiB and alice's 32 MiB without the principal's budget)."""
    with budget_runtime(
        leaks, principal_memory_bytes=64 << 20, server_memory_bytes=192 << 20
    ) as rt:
        kernel_tree(rt, "memory")
        holder = start(
            rt, "m1", "head -c 40M /dev/zero > /tmp/a; echo held; sleep 1000", principal="mallory"
        )
        assert "held" in wait_output(rt, "m1", holder, "held", principal="mallory")["output"]
        filler = run(rt, "m2", "head -c 100M /dev/zero > /dev/shm/b; echo head=$?", "mallory")
        # The OOM killer ends head (its shell says so), the shell itself (SIGKILL: 137), or
        # bwrap (-9: choom gives it the sandbox's score, and its sandbox dies with it).
        assert filler["status"] == "exited", filler
        assert filler["exitCode"] in (137, -9) or filler["output"].endswith("head=137\n"), filler
        # The holder is mallory's too: it may have been chosen, never alice's command.
        held = call(rt, "m1", "poll_process", processId=holder, principal="mallory")
        assert held["status"] == "running" or held["exitCode"] in (137, -9), held
        victim = run(rt, "v1", "head -c 32M /dev/zero > /tmp/x; wc -c < /tmp/x", "alice")
        assert (victim["status"], victim["exitCode"], victim["output"]) == (
            "exited",
            0,
            "33554432\n",
        )


def test_a_principals_running_sandboxes_are_counted_across_its_sessions(leaks: Leaks) -> None:
    """The fallback, in force everywhere: two sandboxes for mallory across two sessions,
    the third refused; alice and callers with no principal are not mallory."""
    marker = f"1000.{os.getpid()}8"
    with budget_runtime(leaks, cgroups="off", principal_running=2, server_running=4) as rt:
        assert budgets_of(rt).tree is None
        start(rt, "m1", f"sleep {marker}", principal="mallory")
        start(rt, "m2", f"sleep {marker}", principal="mallory")
        assert refusal(rt, "m3", "mallory") == (
            "2 sandboxes of this principal are running across its sessions: the limit is 2 "
            "(CTXACTORS_WORKSPACE_PRINCIPAL_RUNNING); wait for one to finish or kill one"
        )
        start(rt, "a1", f"sleep {marker}", principal="alice")
        # No principal: one tenant under the server's budget only (4 sandboxes in all).
        start(rt, "anonymous", f"sleep {marker}")
        assert refusal(rt, "a2", "alice") == (
            "4 sandboxes are running on this server: the limit is 4 "
            "(CTXACTORS_WORKSPACE_SERVER_RUNNING); try again later"
        )
        assert rt.end_session("m1", principal="mallory") == 1
        assert wait_until(lambda: len(pids_of(["sleep", marker])) == 3, WAIT)
        start(rt, "m3", f"sleep {marker}", principal="mallory")


def test_the_startup_log_says_which_enforcement_is_in_force(leaks: Leaks) -> None:
    with capture_logs() as logs, budget_runtime(leaks, cgroups="off"):
        pass
    line = next(e for e in logs if e["event"] == "workspace_budgets")
    assert line["enforcement"] == (
        "fallback: per sandbox RLIMIT_NPROC/RLIMIT_AS/tmpfs sizes, and running sandboxes "
        "counted per principal and per server (CTXACTORS_WORKSPACE_CGROUPS=off)"
    )
    assert (line["principal_processes"], line["principal_running"]) == (1024, 32)
    with capture_logs() as logs, budget_runtime(leaks) as rt:
        tree = budgets_of(rt).tree
    line = next(e for e in logs if e["event"] == "workspace_budgets")
    if tree is None:
        assert line["enforcement"].startswith("fallback: ")
    else:
        assert line["enforcement"] == f"kernel: {tree.describe()}"
        assert line["enforcement"].startswith(f"kernel: cgroup {tree.version} (pids, memory")


def test_the_servers_process_budget_holds_for_every_principal_together(leaks: Leaks) -> None:
    marker = f"1000.{os.getpid()}6"
    with budget_runtime(leaks, server_processes=48) as rt:
        tree = kernel_tree(rt, "pids")
        sleepers(rt, "a1", 42, marker, "alice")
        assert wait_until(lambda: tree.processes() == 45, WAIT), tree.processes()
        assert refusal(rt, "b1", "bob") == (
            "the server's sandboxes hold 45 processes: the limit is 48 "
            "(CTXACTORS_WORKSPACE_SERVER_PROCESSES); try again later"
        )
        assert rt.end_session("a1", principal="alice") == 1
        assert wait_until(lambda: tree.processes() == 0, WAIT), tree.processes()
        ok = run(rt, "b1", "echo ok", "bob")
        assert (ok["status"], ok["exitCode"], ok["output"]) == ("exited", 0, "ok\n")


def cpu_line(pid: int) -> str:
    """Process `pid`'s group in the cpu hierarchy (cgroup v1)."""
    with open(f"/proc/{pid}/cgroup") as f:
        return next(line.split(":", 2)[2].strip() for line in f if line.split(":")[1] == "cpu")


def as_uid(uid: int, command: str) -> subprocess.CompletedProcess[str]:
    """`command` run by `uid` (no groups) outside any sandbox: what that uid's process could do."""
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return subprocess.run([*drop, "/bin/sh", "-c", command], capture_output=True, text=True)


def test_a_tenants_sandbox_joins_its_group_and_cant_move_itself_beside_the_server(
    leaks: Leaks,
) -> None:
    """After the server stepped aside (`cgroups.step_aside`), a sandbox still joins its
    principal's group in the cpu hierarchy; a tenant's uid may write none of the new
    groups' files (to join ``server/`` would outrank every sandbox), nor sees them."""
    marker = f"1000.{os.getpid()}9"
    with budget_runtime(leaks, server_cpu_idle="auto") as rt:
        tree = kernel_tree(rt, "cpu")
        if tree.stepped_aside is None:
            pytest.skip(f"this server did not step aside: {tree.describe()}")
        group = tree.stepped_aside
        assert cpu_line(os.getpid()) == f"/{os.path.basename(group)}/server"
        out = run(rt, "m1", "ls /sys/fs/cgroup 2>&1; cat /proc/self/cgroup", "mallory")
        assert out["exitCode"] == 0 and "No such file or directory" in out["output"], out
        sleepers(rt, "m2", 1, marker, "mallory")
        # Started is said right after the fork: the sleep may not have exec'd yet.
        (sleeper,) = wait_until(lambda: pids_of(["sleep", marker]), WAIT)
        mallory = cgroups.group_name("mallory")
        assert cpu_line(sleeper) == f"/{os.path.basename(group)}/{tree.name}/{mallory}"
        uid = os.stat(f"/proc/{sleeper}").st_uid
        assert uid >= FIRST_UID
        for target in (
            f"{group}/server/cgroup.procs",
            f"{group}/server/tasks",
            f"{group}/cgroup.procs",
            f"{group}/{tree.name}/cgroup.procs",
            f"{group}/{tree.name}/cpu.idle",
            f"{group}/{tree.name}/{mallory}/cpu.shares",
        ):
            refused = as_uid(uid, f"echo {sleeper} > {target}")
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, target
        made = as_uid(uid, f"mkdir {group}/mine")
        assert made.returncode != 0 and "Permission denied" in made.stderr
        assert cpu_line(sleeper) == f"/{os.path.basename(group)}/{tree.name}/{mallory}"


def test_a_server_that_moved_and_then_failed_says_it_moved(
    leaks: Leaks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The move is done (for good) when making the tree fails: the startup line said only
    # "no cgroups", as if the server were where it was.
    homes = {c: tmp_path / c for c in cgroups.CONTROLLERS}
    for home in homes.values():
        home.mkdir()
    (homes["cpu"] / "cpu.idle").write_text("0\n")  # a kernel with cpu.idle
    tree = cgroups.Tree("v1", {c: str(h) for c, h in homes.items()})
    tree.at_root = True
    (homes["memory"] / tree.name).write_text("")  # not a directory: the tree can't be made
    monkeypatch.setattr(cgroups, "find", lambda parent=None: tree)
    budgets = SandboxBudgets.open(BudgetSettings(server_cpu_idle="auto"))
    assert budgets.tree is None
    assert budgets.enforcement.endswith(
        f"(no cgroups: [Errno 20] Not a directory: "
        f"'{homes['memory'] / tree.name / 'memory.limit_in_bytes'}'; the server was in the "
        f"root cpu group, so it moved into {homes['cpu']}/ctxactors-{os.getpid()}/server)"
    )
