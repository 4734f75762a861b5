"""Running a checked batch plan: order, parallelism, references, dedup, timeouts, rollback.

The engine runs in the thread of whichever actor holds the batch call (the batch or the
presets key) and hands each operation to its own key's actor with `Runtime.submit`, so the
operation runs exactly like a direct call (same actor, same ordering, same history). Replies
come back through one queue; `parallel` simply means several operations are submitted
before waiting, so operations on different keys truly overlap while operations on one key
keep their order in that key's mailbox. It never submits to its own key: nested batches
are refused when the plan is made.
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

from ctxactors.actors import SyncReply
from ctxactors.batch_plan import (
    BatchOptions,
    BatchResult,
    OpError,
    OpMetadata,
    OpResult,
    Step,
    Summary,
    resolve,
)
from ctxactors.results import CtxActorsError, ToolError, ToolResult

_encode_sorted = msgspec.json.Encoder(order="sorted").encode


class _OpReply:
    """The reply slot of one operation.

    It normally hands the result to the batch's queue. Once the batch gave up waiting (the
    operation timed out) a late result goes to `on_late` instead, so a write that finishes
    after its timeout can still be compensated.
    """

    __slots__ = ("step", "_lock", "value", "_arrived", "_on_late", "_inbox", "prior", "started")

    def __init__(self, step: Step, inbox: queue.SimpleQueue[_OpReply]) -> None:
        self.step = step
        self._lock = threading.Lock()
        self.value: ToolResult | None = None
        self._arrived = False
        self._on_late: Callable[[_OpReply], None] | None = None
        self._inbox = inbox
        self.prior: Any = None  # what the compensation recorded before the tool ran
        self.started = 0.0

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


class BatchRun:
    """One execution of a plan. Use `execute` once; it returns the result and whether the
    batch was rolled back."""

    def __init__(self, runtime: Any, steps: list[Step], options: BatchOptions) -> None:
        self.runtime = runtime
        self.steps = steps
        self.options = options
        self.by_id = {s.id: s for s in steps}
        self.outcome: dict[str, str] = {}  # id -> success | failed | skipped
        self.results: dict[str, OpResult] = {}
        self.data: dict[str, Any] = {}  # successful results, for references
        self.inbox: queue.SimpleQueue[_OpReply] = queue.SimpleQueue()
        self.inflight: dict[str, tuple[_OpReply, float]] = {}  # id -> (reply, deadline)
        self.writes_done: list[_OpReply] = []  # successful writes, in completion order
        self.write_count: collections.Counter[tuple[Any, ...]] = collections.Counter()
        self.reads: dict[tuple[Any, ...], tuple[str, int]] = {}  # dedup key -> (op, writes)
        self.waiters: dict[str, list[Step]] = {}  # op id -> duplicate reads waiting on it
        self.stop: OpError | None = None
        self._late_lock = threading.Lock()
        self._late: list[_OpReply] = []
        self._rolling_back = False
        self.t0 = time.perf_counter()

    # -- main loop -----------------------------------------------------------------------

    def execute(self) -> tuple[BatchResult, bool]:
        options = self.options
        call_timeout = float(self.runtime.call_timeout)
        budget = options.timeout / 1000 if options.timeout is not None else call_timeout
        deadline = time.monotonic() + budget
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
                self._start(ready.pop(0), call_timeout)
            if self.inflight:
                self._wait(deadline)
        # A transaction that did not run to the end is undone, even when nothing failed:
        # the batch timeout may stop it between two operations with every reply in.
        rolled_back = self.options.transactional and (
            self.stop is not None or "failed" in self.outcome.values()
        )
        if rolled_back:
            self._roll_back(call_timeout)
        return self._result(), rolled_back

    def _wait(self, batch_deadline: float) -> None:
        until = min([batch_deadline, *(d for _, d in self.inflight.values())])
        try:
            reply = self.inbox.get(timeout=max(until - time.monotonic(), 0.0))
        except queue.Empty:
            now = time.monotonic()
            for op_id, (_, op_deadline) in list(self.inflight.items()):
                if op_deadline <= now:
                    self._time_out(op_id, "the operation ran out of time")
            return
        self._complete(reply)

    # -- one operation -------------------------------------------------------------------

    def _start(self, step: Step, call_timeout: float) -> None:
        reason = self._skip_reason(step)
        if reason is not None:
            self._finish(step, "skipped", error=reason)
            return
        if step.validated is None:  # arguments with references: fill them in, then check
            try:
                step.args = resolve(step.args, self.data)
                step.validated = step.spec.validate(step.args)
            except (ToolError, CtxActorsError) as exc:
                self._finish(step, "failed", error=OpError("invalid_arguments", str(exc)))
                return
        key = step.key
        if step.spec.read_only:
            dedup = (step.spec.name, _encode_sorted(step.args), step.ctx)
            seen = self.reads.get(dedup)
            if seen is not None and seen[1] == self.write_count[key]:
                original = seen[0]
                if original in self.results:
                    self._copy(step, self.results[original])
                else:
                    self.waiters.setdefault(original, []).append(step)
                return
            self.reads[dedup] = (step.id, self.write_count[key])
        else:
            self.write_count[key] += 1
        reply = _OpReply(step, self.inbox)
        reply.started = time.perf_counter()
        fn = self._with_prior(step, reply) if self.options.transactional else None
        try:
            self.runtime.submit(step.spec, step.ctx, step.validated, step.args, reply, fn=fn)
        except CtxActorsError as exc:
            self._finish(step, "failed", error=OpError("runtime_error", str(exc)))
            return
        timeout = step.timeout if step.timeout is not None else call_timeout
        self.inflight[step.id] = (reply, time.monotonic() + timeout)

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

    @staticmethod
    def _with_prior(step: Step, reply: _OpReply) -> Callable[[Any], ToolResult]:
        """The handler, preceded (in the actor) by the compensation's `before` record."""
        spec, ctx, args, comp = step.spec, step.ctx, step.validated, step.compensation

        def run(server: Any) -> ToolResult:
            if comp is not None:
                reply.prior = comp.prepare(server, ctx, args)
            return spec.invoke(server, ctx, args)

        return run

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
        self._compensate(reply, wait=None)

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
                thread=step.ctx.thread_id,
                deduplicated=dedup,
            )
        self.outcome[step.id] = status
        if status == "success":
            self.data[step.id] = data
        self.results[step.id] = OpResult(step.id, step.spec.name, status, data, error, meta)
        if status == "failed" and self.options.transactional and self.stop is None:
            self.stop = OpError("aborted", f"{step.id!r} failed; the transaction stops")
        self.sorter.done(step.id)

    # -- rollback ------------------------------------------------------------------------

    def _roll_back(self, call_timeout: float) -> None:
        """Undo every successful write, newest first, each in its key's own actor."""
        with self._late_lock:
            self._rolling_back = True
            late = list(self._late)
        for reply in reversed(self.writes_done):
            problem = self._compensate(reply, wait=call_timeout)
            result = self.results[reply.step.id]
            if problem is None:
                self.results[reply.step.id] = msgspec.structs.replace(result, status="rolled_back")
            else:
                self.results[reply.step.id] = msgspec.structs.replace(
                    result, error=OpError("compensation_failed", problem)
                )
        for reply in late:
            self._compensate(reply, wait=None)
        for op_id, result in self.results.items():
            if result.status == "success" and self.by_id[op_id].spec.read_only:
                self.results[op_id] = msgspec.structs.replace(result, status="rolled_back")

    def _compensate(self, reply: _OpReply, wait: float | None) -> str | None:
        """Run the undo of one operation; with `wait`, wait for it and return any problem."""
        step, value = reply.step, reply.value
        comp = step.compensation
        if comp is None or value is None or value.is_error:
            return None
        structured, prior = value.structured, reply.prior

        def undo(server: Any) -> ToolResult:
            comp(server, step.ctx, step.validated, structured, prior)
            return ToolResult.ok({"compensated": step.spec.name})

        done = SyncReply() if wait is not None else None
        try:
            self.runtime.submit(
                step.spec, step.ctx, step.validated, step.args, done, fn=undo, observe=False
            )
        except CtxActorsError as exc:
            return str(exc)
        if done is None:
            return None
        if not done.wait(wait):
            return f"the compensation did not finish within {wait:g} s"
        outcome: ToolResult = done.value
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
