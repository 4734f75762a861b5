"""The cgroup files the server writes, on both hierarchies.

cgroup v2 can't be had on these machines (v1 holds the pids, memory and cpu controllers),
so its protocol is checked on a directory laid out as a delegated v2 group (what a
systemd service with ``Delegate=yes`` gets): which files are written with what. The v1
tree is the kernel's own, made and removed for real (root only).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from ctxactors import cgroups
from ctxactors.cgroups import Limits
from ctxactors.testing import wait_until


def delegated(tmp_path: Path) -> Path:
    """A v2 group as systemd delegates it: controllers available, the service inside."""
    home = tmp_path / "ctxactors.service"
    home.mkdir()
    (home / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (home / "cgroup.subtree_control").write_text("")
    (home / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (home / "cpu.weight").write_text("100\n")  # its parent enabled cpu for it
    (home / "cgroup.type").write_text("domain\n")  # every group but the host's root
    return home


def test_v2_moves_the_server_to_a_leaf_and_enables_the_controllers(tmp_path: Path) -> None:
    home = delegated(tmp_path)
    tree = cgroups._v2_tree(str(tmp_path), "/ctxactors.service", None)
    assert (tree.version, tree.controllers) == ("v2", ("pids", "memory", "cpu"))
    assert (home / "server" / "cgroup.procs").read_text() == str(os.getpid())
    assert (home / "cgroup.subtree_control").read_text() == "+pids +memory +cpu"
    tree.open(Limits(processes=8192, memory_bytes=6 << 30, cpu_weight=100))
    server = home / tree.name
    assert {f: (server / f).read_text() for f in sorted(os.listdir(server))} == {
        "cgroup.subtree_control": "+pids +memory +cpu",
        "cpu.weight": "100",
        "memory.max": str(6 << 30),
        "pids.max": "8192",
    }
    tree.make("p-1", Limits(processes=64, memory_bytes=1 << 26, cpu_weight=50))
    tree.make("anonymous", Limits())
    assert {f: (server / "p-1" / f).read_text() for f in os.listdir(server / "p-1")} == {
        "cpu.weight": "50",
        "memory.max": str(1 << 26),
        "pids.max": "64",
    }
    assert {
        f: (server / "anonymous" / f).read_text() for f in os.listdir(server / "anonymous")
    } == {
        "cpu.weight": "100",
        "memory.max": "max",
        "pids.max": "max",
    }
    assert tree.procs_files("p-1") == [str(server / "p-1" / "cgroup.procs")]


def test_v2_without_the_pids_and_memory_controllers_is_unavailable(tmp_path: Path) -> None:
    home = delegated(tmp_path)
    (home / "cgroup.controllers").write_text("cpu io\n")
    with pytest.raises(cgroups.Unavailable, match="has controllers cpu io, not pids and memory"):
        cgroups._v2_tree(str(tmp_path), "/ctxactors.service", None)


def test_a_principal_has_one_group_of_its_own() -> None:
    assert cgroups.group_name(None) == "anonymous"
    assert cgroups.group_name("alice") != cgroups.group_name("alice ")
    assert cgroups.group_name("alice") == cgroups.group_name("alice")
    assert len(cgroups.group_name("\udcff")) == len("p-") + 32  # a lone surrogate too


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_v1_groups_are_the_kernels_and_are_removed_on_close() -> None:
    try:
        tree = cgroups.find()
    except cgroups.Unavailable as exc:
        pytest.skip(f"no cgroups here: {exc}")
    tree.open(Limits(processes=100, memory_bytes=1 << 30))
    tree.make("p-x", Limits(processes=10, memory_bytes=1 << 26, cpu_weight=200))
    made = tree.directories("p-x")
    files = {"v1": ("pids.max", "memory.limit_in_bytes", "cpu.shares")}.get(tree.version)
    if files is not None:
        found = {}
        for name in files:
            for d in made:
                if os.path.exists(os.path.join(d, name)):
                    found[name] = Path(d, name).read_text().strip()
        assert found == {
            "pids.max": "10",
            "memory.limit_in_bytes": str(1 << 26),
            "cpu.shares": "2048",
        }
    assert tree.processes("p-x") == 0
    assert tree.cpu_idle is None  # not asked for
    assert tree.close(5.0) == []
    assert [d for d in made + tree.directories() if os.path.exists(d)] == []


def kernel_tree_with_cpu() -> cgroups.Tree:
    """This machine's tree (not yet open), or the test skipped where it has no cpu one."""
    try:
        tree = cgroups.find()
    except cgroups.Unavailable as exc:
        pytest.skip(f"no cgroups here: {exc}")
    if "cpu" not in tree.controllers:
        pytest.skip("no cpu controller here")
    return tree


