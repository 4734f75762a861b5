#!/usr/bin/env python3
"""`Runtime.acall` under concurrency: S sessions, each making C calls one after another,
all at once on one event loop (200 x 50 by default); throughput, latency and loop lag.

Loop lag is how late a 1 ms ticker wakes up meanwhile. Unpinned by default (the actors'
threads and the loop share the machine); ``--pin`` runs it on one CPU.

    python scripts/bench_acall.py [--sessions 200] [--calls 50] [--rounds 3] [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.logs import configure_logging


class Counter(Server):
    name = "counter"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.n = 0

    @tool
    def bump(self, ctx: ToolContext) -> dict[str, Any]:
        """Count one."""
        self.n += 1
        return {"n": self.n}


async def one_round(rt: Runtime, sessions: int, calls: int) -> dict[str, Any]:
    latencies: list[float] = []
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    async def session(s: int) -> None:
        args = {"__sessionId": f"s{s}"}
        for _ in range(calls):
            t0 = time.perf_counter()
            result = await rt.acall("bump", args)
            latencies.append(time.perf_counter() - t0)
            assert not result.is_error

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    await asyncio.gather(*(session(s) for s in range(sessions)))
    elapsed = time.perf_counter() - start
    done.set()
    await tick
    latencies.sort()
    lags.sort()
    total = sessions * calls
    return {
        "calls_per_s": round(total / elapsed),
        "p50_ms": round(latencies[total // 2] * 1e3, 2),
        "p99_ms": round(latencies[int(total * 0.99)] * 1e3, 2),
        "loop_lag_p50_ms": round(lags[len(lags) // 2] * 1e3, 2) if lags else None,
        "loop_lag_max_ms": round(lags[-1] * 1e3, 2) if lags else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--calls", type=int, default=50, help="calls per session")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median shown)")
    parser.add_argument("--pin", action="store_true", help="run on one CPU")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args()
    if args.pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    configure_logging(level="warning", file=open(os.devnull, "w"), force=True)  # noqa: SIM115
    rounds = []
    with Runtime([Counter], max_actors=max(args.sessions * 2, 1000)) as rt:
        asyncio.run(one_round(rt, args.sessions, 2))  # spawn the actors first
        for _ in range(args.rounds):
            rounds.append(asyncio.run(one_round(rt, args.sessions, args.calls)))
    rounds.sort(key=lambda r: r["calls_per_s"])
    median = dict(rounds[len(rounds) // 2])
    median["rounds_calls_per_s"] = [r["calls_per_s"] for r in rounds]
    median["rounds_p99_ms"] = [r["p99_ms"] for r in rounds]
    print(f"acall, {args.sessions} sessions x {args.calls} calls, median of {args.rounds}:")
    for key, value in median.items():
        print(f"  {key:22} {value}")
    print(f"  mean p99 ms            {statistics.fmean(median['rounds_p99_ms']):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "acall", **vars(args), "result": median}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
