"""Key actors on a pool of workers (`ctxactors._scheduler`): threads bounded by the pools,
not by keys; one key's calls one at a time and in order; blocking and async tools holding
no worker; a plain call to an idle key run on its caller's thread; fairness between keys.

Proved by counts, order and gates, never by timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from ctxactors import Runtime, Scope, Server, Settings, ToolContext, tool
from ctxactors.settings import ActorSettings
from ctxactors.testing import context_args, wait_until


def one_worker(**more: Any) -> Settings:
    return Settings(actors=ActorSettings(workers=1, **more))


class Probe(Server):
    """Tools that tell where and in what order they ran."""

    name = "probe"
    scope = Scope.SESSION
    gates: dict[str, threading.Event] = {}

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.inside = 0

    @tool
    def where(self, ctx: ToolContext) -> dict[str, Any]:
        """The thread this call runs on."""
        return {"thread": threading.get_ident()}

    @tool
    def record(self, ctx: ToolContext, n: int) -> dict[str, Any]:
        """Append n; return everything so far."""
        self.seen.append(n)
        return {"seen": list(self.seen)}

    @tool
    def guarded(self, ctx: ToolContext, n: int) -> dict[str, Any]:
        """Append n, noting whether another call of this key was inside meanwhile."""
        self.inside += 1
        overlapped = self.inside > 1
        for _ in range(10):  # give other threads the GIL while inside: they must wait
            time.sleep(0)
        self.seen.append(n)
        self.inside -= 1
        return {"overlapped": overlapped, "thread": threading.get_ident()}

    @tool(blocking=True)
    def wait_gate(self, ctx: ToolContext, gate: str) -> dict[str, Any]:
        """Block (declared so) until the gate opens."""
        return {"opened": Probe.gates.setdefault(gate, threading.Event()).wait(30)}

    @tool
    def open_gate(self, ctx: ToolContext, gate: str) -> dict[str, Any]:
        """Open a gate."""
        Probe.gates.setdefault(gate, threading.Event()).set()
        return {"opened": True}

    @tool
    async def await_gate(self, ctx: ToolContext, gate: str) -> dict[str, Any]:
        """Await (without blocking anything) until the gate opens."""
        event = Probe.gates.setdefault(gate, threading.Event())
        while not event.is_set():
            await asyncio.sleep(0.001)
        return {"opened": True}


def _threads() -> int:
    return threading.active_count()


def test_thousands_of_live_keys_use_the_pools_threads_not_one_each() -> None:
    before = _threads()
    with Runtime([Probe], max_actors=5000) as rt:
        for i in range(3000):
            rt.call("record", context_args(f"s{i}", n=i))

        async def main() -> None:  # from a loop, so the calls go to the workers
            await asyncio.gather(
                *(rt.acall("record", context_args(f"s{i}", n=i)) for i in range(3000))
            )

        asyncio.run(main())
        assert rt.stats()["actors"] == 3000
        assert _threads() - before <= 8 + 2  # the workers, the reaper, the store's none
        assert rt.call("record", context_args("s7", n=-1)).structured == {"seen": [7, 7, -1]}


def test_a_plain_call_to_an_idle_key_runs_on_the_callers_thread_and_never_on_a_loop() -> None:
    with Runtime([Probe]) as rt:
        here = rt.call("where", context_args("s1")).structured
        assert here == {"thread": threading.get_ident()}

        async def main() -> Any:
            return (await rt.acall("where", context_args("s1"))).structured

        elsewhere = asyncio.run(main())
        assert elsewhere is not None and elsewhere["thread"] != threading.get_ident()


def test_one_keys_calls_from_many_threads_run_one_at_a_time_with_none_lost() -> None:
    threads, per_thread = 16, 50
    with Runtime([Probe], settings=one_worker()) as rt:

        def work(t: int) -> None:
            for i in range(per_thread):
                rt.call("record", context_args("shared", n=t * 1000 + i))

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join(60)
        seen = rt.call("record", context_args("shared", n=-1)).structured
    assert seen is not None
    numbers = seen["seen"][:-1]
    assert sorted(numbers) == sorted(
        t * 1000 + i for t in range(threads) for i in range(per_thread)
    )
    for t in range(threads):  # each thread's calls in the order it made them
        mine = [n for n in numbers if n // 1000 == t]
        assert mine == sorted(mine)


def test_one_key_runs_one_call_at_a_time_whether_its_caller_or_a_worker_runs_it() -> None:
    # Blocking callers on their own threads (an idle key runs in place) and a loop's acalls
    # (always a worker) on one key: never two calls inside it, each caller's in its order.
    threads, per_thread, per_loop = 8, 30, 100
    results: dict[int, list[Any]] = {}
    with Runtime([Probe], settings=Settings(actors=ActorSettings(workers=4))) as rt:

        def work(t: int) -> None:
            results[t] = [
                rt.call("guarded", context_args("shared", n=t * 1000 + i)).structured
                for i in range(per_thread)
            ]

        async def loop_calls() -> list[Any]:
            calls = [
                rt.acall("guarded", context_args("shared", n=99_000 + i)) for i in range(per_loop)
            ]
            return [r.structured for r in await asyncio.gather(*calls)]

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        looped = asyncio.run(loop_calls())
        for thread in pool:
            thread.join(60)
        seen = rt.call("record", context_args("shared", n=-1)).structured
    assert seen is not None
    numbers = seen["seen"][:-1]
    expected = {t * 1000 + i for t in range(threads) for i in range(per_thread)}
    assert sorted(numbers) == sorted(expected | {99_000 + i for i in range(per_loop)})
    every = [*looped, *(r for rs in results.values() for r in rs)]
    assert [r for r in every if r["overlapped"]] == []
    for t in range(threads):  # each thread's calls in the order it made them
        mine = [n for n in numbers if n // 1000 == t]
        assert mine == sorted(mine)
    assert [n for n in numbers if n >= 99_000] == [99_000 + i for i in range(per_loop)]
    callers = {thread.ident for thread in pool}
    ran_on = {r["thread"] for r in every}
    assert ran_on & callers and ran_on - callers  # both ways were taken


def test_a_blocking_tool_holds_no_worker() -> None:
    Probe.gates.pop("blocked", None)
    with Runtime([Probe], settings=one_worker()) as rt:

        async def main() -> tuple[Any, Any, Any]:
            waiting = asyncio.ensure_future(
                rt.acall("wait_gate", context_args("a", gate="blocked"))
            )
            # With the one worker held by the wait, these could not run.
            other = await rt.acall("record", context_args("b", n=1))
            opened = await rt.acall("open_gate", context_args("c", gate="blocked"))
            return await waiting, other, opened

        waited, other, opened = asyncio.run(main())
    assert waited.structured == {"opened": True}
    assert other.structured == {"seen": [1]}
    assert opened.structured == {"opened": True}


def test_awaiting_async_tools_park_their_actors_and_hold_no_worker() -> None:
    keys = 50
    Probe.gates.pop("parked", None)
    with Runtime([Probe], settings=one_worker()) as rt:

        async def main() -> list[Any]:
            waiting = [
                asyncio.ensure_future(rt.acall("await_gate", context_args(f"s{i}", gate="parked")))
                for i in range(keys)
            ]
            # Every one of them is awaiting, yet the one worker still runs another key.
            assert (await rt.acall("record", context_args("other", n=1))).structured == {
                "seen": [1]
            }
            await rt.acall("open_gate", context_args("opener", gate="parked"))
            return await asyncio.gather(*waiting)

        results = asyncio.run(main())
    assert [r.structured for r in results] == [{"opened": True}] * keys


def test_a_busy_key_does_not_starve_another_on_one_worker() -> None:
    with Runtime([Probe], settings=one_worker()) as rt:

        async def main() -> tuple[int, Any]:
            busy = [rt.acall("record", context_args("busy", n=i)) for i in range(500)]
            flood = asyncio.gather(*busy)
            quiet = await rt.acall("record", context_args("quiet", n=1))
            done_before = sum(
                1 for task in busy if isinstance(task, asyncio.Future) and task.done()
            )
            await flood
            return done_before, quiet

        _, quiet = asyncio.run(main())
        assert quiet.structured == {"seen": [1]}
        seen = rt.call("record", context_args("busy", n=-1)).structured
    assert seen is not None and seen["seen"] == [*range(500), -1]


@pytest.mark.parametrize("scheduler", ["pool", "thread"])
def test_both_schedulers_reap_and_end_sessions_the_same(scheduler: str) -> None:
    settings = Settings(actors=ActorSettings(scheduler=scheduler))  # type: ignore[arg-type]
    with Runtime([Probe], settings=settings, ttl=60) as rt:
        for i in range(20):
            rt.call("record", context_args(f"s{i}", n=i))
        assert rt.end_session("s3") == 1
        assert rt.stats()["actors"] == 19
        assert rt.call("record", context_args("s3", n=9)).structured == {"seen": [9]}
    wait_until(lambda: rt.stats()["actors"] == 0)
