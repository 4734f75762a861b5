"""The pools share their threads fairly between principals (`ctxactors._scheduler`,
`ctxactors._fair`): one principal with many busy keys can't hold every worker while
another principal's key waits, nor take every blocking thread; a single principal is served
first come, first served, as before.

Proved by the order in which calls start, behind gates, never by timing.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ctxactors import Runtime, Scope, Server, Settings, ToolContext, tool
from ctxactors._fair import FairQueue
from ctxactors.settings import ActorSettings
from ctxactors.testing import await_until, context_args, wait_until


class Turns(Server):
    """Tools that record when they start and then wait for their own gate to open."""

    name = "turns"
    scope = Scope.SESSION
    started: list[str] = []
    gates: dict[str, threading.Event] = {}

    @classmethod
    def reset(cls) -> None:
        cls.started = []
        cls.gates = {}

    @staticmethod
    def gate(name: str) -> threading.Event:
        return Turns.gates.setdefault(name, threading.Event())

    @tool
    def hold(self, ctx: ToolContext, gate: str) -> dict[str, Any]:
        """Busy on a worker (not declared blocking) until the gate opens."""
        Turns.started.append(gate)
        return {"opened": Turns.gate(gate).wait(30)}

    @tool(blocking=True)
    def hold_blocking(self, ctx: ToolContext, gate: str) -> dict[str, Any]:
        """The same, declared blocking: on the blocking pool."""
        Turns.started.append(gate)
        return {"opened": Turns.gate(gate).wait(30)}


def workers(n: int, **more: Any) -> Settings:
    return Settings(actors=ActorSettings(workers=n, **more))


async def delivered() -> None:
    """Let the calls started so far reach their actors: an `acall` task runs on the next
    iteration of the loop and sends its call on the one after (one burst an iteration)."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_principal_holding_every_worker_lets_another_principals_key_go_first() -> None:
    Turns.reset()
    with Runtime([Turns], settings=workers(2)) as rt:

        async def main() -> list[Any]:
            def hold(principal: str, session: str) -> Any:
                args = context_args(session, gate=session)
                return asyncio.ensure_future(rt.acall("hold", args, principal=principal))

            # The attacker's a0 and a1 hold both workers; a2 and a3 are queued behind them.
            calls = [hold("attacker", "a0"), hold("attacker", "a1")]
            await await_until(lambda: len(Turns.started) == 2)
            calls += [hold("attacker", "a2"), hold("attacker", "a3")]
            await delivered()
            calls.append(hold("victim", "v0"))  # queued last, served first
            await delivered()
            assert sorted(Turns.started) == ["a0", "a1"]
            Turns.gate("a0").set()
            await await_until(lambda: len(Turns.started) == 3)
            assert Turns.started[2] == "v0"
            for gate in ("a1", "v0", "a2", "a3"):
                Turns.gate(gate).set()
            return await asyncio.gather(*calls)

        results = asyncio.run(main())
    assert [r.structured for r in results] == [{"opened": True}] * 5
    assert Turns.started[2:] == ["v0", "a2", "a3"]


def test_principals_with_keys_waiting_take_turns_on_one_worker() -> None:
    Turns.reset()
    with Runtime([Turns], settings=workers(1)) as rt:

        async def main() -> list[Any]:
            def hold(principal: str, session: str) -> Any:
                args = context_args(session, gate=session)
                return asyncio.ensure_future(rt.acall("hold", args, principal=principal))

            calls = [hold("a", "first")]
            await await_until(lambda: Turns.started == ["first"])
            # Queued in this order: a's three keys, then b's two, then c's one.
            for principal, session in [
                ("a", "a1"),
                ("a", "a2"),
                ("a", "a3"),
                ("b", "b1"),
                ("b", "b2"),
                ("c", "c1"),
            ]:
                calls.append(hold(principal, session))
                await delivered()
            for gate in ["first", "a1", "a2", "a3", "b1", "b2", "c1"]:
                Turns.gate(gate).set()
            return await asyncio.gather(*calls)

        results = asyncio.run(main())
    assert [r.structured for r in results] == [{"opened": True}] * 7
    # One key each in turn; each principal's own keys first come, first served.
    assert Turns.started == ["first", "a1", "b1", "c1", "a2", "b2", "a3"]


