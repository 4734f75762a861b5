#!/usr/bin/env python3
"""The Ray backend beside the embedded runtime, on one workload, one run.

Each session's planning key holds a goal and 10 todos; every measured call is a
``mark_todo`` that flips one todo, so every call changes state and is saved to Redis
before its reply. Measured, for a single stream (one session) and 32 concurrent sessions
(asyncio, ``acall``): throughput and p50/p99 latency of

- the embedded runtime with the Redis store (this process);
- the Ray backend, 2 shards on a cluster with 1 worker node, then with 2 worker nodes;
- one Ray actor per key (the naive design: a process per key, no store), fewer sessions;

and the memory a live key costs in a shard (RSS growth of the shard process over 2,000
new keys) against a Ray actor per key (the RSS of one such process). The cluster is
``ray.cluster_utils.Cluster`` on this machine (a head and worker nodes) and Redis is
Debian's ``redis-server`` with ``--appendfsync always``; the numbers on a shared 2-core
machine say more about the ratios than about a real deployment.

    python scripts/bench_ray.py [--calls 1200] [--keys 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ray_support import ray_cluster  # noqa: E402 - the tests' cluster and Redis helpers

from ctxactors import Runtime  # noqa: E402
from ctxactors.logs import configure_logging  # noqa: E402
from ctxactors.ray import RayBackend, owner  # noqa: E402
from ctxactors.servers import Planning  # noqa: E402
from ctxactors.state import RedisStore  # noqa: E402

TODOS = 10
SHARD_OPTIONS = {"resources": {"ctxactors_shard": 1}}


def ctx(session: str) -> dict[str, Any]:
    return {"__sessionId": session, "__assistantId": "a1"}


async def prepare(rt: Runtime, sessions: list[str]) -> None:
    async def one(s: str) -> None:
        await rt.acall("create_goal", {"goal": "ship the release", **ctx(s)})
        for i in range(TODOS):
            await rt.acall("add_todo", {"name": f"step {i}", "goal_id": "g1", **ctx(s)})

    await asyncio.gather(*(one(s) for s in sessions))


async def stream(call: Any, session: str, calls: int, latencies: list[float]) -> None:
    for i in range(calls):
        args = {"todo_id": f"t{2 + i % TODOS}", "done": (i // TODOS) % 2 == 0, **ctx(session)}
        started = time.perf_counter()
        result = await call("mark_todo", args)
        latencies.append(time.perf_counter() - started)
        if result.is_error:
            raise RuntimeError(result.text)


def summary(latencies: list[float], elapsed: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "calls_per_s": round(len(ordered) / elapsed),
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 3),
    }


async def measure(call: Any, label: str, sessions: int, calls: int) -> dict[str, float]:
    names = [f"{label}-{sessions}-{i}" for i in range(sessions)]
    latencies: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(stream(call, s, max(calls // sessions, TODOS), latencies) for s in names)
    )
    return summary(latencies, time.perf_counter() - started)


async def both(rt: Runtime, label: str, calls: int, sessions: int) -> dict[str, Any]:
    await prepare(rt, [f"{label}-1-0", *(f"{label}-{sessions}-{i}" for i in range(sessions))])
    return {
        "single": await measure(rt.acall, label, 1, calls // 4),
        f"concurrent_{sessions}": await measure(rt.acall, label, sessions, calls),
    }


def shard_rss(backend: RayBackend, shard: int) -> int:
    import psutil

    stats = {s["shard"]: s for s in backend.shard_stats()}
    return int(psutil.Process(stats[shard]["pid"]).memory_info().rss)


async def key_cost(rt: Runtime, backend: RayBackend, keys: int) -> dict[str, float]:
    """RSS growth of shard 0 over `keys` new live keys (one planning key per session)."""
    sessions: list[str] = []
    i = 0
    while len(sessions) < keys:
        if owner((None, f"mem-{i}"), backend.count) == 0:
            sessions.append(f"mem-{i}")
        i += 1
    before = shard_rss(backend, 0)
    for start in range(0, keys, 200):
        await asyncio.gather(
            *(
                rt.acall("create_goal", {"goal": "g", **ctx(s)})
                for s in sessions[start : start + 200]
            )
        )
    after = shard_rss(backend, 0)
    return {"keys": keys, "bytes_per_key": round((after - before) / keys)}


class NaiveKey:
    """One Ray actor (a process) per key: the grain the issue warns against."""

    def __init__(self) -> None:
        self.server = Planning()

    def call(self, tool: str, args: dict[str, Any]) -> Any:
        from ctxactors.context import ToolContext, clean_args

        return getattr(self.server, tool)(ToolContext.from_args(args), **clean_args(args))

    def rss(self) -> int:
        import psutil

        return int(psutil.Process().memory_info().rss)


async def naive(sessions: int, calls: int) -> dict[str, Any]:
    import ray

    from ctxactors.results import ToolResult

    actor: Any = ray.remote(NaiveKey)
    handles: dict[str, Any] = {
        f"naive-{i}": actor.options(num_cpus=0, resources={"ctxactors_shard": 1}).remote()
        for i in range(sessions)
    }
    names = list(handles)

    async def call(tool: str, args: dict[str, Any]) -> ToolResult:
        return ToolResult.ok(await handles[args["__sessionId"]].call.remote(tool, args))

    for s in names:
        await call("create_goal", {"goal": "ship", **ctx(s)})
        for i in range(TODOS):
            await call("add_todo", {"name": f"step {i}", "goal_id": "g1", **ctx(s)})
    latencies: list[float] = []
    started = time.perf_counter()
    per = max(calls // sessions, TODOS)
    await asyncio.gather(*(stream(call, s, per, latencies) for s in names))
    result = {
        f"concurrent_{sessions}": summary(latencies, time.perf_counter() - started),
        "rss_per_key_bytes": await handles[names[0]].rss.remote(),
    }
    for handle in handles.values():
        ray.kill(handle)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1200)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--keys", type=int, default=2000, help="live keys for the memory figure")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    os.environ["CTXACTORS_LOG_LEVEL"] = "warning"  # here and in the shards: no line per call
    configure_logging()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, ray_cluster(Path(tmp), workers=1) as cluster:
        report["cluster_start_s"] = round(cluster.started_s, 2)
        store = RedisStore(cluster.redis.url)
        with Runtime(store=store) as rt:
            report["embedded_redis"] = asyncio.run(both(rt, "emb", args.calls, args.sessions))
        store.close()
        for workers in (1, 2):
            if workers == 2:
                cluster.add_worker()
            backend = RayBackend(
                cluster.cluster.address,
                shards=2,
                store=cluster.redis.url,
                namespace=cluster.namespace(),
                shard_options=SHARD_OPTIONS,
            )
            started = time.perf_counter()
            rt = Runtime(backend=backend)
            rt.call("get_planning_state", {"__sessionId": "warm-0"})
            rt.call("get_planning_state", {"__sessionId": "warm-1"})
            label = f"ray_{workers}_worker_nodes"
            report[label] = {"shards_ready_s": round(time.perf_counter() - started, 2)}
            report[label].update(asyncio.run(both(rt, f"r{workers}", args.calls, args.sessions)))
            if workers == 2:
                report[label]["memory"] = asyncio.run(key_cost(rt, backend, args.keys))
            rt.close()
            backend.kill_shards()
        report["ray_actor_per_key"] = asyncio.run(naive(8, args.calls // 4))
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
