"""What recording every call in the operation history costs the caller.

Same process, same run, pinned to one CPU by default (cross-CPU wake-ups vary from run to
run; there the history actor's own work is charged to the caller too, the worst case):
round trips of ``create_goal`` with the history recording (the default) against the same
runtime with the history observer removed. Prints calls/s and µs per call for both, and the
ratio. Usage: ``python scripts/bench_history.py [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from ctxactors import Runtime
from ctxactors.logs import configure_logging
from ctxactors.servers import BUILTIN
from ctxactors.servers.history import History


def measure(rt: Runtime, calls: int, session: str) -> tuple[float, float]:
    """Seconds per call over `calls` sequential round trips: wall time, process CPU time."""
    args = {"goal": "bench", "__sessionId": session}
    rt.call("create_goal", args)  # spawn the actors outside the timing
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        rt.call("create_goal", args)
    return (time.perf_counter() - started) / calls, (time.process_time() - cpu) / calls


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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
