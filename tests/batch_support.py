"""Test servers and helpers for the batch tests.

`Probe` records what ran, where and in which order. A batch operation always runs with its
caller's context, so operations that must land on different keys use different servers:
the `LANES`, each Probe's tools again under its own names (``put0``, ``meet1``, ...).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import msgspec

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.batch.engine import BatchRun
from ctxactors.batch.plan import BatchOptions, BatchResult, Operation, make_plan
from ctxactors.errors import ToolError
from ctxactors.results import ToolResult
from ctxactors.servers import BUILTIN
from ctxactors.settings import Settings

WAIT = 10.0  # generous bound for anything a loaded machine might slow down


class Probe(Server):
    """A thread-scoped test server that records what ran, where, and in which order."""

    name = "probe"
    scope = Scope.THREAD
    lock: ClassVar[threading.Lock] = threading.Lock()
    reads: ClassVar[int] = 0
    undone: ClassVar[list[str]] = []
    running: ClassVar[int] = 0
    peak: ClassVar[int] = 0
    barrier: ClassVar[threading.Barrier | None] = None
    ran: ClassVar[list[str]] = []  # what `block` and `note` saw, in order
    entered: ClassVar[threading.Event] = threading.Event()  # a `block` has started
    gate: ClassVar[threading.Event] = threading.Event()  # lets every `block` finish

    def __init__(self) -> None:
        self.items: list[str] = []

    def _undo_put(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        self.items.remove(result["value"])
        with Probe.lock:
            Probe.undone.append(result["value"])

    @tool(compensate=_undo_put)
    def put(self, ctx: ToolContext, value: str, sleep: float = 0.0) -> dict[str, Any]:
        """Append a value (after sleeping), counting how many puts overlap."""
        with Probe.lock:
            Probe.running += 1
            Probe.peak = max(Probe.peak, Probe.running)
        try:
            time.sleep(sleep)
        finally:
            with Probe.lock:
                Probe.running -= 1
        self.items.append(value)
        return {"value": value, "n": len(self.items), "thread": ctx.thread_id}

    @tool(read_only=True)
    def items_now(self, ctx: ToolContext) -> dict[str, Any]:
        """The values so far (counts how often it really ran)."""
        with Probe.lock:
            Probe.reads += 1
        return {"items": list(self.items), "session": ctx.session_id}

    @tool(compensate=_undo_put)
    def meet(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Wait at the shared barrier: only passes if the other party runs at the same time."""
        assert Probe.barrier is not None
        with Probe.lock:
            Probe.running += 1
            Probe.peak = max(Probe.peak, Probe.running)
        try:
            Probe.barrier.wait()
        finally:
            with Probe.lock:
                Probe.running -= 1
        self.items.append(value)
        return {"value": value}

    @tool(read_only=True)
    def block(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Record `value`, then wait until the test opens the gate."""
        Probe.ran.append(value)
        Probe.entered.set()
        Probe.gate.wait(3 * WAIT)
        return {"value": value}

    @tool(read_only=True)
    def note(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Record `value` (shows that an operation ran)."""
        Probe.ran.append(value)
        return {"value": value}

    @tool(read_only=True)
    def fail(self, ctx: ToolContext) -> dict[str, Any]:
        """Always fails (changes nothing, so a transaction may hold it)."""
        raise ToolError("boom")

    @tool
    def no_undo(self, ctx: ToolContext) -> dict[str, Any]:
        """Changes state but declares no compensation."""
        self.items.append("x")
        return {}


def _lane(n: int) -> type[Server]:
    class Lane(Server):
        """Probe's `put`, `meet` and `items_now` on a key of its own."""

        name = f"lane{n}"
        scope = Scope.THREAD

        def __init__(self) -> None:
            self.items: list[str] = []

        @tool(name=f"put{n}", compensate=Probe._undo_put)
        def put(self, ctx: ToolContext, value: str, sleep: float = 0.0) -> dict[str, Any]:
            """Probe's put, on this lane."""
            return Probe.put(self, ctx, value, sleep)  # type: ignore[arg-type]

        @tool(name=f"meet{n}", compensate=Probe._undo_put)
        def meet(self, ctx: ToolContext, value: str) -> dict[str, Any]:
            """Probe's meet, on this lane."""
            return Probe.meet(self, ctx, value)  # type: ignore[arg-type]

        @tool(name=f"items{n}", read_only=True)
        def items_now(self, ctx: ToolContext) -> dict[str, Any]:
            """Probe's items_now, on this lane."""
            return Probe.items_now(self, ctx)  # type: ignore[arg-type]

    return Lane


LANES = [_lane(n) for n in range(6)]


def probe_runtime(
    call_timeout: float = WAIT,
    settings: Settings | None = None,
    extra: Sequence[type[Server]] = (),
) -> Iterator[Runtime]:
    """A runtime with the built-in servers, the probe, its lanes and `extra`; Probe's
    records reset."""
    Probe.reads, Probe.running, Probe.peak, Probe.undone = 0, 0, 0, []
    Probe.barrier = None
    Probe.ran = []
    Probe.entered = threading.Event()
    Probe.gate = threading.Event()
    runtime = Runtime(
        servers=[*BUILTIN, Probe, *LANES, *extra],
        ttl=600,
        call_timeout=call_timeout,
        settings=settings,
    )
    try:
        yield runtime
    finally:
        Probe.gate.set()
        runtime.close()


def batch(
    rt: Runtime,
    operations: list[Any],
    session: str = "s1",
    *,
    call_timeout: float = 3 * WAIT,
    **options: Any,
) -> ToolResult:
    args: dict[str, Any] = {"operations": operations, "__sessionId": session}
    if options:
        args["options"] = options
    return rt.call("batch", args, timeout=call_timeout)


def statuses(result: ToolResult) -> dict[str, str]:
    assert result.structured is not None, result.text
    return {r["id"]: r["status"] for r in result.structured["results"]}


def by_id(result: ToolResult) -> dict[str, dict[str, Any]]:
    assert result.structured is not None, result.text
    return {r["id"]: r for r in result.structured["results"]}


def state(rt: Runtime, tool: str, session: str = "s1", **ctx: str) -> Any:
    return rt.call(tool, {"__sessionId": session, **ctx}).structured


def run_plan(
    runtime: Any,
    rt: Runtime,
    ops: list[dict[str, Any]],
    options: BatchOptions,
    *,
    within: float,
    ctx: ToolContext,
) -> tuple[BatchResult, bool]:
    """Plan `ops` with `rt`'s tools and run them on `runtime` (`rt` or a stand-in) for a
    caller waiting `within` seconds: the engine's result and whether it rolled back."""
    steps = make_plan(
        msgspec.convert(ops, list[Operation]),
        rt.tools,
        ctx,
        excluded=frozenset(),
        max_operations=10,
        transactional=options.transactional,
    )
    run = BatchRun(
        runtime,
        steps,
        options,
        caller_deadline=time.monotonic() + within,
        max_expanded=1000,
        max_result=1000,
    )
    return run.execute()
