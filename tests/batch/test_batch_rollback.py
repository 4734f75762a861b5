"""Transactional batches whose undo fails, and duplicate reads that fail: exact results."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from batch_support import run_plan

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.batch import engine as batch_engine
from ctxactors.batch.plan import BatchOptions, BatchResult, OpError
from ctxactors.errors import RuntimeClosedError, ToolError
from ctxactors.testing import context_args as ctx_args


class Ledger(Server):
    """Entries with an undo that refuses one value; reads that count how often they ran."""

    name = "ledger"
    scope = Scope.SESSION

    stalled = threading.Event()
    release = threading.Event()

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.reads = 0

    def _undo_add(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        if result["value"] == "stuck":
            raise RuntimeError(f"cannot remove {result['value']!r} for {ctx.assistant_id}")
        self.entries.remove(result["value"])

    @tool(compensate=_undo_add)
    def add(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Add an entry."""
        self.entries.append(value)
        return {"value": value}

    @tool(read_only=True)
    def look(self, ctx: ToolContext) -> dict[str, Any]:
        """The entries."""
        self.reads += 1
        return {"entries": list(self.entries), "reads": self.reads}

    @tool
    def nap(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Take at least 50 ms, then add an entry."""
        threading.Event().wait(0.05)
        self.entries.append(value)
        return {"value": value}

    @tool(read_only=True)
    def stall(self, ctx: ToolContext) -> dict[str, Any]:
        """Wait until the test releases it."""
        Ledger.stalled.set()
        Ledger.release.wait(20)
        return {"stalled": True}

    @tool(read_only=True)
    def hold(self, ctx: ToolContext, ms: int) -> dict[str, Any]:
        """Keep the key busy for `ms` milliseconds (a duration, not a synchronisation)."""
        threading.Event().wait(ms / 1000)
        return {"ms": ms}

    @tool(read_only=True)
    def broken(self, ctx: ToolContext) -> dict[str, Any]:
        """A read that fails."""
        self.reads += 1
        raise ToolError(f"broken read {self.reads}")


class Late(Server):
    """A write, on a key of its own, that writes only once the test opens `gate`."""

    name = "late"
    scope = Scope.SESSION

    gate = threading.Event()

    def __init__(self) -> None:
        self.entries: list[str] = []

    def _undo_add(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        self.entries.remove(result["value"])

    @tool(compensate=_undo_add)
    def late_add(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Wait for the gate, then add an entry."""
        Late.gate.wait(20)
        self.entries.append(value)
        return {"value": value}

    @tool(read_only=True)
    def late_look(self, ctx: ToolContext) -> dict[str, Any]:
        """The entries."""
        return {"entries": list(self.entries)}


@pytest.fixture
def rt() -> Iterator[Runtime]:
    with Runtime([Ledger], call_timeout=20) as runtime:
        yield runtime


def run(rt: Runtime, ops: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    result = rt.call("batch", ctx_args("s", "a1", operations=ops, options=options))
    assert result.structured is not None, result.text
    return [
        {k: v for k, v in r.items() if k not in ("duration", "metadata")}
        for r in result.structured["results"]
    ]


def test_an_undo_that_fails_is_reported_on_its_operation_and_the_rest_is_undone(
    rt: Runtime,
) -> None:
    ops = [
        {"id": "a", "tool": "add", "arguments": {"value": "one"}},
        {"id": "b", "tool": "add", "arguments": {"value": "stuck"}},
        {"id": "r", "tool": "look", "arguments": {}},
        {"id": "c", "tool": "add", "arguments": {"value": "two"}},
        {"id": "x", "tool": "broken", "arguments": {}},
    ]
    assert run(rt, ops, transactional=True) == [
        {"id": "a", "tool": "add", "status": "rolled_back", "data": {"value": "one"}},
        {
            "id": "b",
            "tool": "add",
            "status": "success",  # still there: its undo failed
            "data": {"value": "stuck"},
            "error": {
                "code": "compensation_failed",
                "message": "RuntimeError: cannot remove 'stuck' for a1",
            },
        },
        {
            "id": "r",
            "tool": "look",
            "status": "rolled_back",  # a read in an undone transaction is void too
            "data": {"entries": ["one", "stuck"], "reads": 1},
        },
        {"id": "c", "tool": "add", "status": "rolled_back", "data": {"value": "two"}},
        {
            "id": "x",
            "tool": "broken",
            "status": "failed",
            "error": {"code": "tool_error", "message": "broken read 2"},
        },
    ]
    assert rt.call("look", ctx_args("s")).structured == {"entries": ["stuck"], "reads": 3}


def test_a_duplicate_read_that_failed_copies_the_failure_without_running_again(
    rt: Runtime,
) -> None:
    ops = [
        {"id": "x1", "tool": "broken", "arguments": {}},
        {"id": "x2", "tool": "broken", "arguments": {}},
        {"id": "r1", "tool": "look", "arguments": {}},
        {"id": "r2", "tool": "look", "arguments": {}},
        {"id": "use", "tool": "add", "arguments": {"value": "n=${r2.reads}"}},
    ]
    failed = {"code": "tool_error", "message": "broken read 1"}
    assert run(rt, ops) == [
        {"id": "x1", "tool": "broken", "status": "failed", "error": failed},
        {"id": "x2", "tool": "broken", "status": "failed", "error": failed},
        {"id": "r1", "tool": "look", "status": "success", "data": {"entries": [], "reads": 2}},
        {"id": "r2", "tool": "look", "status": "success", "data": {"entries": [], "reads": 2}},
        # the copy's data can be referenced like the original's
        {"id": "use", "tool": "add", "status": "success", "data": {"value": "n=2"}},
    ]


def test_parallel_duplicates_wait_for_the_first_and_share_its_outcome(rt: Runtime) -> None:
    ops = [
        {"id": "r1", "tool": "look", "arguments": {}},
        {"id": "r2", "tool": "look", "arguments": {}},
        {"id": "use", "tool": "add", "arguments": {"value": "n=${r2.reads}"}},
    ]
    result = rt.call("batch", ctx_args("s", "a1", operations=ops, options={"parallel": True}))
    assert result.structured is not None
    by_id = {r["id"]: r for r in result.structured["results"]}
    assert by_id["r1"]["data"] == by_id["r2"]["data"] == {"entries": [], "reads": 1}
    assert by_id["use"]["status"] == "success" and by_id["use"]["data"] == {"value": "n=1"}
    broken = [{"id": f"x{i}", "tool": "broken", "arguments": {}} for i in (1, 2)]
    result = rt.call("batch", ctx_args("s", "a1", operations=broken, options={"parallel": True}))
    assert result.structured is not None
    assert [(r["status"], r["error"]) for r in result.structured["results"]] == [
        ("failed", {"code": "tool_error", "message": "broken read 2"})
    ] * 2


def test_skips_say_which_condition_or_dependency_stopped_them(rt: Runtime) -> None:
    ops = [
        {"id": "zz", "tool": "broken", "arguments": {}},
        {"id": "a", "tool": "add", "arguments": {"value": "x"}},
        {"id": "bb", "tool": "broken", "arguments": {}},
        {"id": "c", "tool": "add", "arguments": {"value": "c"}, "condition": {"ifSuccess": "bb"}},
        {"id": "d", "tool": "add", "arguments": {"value": "d"}, "condition": {"ifFailed": "a"}},
        {"id": "e", "tool": "add", "arguments": {"value": "e"}, "condition": {"ifFailed": "bb"}},
        {"id": "f", "tool": "add", "arguments": {"value": "f"}, "dependsOn": ["bb", "a", "zz"]},
        {"id": "g", "tool": "add", "arguments": {"value": "g"}, "dependsOn": ["c"]},
    ]

    def skipped(op: str, code: str, message: str) -> dict[str, Any]:
        error = {"code": code, "message": message}
        return {"id": op, "tool": "add", "status": "skipped", "error": error}

    def failed(op: str, n: int) -> dict[str, Any]:
        error = {"code": "tool_error", "message": f"broken read {n}"}
        return {"id": op, "tool": "broken", "status": "failed", "error": error}

    assert run(rt, ops) == [
        failed("zz", 1),
        {"id": "a", "tool": "add", "status": "success", "data": {"value": "x"}},
        failed("bb", 2),  # a write in between: the read runs again
        skipped("c", "condition_not_met", "'bb' did not succeed"),
        skipped("d", "condition_not_met", "'a' did not fail"),
        {"id": "e", "tool": "add", "status": "success", "data": {"value": "e"}},
        # the first failed dependency in the batch's order, not by name
        skipped("f", "dependency_failed", "dependency 'zz' failed"),
        skipped("g", "dependency_skipped", "dependency 'c' skipped"),
    ]


def test_a_batch_out_of_time_fails_what_runs_and_skips_the_rest(rt: Runtime) -> None:
    Ledger.stalled.clear()
    Ledger.release.clear()
    ops = [
        {"id": "s", "tool": "stall", "arguments": {}},
        {"id": "after", "tool": "add", "arguments": {"value": "late"}},
    ]
    try:
        result = rt.call("batch", ctx_args("s", "a1", operations=ops, options={"timeout": 100}))
    finally:
        Ledger.release.set()
    assert result.structured is not None
    assert result.structured["results"] == [
        {
            "id": "s",
            "tool": "stall",
            "status": "failed",
            "error": {"code": "timeout", "message": "the batch ran out of time"},
        },
        {
            "id": "after",
            "tool": "add",
            "status": "skipped",
            "error": {"code": "batch_timeout", "message": "the batch ran out of its 0.1 s"},
        },
    ]
    summary = {k: v for k, v in result.structured["summary"].items() if k != "executionTime"}
    assert summary == {"total": 2, "successful": 0, "failed": 1, "skipped": 1, "rolledBack": 0}
    assert result.structured["summary"]["executionTime"] >= 100


def test_metadata_times_each_operation_from_the_batch_start(rt: Runtime) -> None:
    ops = [
        {"id": "n1", "tool": "nap", "arguments": {"value": "a"}},
        {"id": "n2", "tool": "nap", "arguments": {"value": "b"}},
        {"id": "r1", "tool": "look", "arguments": {}},
        {"id": "r2", "tool": "look", "arguments": {}},
    ]
    began = time.perf_counter()
    result = rt.call(
        "batch", ctx_args("s", "a1", operations=ops, options={"includeMetadata": True})
    )
    wall_ms = (time.perf_counter() - began) * 1000
    assert result.structured is not None
    meta = {r["id"]: r["metadata"] for r in result.structured["results"]}
    assert [meta[i]["deduplicated"] for i in ("n1", "n2", "r1", "r2")] == [
        False,
        False,
        False,
        True,
    ]
    for m in meta.values():
        assert m["startedMs"] >= 0 and m["durationMs"] >= 0
        assert round(m["startedMs"], 3) == m["startedMs"]
        assert round(m["durationMs"], 3) == m["durationMs"]
    assert meta["n1"]["durationMs"] >= 45 and meta["n2"]["durationMs"] >= 45  # naps of 50 ms
    # One after the other: n2 starts once n1 is done.
    assert meta["n2"]["startedMs"] >= meta["n1"]["startedMs"] + meta["n1"]["durationMs"] - 0.01
    total = result.structured["summary"]["executionTime"]
    assert meta["n2"]["startedMs"] + meta["n2"]["durationMs"] <= total + 0.01
    assert isinstance(total, float) and round(total, 3) == total and total <= wall_ms


def test_a_rolled_back_batch_is_an_error_whose_text_is_its_result(rt: Runtime) -> None:
    ops = [{"id": "a", "tool": "add", "arguments": {"value": "x"}}, {"id": "x", "tool": "broken"}]
    result = rt.call("batch", ctx_args("s", "a1", operations=ops, options={"transactional": True}))
    assert result.is_error and result.structured is not None
    assert result.text.startswith("batch rolled back: ")
    assert json.loads(result.text.removeprefix("batch rolled back: ")) == result.structured
    assert [r["status"] for r in result.structured["results"]] == ["rolled_back", "failed"]


def test_a_timed_out_operation_is_timed_from_its_own_start(rt: Runtime) -> None:
    Ledger.stalled.clear()
    Ledger.release.clear()
    ops = [{"id": "s", "tool": "stall", "arguments": {}}]
    options = {"timeout": 100, "includeMetadata": True}
    try:
        result = rt.call("batch", ctx_args("s", "a1", operations=ops, options=options))
    finally:
        Ledger.release.set()
    assert result.structured is not None
    (only,) = result.structured["results"]
    assert only["status"] == "failed" and only["metadata"]["durationMs"] >= 50  # of ~100


def test_a_timed_out_write_that_answers_before_the_rollback_starts_is_rolled_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The window: `w` times out, then writes and answers while `s` still runs, so its
    # answer comes in before the rollback starts (the engine keeps it for the rollback).
    Late.gate.clear()
    Ledger.stalled.clear()
    Ledger.release.clear()
    gave_up = threading.Event()  # the batch gave up on an operation still running
    abandon = batch_engine._OpReply.abandon  # noqa: SLF001

    def abandoning(reply: Any, on_late: Any) -> bool:
        abandoned = abandon(reply, on_late)
        if abandoned:
            gave_up.set()
        return abandoned

    monkeypatch.setattr(batch_engine._OpReply, "abandon", abandoning)  # noqa: SLF001
    ops = [
        {"id": "a", "tool": "add", "arguments": {"value": "one"}},
        {"id": "w", "tool": "late_add", "arguments": {"value": "late"}, "timeout": 100},
        {"id": "s", "tool": "stall", "arguments": {}},
    ]
    options = {"parallel": True, "transactional": True}
    with Runtime([Ledger, Late], call_timeout=20) as rt:
        answered: list[Any] = []
        batch = threading.Thread(
            target=lambda: answered.append(
                rt.call("batch", ctx_args("s", "a1", operations=ops, options=options))
            )
        )
        batch.start()
        try:
            assert gave_up.wait(20) and Ledger.stalled.wait(20)  # `w` timed out, `s` runs
            Late.gate.set()
            # Behind `w` on its key: once this answers, `w` has written and answered.
            assert rt.call("late_look", ctx_args("s")).structured == {"entries": ["late"]}
            # Kept for the rollback, which undoes it after the others: not undone yet.
            assert rt.call("late_look", ctx_args("s")).structured == {"entries": ["late"]}
            assert batch.is_alive()  # `s` still runs: the rollback has not started
        finally:
            Late.gate.set()
            Ledger.release.set()
            batch.join(20)
        (result,) = answered
        assert result.is_error and result.structured is not None
        assert [
            {k: v for k, v in r.items() if k != "duration"} for r in result.structured["results"]
        ] == [
            {"id": "a", "tool": "add", "status": "rolled_back", "data": {"value": "one"}},
            {
                "id": "w",
                "tool": "late_add",
                "status": "failed",
                "error": {"code": "timeout", "message": "the operation ran out of time"},
            },
            {"id": "s", "tool": "stall", "status": "rolled_back", "data": {"stalled": True}},
        ]
        summary = {k: v for k, v in result.structured["summary"].items() if k != "executionTime"}
        assert summary == {"total": 3, "successful": 0, "failed": 1, "skipped": 0, "rolledBack": 2}
        # The undo of `w` was sent to its key before the batch answered: this call runs
        # after it. Nothing the batch wrote is left.
        assert rt.call("late_look", ctx_args("s")).structured == {"entries": []}
        assert rt.call("look", ctx_args("s")).structured == {"entries": [], "reads": 1}


def test_long_operations_are_timed_on_one_clock_to_the_microsecond(rt: Runtime) -> None:
    ops = [
        {"id": "d", "tool": "hold", "arguments": {"ms": 1000}},
        {"id": "r", "tool": "look", "arguments": {}},
    ]
    before = time.perf_counter()
    result, _ = _execute(rt, rt, ops, BatchOptions(include_metadata=True), within=20)
    wall_ms = (time.perf_counter() - before) * 1000
    doze, look = (r.metadata for r in result.results)
    assert doze is not None and look is not None
    for meta in (doze, look):
        assert isinstance(meta.started_ms, float) and isinstance(meta.duration_ms, float)
    assert doze.duration_ms >= 1000
    # Each end is read before the next start, and the total after the last end, within
    # the test's own two readings: with one scale for all (ms) these hold to the rounding
    # of each figure, even for operations a second long.
    rounding = 0.002
    assert doze.started_ms + doze.duration_ms <= look.started_ms + rounding
    total = result.summary.execution_time
    assert look.started_ms + look.duration_ms <= total + rounding
    assert total <= wall_ms + rounding


def _execute(
    runtime: Any, rt: Runtime, ops: list[dict[str, Any]], options: BatchOptions, within: float
) -> tuple[BatchResult, bool]:
    return run_plan(runtime, rt, ops, options, within=within, ctx=ToolContext("s", "a1"))


def test_an_undo_not_confirmed_by_the_batchs_deadline_is_reported_and_still_runs(
    rt: Runtime,
) -> None:
    # The caller waits 1 s; the batch ends 0.1 s before, when `h` has run 0.9 s of its 1.4:
    # the undo of `w` queues behind `h` on their key, so it can't be done before 1.4 s. A
    # rollback that waited a second (or for ever) would see it confirmed at about 1.4 s.
    ops = [
        {"id": "w", "tool": "add", "arguments": {"value": "x"}},
        {"id": "h", "tool": "hold", "arguments": {"ms": 1400}},
    ]
    result, rolled_back = _execute(rt, rt, ops, BatchOptions(transactional=True), within=1.0)
    assert rolled_back is True
    assert [(r.id, r.status, r.error) for r in result.results] == [
        (
            "w",
            "success",
            OpError(
                "compensation_failed",
                "the compensation was not confirmed before the batch's deadline",
            ),
        ),
        ("h", "failed", OpError("timeout", "the batch ran out of time")),
    ]
    # It was sent all the same: the next call on that key runs after it.
    assert rt.call("look", ctx_args("s")).structured == {"entries": [], "reads": 1}


class _RefusingUndos:
    """The runtime, refusing every undo as a closed runtime would."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.call_timeout = runtime.call_timeout

    def _submit(self, *args: Any, undo: Any = None, **kwargs: Any) -> None:
        if undo is not None:
            raise RuntimeClosedError("the runtime is closed")
        self.runtime._submit(*args, **kwargs)  # noqa: SLF001


def test_an_undo_the_runtime_refuses_is_reported_with_its_reason(rt: Runtime) -> None:
    ops = [
        {"id": "a", "tool": "add", "arguments": {"value": "x"}},
        {"id": "b", "tool": "broken", "arguments": {}},
    ]
    options = BatchOptions(transactional=True)
    result, rolled_back = _execute(_RefusingUndos(rt), rt, ops, options, within=20)
    assert rolled_back is True
    assert [(r.id, r.status, r.error) for r in result.results] == [
        ("a", "success", OpError("compensation_failed", "the runtime is closed")),
        ("b", "failed", OpError("tool_error", "broken read 1")),
    ]
    assert rt.call("look", ctx_args("s")).structured == {"entries": ["x"], "reads": 2}
