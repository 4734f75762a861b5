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
    assert sorted(os.listdir(tmp_path / "cpu")) == [tree.name]
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
