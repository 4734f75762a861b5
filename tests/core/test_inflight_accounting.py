"""Calls in flight are counted exactly: back to zero after every kind of call.

Everything is synchronised with events: a `Hold` call signals that it is running and then
waits for the test to release it, so "in flight" is a fact, not a timing guess.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ctxactors import CallTimeoutError, InvalidArgumentsError, Runtime, Scope, Server, tool
from ctxactors.context import ToolContext
from ctxactors.errors import ToolError
from ctxactors.servers import BUILTIN
from ctxactors.testing import context_args as ctx_args

WAIT = 20.0  # a bound for waits that succeed at once unless the code is broken


class Hold(Server):
    """`hold` blocks until released; the other tools fail or count."""

    name = "hold"
    scope = Scope.SESSION
    entered: dict[str, threading.Event] = {}
    release: dict[str, threading.Event] = {}

    def __init__(self) -> None:
        self.n = 0

    @tool(blocking=True)  # it waits on a gate: never on its caller's thread
    def hold(self, ctx: ToolContext, name: str) -> dict[str, Any]:
        """Block until the test releases `name`."""
        Hold.entered[name].set()
        assert Hold.release[name].wait(WAIT)
        self.n += 1
        return {"n": self.n}

    @tool
    def refuse(self, ctx: ToolContext) -> dict[str, Any]:
        """A tool's own failure."""
        raise ToolError("refused")

    @tool
    def crash(self, ctx: ToolContext) -> dict[str, Any]:
        """A handler bug."""
        raise RuntimeError("boom")

    @tool
    def count(self, ctx: ToolContext) -> dict[str, Any]:
        """Count calls on this incarnation."""
        self.n += 1
        return {"n": self.n}


def gate(name: str) -> tuple[threading.Event, threading.Event]:
    Hold.entered[name] = threading.Event()
    Hold.release[name] = threading.Event()
    return Hold.entered[name], Hold.release[name]


@pytest.fixture
def rt() -> Iterator[Runtime]:
    with Runtime([*BUILTIN, Hold], call_timeout=10) as runtime:
        yield runtime


def test_the_in_flight_count_returns_to_zero_after_every_kind_of_call(rt: Runtime) -> None:
    assert rt.stats()["inflight"] == 0
    assert rt.call("count", ctx_args("s")).structured == {"n": 1}
    assert rt.stats()["inflight"] == 0
    assert rt.call("refuse", ctx_args("s")).text == "refused"
    assert rt.stats()["inflight"] == 0
    crashed = rt.call("crash", ctx_args("s"))
    assert crashed.is_error and "boom" in crashed.text
    assert rt.stats()["inflight"] == 0
    with pytest.raises(InvalidArgumentsError):
        rt.call("hold", ctx_args("s", name=3))
    assert rt.stats()["inflight"] == 0

    # A timed-out call still runs to its end in the actor; then nothing is in flight.
    entered, release = gate("late")
    with pytest.raises(CallTimeoutError):
        rt.call("hold", ctx_args("s", name="late"), timeout=0.01)
    assert entered.wait(WAIT)
    assert rt.stats()["inflight"] == 1
    release.set()
    # The key's mailbox is in order: this reply comes after the late call was accounted.
    assert rt.call("count", ctx_args("s")).structured == {"n": 3}
    assert rt.stats()["inflight"] == 0
    assert rt.stats()["calls"] == 5  # the invalid call never reached an actor

    ops = [
        {"id": "g", "tool": "create_goal", "arguments": {"goal": "ship"}},
        {"id": "t", "tool": "add_todo", "arguments": {"name": "test", "goal_id": "${g.id}"}},
        {"tool": "refuse", "arguments": {}},
    ]
    batch = rt.call("batch", ctx_args("s", "a1", operations=ops))
    assert batch.structured is not None and batch.structured["summary"]["failed"] == 1
    assert rt.stats()["inflight"] == 0
    assert rt.stats()["calls"] == 5 + 4  # the batch call and its three operations

    async def acalls() -> None:
        assert (await rt.acall("count", ctx_args("s"))).structured == {"n": 4}
        entered, release = gate("async-late")
        with pytest.raises(CallTimeoutError):
            await rt.acall("hold", ctx_args("s", name="async-late"), timeout=0.01)
        assert entered.wait(WAIT)
        release.set()
        assert (await rt.acall("count", ctx_args("s"))).structured == {"n": 6}

    asyncio.run(acalls())
    assert rt.stats()["inflight"] == 0
    assert rt.stats()["calls"] == 12