def server_cpu_dir(tree: cgroups.Tree) -> str:
    """The server-wide group's directory in the cpu hierarchy (once open)."""
    return next(d for d in tree.directories() if os.path.exists(os.path.join(d, "cpu.shares")))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_the_sandboxes_run_on_the_cpu_time_the_server_leaves() -> None:
    tree = kernel_tree_with_cpu()
    tree.open(Limits(processes=100, cpu_weight=100, cpu_idle="on"))
    try:
        cpu = server_cpu_dir(tree)
        if not os.path.exists(os.path.join(cpu, "cpu.idle")):
            assert tree.cpu_idle is False
            assert "cpu.idle not available here" in tree.describe()
            return
        tree.make("p-x", Limits(cpu_weight=50))
        principal = next(d for d in tree.directories("p-x") if d.startswith(cpu + "/"))
        # The server-wide group is idle against the server's threads; inside it, principals
        # still share by weight (an idle group's children are not idle).
        assert Path(cpu, "cpu.idle").read_text().strip() == "1"
        assert Path(principal, "cpu.idle").read_text().strip() == "0"
        assert Path(principal, "cpu.shares").read_text().strip() == "512"
        assert tree.cpu_idle is True
        assert "sandboxes run on the CPU time the server's threads leave" in tree.describe()
        # Made again over its own directories (as after a sweep of one hierarchy): the
        # kernel refuses a weight for an idle group, so none is written.
        tree.open(Limits(processes=100, cpu_weight=100, cpu_idle="on"))
        assert Path(cpu, "cpu.idle").read_text().strip() == "1"
    finally:
        assert tree.close(5.0) == []


# Run as a process of its own: it starts in the root cpu group (as a server on such a host),
# steps aside, and prints where it went; argv[1] is a file of pids it then leaves running.
STEPS_ASIDE = """
import json, os, subprocess, sys
from ctxactors import cgroups
with open("/sys/fs/cgroup/cpu/cgroup.procs", "w") as f:  # a server of the root group
    f.write(str(os.getpid()))
trees = [cgroups.find(), cgroups.find()]
for tree in trees:
    tree.open(cgroups.Limits(processes=100, cpu_weight=100, cpu_idle="auto"))
cpu = [d for d in trees[0].directories() if os.path.exists(os.path.join(d, "cpu.shares"))][0]
own = [l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if l.split(":")[1] == "cpu"]
child = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if sys.argv[1:] == ["child"] else None
print(json.dumps({
    "pid": os.getpid(), "own": own[0], "cpu": cpu,
    "idle": open(os.path.join(cpu, "cpu.idle")).read().strip(),
    "second": trees[1].directories(), "describe": trees[0].describe(),
    "child": child and child.pid,
}))
for tree in trees:
    assert tree.close(5.0) == []
"""


