"""``async def`` tools: awaited on the runtime's own loop, one key's calls still one at a
time and in order, other keys going on meanwhile, a deadline cancelling the coroutine.

Concurrency is proved by counting overlap and by order, never by timing.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ctxactors import (
    CallTimeoutError,
    Runtime,
    Scope,
    Server,
    ServerDefinitionError,
    Settings,
    ToolContext,
    caller_deadline,
    tool,
)
from ctxactors.settings import ActorSettings
from ctxactors.state import SQLiteStore
from ctxactors.testing import context_args, wait_until

KEYS = 200


class _Overlap:
    """Shared by every key's coroutine: they all run on the runtime's one loop thread, so
    plain counters need no lock. The event is made on that loop, on first use."""

    in_flight = 0
    most = 0
    all_in: asyncio.Event | None = None


class Waiter(Server):
    """Async tools whose coroutines wait for one another (the test's proof of overlap)."""

    name = "waiter"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.log: list[str] = []
        self.cancelled = 0

    @tool
    async def wait_for_all(self, ctx: ToolContext, n: int) -> dict[str, Any]:
        """Return once `n` calls are awaiting at once (never, if they run one by one)."""
        if _Overlap.all_in is None:
            _Overlap.all_in = asyncio.Event()
        _Overlap.in_flight += 1
        _Overlap.most = max(_Overlap.most, _Overlap.in_flight)
        if _Overlap.in_flight == n:
            _Overlap.all_in.set()
        try:
            await asyncio.wait_for(_Overlap.all_in.wait(), 60)
        finally:
            _Overlap.in_flight -= 1
        return {"all_in": True}

    @tool
    async def step(self, ctx: ToolContext, n: int) -> dict[str, Any]:
        """Log its start, yield to the loop a few times, log its end."""
        self.log.append(f"start {n}")
        for _ in range(5):
            await asyncio.sleep(0)
        self.log.append(f"end {n}")
        return {"n": n}

    @tool
    async def hang(self, ctx: ToolContext) -> dict[str, Any]:
        """Await forever; count the cancellation that ends it."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # unwinding takes loop turns: the next call must wait
            self.cancelled += 1
            raise
        return {}

    @tool
    async def fail(self, ctx: ToolContext) -> dict[str, Any]:
        """Raise after an await."""
        await asyncio.sleep(0)
        raise ValueError("boom")

    @tool
    async def deadline(self, ctx: ToolContext) -> dict[str, Any]:
        """What `caller_deadline` says inside a coroutine."""
        return {"deadline": caller_deadline()}

    @tool(read_only=True)
    def report(self, ctx: ToolContext) -> dict[str, Any]:
        """The log and the cancellations so far (a sync tool beside the async ones)."""
        return {"log": list(self.log), "cancelled": self.cancelled}


def test_two_hundred_keys_await_at_the_same_time() -> None:
    _Overlap.in_flight = _Overlap.most = 0
    _Overlap.all_in = None

    async def main(rt: Runtime) -> list[Any]:
        return await asyncio.gather(
            *(rt.acall("wait_for_all", context_args(f"s{i}", n=KEYS)) for i in range(KEYS))
        )

    with Runtime([Waiter], max_actors=KEYS + 10) as rt:
        results = asyncio.run(main(rt))
    assert [r.structured for r in results] == [{"all_in": True}] * KEYS
    assert _Overlap.most == KEYS


def test_one_keys_calls_run_one_at_a_time_in_order() -> None:
    async def main(rt: Runtime) -> list[Any]:
        return await asyncio.gather(*(rt.acall("step", context_args("s1", n=i)) for i in range(10)))

    with Runtime([Waiter]) as rt:
        results = asyncio.run(main(rt))
        report = rt.call("report", context_args("s1")).structured
    assert [r.structured for r in results] == [{"n": i} for i in range(10)]
    assert report is not None
    assert report["log"] == [f"{what} {i}" for i in range(10) for what in ("start", "end")]


def test_a_deadline_cancels_the_coroutine_and_the_key_stays_usable() -> None:
    with Runtime([Waiter]) as rt:
        with pytest.raises(CallTimeoutError):
            rt.call("hang", context_args("s1"), timeout=0.2)
        # The key's next call runs only once the cancelled coroutine has unwound.
        report = rt.call("report", context_args("s1")).structured
        assert report == {"log": [], "cancelled": 1}
        assert rt.call("step", context_args("s1", n=7)).structured == {"n": 7}


def test_an_async_tool_that_raises_is_an_error_result_and_the_state_stays() -> None:
    with Runtime([Waiter]) as rt:
        rt.call("step", context_args("s1", n=1))
        result = rt.call("fail", context_args("s1"))
        assert result.is_error and result.text == "ValueError: boom"
        assert rt.call("report", context_args("s1")).structured == {
            "log": ["start 1", "end 1"],
            "cancelled": 0,
        }


def test_other_keys_go_on_while_one_awaits_and_the_callers_loop_is_free() -> None:
    gate = threading.Event()

    class Gated(Server):
        name = "gated"

        @tool
        async def wait_gate(self, ctx: ToolContext) -> dict[str, Any]:
            """Await the test's gate without blocking the runtime's loop."""
            while not gate.is_set():
                await asyncio.sleep(0.001)
            return {"opened": True}

        @tool
        async def open_gate(self, ctx: ToolContext) -> dict[str, Any]:
            """Open the gate."""
            gate.set()
            return {"opened": True}

    async def main(rt: Runtime) -> tuple[Any, Any, int]:
        ticks = 0
        waiting = asyncio.ensure_future(rt.acall("wait_gate", context_args("a")))
        while ticks < 3:  # the caller's loop runs while key "a" awaits
            await asyncio.sleep(0)
            ticks += 1
        opened = await rt.acall("open_gate", context_args("b"))
        return await waiting, opened, ticks

    with Runtime([Gated]) as rt:
        waited, opened, ticks = asyncio.run(main(rt))
    assert waited.structured == {"opened": True} and opened.structured == {"opened": True}
    assert ticks == 3


def test_caller_deadline_is_known_inside_a_coroutine() -> None:
    with Runtime([Waiter]) as rt:
        deadline = rt.call("deadline", context_args("s1"), timeout=30).structured
    assert deadline is not None and isinstance(deadline["deadline"], float)


class CounterState(msgspec.Struct):
    count: int = 0


class AsyncCounter(Server):
    """A durable server whose changing tool is async."""

    name = "async_counter"
    State = CounterState

    def __init__(self) -> None:
        self.count = 0

    @tool
    async def bump(self, ctx: ToolContext) -> dict[str, Any]:
        """Add one, after an await."""
        await asyncio.sleep(0)
        self.count += 1
        return {"count": self.count}

    def snapshot(self) -> CounterState:
        return CounterState(self.count)

    def restore(self, state: CounterState) -> None:
        self.count = state.count


def test_an_async_tools_state_is_saved_after_it_completes(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Runtime([AsyncCounter], store=SQLiteStore(path)) as rt:
        for _ in range(3):
            rt.call("bump", context_args("s1"))
    with Runtime([AsyncCounter], store=SQLiteStore(path)) as rt:
        assert rt.call("bump", context_args("s1")).structured == {"count": 4}
        assert rt.call("bump", context_args("s2")).structured == {"count": 1}


def test_the_runtimes_loop_thread_ends_with_the_runtime() -> None:
    seen: list[threading.Thread] = []

    class Where(Server):
        @tool
        async def where(self, ctx: ToolContext) -> dict[str, Any]:
            """Note the thread the coroutine runs on."""
            seen.append(threading.current_thread())
            return {}

    with Runtime([Where]) as rt:
        rt.call("where", context_args("s1"))
        rt.call("where", context_args("s2"))
        assert seen[0] is seen[1] and seen[0] is not threading.current_thread()
        assert seen[0].is_alive()
    wait_until(lambda: not seen[0].is_alive())


def test_an_async_generator_is_refused_at_registration() -> None:
    with pytest.raises(ServerDefinitionError, match="async generator"):

        class Streams(Server):
            @tool
            async def stream(self, ctx: ToolContext) -> Any:
                """Not a tool: yields."""
                yield 1


@pytest.mark.parametrize("scheduler", ["pool", "thread"])
def test_with_a_thread_waiting_for_it_a_coroutine_runs_in_order_and_is_cancelled_the_same(
    scheduler: str,
) -> None:
    """The thread-per-key scheduler (and a call behind call wrappers) waits on its thread
    for the coroutine (`ToolLoop.run`) instead of parking: the same order and cancellation."""
    settings = Settings(actors=ActorSettings(scheduler=scheduler))  # type: ignore[arg-type]
    with Runtime([Waiter], settings=settings) as rt:
        rt.add_call_wrapper(lambda body, spec, ctx: body)  # no parking behind a wrapper

        async def main() -> list[Any]:
            return await asyncio.gather(
                *(rt.acall("step", context_args("s1", n=i)) for i in range(5))
            )

        assert [r.structured for r in asyncio.run(main())] == [{"n": i} for i in range(5)]
        with pytest.raises(CallTimeoutError):
            rt.call("hang", context_args("s1"), timeout=0.2)
        report = rt.call("report", context_args("s1")).structured
    assert report == {
        "log": [f"{what} {i}" for i in range(5) for what in ("start", "end")],
        "cancelled": 1,
    }
