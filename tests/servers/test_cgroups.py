"""The cgroup files the server writes, on both hierarchies.

cgroup v2 can't be had on these machines (v1 holds the pids, memory and cpu controllers),
so its protocol is checked on a directory laid out as a delegated v2 group (what a
systemd service with ``Delegate=yes`` gets): which files are written with what. The v1
tree is the kernel's own, made and removed for real (root only).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ctxactors import cgroups
from ctxactors.cgroups import Limits


def delegated(tmp_path: Path) -> Path:
    """A v2 group as systemd delegates it: controllers available, the service inside."""
    home = tmp_path / "ctxactors.service"
    home.mkdir()
    (home / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (home / "cgroup.subtree_control").write_text("")
    (home / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (home / "cpu.weight").write_text("100\n")  # its parent enabled cpu for it
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


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroup v1 groups")
def test_auto_leaves_sandboxes_by_weight_in_the_root_group() -> None:
    # In the hierarchy's root group the sandboxes' siblings are every process of the host:
    # idle, they would wait for all of them (a CI run's sandboxes starved beside its tests).
    tree = kernel_tree_with_cpu()
    tree.open(Limits(processes=100, cpu_weight=100, cpu_idle="auto"))
    try:
        cpu = server_cpu_dir(tree)
        idle = Path(cpu, "cpu.idle")
        if tree.at_root:
            assert (tree.cpu_idle, idle.read_text().strip()) == (None, "0")
            assert "not idle: the server is in the root group" in tree.describe()
        else:
            assert tree.cpu_idle is True and idle.read_text().strip() == "1"
    finally:
        assert tree.close(5.0) == []


def test_a_tree_knows_when_it_sits_in_the_root_group(tmp_path: Path) -> None:
    delegated(tmp_path)
    assert cgroups._v2_tree(str(tmp_path), "/ctxactors.service", None).at_root is False
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "cgroup.procs").write_text("")
    assert cgroups._v2_tree(str(tmp_path), "/", None).at_root is True  # the host's root
    # A container's cgroup namespace: its own group at the mount, with a cpu.weight.
    (tmp_path / "cpu.weight").write_text("100\n")
    assert cgroups._v2_tree(str(tmp_path), "/", None).at_root is False