def steps_aside(*args: str) -> dict[str, Any]:
    kernel_tree_with_cpu()
    if not os.path.exists("/sys/fs/cgroup/cpu/cgroup.procs"):
        pytest.skip("no cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu")
    done = subprocess.run(
        [sys.executable, "-c", STEPS_ASIDE, *args], capture_output=True, text=True, check=True
    )
    return cast(dict[str, Any], json.loads(done.stdout))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_a_server_in_the_root_cpu_group_gets_one_of_its_own() -> None:
    # In the root group the sandboxes' siblings would be every process of the host: idle,
    # they starved behind any of them (a CI run's sandboxes beside its tests). So the
    # server moves into a group of its own first, and its sandboxes go idle beside it.
    got = steps_aside()
    group = f"/sys/fs/cgroup/cpu/ctxactors-{got['pid']}"
    assert got["own"] == f"/ctxactors-{got['pid']}/server"
    assert got["cpu"] == f"{group}/ctxactors-{got['pid']}-1"
    if got["idle"] != "1":
        pytest.skip("this kernel has no cpu.idle")
    # Its second runtime's tree goes into the same group: one per process.
    assert f"{group}/ctxactors-{got['pid']}-2" in got["second"]
    assert f"moved into {group}/server" in got["describe"]
    # The process is gone: the next server's sweep removes its group.
    cgroups._sweep("/sys/fs/cgroup/cpu")
    assert not os.path.exists(group)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_a_gone_servers_group_stays_while_a_process_it_started_is_in_it() -> None:
    got = steps_aside("child")
    group = f"/sys/fs/cgroup/cpu/ctxactors-{got['pid']}"
    try:
        cgroups._sweep("/sys/fs/cgroup/cpu")  # the kernel refuses: its child is still in it
        assert Path(group, "server", "cgroup.procs").read_text().split() == [str(got["child"])]
    finally:
        os.kill(got["child"], signal.SIGKILL)
    wait_until(lambda: not _alive(got["child"]), timeout=30)
    cgroups._sweep("/sys/fs/cgroup/cpu")
    assert not os.path.exists(group)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def fake_v1_root(tmp_path: Path) -> cgroups.Tree:
    """A v1 tree whose cpu home is its hierarchy's root, laid out in plain directories."""
    homes = {c: tmp_path / c for c in cgroups.CONTROLLERS}
    for home in homes.values():
        home.mkdir()
    (homes["cpu"] / "cpu.idle").write_text("0\n")  # a kernel with cpu.idle (5.15 or later)
    tree = cgroups.Tree("v1", {c: str(h) for c, h in homes.items()})
    tree.at_root = True
    return tree


def test_a_server_that_cannot_step_aside_keeps_its_sandboxes_by_weight(tmp_path: Path) -> None:
    tree = fake_v1_root(tmp_path)
    # The move fails: its cgroup.procs is a directory, so writing the pid raises.
    (tmp_path / "cpu" / f"ctxactors-{os.getpid()}" / "server" / "cgroup.procs").mkdir(parents=True)
    tree.open(Limits(processes=100, cpu_weight=50, cpu_idle="auto"))
    cpu = tmp_path / "cpu" / tree.name
    assert sorted(os.listdir(cpu)) == ["cpu.shares"]  # by weight: no cpu.idle written
    assert (cpu / "cpu.shares").read_text() == "512"
    assert (tree.at_root, tree.stepped_aside, tree.cpu_idle) == (True, None, None)
    described = tree.describe()
    assert "the server stays in the root cpu group: can't move it into a group of its own" in (
        described
    )
    assert "sandboxes by cpu weight, not idle" in described


def test_off_leaves_the_server_where_it_is(tmp_path: Path) -> None:
    tree = fake_v1_root(tmp_path)
    tree.open(Limits(processes=100, cpu_weight=100, cpu_idle="off"))
    assert sorted(os.listdir(tmp_path / "cpu")) == ["cpu.idle", tree.name]
    assert tree.stepped_aside is None


def test_v2_server_in_the_root_group_moves_into_a_group_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "cgroup.procs").write_text("1\n2\n3\n")  # the host's processes
    tree = cgroups._v2_tree(str(tmp_path), "/", None)
    # The root may hold processes: nothing of the host's is moved, no leaf made.
    assert (tmp_path / "cgroup.procs").read_text() == "1\n2\n3\n"
    assert not (tmp_path / "server").exists()
    tree.open(Limits(processes=100, cpu_weight=100, cpu_idle="auto"))
    group = tmp_path / f"ctxactors-{os.getpid()}"
    assert (group / "server" / "cgroup.procs").read_text() == str(os.getpid())
    assert (group / "cgroup.subtree_control").read_text() == "+pids +memory +cpu"
    assert tree.directories() == [str(group / tree.name)]
    assert {f: (group / tree.name / f).read_text() for f in os.listdir(group / tree.name)} == {
        "cgroup.subtree_control": "+pids +memory +cpu",
        "cpu.idle": "1",
        "memory.max": "max",
        "pids.max": "100",
    }
    assert (tree.at_root, tree.stepped_aside) == (False, str(group))


