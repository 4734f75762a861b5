"""A tool call as plain data, and the one function that runs it in its key's actor.

The caller builds a `ToolCall` once (the tool's name, the context, the clean arguments and
the options) and sends it, in an `Envelope` with its reply slot, to the key's actor, where
`execute` does everything a call involves, in this order:

1. with a store, load the key's state on the incarnation's first call (`ctxactors.durable`);
2. run the handler (or the compensation's ``before`` first, or the undo instead);
3. with a store and a tool that writes, save the state before anyone sees the result;
4. tell the early observers (the operation history: the caller's next call must see it);
5. count the call as done, so a caller holding its result sees the key idle;
6. hand the result to the reply slot;
7. hand the call's log line to the log writer (`ctxactors.logs.call_logger`) and tell the
   other observers, off the caller's clock.

The `ToolCall` has no closures and no locks, so it can be encoded and run elsewhere; the
`Envelope` adds what only this process has (the reply slot, the validated arguments, the
looked-up tool, the runtime's hooks), built once per call from plain references.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import msgspec

from ctxactors._tool_loop import ToolLoop, tool_deadline
from ctxactors.batch.compensation import as_compensation
from ctxactors.context import ToolContext
from ctxactors.logs import call_logger, lazy_logger
from ctxactors.results import ToolResult
from ctxactors.tools import Key, ToolSpec

# An observer sees every call that reached a server: (ctx, spec, clean arguments, result).
Observer = Callable[[ToolContext, ToolSpec, dict[str, Any], ToolResult], None]
# The body of a call in its actor: steps 1-3 below, given the key's server.
Body = Callable[[Any], ToolResult]
# A call wrapper (metrics, tracing) is called in the caller's thread with the call's body and
# returns the body the actor runs instead: ``wrap(body, spec, ctx) -> body``.
CallWrapper = Callable[[Body, ToolSpec, ToolContext], Body]


class Undo(msgspec.Struct, frozen=True):
    """Run the tool's compensation instead of the tool: what the undone call returned
    (its structured result) and what the compensation's ``before`` recorded then."""

    result: dict[str, Any] | None
    prior: Any = None


class ToolCall(msgspec.Struct, frozen=True):
    """One call, as data.

    `arguments` are the clean ones (no ``__*`` context fields), already validated in the
    caller. `deadline` is when the caller stops waiting (`time.monotonic`), for
    `caller_deadline`. `read_only` skips the save; `durable` says the key's state lives in
    the runtime's store. ``observe=False`` keeps the call out of the observers (an undo is
    not a call of the tool it undoes); `prepare` runs the compensation's ``before`` first
    (a transactional batch's operation); `undo` runs the compensation instead of the tool.
    """

    tool: str
    ctx: ToolContext
    arguments: dict[str, Any]
    deadline: float | None = None
    read_only: bool = False
    durable: bool = False
    observe: bool = True
    prepare: bool = False
    undo: Undo | None = None


class Reply(Protocol):
    """Where a call's result goes (see `ctxactors._actors`)."""

    def start(self) -> str | None:
        """In the actor, right before the call runs: None to run it, or why it must not."""
        ...

    def set(self, value: Any) -> None: ...


class PriorReply(Reply, Protocol):
    """The reply slot of a `prepare` call: it also gets what ``before`` recorded."""

    prior: Any


class Finishing(Protocol):
    """The actor's bookkeeping: told once per message, before the reply."""

    def finished(self) -> None: ...


class CallHost:
    """What a runtime lends every call it sends: its log, its store side, its observers.

    One per runtime; the lists are the runtime's own, so observers added later apply.
    """

    __slots__ = (
        "log",
        "log_call",
        "durable",
        "observers",
        "early_observers",
        "wrappers",
        "tool_loop",
    )

    def __init__(
        self,
        log: Any,
        durable: Any,
        observers: list[Observer],
        early_observers: list[Observer],
    ) -> None:
        self.log = log
        # Writes a call's log line; None when the logger's level filters it out.
        self.log_call = call_logger(log)
        self.durable = durable  # a `ctxactors.durable.Durability`, or None
        self.observers = observers
        self.early_observers = early_observers
        self.wrappers: tuple[CallWrapper, ...] = ()
        self.tool_loop = ToolLoop()  # where async tools run (its thread starts on first use)


