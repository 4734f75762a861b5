#!/usr/bin/env python3
"""Router overhead: routed `Runtime.call` vs a raw pykka `ask` vs a direct call under a lock.

All run in one process, interleaved over several rounds (median shown), pinned to one
CPU (cross-CPU wake-ups otherwise dominate and the ratios swing from run to run). A bare
`SimpleQueue` ping-pong between two threads is the floor of any thread hop. Besides wall
time, each variant's process CPU time per call is shown: on a shared machine other
processes stretch wall time, not this process's CPU time, so its ratios hold better. The
routed call does everything a real call does: parse and strip the context, validate with
msgspec, look up the key, hand the call to the key's actor and wait for the reply, and the
session's operation history records it. Per-call log lines are measured both filtered out
(level warning) and written as JSON (level info, to a file); the router alone is
measured with the history's observer detached (the target applies to it;
`bench_history.py` measures the history's own cost).

    python scripts/bench_router.py [--calls 20000] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO, cast

import pykka

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.logs import configure_logging


class Echo(Server):
    name = "echo"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.n = 0

    @tool
    def echo(self, ctx: ToolContext, n: int) -> dict[str, Any]:
        """Count and echo."""
        self.n += 1
        return {"n": n}


class RawEcho(pykka.ThreadingActor):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def on_receive(self, message: Any) -> Any:
        self.n += 1
        return {"n": message["n"]}


def measure(name: str, fn: Callable[[int], Any], calls: int) -> dict[str, Any]:
    for i in range(min(2000, calls)):  # warm up
        fn(i)
    samples = []
    perf = time.perf_counter
    cpu_start = time.process_time()
    t_start = perf()
    for i in range(calls):
        t0 = perf()
        fn(i)
        samples.append(perf() - t0)
    total = perf() - t_start
    cpu = time.process_time() - cpu_start
    samples.sort()
    return {
        "name": name,
        "calls": calls,
        "calls_per_s": round(calls / total),
        "cpu_us": round(cpu / calls * 1e6, 2),
        "p50_us": round(samples[len(samples) // 2] * 1e6, 1),
        "p99_us": round(samples[int(len(samples) * 0.99)] * 1e6, 1),
        "mean_us": round(statistics.fmean(samples) * 1e6, 1),
    }


def bench(calls: int, rounds: int) -> dict[str, Any]:
    """Every variant once per round, interleaved; the median round of each is reported.

    Interleaving keeps a slow moment of a shared machine from landing on one variant only.
    """
    lock = threading.Lock()
    server = Echo()
    ctx = ToolContext("s1")

    def direct(i: int) -> Any:  # baseline 1: what a thread-safe in-process server costs
        with lock:
            return Echo.echo(server, ctx, n=i)

    ref = RawEcho.start()  # baseline 2: a raw pykka ask to a bare actor
    requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()  # baseline 3: the floor
    replies: queue.SimpleQueue[int] = queue.SimpleQueue()

    def pong() -> None:
        while (n := requests.get()) is not None:
            replies.put(n)

    ponger = threading.Thread(target=pong, daemon=True)
    ponger.start()

    def ping(i: int) -> int:
        requests.put(i)
        return replies.get()

    sink = open(os.devnull, "w")  # noqa: SIM115 - closed below
    # The JSON lines go to a real file, as a served process's do.
    log_file = tempfile.NamedTemporaryFile("w", prefix="bench-router-", suffix=".jsonl")
    # A runtime binds its logger when created: make each one under the level it measures.
    runtimes = []
    for level, out in (("warning", sink), ("warning", sink), ("info", log_file)):
        configure_logging(level=level, file=cast(TextIO, out), force=True)
        runtimes.append(Runtime([Echo]))
    runtimes[0]._early_observers.clear()  # noqa: SLF001 - the router alone, no history

    def routed(rt: Runtime) -> Callable[[int], Any]:
        args = {"n": 0, "__sessionId": "s1", "__assistantId": "a1"}

        def call(i: int) -> Any:
            args["n"] = i
            return rt.call("echo", args)

        return call

    variants: list[tuple[str, Callable[[int], Any]]] = [
        ("direct call under a lock", direct),
        ("raw pykka ask", lambda i: ref.ask({"n": i})),
        ("SimpleQueue ping-pong (hop floor)", ping),
        ("routed call, no history, log filtered", routed(runtimes[0])),
        ("routed call (history on, log filtered)", routed(runtimes[1])),
        ("routed call (history on, JSON log file)", routed(runtimes[2])),
    ]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    try:
        for _ in range(rounds):
            for name, fn in variants:
                runs[name].append(measure(name, fn, calls))
    finally:
        ref.stop()
        requests.put(None)
        for rt in runtimes:
            rt.close()
        sink.close()
        log_file.close()
    results = []
    for name, _ in variants:
        ordered = sorted(runs[name], key=lambda r: r["calls_per_s"])
        median = dict(ordered[len(ordered) // 2])
        median["rounds_calls_per_s"] = [r["calls_per_s"] for r in runs[name]]
        results.append(median)
    raw, raw_cpu = results[1]["calls_per_s"], results[1]["cpu_us"]
    for r in results:
        r["ratio_vs_raw_pykka"] = round(r["calls_per_s"] / raw, 3)
        r["cpu_ratio_vs_raw_pykka"] = round(raw_cpu / r["cpu_us"], 3)
    return {"benchmark": "router", "pinned_cpu": PINNED, "rounds": rounds, "results": results}


PINNED: int | None = None


def main() -> int:
    global PINNED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median shown)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--no-pin", action="store_true", help="don't pin to one CPU")
    args = parser.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        PINNED = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {PINNED})
    report = bench(args.calls, args.rounds)
    print(f"{args.calls} calls per variant, {args.rounds} interleaved rounds, median round shown")
    print(
        f"{'':42} {'calls/s':>9} {'p50 µs':>7} {'p99 µs':>7} {'vs pykka':>8}"
        f" {'cpu µs':>7} {'vs pykka':>8}  rounds min-max"
    )
    for r in report["results"]:
        spread = f"{min(r['rounds_calls_per_s'])}-{max(r['rounds_calls_per_s'])}"
        print(
            f"{r['name']:42} {r['calls_per_s']:>9} {r['p50_us']:>7} {r['p99_us']:>7}"
            f" {r['ratio_vs_raw_pykka']:>8} {r['cpu_us']:>7} {r['cpu_ratio_vs_raw_pykka']:>8}"
            f"  {spread}"
        )
    by_name = {r["name"]: r for r in report["results"]}
    bare, filtered, logged = (
        by_name[name]
        for name in (
            "routed call, no history, log filtered",
            "routed call (history on, log filtered)",
            "routed call (history on, JSON log file)",
        )
    )
    print()
    for label, r, target in (
        ("defaults (history, JSON line to a file)", logged, 1.0),
        ("history on, log line filtered", filtered, 1.3),
        ("router alone", bare, None),
    ):
        goal = f" (target >= {target})" if target else ""
        print(
            f"{label} / raw pykka ask: {r['ratio_vs_raw_pykka']:.2f} wall,"
            f" {r['cpu_ratio_vs_raw_pykka']:.2f} CPU{goal}"
        )
    print(
        f"the JSON line costs a call {logged['cpu_us'] - filtered['cpu_us']:.2f} µs CPU"
        f" (target <= 2), the history {filtered['cpu_us'] - bare['cpu_us']:.2f} µs"
        " (target <= 1.5; bench_history.py measures it alone)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
