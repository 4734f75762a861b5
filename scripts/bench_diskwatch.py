#!/usr/bin/env python3
"""How far a writer gets past its disk budget, and what watching it costs.

`ctxactors.sandbox_diskwatch` stops a command that writes past a disk budget, by a count
every 50 ms to 1 s while commands run. One in-process runtime with the workspace server
(real bubblewrap), a SQLite store and the measured disk budget (``disk=off``: the mode a
non-root server has), in a temporary root:

1. Overshoot: a loop writing files of `--sizes` as fast as it can (no pause), each far
   under the principal's `--budget` MiB: the bytes it holds once stopped, past the budget,
   and the seconds from its start to its stop. The baseline: the same loop's write speed,
   unwatched (the same command under a budget it can't reach), so the overshoot reads as
   that many milliseconds of writing.
2. Cost: a command sleeping `--seconds` in a session directory holding `--files` files:
   the process's CPU time while it runs, watched and (the baseline) with the watch off,
   and the watch's passes a second.
3. Spread: one principal's `--spread` sessions x files, a command sleeping in each: the
   passes a second (another tenant's overshoot window is one pause and one pass), the
   entries a pass walks and the CPU, with a pass's walk bounded per principal and (the
   baseline) every directory walked at every pass.

Pinned to one CPU (CPU-time figures; the machine is shared: say what else ran).

    python scripts/bench_diskwatch.py [--budget 16] [--sizes 64,1024] [--files 0,10000,100000]
                                      [--seconds 3] [--spread 8x50000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from ctxactors import Runtime, sandbox_diskwatch
from ctxactors.sandbox_disk import measure
from ctxactors.sandbox_diskwatch import DiskWatch
from ctxactors.servers.workspace import Workspace
from ctxactors.settings import Settings
from ctxactors.state import SQLiteStore
from ctxactors.testing import context_args

MIB = 1 << 20


@contextmanager
def runtime(budget: int) -> Iterator[Runtime]:
    root = tempfile.mkdtemp(prefix="ctxactors-bench-disk-")
    os.chmod(root, 0o755)
    os.environ["CTXACTORS_WORKSPACE_ROOT"] = root
    settings = Settings.from_env()
    changed = msgspec.structs.replace(
        settings.workspace.budget, disk="off", principal_disk_bytes=budget
    )
    workspace = msgspec.structs.replace(settings.workspace, budget=changed)
    store = SQLiteStore(os.path.join(root, "state.db"), retention=3600)
    rt = Runtime(
        servers=[Workspace],
        store=store,
        settings=msgspec.structs.replace(settings, workspace=workspace),
    )
    try:
        yield rt
    finally:
        rt.close()
        store.close()
        shutil.rmtree(root, ignore_errors=True)


def call(rt: Runtime, session: str, tool: str, **args: Any) -> Any:
    result = rt.call(tool, context_args(session, **args), principal="bench")
    if result.is_error:
        raise SystemExit(f"{tool}: {result.text}")
    return result.structured


def run(rt: Runtime, session: str, command: str) -> tuple[dict[str, Any], float]:
    """Run a command to its end: its last poll, and the seconds it ran."""
    began = time.monotonic()
    process = call(rt, session, "execute_command", command=command)["processId"]
    while True:
        polled = call(rt, session, "poll_process", processId=process)
        if polled["status"] != "running":
            return polled, time.monotonic() - began
        time.sleep(0.02)


def held(rt: Runtime, session: str) -> int:
    return measure(Workspace._kept[rt].path(("bench", session)))[0]  # noqa: SLF001


def overshoot(budget: int, kib: int) -> None:
    write = f"head -c {kib}K /dev/zero > f$i || exit 1"
    loop = "while {}; do i=$((i+1)); " + write + "; done"
    with runtime(1 << 40) as rt:  # the baseline: 4 budgets' worth, unwatched (none reached)
        count = max(4 * budget // (kib << 10), 8)
        polled, _ = run(rt, "base", loop.format(f"[ ${{i:-0}} -lt {count} ]"))
        speed = held(rt, "base") / max(_ran(rt, polled), 1e-9)
    with runtime(budget) as rt:
        polled, seconds = run(rt, "s", loop.format(":"))
        past = held(rt, "s") - budget
        print(
            f"files of {kib:>5} KiB: {polled['status']} after {seconds:5.2f} s, "
            f"{past / MIB:6.1f} MiB past the {budget // MIB} MiB budget; unwatched the loop "
            f"writes {speed / MIB:5.0f} MiB/s: {1000 * past / speed:4.0f} ms of its writing"
        )


def _ran(rt: Runtime, polled: dict[str, Any]) -> float:
    """The seconds the baseline loop ran (its files' times, not the poll's)."""
    path = Workspace._kept[rt].path(("bench", "base"))  # noqa: SLF001
    times = [os.stat(os.path.join(path, n)).st_mtime for n in os.listdir(path)]
    assert polled["status"] == "exited", polled
    return max(times) - min(times)


def cost(files: int, seconds: float) -> None:
    figures = {}
    for watched in (False, True):
        with runtime(1 << 40) as rt:
            call(rt, "c", "execute_command", command="true")
            path = Workspace._kept[rt].path(("bench", "c"))  # noqa: SLF001
            for i in range(files):
                os.close(os.open(os.path.join(path, f"f{i}"), os.O_CREAT | os.O_WRONLY, 0o644))
            tenants = Workspace.tenants(rt)
            assert tenants is not None
            watch: DiskWatch = tenants.watch
            add = watch.add
            if not watched:
                watch.add = lambda *a, **k: None  # type: ignore[method-assign]
            passes = watch.passes
            cpu = time.process_time()
            run(rt, "c", f"sleep {seconds}")
            figures[watched] = (time.process_time() - cpu, watch.passes - passes)
            watch.add = add  # type: ignore[method-assign]
    (base, _), (cpu, passes) = figures[False], figures[True]
    print(
        f"{files:>7,} files: CPU {cpu / seconds * 1000:6.1f} ms/s watched, "
        f"{base / seconds * 1000:6.1f} ms/s unwatched (+{(cpu - base) / seconds * 1000:.1f} "
        f"ms/s, {cpu / max(base, 1e-9):.2f}x); {passes / seconds:5.1f} passes/s"
    )


def spread(sessions: int, files: int, seconds: float) -> None:
    """One principal's `sessions` directories of `files` files each, a command sleeping in
    each: what a pass walks and costs, bounded (`PASS_ENTRIES` a pass per principal) and,
    the baseline, every directory at every pass (as before the bound)."""
    figures = {}
    for bound in (10**12, sandbox_diskwatch.PASS_ENTRIES):
        sandbox_diskwatch.PASS_ENTRIES = bound
        with runtime(1 << 40) as rt:
            names = [f"s{i}" for i in range(sessions)]
            for name in names:
                run(rt, name, "true")
                path = Workspace._kept[rt].path(("bench", name))  # noqa: SLF001
                for i in range(files):
                    os.close(os.open(os.path.join(path, f"f{i}"), os.O_CREAT | os.O_WRONLY))
            tenants = Workspace.tenants(rt)
            assert tenants is not None
            for name in names:  # counted, as a command that wrote them would have been
                tenants.disks.measure("bench", Workspace._kept[rt].path(("bench", name)))  # noqa: SLF001
            watch: DiskWatch = tenants.watch
            passes, walked = watch.passes, watch.walked
            cpu, began = time.process_time(), time.monotonic()
            started = [
                (name, call(rt, name, "execute_command", command=f"sleep {seconds}"))
                for name in names
            ]
            for name, answer in started:
                while call(rt, name, "poll_process", processId=answer["processId"])["status"] == (
                    "running"
                ):
                    time.sleep(0.05)
            wall = time.monotonic() - began
            done = max(watch.passes - passes, 1)
            figures[bound] = (time.process_time() - cpu, wall, done, watch.walked - walked)
    sandbox_diskwatch.PASS_ENTRIES = bound
    for bound, (cpu, wall, done, walked) in figures.items():
        how = "every directory every pass" if bound == 10**12 else f"{bound:,} entries a pass"
        print(
            f"{sessions} x {files:,} files, {how:>26}: {done / wall:5.1f} passes/s, "
            f"{1000 * wall / done:6.0f} ms between passes, {walked / done:9,.0f} entries/pass, "
            f"CPU {1000 * cpu / wall:5.0f} ms/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=16, help="MiB")
    parser.add_argument("--sizes", default="64,1024", help="KiB, comma-separated")
    parser.add_argument("--files", default="0,10000,100000")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--spread", default="8x50000", help="sessions x files (one principal)")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for kib in filter(None, args.sizes.split(",")):
        overshoot(args.budget * MIB, int(kib))
    for files in filter(None, args.files.split(",")):
        cost(int(files), args.seconds)
    if args.spread:
        sessions, files = args.spread.split("x")
        spread(int(sessions), int(files), args.seconds)


if __name__ == "__main__":
    main()