class Envelope:
    """A `ToolCall` on its way to an actor in this process, with its reply slot."""

    __slots__ = ("call", "spec", "validated", "key", "reply", "host", "started", "body")

    def __init__(
        self,
        call: ToolCall,
        spec: ToolSpec,
        validated: Any,
        key: Key,
        reply: Reply | None,
        host: CallHost,
    ) -> None:
        self.call = call
        self.spec = spec
        self.validated = validated
        self.key = key
        self.reply = reply
        self.host = host
        self.started = time.perf_counter()
        self.body: Body | None = None  # set only when the runtime has call wrappers

    def wrap(self, wrappers: tuple[CallWrapper, ...]) -> None:
        """In the caller's thread: let each wrapper wrap the call's body (see `CallWrapper`)."""
        body: Body = cast(Body, functools.partial(_run, self))  # no actor: it saves in place
        for wrapper in wrappers:
            body = wrapper(body, self.spec, self.call.ctx)
        self.body = body


_running = threading.local()
# For a failing log line: the runtime's own logger may be what fails.
_log = lazy_logger("ctxactors.call")


def caller_deadline() -> float | None:
    """When the caller of the call this actor thread (or async tool) is running stops
    waiting for it.

    A `time.monotonic` instant, or None when unknown. A handler that starts more work on
    its caller's behalf (the batch tool) ends that work before this, so nothing runs for a
    caller that has given up.
    """
    deadline: float | None = getattr(_running, "deadline", None)
    if deadline is None:  # an async tool's coroutine, on the runtime's loop
        deadline = tool_deadline.get()
    return deadline


# Parks an actor whose async tool is awaiting: ``park(envelope, coroutine)`` runs the
# coroutine without holding the actor's thread, and calls `resume` once it is done.
Park = Callable[["Envelope", Any], None]


def execute(
    envelope: Envelope,
    server: Any,
    actor: Finishing,
    start_error: BaseException | None,
    park: Park | None = None,
) -> None:
    """Run one call in its key's actor (the module docstring lists the steps).

    Given `park`, an async tool's coroutine is handed to it after step 1, and the call
    goes on in `resume` (steps 3-7) once the coroutine is done; without it, the actor's
    thread waits for the coroutine. Never raises: a failing handler, store or observer
    gives an error result or a log line, and the actor goes on serving its key.
    """
    call = envelope.call
    # Set back after: a call run in place inside a tool (a tool calling another key) must
    # leave that tool's own deadline.
    outer = getattr(_running, "deadline", None)
    _running.deadline = call.deadline
    try:
        if start_error is not None:
            raise RuntimeError(f"server failed to start: {start_error}")
        if envelope.body is not None:
            result = envelope.body(server)
        elif call.durable:  # steps 1-3
            saved = _run(envelope, server, actor, park)
            if saved is None:
                return  # being saved (`finish` runs once the store has answered), or parked
            result = saved
        else:  # without a store, step 2 only
            handled = _handle(envelope, server, park)
            if handled is None:
                return  # parked
            result = handled
    except BaseException as exc:  # noqa: BLE001 - a call must never take its actor down
        result = ToolResult.from_exception(exc)
    finally:
        _running.deadline = outer
    finish(envelope, actor, result)


def resume(envelope: Envelope, server: Any, actor: Finishing, result: ToolResult) -> None:
    """Go on with a parked call once its coroutine is done: steps 3-7. Never raises."""
    try:
        saved = _save(envelope, server, actor, result)
        if saved is None:
            return  # being saved: `finish` runs once the store has answered
        result = saved
    except BaseException as exc:  # noqa: BLE001
        result = ToolResult.from_exception(exc)
    finish(envelope, actor, result)


