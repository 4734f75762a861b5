#!/usr/bin/env python3
"""Router overhead: routed `Runtime.call` vs a raw pykka `ask` vs a direct call under a lock.

All three run in one process, one after another, pinned to one CPU (cross-CPU wake-ups
otherwise dominate and the ratios swing from run to run). The routed call does everything a
real call does: parse and strip the context, validate with msgspec, look up the key, hand
the call to the key's actor and wait for the reply, and the session's operation history
records it. Per-call log lines are measured both filtered out (level warning) and written as
JSON (level info, to /dev/null); the router alone is measured with the history's observer
detached (the target applies to it; `bench_history.py` measures the history's own cost).

    python scripts/bench_router.py [--calls 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

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
    t_start = perf()
    for i in range(calls):
        t0 = perf()
        fn(i)
        samples.append(perf() - t0)
    total = perf() - t_start
    samples.sort()
    return {
        "name": name,
        "calls": calls,
        "calls_per_s": round(calls / total),
        "p50_us": round(samples[len(samples) // 2] * 1e6, 1),
        "p99_us": round(samples[int(len(samples) * 0.99)] * 1e6, 1),
        "mean_us": round(statistics.fmean(samples) * 1e6, 1),
    }


def bench(calls: int) -> dict[str, Any]:
    results = []
    # Baseline 1: a direct call under a lock (what a thread-safe in-process server costs).
    lock = threading.Lock()
    server = Echo()
    ctx = ToolContext("s1")

    def direct(i: int) -> Any:
        with lock:
            return Echo.echo(server, ctx, n=i)

    results.append(measure("direct call under a lock", direct, calls))

    # Baseline 2: a raw pykka ask to a bare actor.
    ref = RawEcho.start()
    try:
        results.append(measure("raw pykka ask", lambda i: ref.ask({"n": i}), calls))
    finally:
        ref.stop()

    for level, history, label in (
        ("warning", False, "routed call, no history, log filtered"),
        ("warning", True, "routed call (history on, log filtered)"),
        ("info", True, "routed call (history on, JSON call log)"),
    ):
        with open(os.devnull, "w") as sink:
            configure_logging(level=level, file=sink, force=True)
            with Runtime([Echo]) as rt:
                if not history:
                    rt._early_observers.clear()  # noqa: SLF001 - the router alone
                args = {"n": 0, "__sessionId": "s1", "__assistantId": "a1"}

                def routed(i: int, rt: Runtime = rt, args: dict[str, Any] = args) -> Any:
                    args["n"] = i
                    return rt.call("echo", args)

                results.append(measure(label, routed, calls))
    raw = results[1]["calls_per_s"]
    for r in results:
        r["ratio_vs_raw_pykka"] = round(r["calls_per_s"] / raw, 3)
    return {"benchmark": "router", "pinned_cpu": PINNED, "results": results}


PINNED: int | None = None


def main() -> int:
    global PINNED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--no-pin", action="store_true", help="don't pin to one CPU")
    args = parser.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        PINNED = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {PINNED})
    report = bench(args.calls)
    print(f"{'':42} {'calls/s':>9} {'p50 µs':>8} {'p99 µs':>8} {'vs pykka':>9}")
    for r in report["results"]:
        print(
            f"{r['name']:42} {r['calls_per_s']:>9} {r['p50_us']:>8} {r['p99_us']:>8} {r['ratio_vs_raw_pykka']:>9}"
        )
    router, default = (report["results"][i]["ratio_vs_raw_pykka"] for i in (2, 3))
    print(f"\nrouter alone / raw pykka ask = {router:.2f} (target >= 0.8)")
    print(f"routed call with history (the default) / raw pykka ask = {default:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