def test_a_tree_knows_when_it_sits_in_the_root_group(tmp_path: Path) -> None:
    delegated(tmp_path)
    assert cgroups._v2_tree(str(tmp_path), "/ctxactors.service", None).at_root is False
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "cgroup.procs").write_text("")
    assert cgroups._v2_tree(str(tmp_path), "/", None).at_root is True  # the host's root
    # A container's cgroup namespace: its own group at the mount, which has a type.
    (tmp_path / "cgroup.type").write_text("domain\n")
    assert cgroups._v2_tree(str(tmp_path), "/", None).at_root is False


# -- an attacker's and reviewer's pass over the step aside (issue 27) ----------------------


def run_script(tmp_path: Path, script: str) -> dict[str, Any]:
    """Run `script` as a server of the root cpu group (as `steps_aside`); its JSON line."""
    kernel_tree_with_cpu()
    if not os.path.exists("/sys/fs/cgroup/cpu/cgroup.procs"):
        pytest.skip("no cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu")
    prelude = (
        "import json, os, signal, subprocess, sys, threading\n"
        "from ctxactors import cgroups\n"
        "if sys.argv[1:] != ['child']:  # a child stays where its parent started it\n"
        "    with open('/sys/fs/cgroup/cpu/cgroup.procs', 'w') as f:\n"
        "        f.write(str(os.getpid()))\n"
        "LIMITS = cgroups.Limits(processes=100, cpu_weight=100, cpu_idle='auto')\n"
        "def own_cpu():\n"
        "    return [l.split(':', 2)[2].strip() for l in open('/proc/self/cgroup')"
        " if l.split(':')[1] == 'cpu'][0]\n"
    )
    path = tmp_path / "server.py"
    path.write_text(prelude + script)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return cast(dict[str, Any], json.loads(done.stdout.splitlines()[-1]))


REOPENS = """
first = cgroups.find()
first.open(LIMITS)
assert first.close(5.0) == []
later = cgroups.find()  # made after the move: this process is in <group>/server now
later.open(LIMITS)
print(json.dumps({"pid": os.getpid(), "own": own_cpu(), "dirs": later.directories(),
                  "stepped": later.stepped_aside, "describe": later.describe()}))
assert later.close(5.0) == []
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_a_runtime_made_after_the_move_goes_beside_the_server_too(tmp_path: Path) -> None:
    # Found its own group at <group>/server, a later runtime's tree went inside the
    # server's group (v2: the server moved a level down again for each runtime).
    got = run_script(tmp_path, REOPENS)
    group = f"/sys/fs/cgroup/cpu/ctxactors-{got['pid']}"
    assert got["own"] == f"/ctxactors-{got['pid']}/server"
    assert f"{group}/ctxactors-{got['pid']}-2" in got["dirs"]
    assert got["stepped"] == group
    assert (
        f"the server was in the root cpu group, so it moved into {group}/server"
        in (got["describe"])
    )
    cgroups._sweep("/sys/fs/cgroup/cpu")
    assert not os.path.exists(group)


# A server that steps aside, starts another server (in its own server/, so that one's tree
# is made there) and ends without closing (a crash): it prints the other server's pid.
STARTS_A_SERVER = """
if sys.argv[1:] == ["child"]:
    tree = cgroups.find()
    tree.open(LIMITS)
    tree.make("p-x", cgroups.Limits(cpu_weight=50))
    print(json.dumps({"pid": os.getpid(), "own": own_cpu(), "dirs": tree.directories("p-x")}))
    sys.stdout.close()
    signal.pause()
