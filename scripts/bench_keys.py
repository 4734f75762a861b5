#!/usr/bin/env python3
"""Live keys at scale on the worker pool: memory per idle key, activations, reaping.

Each figure sits beside a baseline measured in the same run:

- memory per idle key (RSS after N first calls, one key each, minus the RSS before) vs the
  same N server instances held in a plain dict (the server's own state: what is left is
  what a key costs the runtime); target: at most 4 KiB beyond the server's state;
- threads while N keys are live (bounded by the pools' sizes, not by N);
- activations per second from one caller (each call a new key) vs the thread-per-key
  scheduler (``CTXACTORS_SCHEDULER=thread``) at the count it can hold; target: 20,000/s;
- one reaper pass over the N idle keys while another thread calls a live key in a loop:
  that caller's latency p50/p99 during the pass vs before it; target: p99 under 10 ms.

Every case runs in a fresh interpreter, pinned to one CPU unless ``--no-pin``.

    python scripts/bench_keys.py [--keys 1000000] [--thread-keys 10000] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
from bench_actors import Counter  # the same one-integer session server

from ctxactors import Runtime, Settings
from ctxactors.logs import configure_logging
from ctxactors.settings import ActorSettings
from ctxactors.testing import ManualClock

TARGET_BYTES = 4096
TARGET_ACTIVATIONS = 20_000
TARGET_P99_MS = 10.0


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _runtime(scheduler: str, n: int, clock: ManualClock | None = None) -> Runtime:
    settings = Settings(actors=ActorSettings(scheduler=scheduler))  # type: ignore[arg-type]
    return Runtime([Counter], settings=settings, max_actors=n + 10, ttl=60, clock=clock)


def case_baseline(n: int) -> dict[str, Any]:
    """N server instances in a dict: the servers' own state."""
    before = _rss()
    held = {("counter", (None, f"s{i}")): Counter() for i in range(n)}
    after = _rss()
    assert len(held) == n
    return {"bytes_per_key": (after - before) / n}


def case_keys(n: int, scheduler: str) -> dict[str, Any]:
    """N keys made by one caller, one first call each."""
    with _runtime(scheduler, n) as rt:
        rt.call("bump", {"__sessionId": "warm"})
        before, threads_before = _rss(), threading.active_count()
        started = time.perf_counter()
        for i in range(n):
            rt.call("bump", {"__sessionId": f"s{i}"})
        elapsed = time.perf_counter() - started
        after = _rss()
        live = rt.stats()["actors"]
        threads = threading.active_count() - threads_before
    return {
        "keys": live - 1,
        "activations_per_s": n / elapsed,
        "bytes_per_key": (after - before) / n,
        "threads_added": threads,
    }


def case_reap(n: int, scheduler: str) -> dict[str, Any]:
    """One reaper pass over N idle keys while a caller keeps calling a live key."""
    clock = ManualClock()
    with _runtime(scheduler, n, clock) as rt:
        for i in range(n):
            rt.call("bump", {"__sessionId": f"s{i}"})
        clock.advance(120)  # every key idle past its TTL
        stop = threading.Event()
        during: list[float] = []
        before: list[float] = []
        sink = before

        def caller() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                rt.call("bump", {"__sessionId": "live"})
                sink.append(time.perf_counter() - t0)
                time.sleep(0.0005)

        thread = threading.Thread(target=caller)
        thread.start()
        while len(before) < 500:
            time.sleep(0.01)
        sink = during
        started = time.perf_counter()
        reaped = rt.reap()
        elapsed = time.perf_counter() - started
        stop.set()
        thread.join()
    return {
        "reaped": reaped,
        "pass_s": elapsed,
        "before_p50_ms": _pct(before, 50),
        "before_p99_ms": _pct(before, 99),
        "during_p50_ms": _pct(during, 50),
        "during_p99_ms": _pct(during, 99),
        "calls_during": len(during),
    }


def _pct(values: list[float], p: int) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, len(ordered) * p // 100)]


CASES: dict[str, Callable[..., dict[str, Any]]] = {
    "baseline": case_baseline,
    "keys": case_keys,
    "reap": case_reap,
}


def _run(case: str, n: int, scheduler: str, pin: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--case", case, "--n", str(n), "--scheduler", scheduler]
    if not pin:
        cmd.append("--no-pin")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="live keys on the pool")
    parser.add_argument(
        "--thread-keys", type=int, default=10_000, help="keys for the thread-per-key baseline"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--no-pin", action="store_true", help="don't pin to one CPU")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1000, help=argparse.SUPPRESS)
    parser.add_argument("--scheduler", default="pool", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    configure_logging(level="warning", force=True)
    if args.case:
        fn = CASES[args.case]
        figures = fn(args.n) if args.case == "baseline" else fn(args.n, args.scheduler)
        print(json.dumps(figures))
        return 0
    pin = not args.no_pin
    n, small = args.keys, args.thread_keys
    report = {
        "servers_alone": _run("baseline", n, "pool", pin),
        "pool": _run("keys", n, "pool", pin),
        "pool_small": _run("keys", small, "pool", pin),
        "thread_small": _run("keys", small, "thread", pin),
        "pool_reap": _run("reap", n, "pool", pin),
    }
    beyond = report["pool"]["bytes_per_key"] - report["servers_alone"]["bytes_per_key"]
    print(f"live keys on the pool: {report['pool']['keys']:,}")
    print(
        f"  memory per idle key: {report['pool']['bytes_per_key']:,.0f} B; the server alone "
        f"{report['servers_alone']['bytes_per_key']:,.0f} B; beyond it {beyond:,.0f} B "
        f"(target <= {TARGET_BYTES})"
    )
    print(f"  threads added: {report['pool']['threads_added']} (bounded by the pools)")
    print(
        f"activations/s, one caller: pool {report['pool']['activations_per_s']:,.0f} "
        f"({n:,} keys), pool {report['pool_small']['activations_per_s']:,.0f} and "
        f"thread-per-key {report['thread_small']['activations_per_s']:,.0f} ({small:,} keys) "
        f"(target >= {TARGET_ACTIVATIONS:,})"
    )
    reap = report["pool_reap"]
    print(
        f"reaping {reap['reaped']:,} idle keys: {reap['pass_s']:.2f} s; a caller's latency "
        f"p50/p99 {reap['during_p50_ms']:.2f}/{reap['during_p99_ms']:.2f} ms during the pass "
        f"({reap['calls_during']} calls) vs {reap['before_p50_ms']:.2f}/"
        f"{reap['before_p99_ms']:.2f} ms before (target p99 < {TARGET_P99_MS} ms)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
