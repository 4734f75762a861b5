#!/usr/bin/env python3
"""What `parallel` buys a batch: 10 operations of 100 ms on 10 keys of one session.

Measured in one run, against baselines from the same run:

- one direct call of the 100 ms tool (the floor a parallel batch can reach),
- the 10 operations as a sequential batch (about 10x that),
- the same 10 as a `parallel` batch (target: within 1.3x of the single call),
- the 10 as 10 separate direct calls one after another (what a model does without batch).

Each figure is the median of `--repeat` runs; logs are silenced so they don't count.

    python scripts/bench_batch.py [--ops 10] [--sleep-ms 100] [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.logs import configure_logging


def sleeper(n: int) -> type[Server]:
    """A server whose tool ``nap<n>`` takes a fixed time (stands in for real I/O).

    A batch's operations share its caller's context, so operations that should overlap
    need keys of their own: one such server each.
    """

    class Sleeper(Server):
        name = f"sleeper{n}"
        scope = Scope.SESSION

        @tool(name=f"nap{n}")
        def nap(self, ctx: ToolContext, ms: int) -> dict[str, Any]:
            """Sleep for `ms` milliseconds."""
            time.sleep(ms / 1000)
            return {}

    return Sleeper


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10, help="operations (one key each)")
    parser.add_argument("--sleep-ms", type=int, default=100, help="time each operation takes")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args()
    configure_logging(format="json", level="error", force=True)
    logging.disable(logging.CRITICAL)

    ops = [
        {"id": f"op{i}", "tool": f"nap{i}", "arguments": {"ms": args.sleep_ms}}
        for i in range(args.ops)
    ]
    base = {"__sessionId": "bench"}
    with Runtime(servers=[sleeper(i) for i in range(args.ops)], call_timeout=600) as rt:

        def run_batch(parallel: bool) -> None:
            options = {"parallel": parallel}
            result = rt.call("batch", {**base, "operations": ops, "options": options})
            assert not result.is_error and result.structured is not None, result.text
            assert result.structured["summary"]["successful"] == args.ops, result.text

        # Warm up: spawn every key's actor, so spawning is not what is measured.
        run_batch(parallel=True)
        single = median_ms(lambda: rt.call("nap0", {**base, "ms": args.sleep_ms}), args.repeat)

        def direct_calls() -> None:
            for i in range(args.ops):
                rt.call(f"nap{i}", {**base, "ms": args.sleep_ms})

        direct = median_ms(direct_calls, args.repeat)
        sequential = median_ms(lambda: run_batch(parallel=False), args.repeat)
        parallel = median_ms(lambda: run_batch(parallel=True), args.repeat)

    report = {
        "ops": args.ops,
        "sleep_ms": args.sleep_ms,
        "repeat": args.repeat,
        "single_call_ms": round(single, 1),
        "direct_calls_ms": round(direct, 1),
        "sequential_batch_ms": round(sequential, 1),
        "parallel_batch_ms": round(parallel, 1),
        "parallel_vs_single": round(parallel / single, 3),
        "sequential_vs_parallel": round(sequential / parallel, 2),
        "target_parallel_vs_single": 1.3,
    }
    print(f"{args.ops} operations of {args.sleep_ms} ms on {args.ops} keys of one session")
    print(f"(median of {args.repeat} runs)")
    print(f"  one direct call           {single:8.1f} ms   (baseline)")
    print(f"  {args.ops} direct calls in turn    {direct:8.1f} ms")
    print(f"  sequential batch          {sequential:8.1f} ms")
    print(f"  parallel batch            {parallel:8.1f} ms")
    print(f"  parallel / one call       {parallel / single:8.3f} x   (target <= 1.3)")
    print(f"  sequential / parallel     {sequential / parallel:8.2f} x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
