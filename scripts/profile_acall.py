#!/usr/bin/env python3
"""Where an `acall` of `scripts/bench_acall.py` spends its time: the evidence behind the
issue 19 note on what stands between acall and its targets.

1. CPU of each piece of one call, on one CPU, one thread, no other call running (the best
   of 5 runs of 20,000): what the event loop's thread and the actor's thread each pay in
   Python, without any wake-up.
2. cProfile of the event loop's thread during one bench round (200 sessions x 50 calls):
   wall time, so the GIL waits and the wake-ups show where they land (``put`` of a
   ``SimpleQueue``: waking an actor's thread), beside the same profile of the bare-threads
   floor.

    python scripts/profile_acall.py [--top 12]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import bench_acall

from ctxactors import Runtime
from ctxactors._actors import AsyncReply, KeyActor
from ctxactors._call import execute
from ctxactors._scheduler import PoolActor
from ctxactors.logs import configure_logging

N = 20_000


def best_us(run: Callable[[], None]) -> float:
    """Thread CPU per iteration of `run` (which loops N times), best of 5."""
    times = []
    for _ in range(5):
        start = time.thread_time()
        run()
        times.append((time.thread_time() - start) / N * 1e6)
    return min(times)


def pieces() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with Runtime([bench_acall.Counter]) as rt:
            args = {"__sessionId": "s"}
            await rt.acall("bump", args)

            def own() -> None:
                for _ in range(N):
                    reply = AsyncReply(loop, time.monotonic() + 30.0)
                    reply.expire()
                    reply.settle()

            sent: list[tuple[Any, Any]] = []
            # Whichever actor type the settings chose (the worker pool's by default).
            actor_type: Any = PoolActor if rt.settings.actors.scheduler == "pool" else KeyActor
            post = actor_type.post

            def keep_first(self: Any, envelope: Any) -> None:
                if not sent:  # one call to run in `execute` below; the rest go nowhere
                    sent.append((self, envelope))

            actor_type.post = keep_first

            def dispatch() -> None:
                for _ in range(N):
                    rt._dispatch("bump", args, None, None, "default", AsyncReply(loop, 1e18))

            try:
                print(f"  acall's own (reply slot, deadline, settle)  {best_us(own):5.2f} us")
                print(f"  routing: _dispatch with registry, no send   {best_us(dispatch):5.2f} us")
            finally:
                actor_type.post = post
            actor, envelope = sent[0]
            envelope.reply = None

            def run() -> None:
                for _ in range(N):
                    execute(envelope, actor._server, actor._lifecycle, None)

            print(f"  execute in the actor (no reply)             {best_us(run):5.2f} us")

    asyncio.run(main())


def loop_profile(top: int) -> None:
    profile = cProfile.Profile()
    real_round = bench_acall.one_round
    rounds = [0]

    async def profiled(*args: Any) -> dict[str, Any]:
        rounds[0] += 1
        if rounds[0] != 2:  # the first round spawns the actors
            return await real_round(*args)
        profile.enable()
        try:
            return await real_round(*args)
        finally:
            profile.disable()

    bench_acall.one_round = profiled  # type: ignore[assignment]
    for name, run in (("ctxactors", bench_acall.run_ctxactors), ("floor", bench_acall.run_floor)):
        rounds[0] = 0
        profile = cProfile.Profile()
        run(200, 50)
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
        body = out.getvalue()
        print(f"\n--- event loop thread, {name}, 200 x 50 (wall time; cProfile slows Python)")
        print(body[body.index("   ncalls") :].rstrip())
    bench_acall.one_round = real_round  # type: ignore[assignment]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--top", type=int, default=12, help="functions shown per profile")
    args = parser.parse_args()
    configure_logging(level="warning", file=open(os.devnull, "w"), force=True)  # noqa: SIM115
    print("CPU per piece of one call, pinned to one CPU, nothing else running:")
    if hasattr(os, "sched_setaffinity"):
        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cpus)})
        pieces()
        os.sched_setaffinity(0, cpus)
    else:
        pieces()
    loop_profile(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
