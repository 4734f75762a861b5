"""Running a checked batch plan: order, parallelism, references, dedup, timeouts, rollback.

The engine runs in the thread of whichever actor holds the batch call (the batch or the
presets key) and hands each operation to its own key's actor as a call like any other
(`Runtime._submit`), so it runs exactly like a direct call (same actor, same ordering, same
history); an undo is a call too, with the compensation as its `Undo`. Replies
come back through one queue; `parallel` simply means several operations are submitted
before waiting, so operations on different keys truly overlap while operations on one key
keep their order in that key's mailbox. It never submits to its own key: nested batches
are refused when the plan is made.

Time: the batch's own limits end before its caller's (`caller_deadline`), with a margin to
hand the result back, so an operation that uses all of its time becomes a per-operation
``timeout`` inside the batch result, never the caller's `CallTimeoutError`. An operation
still waiting in its key's mailbox when the batch gives up on it does not run at all. A
rollback waits for its undos until half that margin past the batch's end (so still half
a margin before the caller's deadline), and no longer: an undo not confirmed by then is
reported as such and still runs in its key's actor, before that key's next call.
"""

from __future__ import annotations

import collections
import graphlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ctxactors._call import Undo
from ctxactors.batch.plan import (
    BadReference,
    BatchOptions,
    BatchResult,
    OpError,
    OpMetadata,
    OpResult,
    Step,
    Summary,
    lookup,
    resolve,
)
from ctxactors.batch.template import REFERENCES, Path, size_of
from ctxactors.errors import CtxActorsError
from ctxactors.results import ToolResult

_encode_sorted = msgspec.json.Encoder(order="sorted").encode


def _margin(remaining: float) -> float:
    """How long before the caller's deadline a batch stops, to hand its result back."""
    return min(max(remaining / 10, 0.01), 1.0)


class _OpReply:
    """The reply slot of one operation.

    It normally hands the result to the batch's queue. Once the batch gave up waiting (the
    operation timed out) a late result goes to `on_late` instead, so a write that finishes
    after its timeout can still be compensated; an operation the batch gave up on before
    its actor reached it does not run (`begin` says so).
    """

    __slots__ = (
        "step",
        "_lock",
        "value",
        "_arrived",
        "_began",
        "_on_late",
        "_inbox",
        "prior",
        "started",
        "deadline",
    )

    def __init__(self, step: Step, inbox: queue.SimpleQueue[_OpReply], deadline: float) -> None:
        self.step = step
        self._lock = threading.Lock()
        self.value: ToolResult | None = None
        self._arrived = False
        self._began = False
        self._on_late: Callable[[_OpReply], None] | None = None
        self._inbox = inbox
        self.prior: Any = None  # what the compensation recorded before the tool ran
        self.started = 0.0
        self.deadline = deadline  # the operation's own, for `caller_deadline` in its actor

    def begin(self) -> bool:
        """In the operation's actor, before it runs: False if the batch already gave up."""
        with self._lock:
            self._began = self._on_late is None
            return self._began

    def start(self) -> str | None:
        """The reply slot's side of `begin`: why it must not run, if it must not."""
        return None if self.begin() else "not run: the batch gave up on it before it started"

    def set(self, value: Any) -> None:
        with self._lock:
            self.value = value
            self._arrived = True
            late = self._on_late
        if late is not None:
            late(self)
        else:
            self._inbox.put(self)

    def abandon(self, on_late: Callable[[_OpReply], None]) -> bool:
        """Send a future result to `on_late`; False if it already arrived (it is queued)."""
        with self._lock:
            if self._arrived:
                return False
            self._on_late = on_late
            return True


class _UndoReply:
    """Where one undo's result comes back to a rollback that waits for it.

    Not a `SyncReply`: the scheduler runs a `SyncReply`'s sync call to an idle key on the
    sending thread, and then this batch would wait for the undo however long it took
    instead of answering its caller in time."""

    __slots__ = ("_done", "value")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.value: ToolResult | None = None

    def start(self) -> str | None:
        return None

    def set(self, value: ToolResult) -> None:
        self.value = value
        self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(max(timeout, 0.0))