def finish(envelope: Envelope, actor: Finishing, result: ToolResult) -> None:
    """Steps 4-7, in the actor's thread or, after a save it went on without, in the thread
    that wrote it."""
    call, host = envelope.call, envelope.host
    try:
        if call.observe and host.early_observers:
            _notify(host.early_observers, envelope, result)
    except BaseException as exc:  # noqa: BLE001 - a call must never take its actor down
        result = ToolResult.from_exception(exc)
    finally:
        actor.finished()
    if envelope.reply is not None:
        envelope.reply.set(result)
    try:
        if host.log_call is not None:
            error = result.text if result.is_error else None  # the line says what failed
            host.log_call(call.ctx, call.tool, envelope.started, error)
        if call.observe and host.observers:
            _notify(host.observers, envelope, result)
    except Exception as exc:  # noqa: BLE001 - bookkeeping never fails a call
        _log.error("after_call_failed", exc_info=exc)


def _run(
    envelope: Envelope, server: Any, actor: Finishing | None = None, park: Park | None = None
) -> ToolResult | None:
    """Steps 1-3: the handler between the load and the save of a durable key's state.

    Given the `actor` (no call wrapper waits for the body's result), the save goes on
    without the actor and None means `finish` is called once the store has answered (or,
    for a parked call, `resume` once its coroutine is done).
    """
    call = envelope.call
    durable = envelope.host.durable if call.durable else None
    if durable is not None:
        failed: ToolResult | None = durable.load(server, envelope.key)
        if failed is not None:
            return failed
    result = _handle(envelope, server, park)
    if result is None:
        return None  # parked
    return _save(envelope, server, actor, result)


def _save(
    envelope: Envelope, server: Any, actor: Finishing | None, result: ToolResult
) -> ToolResult | None:
    """Step 3: a writing call's state saved before anyone sees its result (with the `actor`,
    pipelined: None, and `finish` runs once the store has answered)."""
    call = envelope.call
    durable = envelope.host.durable if call.durable else None
    if durable is not None and not call.read_only:
        then = None if actor is None else functools.partial(finish, envelope, actor)
        saved: ToolResult | None = durable.save(server, envelope.key, result, then)
        return saved
    return result


def _handle(envelope: Envelope, server: Any, park: Park | None = None) -> ToolResult | None:
    call, spec, args = envelope.call, envelope.spec, envelope.validated
    if call.undo is not None:
        undo = as_compensation(spec.compensate)
        if undo is None:
            raise RuntimeError(f"tool {spec.name!r} has no compensation")
        undo(server, call.ctx, args, call.undo.result, call.undo.prior)
        return ToolResult.ok({"compensated": spec.name})
    reply = envelope.reply
    refusal = reply.start() if reply is not None else None
    if refusal is not None:
        return ToolResult.error(refusal)
    if call.prepare:
        compensation = as_compensation(spec.compensate)
        if compensation is not None and reply is not None:
            cast(PriorReply, reply).prior = compensation.prepare(server, call.ctx, args)
    if spec.is_async:
        if park is None:  # this thread waits for the coroutine
            return spec.invoke(server, call.ctx, args, envelope.host.tool_loop, call.deadline)
        coroutine = spec.start(server, call.ctx, args)
        if isinstance(coroutine, ToolResult):
            return coroutine
        park(envelope, coroutine)
        return None
    return spec.invoke(server, call.ctx, args)


def _notify(observers: list[Observer], envelope: Envelope, result: ToolResult) -> None:
    call = envelope.call
    for observer in observers:
        try:
            observer(call.ctx, envelope.spec, call.arguments, result)
        except Exception as exc:  # noqa: BLE001 - recording never fails a call
            envelope.host.log.error("observer_failed", exc_info=exc)
