"""`acall` never blocks the event loop, and a slow key delays no other key."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from ctxactors import (
    CallTimeoutError,
    InvalidArgumentsError,
    Runtime,
    Scope,
    Server,
    ToolContext,
    ToolResult,
    tool,
)
from ctxactors._call import caller_deadline
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


class Clocked(Server):
    name = "clocked"
    scope = Scope.SESSION

    @tool
    def deadline(self, ctx: ToolContext) -> dict[str, Any]:
        """When this call's caller stops waiting, as its handler sees it."""
        return {"deadline": caller_deadline(), "principal": ctx.principal}


def structured(result: ToolResult) -> dict[str, Any]:
    assert result.structured is not None, result.text
    return result.structured


def test_a_handler_sees_when_its_caller_stops_waiting() -> None:
    """`caller_deadline` is the caller's own wait: its timeout, else the call_timeout."""

    def seen(call: Callable[[], ToolResult], wait: float) -> None:
        before = time.monotonic()
        deadline = structured(call())["deadline"]
        after = time.monotonic()
        assert before + wait <= deadline <= after + wait

    async def main(rt: Runtime) -> None:
        before = time.monotonic()
        result = await rt.acall("deadline", ctx_args("s"), timeout=7.0)
        assert before + 7.0 <= structured(result)["deadline"] <= time.monotonic() + 7.0
        before = time.monotonic()
        result = await rt.acall("deadline", ctx_args("s"))
        assert before + 9.0 <= structured(result)["deadline"] <= time.monotonic() + 9.0

    assert caller_deadline() is None  # not in an actor's thread
    with Runtime([Clocked], call_timeout=9.0) as rt:
        seen(lambda: rt.call("deadline", ctx_args("s"), timeout=7.0), 7.0)
        seen(lambda: rt.call("deadline", ctx_args("s")), 9.0)
        asyncio.run(main(rt))


def test_acall_keys_by_the_principal_and_falls_back_to_the_given_session() -> None:
    async def main(rt: Runtime) -> None:
        made = await rt.acall("create_goal", {"goal": "x"}, principal="p1")
        assert made.structured == {"id": "g1", "goal": "x"}
        assert rt.has_session("default", principal="p1") and not rt.has_session("default")
        await rt.acall("create_goal", {"goal": "y"}, principal="p1", session_fallback="fb")
        assert rt.has_session("fb", principal="p1")
        with pytest.raises(InvalidArgumentsError, match="^no session given: "):
            await rt.acall("create_goal", {"goal": "z"}, principal="p1", session_fallback=None)
        seen = await rt.acall("deadline", ctx_args("s"), principal="p2")
        assert structured(seen)["principal"] == "p2"

    with Runtime([*BUILTIN, Clocked]) as rt:
        asyncio.run(main(rt))


class Tick(Server):
    name = "tick"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.n = 0

    @tool
    def tick(self, ctx: ToolContext) -> dict[str, Any]:
        """Count one."""
        self.n += 1
        return {"n": self.n}


def test_replies_batched_into_one_loop_wake_up_all_reach_their_callers() -> None:
    # 100 sessions' actors answer at once: replies arriving while the loop drains a batch
    # must start the next one, and each must reach its own caller.
    async def session(rt: Runtime, s: int) -> list[int]:
        results = [await rt.acall("tick", ctx_args(f"s{s}"), timeout=WAIT) for _ in range(30)]
        return [r.structured["n"] for r in results if r.structured is not None]

    async def main(rt: Runtime) -> list[list[int]]:
        return await asyncio.gather(*(session(rt, s) for s in range(100)))

    with Runtime([Tick]) as rt:
        counts = asyncio.run(main(rt))
        assert counts == [list(range(1, 31))] * 100
        # A second loop in the same process gets replies of its own.
        assert asyncio.run(main(rt)) == [list(range(31, 61))] * 100


