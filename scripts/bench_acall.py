#!/usr/bin/env python3
"""`Runtime.acall` under concurrency: S sessions, each making C calls one after another,
all at once on one event loop (200 x 50 by default); throughput, latency, loop lag and CPU.

Beside it, in the same run and alternating round by round (the machine is shared and
noisy), each in a fresh process:

- ``baseline``: the same benchmark against ctxactors as it was when issue 19 was filed
  (``--baseline``, a git revision, exported with ``git archive``): the figure the issue's
  "3x today's throughput" target is measured against;
- ``floor``: 200 bare threads, each with a ``SimpleQueue`` inbox, answering one loop through
  one batched wake-up (no routing, no validation, no registry, no history): what one event
  loop and one thread per key can reach at all in this interpreter.

Loop lag is how late a 1 ms ticker wakes up meanwhile. CPU is the whole process's per call
(`time.process_time`), and the event loop thread's alone. Unpinned by default; ``--pin``
runs every process on one CPU.

``--gc-freeze`` does what a long-running host does once it has started (``ctxactors
serve`` does it): ``gc.collect(); gc.freeze()`` after the warm-up, in every variant, so the
cyclic collector's full passes no longer walk the ~30,000 objects of the imported modules.
Without it, each process is young: its first full pass (10-30 ms here, every thread
stopped) lands in the measured round, and that pause is the round's p99.

    python scripts/bench_acall.py [--sessions 200] [--calls 50] [--rounds 5] [--pin]
                                  [--gc-freeze] [--baseline e7427b3 | --baseline none]
                                  [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from bench_actors import Counter  # the same one-integer session server

# Whichever ctxactors this process finds first: a worker for the baseline runs with the
# baseline's tree ahead on PYTHONPATH (see `measure`).
import ctxactors
from ctxactors import Runtime
from ctxactors.logs import configure_logging

# main before the first change for issue 19 (merge of 'call-path'; the 'perf' branch came next).
ISSUE_BASELINE = "e7427b3"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def one_round(
    call: Callable[[int], Awaitable[None]], sessions: int, calls: int
) -> dict[str, Any]:
    """S sessions x C sequential calls of ``call(session)``, all at once on this loop."""
    latencies: list[float] = []
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    async def session(s: int) -> None:
        for _ in range(calls):
            t0 = time.perf_counter()
            await call(s)
            latencies.append(time.perf_counter() - t0)

    tick = asyncio.create_task(ticker())
    cpu0, loop_cpu0 = time.process_time(), time.thread_time()
    start = time.perf_counter()
    await asyncio.gather(*(session(s) for s in range(sessions)))
    elapsed = time.perf_counter() - start
    cpu, loop_cpu = time.process_time() - cpu0, time.thread_time() - loop_cpu0
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
        "cpu_us_per_call": round(cpu / total * 1e6, 1),
        "loop_cpu_us_per_call": round(loop_cpu / total * 1e6, 1),
    }


def settle(freeze: bool) -> None:
    """After the warm-up: with `freeze`, what is alive now stays out of the collector's
    passes (see the module docstring)."""
    if freeze:
        gc.collect()
        gc.freeze()


def run_ctxactors(sessions: int, calls: int, freeze: bool = False) -> dict[str, Any]:
    """One round against whichever ctxactors this process imports (see `measure`)."""
    configure_logging(level="warning", file=open(os.devnull, "w"), force=True)  # noqa: SIM115
    arguments = [{"__sessionId": f"s{s}"} for s in range(sessions)]
    with Runtime([Counter], max_actors=max(sessions * 2, 1000)) as rt:

        async def call(s: int) -> None:
            result = await rt.acall("bump", arguments[s])
            assert not result.is_error, result

        asyncio.run(one_round(call, sessions, 2))  # spawn the actors first
        settle(freeze)
        figures = asyncio.run(one_round(call, sessions, calls))
    figures["package"] = os.path.dirname(ctxactors.__file__)
    return figures


def run_floor(sessions: int, calls: int, freeze: bool = False) -> dict[str, Any]:
    """One round of the floor: bare threads and one batched reply queue, nothing else."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        pending: deque[tuple[asyncio.Future[int], int]] = deque()
        scheduled = [False]

        def drain() -> None:
            scheduled[0] = False
            while pending:
                future, value = pending.popleft()
                future.set_result(value)

        def worker(inbox: queue.SimpleQueue[asyncio.Future[int] | None]) -> None:
            n = 0
            while (future := inbox.get()) is not None:
                n += 1
                pending.append((future, n))
                if not scheduled[0]:
                    scheduled[0] = True
                    loop.call_soon_threadsafe(drain)

        inboxes: list[queue.SimpleQueue[asyncio.Future[int] | None]] = [
            queue.SimpleQueue() for _ in range(sessions)
        ]
        for inbox in inboxes:
            threading.Thread(target=worker, args=(inbox,), daemon=True).start()

        async def call(s: int) -> None:
            future = loop.create_future()
            inboxes[s].put(future)
            await future

        await one_round(call, sessions, 2)
        settle(freeze)
        figures = await one_round(call, sessions, calls)
        for inbox in inboxes:
            inbox.put(None)
        return figures

    return asyncio.run(main())


