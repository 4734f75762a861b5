#!/usr/bin/env python3
"""Live session actors at scale: spawn time, memory per idle actor, a reaper pass, loop lag.

Each figure sits beside a baseline measured in the same run:

- spawn N session actors through `Runtime.call` (one first call per session) vs starting N
  bare pykka actors and asking each once;
- RSS per idle actor (psutil, after spawning N) vs a bare pykka actor and a bare thread;
  target: at most 40 KB per idle session actor;
- one reaper pass over 10,000 idle actors (`Runtime.reap`, manual clock) vs telling 10,000
  bare pykka actors to stop;
- event-loop lag (how late a 1 ms ticker wakes up) during 1,000 concurrent `acall`s vs an
  idle loop, vs launching 1,000 trivial tasks at once (what `gather` itself costs), and vs
  the same 1,000 calls bridged with ``run_in_executor``. `acall` never waits in the loop,
  but each call's routing (parse, validate, hand to the actor) does run in it: launching
  1,000 at once shows up as one long loop iteration.

Every memory case runs in a fresh interpreter so one case's freed memory can't flatter the
next. The process is pinned to one CPU unless ``--no-pin`` (cross-CPU wake-ups otherwise
dominate and the ratios swing from run to run).

    python scripts/bench_actors.py [--sizes 1000,10000] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import pykka

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.logs import configure_logging

TARGET_KB = 40


class Counter(Server):
    """The smallest useful session server: one integer of state."""

    name = "counter"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.n = 0

    @tool
    def bump(self, ctx: ToolContext) -> dict[str, Any]:
        """Add one."""
        self.n += 1
        return {"n": self.n}


class Bare(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return message


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rss() -> int:
    gc.collect()
    time.sleep(0.2)  # let just-started threads reach their idle wait
    return int(psutil.Process().memory_info().rss)


# -- cases (each runs in its own interpreter) ----------------------------------------------


def case_runtime(n: int) -> dict[str, Any]:
    before = rss()
    clock = Clock()
    rt = Runtime([Counter], ttl=60.0, max_actors=n + 10, clock=clock)
    started = time.perf_counter()
    for i in range(n):
        rt.call("bump", {"__sessionId": f"s{i}"})
    spawn = time.perf_counter() - started
    after = rss()
    live = rt.stats()["actors"]
    clock.now += 120.0
    started = time.perf_counter()
    reaped = rt.reap()
    reap = time.perf_counter() - started
    started = time.perf_counter()
    rt.close()
    drained = time.perf_counter() - started
    return {
        "spawn_s": spawn,
        # per live actor: servers every runtime has (history, say) may add their own actors
        "rss_per_actor_kb": (after - before) / live / 1024,
        "rss_per_session_kb": (after - before) / n / 1024,
        "live": live,
        "reap_pass_s": reap,
        "reaped": reaped,
        "stopped_all_s": drained,
    }


def case_pykka(n: int) -> dict[str, Any]:
    before = rss()
    started = time.perf_counter()
    refs = [Bare.start() for _ in range(n)]
    for ref in refs:
        ref.ask(1)
    spawn = time.perf_counter() - started
    after = rss()
    started = time.perf_counter()
    for ref in refs:
        ref.stop(block=False)
    stop = time.perf_counter() - started
    pykka.ActorRegistry.stop_all()
    return {"spawn_s": spawn, "rss_per_actor_kb": (after - before) / n / 1024, "stop_tell_s": stop}


def case_thread(n: int) -> dict[str, Any]:
    before = rss()
    gate = threading.Event()
    threads = [threading.Thread(target=gate.wait, daemon=True) for _ in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    spawn = time.perf_counter() - started
    after = rss()
    gate.set()
    return {"spawn_s": spawn, "rss_per_actor_kb": (after - before) / n / 1024}


async def _lag_during(work: Any, tick: float = 0.001) -> dict[str, float]:
    """Run `work()` while a ticker measures how late each 1 ms sleep wakes up."""
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            t0 = loop.time()
            await asyncio.sleep(tick)
            lags.append(loop.time() - t0 - tick)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await work()
    elapsed = time.perf_counter() - started
    done.set()
    await task
    lags.sort()
    return {
        "work_s": elapsed,
        "lag_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1000 if lags else 0.0,
        "lag_max_ms": lags[-1] * 1000 if lags else 0.0,
        "ticks": len(lags),
    }


def case_loop_lag(calls: int) -> dict[str, Any]:
    with Runtime([Counter]) as rt:
        for s in range(100):  # spawn first: measure calls, not spawns
            rt.call("bump", {"__sessionId": f"s{s}"})
        args = [{"__sessionId": f"s{i % 100}"} for i in range(calls)]

        async def idle() -> None:
            await asyncio.sleep(0.2)

        async def trivial() -> None:  # the cost of launching 1,000 tasks at once, alone
            loop = asyncio.get_running_loop()

            async def one() -> None:
                future = loop.create_future()
                loop.call_soon(future.set_result, None)
                await future

            await asyncio.gather(*(one() for _ in args))

        async def acalls() -> None:
            await asyncio.gather(*(rt.acall("bump", a) for a in args))

        async def executor() -> None:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(None, rt.call, "bump", a) for a in args))

        async def all_three() -> dict[str, Any]:
            return {
                "idle_loop": await _lag_during(idle),
                "trivial_tasks": await _lag_during(trivial),
                "acall": await _lag_during(acalls),
                "run_in_executor": await _lag_during(executor),
            }

        return asyncio.run(all_three())


CASES = {"runtime": case_runtime, "pykka": case_pykka, "thread": case_thread, "loop": case_loop_lag}


def run_case(name: str, n: int, pin: bool) -> dict[str, Any]:
    """One case in a fresh interpreter (this script with --case)."""
    cmd = [sys.executable, __file__, "--case", name, "--n", str(n)]
    if not pin:
        cmd.append("--no-pin")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"case {name} (n={n}) failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench(sizes: list[int], lag_calls: int, pin: bool) -> dict[str, Any]:
    scale = []
    for n in sizes:
        rt, bare, thread = (run_case(c, n, pin) for c in ("runtime", "pykka", "thread"))
        scale.append({"actors": n, "ctxactors": rt, "bare_pykka": bare, "bare_thread": thread})
    lag = run_case("loop", lag_calls, pin)
    return {"benchmark": "actors", "scale": scale, "loop_lag": {"calls": lag_calls, **lag}}


def print_report(report: dict[str, Any]) -> None:
    print(f"{'live session actors':34} {'ctxactors':>12} {'bare pykka':>12} {'bare thread':>12}")
    for row in report["scale"]:
        rt, bare, th = row["ctxactors"], row["bare_pykka"], row["bare_thread"]
        n = row["actors"]
        print(
            f"{f'spawn {n:,} (s)':34} {rt['spawn_s']:>12.3f} {bare['spawn_s']:>12.3f} {th['spawn_s']:>12.3f}"
        )
        print(
            f"{f'RSS per idle actor, {n:,} (KB)':34} {rt['rss_per_actor_kb']:>12.1f}"
            f" {bare['rss_per_actor_kb']:>12.1f} {th['rss_per_actor_kb']:>12.1f}"
        )
        print(
            f"{f'reaper pass over {n:,} idle (ms)':34} {rt['reap_pass_s'] * 1000:>12.1f}"
            f" {bare['stop_tell_s'] * 1000:>12.1f} {'':>12}   (baseline: tell each bare actor to stop)"
        )
        verdict = "ok" if rt["rss_per_actor_kb"] <= TARGET_KB else "OVER TARGET"
        print(f"{'':34} target <= {TARGET_KB} KB per idle actor: {verdict}")
    lag = report["loop_lag"]
    print(f"\nevent-loop lag during {lag['calls']:,} concurrent calls (1 ms ticker)")
    print(f"{'':34} {'work (ms)':>12} {'lag p99 ms':>12} {'lag max ms':>12}")
    for key, label in (
        ("idle_loop", "idle loop (baseline)"),
        ("trivial_tasks", "1,000 trivial tasks (baseline)"),
        ("acall", "Runtime.acall"),
        ("run_in_executor", "run_in_executor(rt.call)"),
    ):
        r = lag[key]
        print(
            f"{label:34} {r['work_s'] * 1000:>12.1f} {r['lag_p99_ms']:>12.2f} {r['lag_max_ms']:>12.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="live actor counts to measure")
    parser.add_argument("--lag-calls", type=int, default=1000, help="concurrent acalls")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--no-pin", action="store_true", help="don't pin to one CPU")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    pin = not args.no_pin and hasattr(os, "sched_setaffinity")
    if pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if args.case:
        configure_logging(level="warning", force=True)
        print(json.dumps(CASES[args.case](args.n)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    report = bench(sizes, args.lag_calls, pin)
    report["pinned_cpu"] = min(os.sched_getaffinity(0)) if pin else None
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