@pytest.mark.timeout(60)
def test_each_acall_times_out_at_its_own_deadline_whatever_the_others_wait() -> None:
    """The calls of one loop share a deadline timer: a shorter wait sent after a longer one
    still ends first, a cancelled call ends at once, and the long one still gets its reply."""
    HELD_RUNNING.clear()
    RELEASE.clear()

    async def main(rt: Runtime) -> None:
        long = asyncio.create_task(rt.acall("hold", ctx_args("k1"), timeout=WAIT))
        await asyncio.sleep(0)  # the long wait is armed first
        for key, wait in (("k2", 0.05), ("k3", 0.01)):
            with pytest.raises(CallTimeoutError) as caught:
                # Bounded well below WAIT: only the call's own deadline can end it this soon.
                await asyncio.wait_for(rt.acall("hold", ctx_args(key), timeout=wait), WAIT / 4)
            assert str(caught.value) == f"tool 'hold' did not answer within {wait:g} s"
        both = await asyncio.gather(
            *(
                rt.acall("hold", ctx_args(f"k{4 + i}"), timeout=w)
                for i, w in enumerate((0.02, 0.04))
            ),
            return_exceptions=True,
        )
        assert [type(e) for e in both] == [CallTimeoutError, CallTimeoutError]
        cancelled = asyncio.create_task(rt.acall("hold", ctx_args("k6"), timeout=WAIT))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not long.done()
        RELEASE.set()
        assert (await long).structured == {"released": True}

    with Runtime([Sleepy], call_timeout=WAIT) as rt:
        try:
            asyncio.run(main(rt))
        finally:
            RELEASE.set()


def test_an_event_loop_that_is_gone_is_not_kept_alive_by_acall() -> None:
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one(rt: Runtime) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        assert (await rt.acall("tick", ctx_args("s"))).structured is not None

    with Runtime([Tick]) as rt:
        for _ in range(3):
            asyncio.run(one(rt))
        rt.call("tick", ctx_args("s"))  # the actor lets go of the last acall's message
        gc.collect()
        assert [ref() for ref in loops] == [None, None, None]


def test_a_blocking_call_on_the_loops_thread_runs_after_the_acalls_it_made_before() -> None:
    """Calls leave a loop once per iteration, in a burst; a call that blocks the loop's own
    thread sends them first, so one key's calls from one thread keep their order."""

    async def main(rt: Runtime) -> None:
        first = asyncio.create_task(rt.acall("tick", ctx_args("s")))
        await asyncio.sleep(0)  # `first` is sent, in this iteration's burst
        assert rt.call("tick", ctx_args("s")).structured == {"n": 2}
        assert (await first).structured == {"n": 1}

    with Runtime([Tick]) as rt:
        asyncio.run(main(rt))


@pytest.mark.timeout(60)
def test_end_session_and_close_on_the_loops_thread_wait_for_acalls_not_yet_sent() -> None:
    async def main() -> None:
        rt = Runtime([Tick], call_timeout=WAIT)
        ended = asyncio.create_task(rt.acall("tick", ctx_args("ended")))
        kept = asyncio.create_task(rt.acall("tick", ctx_args("kept")))
        await asyncio.sleep(0)  # both sent, in this iteration's burst
        started = time.monotonic()
        assert rt.end_session("ended") == 1
        rt.close()
        # Both waited for the calls, which only happens this soon if they were sent.
        assert time.monotonic() - started < WAIT / 4
        assert [(await ended).structured, (await kept).structured] == [{"n": 1}, {"n": 1}]

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_a_call_held_back_by_a_loop_closed_before_its_next_iteration_is_still_sent() -> None:
    rt = Runtime([Tick], call_timeout=WAIT)
    loop = asyncio.new_event_loop()
    task = loop.create_task(rt.acall("tick", ctx_args("s")))
    loop.call_soon(loop.stop)  # after the task's first step: the loop stops, burst unsent
    loop.run_forever()
    loop.close()
    ended: list[int] = []
    started = time.monotonic()
    other = threading.Thread(target=lambda: ended.append(rt.end_session("s")))
    other.start()
    other.join(WAIT)
    # end_session waited for the held-back call, which only ends this soon if it was sent.
    assert ended == [1] and time.monotonic() - started < WAIT / 4
    assert not task.done()  # its loop is gone: nobody reads the reply
    rt.close()
