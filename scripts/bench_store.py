#!/usr/bin/env python3
"""Routed call cost with no store, the SQLite store and the Redis store, side by side.

One workload for all: each session's planning key holds a goal and 10 todos (about 0.6 KB
of msgpack), and every measured call is a ``mark_todo`` that flips one todo, so every call
changes state and must be saved before its reply (and the session's history is written
behind it: a run's time includes writing what its calls left behind). Run as a single stream (one session, one call at a time) and as 32 concurrent
sessions (32 threads, one session each), so group commit can batch saves. Also measured:
the time to restart a runtime on a SQLite file holding 10,000 sessions and answer a first
call (state is loaded lazily, per key, on its first call).

Redis runs as Debian's ``redis-server`` with ``--appendfsync always`` on a free port. The
process is pinned to one CPU by default (`--no-pin` to use every CPU).

Every configuration runs `--rounds` times (3), the rounds taken in turn (no store, SQLite,
Redis, again), and the run of median throughput is reported: the machine is shared, and a
short run's figures move with the scheduler's turns.

    python scripts/bench_store.py [--calls 10000] [--single-calls 2000] [--sessions 32]
        [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from state_support import redis_server  # noqa: E402 - the tests' real redis-server helper

from ctxactors import Runtime  # noqa: E402
from ctxactors.logs import configure_logging  # noqa: E402
from ctxactors.servers import Content, Planning  # noqa: E402
from ctxactors.state import RedisStore, SQLiteStore, StateStore, Write  # noqa: E402

TODOS = 10


def ctx(session: str) -> dict[str, Any]:
    return {"__sessionId": session, "__assistantId": "a1"}


def prepare(rt: Runtime, sessions: list[str]) -> None:
    for s in sessions:
        rt.call("create_goal", {"goal": "ship the release", **ctx(s)})
        for i in range(TODOS):
            rt.call("add_todo", {"name": f"step {i} of the release", "goal_id": "g1", **ctx(s)})


def stream(rt: Runtime, session: str, calls: int, latencies: list[float]) -> None:
    args = ctx(session)
    for i in range(calls):
        args["todo_id"] = f"t{2 + i % TODOS}"
        args["done"] = bool((i // TODOS) % 2 == 0)
        started = time.perf_counter()
        result = rt.call("mark_todo", args)
        latencies.append(time.perf_counter() - started)
        if result.is_error:
            raise RuntimeError(result.text)


def measure(rt: Runtime, label: str, sessions: int, calls: int) -> dict[str, Any]:
    names = [f"{label}-{sessions}-{i}" for i in range(sessions)]
    prepare(rt, names)
    per_thread = max(calls // sessions, TODOS)
    latencies: list[list[float]] = [[] for _ in names]
    durability = rt.durability
    commit = durability.commit if durability is not None else None
    saves, batches = (commit.saves, commit.batches) if commit is not None else (0, 0)
    threads = [
        threading.Thread(target=stream, args=(rt, s, per_thread, latencies[i]))
        for i, s in enumerate(names)
    ]
    started, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if durability is not None:
        durability.flush()  # what the calls left to write behind them (their history) counts
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    flat = sorted(x for lat in latencies for x in lat)
    # Saves per transaction in the measured calls only (with the history writes).
    grouping = (
        round((commit.saves - saves) / (commit.batches - batches), 1)
        if commit is not None and commit.batches > batches
        else None
    )
    return {
        "store": label,
        "sessions": sessions,
        "calls": len(flat),
        "calls_per_s": round(len(flat) / elapsed),
        # This process's CPU time per call: what the calls cost, whatever else the machine
        # runs (wall-clock throughput on a shared CPU also counts other processes' turns).
        "cpu_us": round(cpu / len(flat) * 1e6, 1),
        "p50_us": round(statistics.median(flat) * 1e6, 1),
        "p99_us": round(flat[int(len(flat) * 0.99) - 1] * 1e6, 1),
        "saves_per_write": grouping,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median throughput (the machine is shared: one slow or fast turn of the
    scheduler moves a short run's figures; every configuration got the same turns)."""
    ordered = sorted(runs, key=lambda r: r["calls_per_s"])
    return {**ordered[len(ordered) // 2], "rounds": len(runs)}


@contextmanager
def stores(directory: Path) -> Iterator[list[tuple[str, Callable[[], StateStore | None]]]]:
    (directory / "redis").mkdir()
    with redis_server(directory / "redis") as redis:
        yield [
            ("none", lambda: None),
            ("sqlite", lambda: SQLiteStore(directory / f"bench-{time.monotonic_ns()}.db")),
            ("redis", lambda: RedisStore(redis.url, prefix=f"bench{time.monotonic_ns()}")),
        ]


def restart_time(directory: Path, sessions: int) -> dict[str, Any]:
    """Fill a SQLite store with `sessions` planning states, then time a restart."""
    path = directory / "restart.db"
    store = SQLiteStore(path)
    with Runtime([Planning], store=store) as rt:
        prepare(rt, ["template"])
    record = store.load((None, "template"), ("planning", "a1", None))
    assert record is not None
    for start in range(0, sessions, 1000):
        batch = [
            Write((None, f"s{i}"), ("planning", "a1", None), record.data, 0)
            for i in range(start, min(start + 1000, sessions))
        ]
        store.write(batch)
    store.close()
    started = time.perf_counter()
    store = SQLiteStore(path)
    with Runtime([Planning], store=store) as rt:
        ready = time.perf_counter() - started
        first = rt.call("get_planning_state", ctx(f"s{sessions - 1}"))
        answered = time.perf_counter() - started
        assert len((first.structured or {})["todos"]) == TODOS
    store.close()
    return {
        "stored_sessions": sessions,
        "runtime_ready_ms": round(ready * 1000, 2),
        "first_call_answered_ms": round(answered * 1000, 2),
    }


def content_cost(directory: Path, sizes: tuple[int, ...] = (100, 1000)) -> list[dict[str, Any]]:
    """An ``add_content`` of 4 KiB when the session already holds N such documents (each
    document is its own part of the key, so the cost should not follow N)."""
    text = ("lorem ipsum dolor sit amet " * 160)[:4096]
    rows = []
    for label, store in (("none", None), ("sqlite", SQLiteStore(directory / "content.db"))):
        with Runtime([Content], store=store) as rt:
            for n in sizes:
                session = {"__sessionId": f"content-{label}-{n}"}
                for i in range(n):
                    rt.call("add_content", {"filename": f"f{i}", "content": text, **session})
                started = time.perf_counter()
                for i in range(20):
                    rt.call("add_content", {"filename": f"x{i}", "content": text, **session})
                per_call = (time.perf_counter() - started) / 20
                rows.append({"store": label, "documents": n, "add_us": round(per_call * 1e6)})
        if store is not None:
            store.close()
    return rows


def content_restart(directory: Path, documents: int = 1000) -> dict[str, Any]:
    """A session holding `documents` documents of 4 KiB, after a restart: the time to its
    first call (which loads the documents) and to its first search (which needs the index)."""
    text = ("lorem ipsum dolor sit amet " * 160)[:4096]
    path = directory / "content-restart.db"
    session = {"__sessionId": "content-restart"}
    store = SQLiteStore(path)
    with Runtime([Content], store=store) as rt:
        for i in range(documents):
            rt.call("add_content", {"filename": f"f{i}", "content": f"doc{i} {text}", **session})
    store.close()
    store = SQLiteStore(path)
    with Runtime([Content], store=store) as rt:
        started = time.perf_counter()
        listed = rt.call("list_content", session)
        first = time.perf_counter() - started
        found = rt.call("search_content", {"query": f"doc{documents - 1}", **session})
        search = time.perf_counter() - started - first
        assert (listed.structured or {})["count"] > 0 and (found.structured or {})["count"] == 1
        started = time.perf_counter()
        rt.call("search_content", {"query": "doc7", **session})
        again = time.perf_counter() - started
    store.close()
    return {
        "documents": documents,
        "first_call_ms": round(first * 1000, 1),
        "first_search_ms": round(search * 1000, 1),
        "next_search_ms": round(again * 1000, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", type=int, default=10_000, help="measured calls per run of the sessions"
    )
    parser.add_argument(
        "--single-calls",
        type=int,
        default=2000,
        help="measured calls per single-stream run (Redis fsyncs every one of them)",
    )
    parser.add_argument("--sessions", type=int, default=32, help="concurrent sessions")
    parser.add_argument("--stored", type=int, default=10_000, help="sessions for the restart")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--no-pin", action="store_true", help="don't pin to one CPU")
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of every configuration, taken in turn"
    )
    args = parser.parse_args()
    sink = open(os.devnull, "w")  # noqa: SIM115 - closed below
    configure_logging(level="warning", file=sink, force=True)
    pinned = None
    with tempfile.TemporaryDirectory() as tmp, stores(Path(tmp)) as choices:
        # Pinned after redis-server started, so it keeps every CPU (as a real one would).
        if not args.no_pin and hasattr(os, "sched_setaffinity"):
            pinned = min(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {pinned})
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for round_ in range(args.rounds):
            for label, make in choices:
                for sessions in (1, args.sessions):
                    store = make()
                    with Runtime([Planning], store=store, max_actors=10_000) as rt:
                        calls = args.single_calls if sessions == 1 else args.calls
                        run = measure(rt, f"{label}{round_}", sessions, calls)
                    runs.setdefault((label, sessions), []).append({**run, "store": label})
                    if store is not None:
                        store.close()
        results = [median_run(r) for r in runs.values()]
        restart = restart_time(Path(tmp), args.stored)
        content = content_cost(Path(tmp))
        reload = content_restart(Path(tmp))
    sink.close()
    base = {r["sessions"]: r["calls_per_s"] for r in results if r["store"] == "none"}
    base_cpu = {r["sessions"]: r["cpu_us"] for r in results if r["store"] == "none"}
    for r in results:
        r["vs_no_store"] = round(r["calls_per_s"] / base[r["sessions"]], 3)
        r["cpu_vs_no_store"] = round(base_cpu[r["sessions"]] / r["cpu_us"], 3)
    print(f"mark_todo, every call saved before its reply; pinned to CPU {pinned}")
    print(
        f"{'store':8} {'sessions':>8} {'calls/s':>9} {'p50 µs':>9} {'p99 µs':>9} "
        f"{'vs none':>8} {'CPU µs':>8} {'CPU vs none':>11} {'saves/write':>11}"
    )
    for r in results:
        print(
            f"{r['store']:8} {r['sessions']:>8} {r['calls_per_s']:>9} {r['p50_us']:>9} "
            f"{r['p99_us']:>9} {r['vs_no_store']:>8} {r['cpu_us']:>8} "
            f"{r['cpu_vs_no_store']:>11} {r['saves_per_write'] or '-':>11}"
        )
    print(
        f"\nrestart on a SQLite store of {restart['stored_sessions']} sessions: runtime ready "
        f"in {restart['runtime_ready_ms']} ms, first call answered at "
        f"{restart['first_call_answered_ms']} ms"
    )
    for row in content:
        print(
            f"add_content of 4 KiB beside {row['documents']} documents, store "
            f"{row['store']}: {row['add_us']} µs"
        )
    print(
        f"content after a restart, {reload['documents']} documents of 4 KiB: first call "
        f"{reload['first_call_ms']} ms, then first search {reload['first_search_ms']} ms, "
        f"next search {reload['next_search_ms']} ms"
    )
    if args.json:
        report = {"benchmark": "store", "results": results, "restart": restart}
        with open(args.json, "w") as f:
            json.dump({**report, "content": content, "content_restart": reload}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