def export_baseline(rev: str, into: str) -> str | None:
    """Put ``ctxactors/`` as it was at `rev` under `into`; None, or why it could not."""
    try:
        archive = subprocess.run(
            ["git", "-C", ROOT, "archive", rev, "ctxactors"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        stderr = getattr(exc, "stderr", b"") or b""
        return f"{exc} {stderr.decode(errors='replace').strip()}"
    return None


def measure(variant: str, args: argparse.Namespace, pythonpath: str | None) -> dict[str, Any]:
    """One round of `variant` in a fresh process (so no variant inherits another's threads)."""
    env = dict(os.environ)
    if pythonpath is not None:  # ahead of the editable install of the working tree
        env["PYTHONPATH"] = pythonpath
    command = [sys.executable, __file__, "--worker", variant]
    command += ["--sessions", str(args.sessions), "--calls", str(args.calls)]
    if args.pin:
        command.append("--pin")
    if args.gc_freeze:
        command.append("--gc-freeze")
    out = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    figures: dict[str, Any] = json.loads(out)
    return figures


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round of median throughput, with every round's throughput and p99 beside it."""
    ordered = sorted(rounds, key=lambda r: r["calls_per_s"])
    median = dict(ordered[len(ordered) // 2])
    median["rounds_calls_per_s"] = [r["calls_per_s"] for r in rounds]
    median["rounds_p99_ms"] = [r["p99_ms"] for r in rounds]
    median["rounds_loop_lag_p50_ms"] = [r["loop_lag_p50_ms"] for r in rounds]
    return median


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--calls", type=int, default=50, help="calls per session")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per variant (median shown)")
    parser.add_argument("--pin", action="store_true", help="run on one CPU")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after the warm-up, as serve does"
    )
    parser.add_argument(
        "--baseline",
        default=ISSUE_BASELINE,
        help="git revision to compare with, or 'none' (default: main when issue 19 was filed)",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the bare-threads floor")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--worker", choices=["ctxactors", "floor"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if args.worker is not None:
        run = run_ctxactors if args.worker == "ctxactors" else run_floor
        print(json.dumps(run(args.sessions, args.calls, args.gc_freeze)))
        return 0

    with tempfile.TemporaryDirectory(prefix="bench-acall-") as tmp:
        variants: dict[str, tuple[str, str | None]] = {"ctxactors": ("ctxactors", None)}
        if args.baseline != "none":
            failed = export_baseline(args.baseline, tmp)
            if failed is None:
                variants["baseline"] = ("ctxactors", tmp)
            else:
                print(f"baseline {args.baseline} unavailable: {failed}", file=sys.stderr)
        if not args.no_floor:
            variants["floor"] = ("floor", None)
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (worker, pythonpath) in variants.items():
                rounds[name].append(measure(worker, args, pythonpath))
    results = {name: summary(r) for name, r in rounds.items()}
    filed = ", issue 19 filed" if args.baseline == ISSUE_BASELINE else ""
    label = {"baseline": f"baseline ({args.baseline}{filed})", "floor": "floor (bare threads)"}
    print(
        f"acall, {args.sessions} sessions x {args.calls} calls, "
        f"{'pinned to one CPU' if args.pin else 'unpinned'}, "
        f"{'gc.freeze() after the warm-up, ' if args.gc_freeze else ''}"
        f"median of {args.rounds} alternating rounds:"
    )
    for name, figures in results.items():
        print(f" {label.get(name, name)}:")
        for key, value in figures.items():
            if key != "package":
                print(f"   {key:24} {value}")
    if "baseline" in results:
        ratios = [
            now["calls_per_s"] / then["calls_per_s"]
            for now, then in zip(rounds["ctxactors"], rounds["baseline"], strict=True)
        ]
        ratio = results["ctxactors"]["calls_per_s"] / results["baseline"]["calls_per_s"]
        print(f" throughput vs baseline: {ratio:.2f}x (medians); per round {_fmt(ratios)}")
        print(f"   median of per-round ratios {statistics.median(ratios):.2f}x")
        cpu = results["baseline"]["cpu_us_per_call"] / results["ctxactors"]["cpu_us_per_call"]
        print(
            f" CPU per call vs baseline: {cpu:.2f}x less (the figure load on the machine moves least)"
        )
    if "floor" in results:
        share = results["ctxactors"]["calls_per_s"] / results["floor"]["calls_per_s"]
        cpu = results["floor"]["cpu_us_per_call"] / results["ctxactors"]["cpu_us_per_call"]
        print(f" throughput vs floor: {share:.2f}x, CPU per call vs floor: {cpu:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "acall", **vars(args), "results": results}, f, indent=2)
    return 0


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


if __name__ == "__main__":
    sys.exit(main())
