"""`acall` never blocks the event loop, and a slow key delays no other key."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import ctx_args

from ctxactors import (
    CallTimeoutError,
    InvalidArgumentsError,
    Runtime,
    Scope,
    Server,
    ToolContext,
    tool,
)
from ctxactors.servers import BUILTIN


class Sleepy(Server):
    name = "sleepy"
    scope = Scope.SESSION

    @tool
    def nap(self, ctx: ToolContext, seconds: float) -> dict[str, Any]:
        """Block this key's actor for a while."""
        time.sleep(seconds)
        return {"slept": seconds}


async def _lag_monitor(stop: asyncio.Event, lags: list[float], period: float = 0.005) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - t0 - period)


@pytest.mark.timeout(60)
def test_many_acalls_finish_while_one_key_is_slow_and_the_loop_never_blocks() -> None:
    async def main() -> tuple[float, float, list[float], list[Any]]:
        with Runtime([*BUILTIN, Sleepy], call_timeout=30) as rt:
            stop = asyncio.Event()
            lags: list[float] = []
            monitor = asyncio.create_task(_lag_monitor(stop, lags))
            slow = asyncio.create_task(rt.acall("nap", ctx_args("slow-key", seconds=2.0)))
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            calls = [
                rt.acall("create_goal", ctx_args(f"s{i % 50}", "a1", goal=f"g{i}"))
                for i in range(500)
            ]
            results = await asyncio.gather(*calls)
            others = time.perf_counter() - t0
            slow_result = await slow
            stop.set()
            await monitor
            return others, slow_result.structured["slept"], lags, results

    others, slept, lags, results = asyncio.run(main())
    assert slept == 2.0
    assert all(not r.is_error for r in results)
    # Generous bounds for a loaded 2-core machine; the slow key takes 2 s.
    assert others < 1.5, f"500 calls on other keys took {others:.2f}s behind a 2 s handler"
    assert max(lags) < 0.5, f"event loop blocked for {max(lags):.3f}s"


def test_acall_state_matches_call_and_errors_raise_the_same_way() -> None:
    async def main() -> None:
        with Runtime([*BUILTIN, Sleepy]) as rt:
            g = await rt.acall("create_goal", ctx_args("s", goal="x"))
            assert g.structured == {"id": "g1", "goal": "x"}
            assert rt.call("get_planning_state", ctx_args("s")).structured["goals"] == [
                g.structured
            ]
            with pytest.raises(InvalidArgumentsError, match="goal"):
                await rt.acall("create_goal", ctx_args("s", goal=3))
            with pytest.raises(CallTimeoutError):
                await rt.acall("nap", ctx_args("t", seconds=0.3), timeout=0.05)
            # The late reply lands in the cancelled future and is dropped.
            again = await rt.acall("nap", ctx_args("t", seconds=0.0))
            assert again.structured == {"slept": 0.0}

    asyncio.run(main())
