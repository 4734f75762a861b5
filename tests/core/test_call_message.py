"""A call is plain data: it encodes and decodes whole, and a decoded one runs like any call.

And the path it takes is short: one call takes the registry's lock once (on lookup/spawn).
"""

from __future__ import annotations

import pickle
import threading
from types import TracebackType
from typing import Any

import msgspec

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors._actors import SyncReply, current_actor
from ctxactors._call import Body, CallWrapper, Envelope, ToolCall, Undo
from ctxactors.batch.compensation import Compensation
from ctxactors.errors import ToolError
from ctxactors.results import ToolResult
from ctxactors.testing import ManualClock
from ctxactors.testing import context_args as ctx_args
from ctxactors.tools import ToolSpec

WAIT = 20.0

CALL = ToolCall(
    "mark_todo",
    ToolContext("s1", "a1", "t1", principal="alice"),
    {"todo_id": "t2", "done": True, "notes": ["é", {"n": 1.5, "none": None}]},
    deadline=1234.5,
    read_only=False,
    durable=True,
    observe=False,
    prepare=True,
    undo=Undo({"id": "t2", "done": True}, prior={"done": False}),
)


def test_a_call_message_round_trips_through_msgpack_json_and_pickle() -> None:
    for encoding in (msgspec.msgpack, msgspec.json):
        data = encoding.encode(CALL)
        assert encoding.decode(data, type=ToolCall) == CALL
    assert pickle.loads(pickle.dumps(CALL)) == CALL
    # Defaults stay out of nothing: a plain call decodes to the same plain call.
    plain = ToolCall("get_planning_state", ToolContext("s1"), {})
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(plain), type=ToolCall) == plain
    assert (plain.observe, plain.prepare, plain.undo, plain.deadline) == (True, False, None, None)


def test_a_decoded_call_runs_in_its_keys_actor_like_a_direct_call() -> None:
    with Runtime() as rt:
        assert rt.call("create_goal", ctx_args("s1", goal="first")).structured == {
            "id": "g1",
            "goal": "first",
        }
        wire = msgspec.msgpack.encode(
            ToolCall("create_goal", ToolContext("s1"), {"goal": "sent as bytes"})
        )
        call = msgspec.msgpack.decode(wire, type=ToolCall)
        spec = rt.tool_spec(call.tool)
        key = spec.server.scope.key(spec.server.name, call.ctx)
        reply = SyncReply()
        envelope = Envelope(call, spec, spec.validate(call.arguments), key, reply, rt._host)
        rt._registry.submit(key, rt._factories[spec.server], envelope)
        assert reply.wait(WAIT)
        # The same actor and state as the direct call (g2 follows g1), and recorded.
        assert reply.value.structured == {"id": "g2", "goal": "sent as bytes"}
        recent = rt.call("get_recent_context", ctx_args("s1", limit=1)).structured
        assert recent is not None
        assert [(op["tool"], op["arguments"]) for op in recent["operations"]] == [
            ("create_goal", {"goal": "sent as bytes"})
        ]