class BatchRun:
    """One execution of a plan. Use `execute` once; it returns the result and whether the
    batch was rolled back."""

    def __init__(
        self,
        runtime: Any,
        steps: list[Step],
        options: BatchOptions,
        *,
        caller_deadline: float | None,
        max_expanded: int,
        max_result: int,
        expanded: int = 0,
    ) -> None:
        self.runtime = runtime
        self.steps = steps
        self.options = options
        self.caller = (
            caller_deadline
            if caller_deadline is not None
            else time.monotonic() + float(runtime.call_timeout)
        )
        self.max_expanded = max_expanded
        self.expanded = expanded  # bytes of text built from references (and params) so far
        self.max_result = max_result
        self.result_bytes = 0  # the operations' data and error messages so far
        self._sizes: dict[Path, int] = {}
        self.by_id = {s.id: s for s in steps}
        self.outcome: dict[str, str] = {}  # id -> success | failed | skipped
        self.results: dict[str, OpResult] = {}
        self.data: dict[str, Any] = {}  # successful results, for references
        self.inbox: queue.SimpleQueue[_OpReply] = queue.SimpleQueue()
        self.inflight: dict[str, tuple[_OpReply, float]] = {}  # id -> (reply, deadline)
        self.writes_done: list[_OpReply] = []  # successful writes, in completion order
        self.last_read: tuple[bytes, str] | None = None  # (read, op id) if last submitted
        self.waiters: dict[str, list[Step]] = {}  # op id -> duplicate reads waiting on it
        self.stop: OpError | None = None
        self._late_lock = threading.Lock()
        self._late: list[_OpReply] = []
        self._rolling_back = False
        self.t0 = time.perf_counter()

    # -- main loop -----------------------------------------------------------------------

    def execute(self) -> tuple[BatchResult, bool]:
        options = self.options
        now = time.monotonic()
        # End early enough to hand the result back before the caller stops waiting.
        deadline = self.caller - _margin(self.caller - now)
        if options.timeout is not None:
            deadline = min(deadline, now + options.timeout / 1000)
        self.end = deadline
        budget = max(deadline - now, 0.0)
        # A rollback that starts at the end still gets time for its undos: half the margin.
        self.undo_until = deadline + _margin(self.caller - now) / 2
        if self.caller <= now:
            self.stop = OpError("caller_timeout", "the caller stopped waiting before it ran")
        limit = (options.max_concurrency or len(self.steps)) if options.parallel else 1
        sorter = graphlib.TopologicalSorter({s.id: s.after for s in self.steps})
        sorter.prepare()
        self.sorter = sorter
        ready: list[Step] = []
        while sorter.is_active():
            ready.extend(self.by_id[i] for i in sorter.get_ready())
            ready.sort(key=lambda s: s.index)  # input order among the ready ones
            if self.stop is None and time.monotonic() >= deadline:
                self.stop = OpError("batch_timeout", f"the batch ran out of its {budget:g} s")
                for op_id in list(self.inflight):
                    self._time_out(op_id, "the batch ran out of time")
            if self.stop is not None:
                for step in ready:
                    self._finish(step, "skipped", error=self.stop)
                ready.clear()
            while ready and len(self.inflight) < limit:
                self._start(ready.pop(0))
            if self.inflight:
                self._wait(deadline)
        # A transaction that did not run to the end is undone, even when nothing failed:
        # the batch timeout may stop it between two operations with every reply in.
        rolled_back = self.options.transactional and (
            self.stop is not None or "failed" in self.outcome.values()
        )
        if rolled_back:
            self._roll_back()
        return self._result(), rolled_back

    def _wait(self, batch_deadline: float) -> None:
        until = min([batch_deadline, *(d for _, d in self.inflight.values())])
        try:
            reply = self.inbox.get(timeout=max(until - time.monotonic(), 0.0))
        except queue.Empty:
            now = time.monotonic()
            for op_id, (_, op_deadline) in list(self.inflight.items()):
                if op_deadline <= now:  # its own limit, or the batch's when it had none
                    whose = "batch" if op_deadline >= batch_deadline else "operation"
                    self._time_out(op_id, f"the {whose} ran out of time")
            return
        self._complete(reply)

    # -- one operation -------------------------------------------------------------------

    def _start(self, step: Step) -> None:
        reason = self._skip_reason(step)
        if reason is not None:
            self._finish(step, "skipped", error=reason)
            return
        if step.validated is None:  # arguments with references: fill them in, then check
            problem = self._fill(step)
            if problem is not None:
                self._finish(step, "failed", error=problem)
                return
        if self._deduplicated(step):
            return
        deadline = (
            self.end if step.timeout is None else min(self.end, time.monotonic() + step.timeout)
        )
        reply = _OpReply(step, self.inbox, deadline)
        reply.started = time.perf_counter()
        try:
            self.runtime._submit(
                step.spec,
                step.ctx,
                step.validated,
                step.args,
                reply,
                deadline=deadline,
                prepare=self.options.transactional and step.compensation is not None,
            )
        except CtxActorsError as exc:
            self._finish(step, "failed", error=OpError("runtime_error", str(exc)))
            return
        self.inflight[step.id] = (reply, deadline)

    def _fill(self, step: Step) -> OpError | None:
        """Put the referenced values into the arguments, unless that would build more text
        than the batch may (counted before anything is built), and check them."""
        grown = REFERENCES.filled_size(step.args, self._size)
        if self.expanded + grown > self.max_expanded:
            return OpError(
                "too_large",
                f"operation {step.index} ({step.id!r}): its references would build "
                f"{grown} bytes of arguments, {self.expanded} were built before it, over the "
                f"batch's limit of {self.max_expanded} (CTXACTORS_BATCH_MAX_EXPANDED_BYTES)",
            )
        self.expanded += grown
        try:
            step.args = resolve(step.args, self.data)
            step.validated = step.spec.validate(step.args)
        except CtxActorsError as exc:  # a bad reference (a ToolError) or bad arguments
            return OpError("invalid_arguments", str(exc))
        return None

    def _size(self, ref: Path) -> int:
        size = self._sizes.get(ref)
        if size is None:
            try:
                size = size_of(lookup(ref, self.data))
            except BadReference:
                size = 0  # filling it reports the bad reference
            self._sizes[ref] = size
        return size

    def _deduplicated(self, step: Step) -> bool:
        """Answer a read with the result of the identical read submitted right before it.

        Only when nothing else was submitted in between: then nothing this batch did can
        have changed what the read sees. (Any other operation might: a write to any key,
        and even a read, which `get_recent_context` would show.)
        """
        if not step.spec.read_only:
            self.last_read = None
            return False
        signature = _encode_sorted([step.spec.name, step.args])
        if self.last_read is None or self.last_read[0] != signature:
            self.last_read = (signature, step.id)
            return False
        original = self.last_read[1]
        if original in self.results:
            self._copy(step, self.results[original])
        else:
            self.waiters.setdefault(original, []).append(step)
        return True

    def _skip_reason(self, step: Step) -> OpError | None:
        if self.stop is not None:
            return self.stop
        for need in sorted(step.needs, key=lambda i: self.by_id[i].index):
            if self.outcome[need] != "success":
                return OpError(
                    "dependency_" + self.outcome[need], f"dependency {need!r} {self.outcome[need]}"
                )
        cond = step.condition
        if cond is not None:
            if cond.if_success is not None and self.outcome[cond.if_success] != "success":
                return OpError("condition_not_met", f"{cond.if_success!r} did not succeed")
            if cond.if_failed is not None and self.outcome[cond.if_failed] != "failed":
                return OpError("condition_not_met", f"{cond.if_failed!r} did not fail")
        return None

    def _complete(self, reply: _OpReply) -> None:
        step = reply.step
        del self.inflight[step.id]
        value = reply.value
        assert value is not None
        started = reply.started
        if value.is_error:
            self._finish(step, "failed", error=OpError("tool_error", value.text), since=started)
        else:
            data = value.structured if value.structured is not None else value.text
            self._finish(step, "success", data=data, since=started)
            if not step.spec.read_only:
                self.writes_done.append(reply)
        for waiter in self.waiters.pop(step.id, []):
            self._copy(waiter, self.results[step.id])

    def _time_out(self, op_id: str, why: str) -> None:
        reply, _ = self.inflight[op_id]
        if not reply.abandon(self._late_result):
            return  # it answered just now: the reply is in the queue
        del self.inflight[op_id]
        step = reply.step
        self._finish(step, "failed", error=OpError("timeout", why), since=reply.started)
        for waiter in self.waiters.pop(op_id, []):
            self._copy(waiter, self.results[op_id])

    def _late_result(self, reply: _OpReply) -> None:
        """A timed-out operation answered after all (runs in its key's actor thread)."""
        if not self.options.transactional or reply.step.spec.read_only:
            return
        with self._late_lock:
            if not self._rolling_back:
                self._late.append(reply)
                return
        self._compensate(reply, wait=False)

    def _copy(self, step: Step, original: OpResult) -> None:
        """A duplicate read: the same outcome as the first, without running it again."""
        status = original.status
        if status == "success":
            self.data[step.id] = original.data
        self._finish(step, status, data=original.data, error=original.error, dedup=True)

    def _finish(
        self,
        step: Step,
        status: str,
        *,
        data: Any = None,
        error: OpError | None = None,
        since: float | None = None,
        dedup: bool = False,
    ) -> None:
        now = time.perf_counter()
        started = now if since is None else since
        meta = None
        if self.options.include_metadata:
            meta = OpMetadata(
                started_ms=round((started - self.t0) * 1000, 3),
                duration_ms=round((now - started) * 1000, 3),
                deduplicated=dedup,
            )
        self.outcome[step.id] = status
        if status == "success":
            self.data[step.id] = data
        self.results[step.id] = OpResult(step.id, step.spec.name, status, data, error, meta)
        if status == "failed" and self.options.transactional and self.stop is None:
            self.stop = OpError("aborted", f"{step.id!r} failed; the transaction stops")
        self._count_result(data, error)
        self.sorter.done(step.id)

    def _count_result(self, data: Any, error: OpError | None) -> None:
        """Stop starting operations once their results pass the bound: a few bytes of
        batch must not read the same megabyte a hundred times into one answer."""
        self.result_bytes += (0 if data is None else size_of(data)) + (
            0 if error is None else len(error.message)
        )
        if self.result_bytes > self.max_result and self.stop is None:
            self.stop = OpError(
                "batch_too_large",
                f"the operations' results reached {self.result_bytes} bytes, over the "
                f"batch's limit of {self.max_result} (CTXACTORS_BATCH_MAX_RESULT_BYTES)",
            )

    # -- rollback ------------------------------------------------------------------------

    def _roll_back(self) -> None:
        """Undo every successful write, newest first, each in its key's own actor.

        Each undo is sent once the one before it is confirmed, and waited for until
        `undo_until` at most. Past that, the rest are sent without waiting: an undo not
        confirmed still runs in its key's actor (before that key's next call), but is not
        reported undone."""
        with self._late_lock:
            self._rolling_back = True
            late = list(self._late)
        for reply in reversed(self.writes_done):
            undo = self._compensate(reply)
            problem = undo if isinstance(undo, str) else self._confirm(undo)
            result = self.results[reply.step.id]
            if problem is None:
                self.results[reply.step.id] = msgspec.structs.replace(result, status="rolled_back")
            else:
                self.results[reply.step.id] = msgspec.structs.replace(
                    result, error=OpError("compensation_failed", problem)
                )
        for reply in late:
            self._compensate(reply, wait=False)
        for op_id, result in self.results.items():
            if result.status == "success" and self.by_id[op_id].spec.read_only:
                self.results[op_id] = msgspec.structs.replace(result, status="rolled_back")

    def _compensate(self, reply: _OpReply, wait: bool = True) -> _UndoReply | str | None:
        """Send the undo of one operation: where its result will come (with `wait`), the
        reason it could not be sent, or None when there is nothing to wait for."""
        step, value = reply.step, reply.value
        comp = step.compensation
        if comp is None or value is None or value.is_error:
            return None
        done = _UndoReply() if wait else None
        try:
            self.runtime._submit(
                step.spec,
                step.ctx,
                step.validated,
                step.args,
                done,
                deadline=None,
                undo=Undo(value.structured, reply.prior),
            )
        except CtxActorsError as exc:
            return str(exc)
        return done

    def _confirm(self, done: _UndoReply | None) -> str | None:
        """Wait for a sent undo until `undo_until`: any problem it had, or that it was not
        confirmed in time."""
        if done is None:
            return None
        if not done.wait(self.undo_until - time.monotonic()):
            return "the compensation was not confirmed before the batch's deadline"
        outcome = done.value
        assert outcome is not None
        return outcome.text if outcome.is_error else None

    def _result(self) -> BatchResult:
        results = [self.results[s.id] for s in self.steps]
        counts = collections.Counter(r.status for r in results)
        summary = Summary(
            total=len(results),
            successful=counts["success"],
            failed=counts["failed"],
            skipped=counts["skipped"],
            rolled_back=counts["rolled_back"],
            execution_time=round((time.perf_counter() - self.t0) * 1000, 3),
        )
        return BatchResult(summary, results)
