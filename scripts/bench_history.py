"""What recording every call in the operation history costs the caller.

Same process, same run, pinned to one CPU by default (cross-CPU wake-ups vary from run to
run; there the history actor's own work is charged to the caller too, the worst case):
round trips of ``create_goal`` with the history recording (the default) against the same
runtime with the history observer removed. Prints calls/s and µs per call for both, and the
ratio. Then the recording alone, in one thread (`SessionHistory.record` of one
``mark_todo`` call, over and over): without a store (the baseline), and kept in a
`MemoryStore` and a SQLite store, written every 40 records (a busy session's 50 ms).
Usage: ``python scripts/bench_history.py [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxactors import Runtime
from ctxactors.durable import Durability
from ctxactors.history_store import HistorySaver
from ctxactors.logs import configure_logging
from ctxactors.servers import BUILTIN
from ctxactors.servers.history import History, SessionHistory, runtime_config
from ctxactors.state import MemoryStore, SQLiteStore, StateStore


def measure(rt: Runtime, calls: int, session: str) -> tuple[float, float]:
    """Seconds per call over `calls` sequential round trips: wall time, process CPU time."""
    args = {"goal": "bench", "__sessionId": session}
    rt.call("create_goal", args)  # spawn the actors outside the timing
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        rt.call("create_goal", args)
    return (time.perf_counter() - started) / calls, (time.process_time() - cpu) / calls


def a_call() -> tuple[Any, ...]:
    """A real ``mark_todo`` call as the recorder sees it: context, spec, arguments, result."""
    seen: list[tuple[Any, ...]] = []
    with Runtime(servers=BUILTIN) as rt:
        rt.add_observer(lambda *call: seen.append(call), before_reply=True)
        ctx = {"__sessionId": "s", "__assistantId": "a1"}
        rt.call("create_goal", {"goal": "ship the release", **ctx})
        rt.call("add_todo", {"name": "step 1 of the release", "goal_id": "g1", **ctx})
        rt.call("mark_todo", {"todo_id": "t2", "done": True, **ctx})
        return (*seen[-1], rt)


def record_cost(calls: int, store: Callable[[], StateStore] | None) -> float:
    """CPU seconds per `SessionHistory.record` of one call; with a store, the history is
    written (`HistorySaver.flush`) every 40 records."""
    ctx, spec, args, result, rt = a_call()
    config = runtime_config(rt)
    durable = None if store is None else Durability(store())
    saver = None if durable is None else HistorySaver(durable, (None, "s"))
    history = SessionHistory(config, saver, rt.tools)
    cpu = time.process_time()
    for n in range(calls):
        history.record(ctx, spec, args, result)
        if saver is not None and n % 40 == 39:
            saver.flush()
    cpu = time.process_time() - cpu
    if durable is not None:
        durable.close()
        durable.store.close()
    return cpu / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--all-cpus", action="store_true", help="don't pin to one CPU")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity") and not args.all_cpus:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    configure_logging(format="json", level="warning", force=True)

    with Runtime(servers=[*BUILTIN, History]) as recording, Runtime(servers=BUILTIN) as bare:
        # The baseline: the same servers, nothing attached to record.
        bare._early_observers.clear()  # noqa: SLF001 - a benchmark's baseline
        on: list[tuple[float, float]] = []
        off: list[tuple[float, float]] = []
        for r in range(args.rounds):  # interleaved, so drift hits both alike
            on.append(measure(recording, args.calls, f"on{r}"))
            off.append(measure(bare, args.calls, f"off{r}"))
        kept = recording.call("get_recent_context", {"__sessionId": "on0", "limit": 1000})
        assert kept.structured is not None
    cpus = "all CPUs" if args.all_cpus else "one CPU"
    print(f"calls per round: {args.calls}, rounds: {args.rounds} (median shown), {cpus}")
    print(f"{'':24} {'calls/s':>9} {'µs/call':>8} {'CPU µs/call':>12}")
    for label, runs in (("baseline (no history)", off), ("with history recording", on)):
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{label:24} {1 / wall:>9,.0f} {wall * 1e6:>8.1f} {cpu * 1e6:>12.2f}")
    wall_on, wall_off = (statistics.median(w for w, _ in runs) for runs in (on, off))
    cpu_on, cpu_off = (statistics.median(c for _, c in runs) for runs in (on, off))
    print(f"ratio (with / baseline time per call): {wall_on / wall_off:.2f}")
    print(
        f"the history costs a call {(wall_on - wall_off) * 1e6:.2f} µs wall,"
        f" {(cpu_on - cpu_off) * 1e6:.2f} µs CPU (target <= 1.5)"
    )
    print(f"operations kept per session: {kept.structured['count']} (the bound)")

    with tempfile.TemporaryDirectory() as tmp:
        paths = iter(Path(tmp) / f"h{n}.db" for n in range(args.rounds))
        stores: list[tuple[str, Callable[[], StateStore] | None]] = [
            ("no store (baseline)", None),
            ("MemoryStore", MemoryStore),
            ("SQLite store", lambda: SQLiteStore(next(paths))),
        ]
        costs: dict[str, list[float]] = {label: [] for label, _ in stores}
        for _ in range(args.rounds):  # interleaved, like the round trips above
            for label, store in stores:
                costs[label].append(record_cost(args.calls, store))
    print("\nrecording alone, one thread (a mark_todo call; written every 40 records):")
    base = statistics.median(costs["no store (baseline)"])
    for label, each in costs.items():
        cost = statistics.median(each)
        print(f"{label:24} {cost * 1e6:>8.2f} µs/call  {cost / base:>5.2f}x the baseline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