class CountingLock:
    """The registry's lock, counting how often it is taken."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.taken = 0

    def acquire(self) -> bool:
        taken: bool = self._lock.acquire()
        self.taken += 1
        return taken

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> CountingLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()


def test_one_call_takes_the_registry_lock_once(clock: ManualClock) -> None:
    # A manual clock and no scan interval: no background reaper takes the lock meanwhile.
    with Runtime(clock=clock) as rt:
        lock = CountingLock(rt._registry._lock)
        rt._registry._lock = lock  # type: ignore[assignment]
        calls = [
            ("create_goal", ctx_args("s1", "a1", goal="ship")),  # spawns planning, history kept
            ("create_goal", ctx_args("s1", "a1", goal="test")),
            ("get_planning_state", ctx_args("s1", "a1")),
            ("get_recent_context", ctx_args("s1", "a1")),  # spawns the history actor
            ("get_recent_context", ctx_args("s1", "a1")),
        ]
        for n, (tool, args) in enumerate(calls, 1):
            assert not rt.call(tool, args).is_error
            assert lock.taken == n
        # Each call's post-reply step (log line, observers) took no lock either: a call
        # queued behind them on the same key finds the count unchanged.
        assert rt.call("get_planning_state", ctx_args("s1", "a1")).structured is not None
        assert lock.taken == len(calls) + 1


def test_calls_from_many_threads_leave_nothing_in_flight() -> None:
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait(WAIT)
            for n in range(50):
                args = ctx_args(f"s{i % 3}", f"a{n % 2}", goal=f"{i}-{n}")
                assert not rt.call("create_goal", args).is_error
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with Runtime() as rt:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert errors == []
        stats = rt.stats()
        assert (stats["inflight"], stats["calls"]) == (0, 400)
        goals = sum(
            len(rt.call("get_planning_state", ctx_args(f"s{s}", f"a{a}")).structured["goals"])
            for s in range(3)
            for a in range(2)
        )
        assert goals == 400


def test_call_wrappers_wrap_the_body_the_actor_runs_the_last_added_outermost(
    clock: ManualClock,
) -> None:
    seen: list[tuple[Any, ...]] = []
    caller = threading.current_thread()

    def wrapper(label: str) -> CallWrapper:
        def wrap(body: Body, spec: ToolSpec, ctx: ToolContext) -> Body:
            assert threading.current_thread() is caller  # wrapped in the caller's thread
            seen.append((label, "wrap", spec.name, ctx.session_id, ctx.assistant_id))

            def run(server: Any) -> ToolResult:
                # Run by the key's actor: a worker, or the caller's thread in its stead.
                in_actor = current_actor() is not None
                seen.append((label, "run", type(server).__name__, in_actor))
                result = body(server)
                seen.append((label, "ran", result.structured))
                return ToolResult.ok({**(result.structured or {}), label: True})

            return run

        return wrap

    with Runtime(clock=clock) as rt:
        rt.add_call_wrapper(wrapper("inner"))
        rt.add_call_wrapper(wrapper("outer"))
        result = rt.call("create_goal", ctx_args("s1", "a1", goal="ship"))
        assert result.structured == {"id": "g1", "goal": "ship", "inner": True, "outer": True}
        assert seen == [
            ("inner", "wrap", "create_goal", "s1", "a1"),
            ("outer", "wrap", "create_goal", "s1", "a1"),
            ("outer", "run", "Planning", True),
            ("inner", "run", "Planning", True),
            ("inner", "ran", {"id": "g1", "goal": "ship"}),
            ("outer", "ran", {"id": "g1", "goal": "ship", "inner": True}),
        ]


def test_a_rolled_back_batch_wraps_its_operations_but_not_their_undo(
    clock: ManualClock,
) -> None:
    """The undo of a transactional batch restores what the operation's ``before`` recorded
    (a mark undone goes back to not done), and no call wrapper sees it: an undo is not a
    call of the tool it undoes."""
    wrapped: list[str] = []
    lock = threading.Lock()

    def wrap(body: Body, spec: ToolSpec, ctx: ToolContext) -> Body:
        with lock:
            wrapped.append(spec.name)
        return body

    with Runtime(clock=clock) as rt:
        todo = rt.call("add_todo", ctx_args("s1", name="ship")).structured
        assert todo is not None and todo["id"] == "t1"
        rt.add_call_wrapper(wrap)
        ops = [
            {"id": "m", "tool": "mark_todo", "arguments": {"todo_id": "t1"}},
            {"id": "bad", "tool": "mark_todo", "arguments": {"todo_id": "no"}, "dependsOn": ["m"]},
        ]
        options = {"transactional": True}
        result = rt.call("batch", ctx_args("s1", operations=ops, options=options))
        assert result.is_error
        state = rt.call("get_planning_state", ctx_args("s1")).structured
        assert state is not None
        assert [(t["id"], t["done"]) for t in state["todos"]] == [("t1", False)]
        assert wrapped == ["batch", "mark_todo", "mark_todo", "get_planning_state"]


class Ledger(Server):
    """A tool whose undo needs the call's context and what ``before`` recorded."""

    name = "ledger"
    scope = Scope.SESSION

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.undone: list[Any] = []

    def _before(self, ctx: ToolContext, args: Any) -> tuple[str | None, int]:
        return ctx.assistant_id, len(self.entries)

    def _undo(self, ctx: ToolContext, args: Any, result: Any, before: Any) -> None:
        self.undone.append([ctx.thread_id, args.item, result, before])
        del self.entries[before[1]]

    @tool(compensate=Compensation(_undo, before=_before))
    def put(self, ctx: ToolContext, item: str) -> dict[str, Any]:
        """Add an entry (not "boom")."""
        if item == "boom":
            raise ToolError("refused")
        self.entries.append(item)
        return {"at": len(self.entries)}

    @tool(read_only=True)
    def show(self, ctx: ToolContext) -> dict[str, Any]:
        """What is kept and what was undone."""
        return {"entries": self.entries, "undone": self.undone}


def test_an_undo_gets_the_calls_context_arguments_result_and_what_before_recorded(
    clock: ManualClock,
) -> None:
    with Runtime([Ledger], clock=clock) as rt:
        assert rt.call("put", ctx_args("s1", "a1", "t1", item="kept")).structured == {"at": 1}
        ops = [
            {"id": "p", "tool": "put", "arguments": {"item": "x"}},
            {"id": "b", "tool": "put", "arguments": {"item": "boom"}, "dependsOn": ["p"]},
        ]
        options = {"transactional": True}
        result = rt.call("batch", ctx_args("s1", "a1", "t1", operations=ops, options=options))
        assert result.is_error, result.text
        assert rt.call("show", ctx_args("s1", "a1", "t1")).structured == {
            "entries": ["kept"],
            "undone": [["t1", "x", {"at": 2}, ("a1", 1)]],
        }