cgroups.find().open(LIMITS)
child = subprocess.Popen(
    [sys.executable, __file__, "child"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True,
)
print(child.stdout.readline().strip())
os._exit(0)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_the_sweep_keeps_a_live_servers_groups_inside_a_gone_servers_group(
    tmp_path: Path,
) -> None:
    # Before: the walk of the gone server's group removed the live one's empty groups
    # (its server-wide group and its principals' between sandboxes).
    got = run_script(tmp_path, STARTS_A_SERVER)
    child, dirs = got["pid"], got["dirs"]
    parent = got["own"].split("/")[1]  # the gone server's group: its child is in server/
    try:
        assert got["own"] == f"/{parent}/server" and parent != f"ctxactors-{child}"
        cpu = next(d for d in dirs if d.startswith("/sys/fs/cgroup/cpu/"))
        assert cpu == f"/sys/fs/cgroup/cpu/{parent}/server/ctxactors-{child}-1/p-x"
        cgroups._sweep("/sys/fs/cgroup/cpu")
        assert [d for d in dirs if not os.path.isdir(d)] == []
    finally:
        os.kill(child, signal.SIGKILL)
    # Reaped, not only dead: the sweep's os.kill takes a zombie for a live process.
    wait_until(lambda: not os.path.exists(f"/proc/{child}"), timeout=30)
    for home in {os.path.dirname(os.path.dirname(d)) for d in dirs}:
        cgroups._sweep(home)  # its own tree: pids and memory
    cgroups._sweep("/sys/fs/cgroup/cpu")  # both, the child's inside the parent's
    assert not os.path.exists(f"/sys/fs/cgroup/cpu/{parent}")
    assert [d for d in dirs if os.path.exists(d)] == []


REALTIME = """
ready, stop = threading.Event(), threading.Event()
def realtime():
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    ready.set()
    stop.wait()
threading.Thread(target=realtime, daemon=True).start()
ready.wait()
from ctxactors.sandbox_limits import SandboxBudgets
from ctxactors.settings import BudgetSettings
budgets = SandboxBudgets.open(BudgetSettings())
lease = budgets.enter("alice")
print(json.dumps({"pid": os.getpid(), "own": own_cpu(), "said": budgets.enforcement,
                  "files": lease.procs_files}))
lease.release()
assert budgets.close() == []
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_a_server_with_a_realtime_thread_stays_and_says_why(tmp_path: Path) -> None:
    # A new group has no cpu.rt_runtime_us: the kernel refuses a SCHED_FIFO thread (EINVAL).
    got = run_script(tmp_path, REALTIME)
    assert got["own"] == "/"
    assert (
        "the server stays in the root cpu group: can't move it into a group of its own: "
        in (got["said"])
    )
    assert "(a realtime thread? a new group has no cpu.rt_runtime_us" in got["said"]
    assert "sandboxes by cpu weight, not idle" in got["said"]
    alice = cgroups.group_name("alice")
    name = f"ctxactors-{got['pid']}"
    assert f"/sys/fs/cgroup/cpu/{name}-1/{alice}/cgroup.procs" in got["files"]
    assert not os.path.exists(f"/sys/fs/cgroup/cpu/{name}")  # the half-made group went


def test_a_fork_while_a_thread_moves_the_process_does_not_hang_the_child(
    tmp_path: Path,
) -> None:
    # The child of a fork made while another thread held the move's lock: its own first
    # runtime hung forever on that lock (multiprocessing's fork, a server's threads).
    root = tmp_path / "cpu"
    root.mkdir()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cgroups._stepping:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: never back into pytest
            code = 1
            try:
                group = cgroups.step_aside(str(root), "v1", ["cpu"])
                code = 0 if group == str(root / f"ctxactors-{os.getpid()}") else 1
            finally:
                os._exit(code)
        ended: list[int] = []

        def reaped() -> bool:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ended.append(os.waitstatus_to_exitcode(status))
            return bool(done)

        try:
            wait_until(reaped, timeout=10)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung in step_aside")
        assert ended == [0]
    finally:
        release.set()
        holder.join()


def test_a_failed_move_the_root_refuses_back_is_said_as_it_is(tmp_path: Path) -> None:
    # v2: the process moved into server/, enabling the controllers failed, and the root's
    # cgroup.procs refused it back. The line said "the server stays in the root cpu group".
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    tree = cgroups._v2_tree(str(tmp_path), "/", None)
    group = tmp_path / f"ctxactors-{os.getpid()}"
    (group / "cgroup.subtree_control").mkdir(parents=True)  # writing it fails
    (tmp_path / "cgroup.procs").mkdir()  # and so does the move back
    tree.open(Limits(processes=100, cpu_weight=100, cpu_idle="auto"))
    assert (group / "server" / "cgroup.procs").read_text() == str(os.getpid())
    assert (tree.at_root, tree.stepped_aside, tree.cpu_idle) == (True, None, None)
    assert tree.directories() == [str(tmp_path / tree.name)]  # by weight, in the root
    described = tree.describe()
    assert f"the server moved into {group}/server, but [Errno 21] Is a directory" in described
    assert "and the root group refused it back ([Errno 21] Is a directory" in described
    assert "it stays there, its sandboxes' group in the root group" in described
    assert "the server stays in the root cpu group" not in described


def test_the_sweep_passes_over_names_that_are_no_pid_of_ours(tmp_path: Path) -> None:
    # ctxactors-<huge>: os.kill raised OverflowError, and every later server failed to start.
    gone = subprocess.Popen(["true"])
    gone.wait()
    for name in ("ctxactors-99999999999", "ctxactors-0", f"ctxactors-{gone.pid}"):
        (tmp_path / name / "server").mkdir(parents=True)
    cgroups._sweep(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["ctxactors-0", "ctxactors-99999999999"]


REUSES_A_PID = """
from ctxactors.sandbox_limits import SandboxBudgets
from ctxactors.settings import BudgetSettings
pid, root = os.getpid(), '/sys/fs/cgroup/cpu'
def left_by_an_earlier_process(tree):
    os.makedirs(f"{tree}/p-old")
    with open(f"{tree}/cpu.idle", "w") as f:
        f.write("1")
said = []
left_by_an_earlier_process(f"{root}/ctxactors-{pid}-1")  # where an idle-less tree goes
budgets = SandboxBudgets.open(BudgetSettings(server_cpu_idle="off"))
said.append(budgets.enforcement)
assert budgets.close() == []
left_by_an_earlier_process(f"{root}/ctxactors-{pid}/ctxactors-{pid}-2")  # and a moved one's
budgets = SandboxBudgets.open(BudgetSettings(server_cpu_idle="auto"))
said.append(budgets.enforcement)
left = budgets.close()
print(json.dumps({"pid": pid, "said": said, "left": left, "there": sorted(
    p for p, _, _ in os.walk(root) if f"ctxactors-{pid}" in p)}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_groups_an_earlier_process_with_the_same_pid_left_are_swept(tmp_path: Path) -> None:
    # pid_max is 32,768 here: a crashed server's groups meet a new server of its pid. Its
    # tree was taken as the new one's: a left idle group refused the weight (EINVAL, no
    # cgroups at all), and its principals' groups kept the tree from being removed.
    got = run_script(tmp_path, REUSES_A_PID)
    name = f"ctxactors-{got['pid']}"
    assert got["said"][0].startswith(
        f"kernel: cgroup v1 (pids, memory, cpu) at /sys/fs/cgroup/cpu/{name}-1,"
    )
    assert got["said"][1].startswith(
        f"kernel: cgroup v1 (pids, memory, cpu) at /sys/fs/cgroup/cpu/{name}/{name}-2,"
    )
    assert got["left"] == []
    # Only the process's own group is left (it is in it), swept once it is gone.
    assert got["there"] == [f"/sys/fs/cgroup/cpu/{name}", f"/sys/fs/cgroup/cpu/{name}/server"]
    cgroups._sweep("/sys/fs/cgroup/cpu")
    assert not os.path.exists(f"/sys/fs/cgroup/cpu/{name}")


def test_on_where_the_server_cant_step_aside_says_whom_the_sandboxes_yield_to(
    tmp_path: Path,
) -> None:
    # The line said "sandboxes run on the CPU time the server's threads leave": in the
    # root group they yield to every process of the host.
    tree = fake_v1_root(tmp_path)
    (tmp_path / "cpu" / f"ctxactors-{os.getpid()}" / "server" / "cgroup.procs").mkdir(parents=True)
    tree.open(Limits(processes=100, cpu_weight=100, cpu_idle="on"))
    assert (tmp_path / "cpu" / tree.name / "cpu.idle").read_text() == "1"
    described = tree.describe()
    assert "; sandboxes yield the CPU to every process of the host (cpu.idle); the server " in (
        described
    )
    assert "the server's threads leave" not in described


def test_a_kernel_without_cpu_idle_keeps_the_server_where_it_is(tmp_path: Path) -> None:
    # Before Linux 5.15 the move (for good: the whole process) bought nothing.
    tree = fake_v1_root(tmp_path)
    (tmp_path / "cpu" / "cpu.idle").unlink()
    tree.open(Limits(processes=100, cpu_weight=100, cpu_idle="on"))
    assert sorted(os.listdir(tmp_path / "cpu")) == [tree.name]  # no group of its own
    assert (tree.stepped_aside, tree.at_root) == (None, True)
    described = tree.describe()
    assert "; the server stays in the root cpu group: no cpu.idle here" in described