def test_one_principals_keys_run_first_come_first_served_one_call_at_a_time() -> None:
    Turns.reset()
    with Runtime([Turns], settings=workers(1)) as rt:

        async def main() -> list[Any]:
            first = asyncio.ensure_future(rt.acall("hold", context_args("k0", gate="k0")))
            await await_until(lambda: Turns.started == ["k0"])
            # Two calls each to five keys, interleaved; the worker is held meanwhile.
            calls = [
                asyncio.ensure_future(rt.acall("hold", context_args(f"k{k}", gate=f"k{k}-{n}")))
                for n in range(2)
                for k in range(1, 6)
            ]
            await delivered()
            Turns.gate("k0").set()
            for k in range(1, 6):
                for n in range(2):
                    Turns.gate(f"k{k}-{n}").set()
            return [await first, *await asyncio.gather(*calls)]

        results = asyncio.run(main())
    assert [r.structured for r in results] == [{"opened": True}] * 11
    # Each key's turn runs its queued calls in order (a turn drains up to 16 of them).
    assert Turns.started == ["k0"] + [f"k{k}-{n}" for k in range(1, 6) for n in range(2)]


def test_one_principal_runs_at_most_an_eighth_of_the_blocking_pool_and_queues_the_rest() -> None:
    Turns.reset()
    # 16 blocking threads: one principal runs 2 at once.
    with Runtime([Turns], settings=workers(1, blocking_threads=16)) as rt:
        done: list[str] = []

        def call(principal: str | None, session: str) -> threading.Thread:
            def run() -> None:
                result = rt.call(
                    "hold_blocking", context_args(session, gate=session), principal=principal
                )
                assert result.structured == {"opened": True}
                done.append(session)

            thread = threading.Thread(target=run)
            thread.start()
            return thread

        threads = [call("attacker", f"a{i}") for i in range(4)]
        wait_until(lambda: len(Turns.started) == 2)
        jobs = rt._dispatcher.blocking._jobs  # type: ignore[union-attr]
        wait_until(lambda: len(jobs) == 2)  # the other two are in line
        # The attacker's other two wait in line, holding no thread: another principal's
        # blocking call starts at once.
        threads.append(call("victim", "v0"))
        wait_until(lambda: "v0" in Turns.started)
        assert sorted(Turns.started) == sorted(["v0", *Turns.started[:2]])
        assert len(Turns.started) == 3
        first_two = Turns.started[:2]
        Turns.gate(first_two[0]).set()
        wait_until(lambda: len(Turns.started) == 4)  # one ended: its next one starts
        Turns.gate("v0").set()
        for gate in ("a0", "a1", "a2", "a3"):
            Turns.gate(gate).set()
        for thread in threads:
            thread.join(30)
    assert sorted(done) == ["a0", "a1", "a2", "a3", "v0"]
    assert sorted(Turns.started) == ["a0", "a1", "a2", "a3", "v0"]


def test_callers_without_a_principal_are_one_tenant_under_the_pools_own_bound_only() -> None:
    Turns.reset()
    with Runtime([Turns], settings=workers(1, blocking_threads=16)) as rt:

        async def main() -> list[Any]:
            calls = [
                asyncio.ensure_future(rt.acall("hold_blocking", context_args(f"s{i}", gate="g")))
                for i in range(6)
            ]
            # Six at once, past the two a principal may run.
            await await_until(lambda: len(Turns.started) == 6)
            Turns.gate("g").set()
            return await asyncio.gather(*calls)

        results = asyncio.run(main())
    assert [r.structured for r in results] == [{"opened": True}] * 6


def test_the_fair_queue_goes_round_the_owners_and_keeps_each_owners_order() -> None:
    queue: FairQueue[str] = FairQueue()
    for owner, item in [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1")]:
        queue.put(owner, item)
    assert len(queue) == 5
    assert [queue.take()[1] for _ in range(3)] == ["a1", "b1", "c1"]
    queue.put("b", "b2")
    assert [queue.take()[1] for _ in range(3)] == ["a2", "b2", "a3"]
    assert not queue


def test_the_fair_queue_prefers_and_passes_over_owners_as_asked() -> None:
    queue: FairQueue[str] = FairQueue()
    for owner, item in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2"), ("c", "c1")]:
        queue.put(owner, item)
    # Preferred: the first owner in line that holds no worker (here: not a).
    assert queue.take(lambda owner: owner != "a") == ("b", "b1")
    # Passed over: a and c keep their places at the front; b goes to the back.
    assert queue.take_if(lambda owner: owner == "b") == ("b", "b2")
    assert queue.take_if(lambda owner: owner == "z") is None
    assert [queue.take()[1] for _ in range(3)] == ["a1", "c1", "a2"]
    assert not queue
