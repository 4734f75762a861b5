"""`acall` never blocks the event loop, and a slow key delays no other key."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

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
from ctxactors.testing import context_args as ctx_args

WAIT = 20.0  # bound for waits that pass at once unless the code is broken
HELD_RUNNING = threading.Event()
RELEASE = threading.Event()


class Sleepy(Server):
    name = "sleepy"
    scope = Scope.SESSION

    @tool
    def nap(self, ctx: ToolContext, seconds: float) -> dict[str, Any]:
        """Block this key's actor for a while."""
        time.sleep(seconds)
        return {"slept": seconds}

    @tool
    def hold(self, ctx: ToolContext) -> dict[str, Any]:
        """Block this key's actor until the test releases it (or WAIT runs out)."""
        HELD_RUNNING.set()
        return {"released": RELEASE.wait(WAIT)}


@pytest.mark.timeout(60)
def test_many_acalls_finish_while_one_key_is_held_and_the_loop_never_blocks() -> None:
    """By order, not by timing: 500 calls on other keys all finish while one key is held,
    and the hold is released from the event loop itself while its acall is pending, which
    only works if that acall left the loop running."""
    HELD_RUNNING.clear()
    RELEASE.clear()

    async def main() -> tuple[Any, list[Any]]:
        with Runtime([*BUILTIN, Sleepy], call_timeout=30) as rt:
            held = asyncio.create_task(rt.acall("hold", ctx_args("slow-key")))
            assert await asyncio.to_thread(HELD_RUNNING.wait, WAIT)
            calls = [
                rt.acall("create_goal", ctx_args(f"s{i % 50}", "a1", goal=f"g{i}"))
                for i in range(500)
            ]
            results = await asyncio.wait_for(asyncio.gather(*calls), WAIT)
            assert not held.done()  # the held key delayed none of them
            RELEASE.set()
            return await held, results

    held, results = asyncio.run(main())
    assert held.structured == {"released": True}
    assert [r.structured["goal"] for r in results] == [f"g{i}" for i in range(500)]
    assert {r.structured["id"] for r in results[:50]} == {"g1"}  # first goal of each key


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
            with pytest.raises(CallTimeoutError) as caught:
                await rt.acall("nap", ctx_args("t", seconds=0.3), timeout=0.05)
            assert str(caught.value) == "tool 'nap' did not answer within 0.05 s"
            # The late reply lands in the cancelled future and is dropped.
            again = await rt.acall("nap", ctx_args("t", seconds=0.0))
            assert again.structured == {"slept": 0.0}

    asyncio.run(main())


def test_acall_reads_the_context_from_meta() -> None:
    async def main() -> None:
        with Runtime() as rt:
            meta = {"ctxactors/sessionId": "m1", "ctxactors/assistantId": "a1"}
            made = await rt.acall("create_goal", {"goal": "x"}, meta=meta)
            assert made.structured == {"id": "g1", "goal": "x"}
            state = rt.call("get_planning_state", ctx_args("m1", "a1")).structured
            assert state == {"goals": [{"id": "g1", "goal": "x"}], "todos": []}

    asyncio.run(main())


def test_acall_without_a_timeout_waits_the_runtimes_call_timeout() -> None:
    HELD_RUNNING.clear()
    RELEASE.clear()

    async def main() -> None:
        with Runtime([*BUILTIN, Sleepy], call_timeout=0.05) as rt:
            try:
                with pytest.raises(CallTimeoutError) as caught:
                    await rt.acall("hold", ctx_args("held"))
                assert str(caught.value) == "tool 'hold' did not answer within 0.05 s"
            finally:
                RELEASE.set()

    asyncio.run(main())


def test_call_reads_meta_and_times_out_after_the_call_timeout() -> None:
    HELD_RUNNING.clear()
    RELEASE.clear()
    with Runtime([*BUILTIN, Sleepy], call_timeout=0.05) as rt:
        meta = {"ctxactors/sessionId": "m1"}
        assert rt.call("create_goal", {"goal": "x"}, meta=meta).structured == {
            "id": "g1",
            "goal": "x",
        }
        assert rt.call("get_planning_state", ctx_args("m1")).structured["goals"] == [
            {"id": "g1", "goal": "x"}
        ]
        try:
            with pytest.raises(CallTimeoutError) as caught:
                rt.call("hold", ctx_args("held"))
            assert str(caught.value) == "tool 'hold' did not answer within 0.05 s"
        finally:
            RELEASE.set()
