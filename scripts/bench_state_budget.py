#!/usr/bin/env python3
"""The state budget's cost per save: routed calls that each change and save a key, on a
SQLite store, made by a principal (charged to ``state.max_principal_bytes``) and by no
principal (not counted: the baseline), in turns, pinned to one CPU. Process CPU time per
call is shown beside wall time (the machine is shared; CPU time holds better). Runs on
main as well (where neither is counted), for a baseline of the same code path there.

    python scripts/bench_state_budget.py [--calls 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.logs import configure_logging
from ctxactors.state import SQLiteStore
from ctxactors.testing import context_args


class Tally(Server):
    """A durable key whose every call changes its state (so every call saves)."""

    name = "tally"
    scope = Scope.SESSION
    State = int

    def __init__(self) -> None:
        self.n = 0

    def snapshot(self) -> int:
        return self.n

    def restore(self, state: int) -> None:
        self.n = state

    @tool
    def bump(self, ctx: ToolContext) -> dict[str, Any]:
        """Add one."""
        self.n += 1
        return {"n": self.n}


def run(rt: Runtime, principal: str | None, calls: int) -> tuple[float, float]:
    """(wall µs, CPU µs) per call."""
    args = context_args("s1")
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        rt.call("bump", args, principal=principal)
    return (
        (time.perf_counter() - wall) / calls * 1e6,
        (time.process_time() - cpu) / calls * 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    configure_logging(level="warning")
    figures: dict[str, list[tuple[float, float]]] = {"principal": [], "none": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        Runtime([Tally], store=SQLiteStore(Path(tmp) / "s.db")) as rt,
    ):
        run(rt, "alice", 200)  # warm up both keys (and the principal's first count)
        run(rt, None, 200)
        for _ in range(args.rounds):
            figures["principal"].append(run(rt, "alice", args.calls))
            figures["none"].append(run(rt, None, args.calls))
    base_wall = statistics.median(w for w, _ in figures["none"])
    base_cpu = statistics.median(c for _, c in figures["none"])
    for name, runs in figures.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(
            f"{name:>9}: {wall:7.1f} µs wall ({wall / base_wall:.3f}x)  "
            f"{cpu:7.1f} µs CPU ({cpu / base_cpu:.3f}x) per saved call"
        )


if __name__ == "__main__":
    main()
