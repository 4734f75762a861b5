"""Batch planning and engine details pinned to exact values (mutation testing found them
unasserted): reference lookup, its error text, and what plans and results carry."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import msgspec
import pytest
from batch_support import WAIT, Probe, batch, by_id, run_plan

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors._call import caller_deadline
from ctxactors.batch.compensation import Compensation
from ctxactors.batch.engine import BatchRun, _margin, _OpReply
from ctxactors.batch.plan import (
    BadReference,
    BatchOptions,
    BatchResult,
    Condition,
    Operation,
    OpError,
    lookup,
    make_plan,
    references,
    resolve,
)
from ctxactors.errors import ToolError
from ctxactors.results import ToolResult
from ctxactors.servers import BUILTIN
from ctxactors.settings import BatchSettings, Settings
from ctxactors.testing import context_args as ctx_args

RESULTS = {"a": {"items": [{"id": "x"}, {"id": "y"}], "n": 0}, "b": None}


def test_lookup_walks_dicts_and_list_indexes() -> None:
    assert lookup(("a", ()), RESULTS) == RESULTS["a"]
    assert lookup(("a", ("items", "1", "id")), RESULTS) == "y"
    assert lookup(("a", ("n",)), RESULTS) == 0
    assert lookup(("b", ()), RESULTS) is None


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (("items", "2", "id"), "reference ${a.items.2.id}: no value at a.items.2"),
        (("items", "-1"), "reference ${a.items.-1}: no value at a.items.-1"),
        (("items", "x"), "reference ${a.items.x}: no value at a.items.x"),
        (("n", "0"), "reference ${a.n.0}: no value at a.n.0"),
        (("missing",), "reference ${a.missing}: no value at a.missing"),
    ],
)
def test_lookup_says_where_the_path_ends(path: tuple[str, ...], message: str) -> None:
    with pytest.raises(BadReference) as bad:
        lookup(("a", path), RESULTS)
    assert str(bad.value) == message


def test_resolve_and_references() -> None:
    value = {"whole": "${a.items.0}", "text": "id=${a.items.0.id};n=${a.n}", "k": [1]}
    assert resolve(value, RESULTS) == {"whole": {"id": "x"}, "text": "id=x;n=0", "k": [1]}
    assert references(value) == {"a"}
    assert references(["${b}", "${c.d}", "${}", 3]) == {"b", "c"}


@pytest.mark.parametrize(
    ("remaining", "margin"), [(100.0, 1.0), (10.0, 1.0), (5.0, 0.5), (0.05, 0.01), (-1.0, 0.01)]
)
def test_the_margin_kept_to_hand_the_result_back(remaining: float, margin: float) -> None:
    assert _margin(remaining) == pytest.approx(margin)


class Extra(Server):
    """Tools whose results the batch engine handles in ways the Probe's don't."""

    name = "extra"
    scope = Scope.THREAD
    gate: ClassVar[threading.Event] = threading.Event()
    undone: ClassVar[list[str]] = []
    before: ClassVar[list[str]] = []  # what `tag`'s compensation recorded, in order

    def __init__(self) -> None:
        self.tags: list[str] = []

    def _tags_before(self, ctx: ToolContext, args: Any) -> list[str]:
        Extra.before.append(args.value)
        return list(self.tags)

    def _tags_back(self, ctx: ToolContext, args: Any, result: Any, prior: list[str]) -> None:
        self.tags = prior

    @tool(compensate=Compensation(_tags_back, _tags_before))
    def tag(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Add a tag; its undo puts back the tags from before."""
        self.tags.append(value)
        return {"tags": list(self.tags)}

    def _undo(self, ctx: ToolContext, args: Any, result: dict[str, Any] | None) -> None:
        Extra.undone.append(repr(result))

    @tool(compensate=_undo)
    def slow_bad_write(self, ctx: ToolContext, ms: int) -> dict[str, Any]:
        """A write that fails after `ms` milliseconds (so after its batch timeout)."""
        time.sleep(ms / 1000)
        raise ToolError("the write failed late")

    @tool(read_only=True)
    def undone_now(self, ctx: ToolContext) -> dict[str, Any]:
        """What was undone so far."""
        return {"undone": list(Extra.undone)}

    @tool(read_only=True)
    def say(self, ctx: ToolContext, text: str) -> str:
        """Plain text, no structured result."""
        return text

    @tool(read_only=True)
    def slow_fail(self, ctx: ToolContext, ms: int) -> dict[str, Any]:
        """Fail after `ms` milliseconds (a duration to measure, not a synchronisation)."""
        time.sleep(ms / 1000)
        raise ToolError("late failure")

    @tool(read_only=True)
    def held(self, ctx: ToolContext) -> dict[str, Any]:
        """Wait until the test opens the gate."""
        Extra.gate.wait(3 * WAIT)
        return {}

    @tool(read_only=True)
    def left(self, ctx: ToolContext) -> dict[str, Any]:
        """Seconds until this call's caller stops waiting (None: no deadline known)."""
        deadline = caller_deadline()
        return {"left": None if deadline is None else deadline - time.monotonic()}

    @tool(read_only=True)
    def quad(self, ctx: ToolContext, a: int, b: int, c: int, ref: str) -> dict[str, Any]:
        """Four required arguments."""
        return {}


@pytest.fixture
def rt(rt_settings: Settings) -> Iterator[Runtime]:
    Extra.gate = threading.Event()
    Extra.undone = []
    Extra.before = []
    runtime = Runtime(
        servers=[*BUILTIN, Probe, Extra], ttl=600, call_timeout=WAIT, settings=rt_settings
    )
    try:
        yield runtime
    finally:
        Extra.gate.set()
        runtime.close()


def test_a_text_result_is_the_operations_data_and_can_be_referenced(rt: Runtime) -> None:
    ops = [
        {"id": "s", "tool": "say", "arguments": {"text": "hello"}},
        {"id": "t", "tool": "say", "arguments": {"text": "${s}, world"}},
    ]
    results = by_id(batch(rt, ops))
    assert (results["s"]["data"], results["t"]["data"]) == ("hello", "hello, world")


def test_a_failed_operation_reports_how_long_it_ran(rt: Runtime) -> None:
    ops = [{"id": "f", "tool": "slow_fail", "arguments": {"ms": 200}}]
    result = by_id(batch(rt, ops, includeMetadata=True))["f"]
    assert result["status"] == "failed"
    assert result["error"] == {"code": "tool_error", "message": "late failure"}
    assert result["metadata"]["durationMs"] >= 200


def test_a_duplicate_read_waiting_on_one_that_times_out_fails_with_it(rt: Runtime) -> None:
    ops = [
        {"id": "a", "tool": "held", "arguments": {}, "timeout": 300},
        {"id": "b", "tool": "held", "arguments": {}},
    ]
    result = batch(rt, ops, call_timeout=WAIT, parallel=True, includeMetadata=True)
    Extra.gate.set()
    results = by_id(result)
    timeout = {"code": "timeout", "message": "the operation ran out of time"}
    assert (results["a"]["status"], results["a"]["error"]) == ("failed", timeout)
    assert (results["b"]["status"], results["b"]["error"]) == ("failed", timeout)
    assert results["b"]["metadata"]["deduplicated"] is True
    assert results["a"]["metadata"]["deduplicated"] is False


def test_arguments_filled_later_are_checked_by_name_and_the_rest_strictly(rt: Runtime) -> None:
    ops = [
        {"id": "x", "tool": "say", "arguments": {"text": "v"}},
        {"id": "q", "tool": "quad", "arguments": {"a": "5", "ref": "${x}", "zz": 1, "yy": 2}},
    ]
    result = batch(rt, ops)
    assert result.is_error
    assert result.text == (
        "operation 1 ('q'): invalid arguments for 'quad': unknown yy, zz; missing b, c; "
        "Expected `int`, got `str` - in `a`"
    )


@pytest.mark.parametrize("rt_settings", [Settings(batch=BatchSettings(max_expanded_bytes=10))])
def test_the_expansion_bound_is_inclusive_and_a_bad_reference_counts_nothing(
    rt: Runtime,
) -> None:
    ops = [
        {"id": "r", "tool": "say", "arguments": {"text": "x" * 10}},
        {"id": "e", "tool": "say", "arguments": {"text": "${r}"}},  # exactly 10 bytes
        {"id": "f", "tool": "say", "arguments": {"text": "${r.nope}"}},  # nothing to build
    ]
    results = by_id(batch(rt, ops))
    assert (results["e"]["status"], results["e"]["data"]) == ("success", "x" * 10)
    assert results["f"]["status"] == "failed"
    assert results["f"]["error"]["code"] == "invalid_arguments"


def test_a_reply_that_arrived_is_not_abandoned() -> None:
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    reply = _OpReply(cast(Any, None), inbox, 0.0)
    late: list[Any] = []
    reply.set(ToolResult.ok({"v": 1}))
    assert reply.abandon(late.append) is False
    assert inbox.get_nowait() is reply and late == []
    # Abandoned before its answer: the answer goes to on_late, not to the batch.
    other = _OpReply(cast(Any, None), inbox, 0.0)
    assert other.abandon(late.append) is True
    assert other.begin() is False
    other.set(ToolResult.ok({"v": 2}))
    assert late == [other] and inbox.empty()
    fresh = _OpReply(cast(Any, None), inbox, 0.0)
    assert fresh.begin() is True


def test_an_operation_sees_its_own_deadline(rt: Runtime) -> None:
    ops = [{"id": "d", "tool": "left", "arguments": {}, "timeout": 5000}]
    left = by_id(batch(rt, ops))["d"]["data"]["left"]
    assert 0 < left <= 5


def test_without_a_caller_deadline_a_batch_has_the_runtimes_call_timeout(rt: Runtime) -> None:
    before = time.monotonic()
    run = BatchRun(rt, [], BatchOptions(), caller_deadline=None, max_expanded=1, max_result=1)
    assert before + WAIT <= run.caller <= time.monotonic() + WAIT
    assert run.expanded == 0


def test_a_timed_out_write_that_fails_later_is_not_undone(rt: Runtime) -> None:
    ops = [{"id": "w", "tool": "slow_bad_write", "arguments": {"ms": 300}, "timeout": 50}]
    result = batch(rt, ops, transactional=True)
    assert result.is_error
    assert by_id(result)["w"]["error"] == {
        "code": "timeout",
        "message": "the operation ran out of time",
    }
    # Same key: the first call queues behind the write, the second behind any undo that
    # the write's late failure would have queued.
    rt.call("undone_now", ctx_args("s1"))
    assert rt.call("undone_now", ctx_args("s1")).structured == {"undone": []}


def test_a_batch_whose_caller_gave_up_runs_nothing(rt: Runtime) -> None:
    ops = [Operation(tool="say", id=f"s{i}", arguments={"text": "x"}) for i in range(2)]
    steps = make_plan(ops, rt.tools, ToolContext("s1"), excluded=frozenset(), max_operations=9)
    run = BatchRun(
        rt,
        steps,
        BatchOptions(),
        caller_deadline=time.monotonic() - 1,
        max_expanded=1000,
        max_result=1000,
    )
    result, rolled_back = run.execute()
    gave_up = OpError("caller_timeout", "the caller stopped waiting before it ran")
    assert [(r.id, r.status, r.error) for r in result.results] == [
        ("s0", "skipped", gave_up),
        ("s1", "skipped", gave_up),
    ]
    assert rolled_back is False


def test_a_failure_stops_a_transaction_and_says_which(rt: Runtime) -> None:
    ops = [
        {"id": "ok", "tool": "say", "arguments": {"text": "a"}},
        {"id": "bad", "tool": "fail", "arguments": {}},
        {"id": "next", "tool": "say", "arguments": {"text": "b"}},
    ]
    results = by_id(batch(rt, ops, transactional=True))
    assert results["bad"]["error"] == {"code": "tool_error", "message": "boom"}
    assert results["next"]["status"] == "skipped"
    assert results["next"]["error"] == {
        "code": "aborted",
        "message": "'bad' failed; the transaction stops",
    }


@pytest.mark.parametrize("rt_settings", [Settings(batch=BatchSettings(max_result_bytes=20))])
def test_results_count_data_and_error_messages_up_to_an_inclusive_bound(rt: Runtime) -> None:
    ops = [
        {"id": "a", "tool": "say", "arguments": {"text": "x" * 10}},  # 10 bytes
        {"id": "f", "tool": "fail", "arguments": {}},  # "boom": 4 bytes, no data
        {"id": "b", "tool": "say", "arguments": {"text": "y" * 6}},  # 20: at the bound
        {"id": "c", "tool": "say", "arguments": {"text": "z"}},  # 21: over it
        {"id": "d", "tool": "say", "arguments": {"text": "never"}},
    ]
    results = by_id(batch(rt, ops))
    assert [results[i]["status"] for i in "afbcd"] == [
        "success",
        "failed",
        "success",
        "success",
        "skipped",
    ]
    assert results["d"]["error"] == {
        "code": "batch_too_large",
        "message": "the operations' results reached 21 bytes, over the batch's limit of 20 "
        "(CTXACTORS_BATCH_MAX_RESULT_BYTES)",
    }


def _op(op_id: str | None = None, tool: str = "say", **fields: Any) -> Operation:
    return Operation(tool=tool, id=op_id, arguments={"text": "x"}, **fields)


@pytest.mark.parametrize(
    ("ops", "options", "message"),
    [
        ([], {}, "a batch needs at least one operation"),
        ([_op()] * 3, {}, "a batch may hold at most 2 operations, got 3"),
        ([Operation(tool="nope")], {}, "operation 0: unknown tool 'nope'"),
        (
            [_op("a"), _op("a")],
            {},
            "operation 1 ('a'): duplicate id 'a' (also operation 0)",
        ),
        (
            [Operation(tool="no_undo", id="w")],
            {"transactional": True},
            "operation 0 ('w'): 'no_undo' has no compensation, so it can't run in a "
            "transactional batch",
        ),
        ([_op("a", depends_on=["a"])], {}, "operation 0 ('a') depends on itself"),
        (
            [_op("a", depends_on=["b"]), _op("b", depends_on=["a"])],
            {},
            "the operations' dependencies form a cycle: a -> b -> a",
        ),
        (
            [_op("a", condition=Condition(if_success="b", if_failed="b")), _op("b")],
            {},
            "operation 0 ('a'): a condition names exactly one of ifSuccess/ifFailed",
        ),
        (
            [_op(action="note")],
            {},
            "operation 0: `tool` 'say' and `action` 'note' disagree",
        ),
    ],
)
def test_plans_refused_say_exactly_why(
    rt: Runtime, ops: list[Operation], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolError) as refused:
        make_plan(
            ops, rt.tools, ToolContext("s1"), excluded=frozenset(), max_operations=2, **options
        )
    assert str(refused.value) == message


def test_a_plan_at_the_operation_limit_names_and_times_its_steps(rt: Runtime) -> None:
    ops = [_op(timeout=250), _op(action="say")]
    steps = make_plan(ops, rt.tools, ToolContext("s1"), excluded=frozenset(), max_operations=2)
    assert [(s.index, s.id, s.timeout) for s in steps] == [(0, "#0", 0.25), (1, "#1", None)]


def test_operations_a_closed_runtime_refuses_fail_saying_so() -> None:
    runtime = Runtime(servers=[*BUILTIN, Probe, Extra])
    ops = [Operation(tool="say", id=f"s{i}", arguments={"text": "x"}) for i in range(2)]
    steps = make_plan(ops, runtime.tools, ToolContext("s1"), excluded=frozenset(), max_operations=9)
    runtime.close()
    run = BatchRun(
        runtime,
        steps,
        BatchOptions(),
        caller_deadline=time.monotonic() + WAIT,
        max_expanded=1000,
        max_result=1000,
    )
    result, rolled_back = run.execute()
    closed = OpError("runtime_error", "the runtime is closed")
    assert [(r.id, r.status, r.error) for r in result.results] == [
        ("s0", "failed", closed),
        ("s1", "failed", closed),
    ]
    assert (result.summary.failed, rolled_back) == (2, False)


def test_the_state_before_an_operation_is_recorded_only_in_a_transaction(rt: Runtime) -> None:
    kept = batch(rt, [{"id": "a", "tool": "tag", "arguments": {"value": "a"}}])
    assert by_id(kept)["a"]["data"] == {"tags": ["a"]}
    assert Extra.before == []  # nothing to undo outside a transaction: nothing recorded
    ops = [
        {"id": "b", "tool": "tag", "arguments": {"value": "b"}},
        {"id": "f", "tool": "fail", "arguments": {}},
    ]
    undone = batch(rt, ops, transactional=True)
    assert [r["status"] for r in undone.structured["results"]] == ["rolled_back", "failed"]
    assert Extra.before == ["b"]
    again = batch(rt, [{"id": "c", "tool": "tag", "arguments": {"value": "c"}}])
    assert by_id(again)["c"]["data"] == {"tags": ["a", "c"]}  # `b` undone to what it found


def _run(
    runtime: Any, rt: Runtime, options: BatchOptions, within: float
) -> tuple[BatchResult, bool]:
    """`held` (until the test opens the gate), then `say`, for a caller waiting `within` s."""
    ops = [
        {"id": "h", "tool": "held", "arguments": {}},
        {"id": "s", "tool": "say", "arguments": {"text": "x"}},
    ]
    return run_plan(runtime, rt, ops, options, within=within, ctx=ToolContext("s1"))


def test_a_batch_keeps_a_tenth_of_its_callers_time_to_hand_the_result_back(
    rt: Runtime,
) -> None:
    try:
        result, _ = _run(rt, rt, BatchOptions(), within=0.5)
    finally:
        Extra.gate.set()
    held, said = result.results
    assert held.error == OpError("timeout", "the batch ran out of time")
    assert said.status == "skipped" and said.error is not None
    found = re.fullmatch(r"the batch ran out of its (\S+) s", said.error.message)
    assert found is not None, said.error.message
    assert 0.4 < float(found.group(1)) <= 0.45  # 0.5 s less a tenth, less the start-up


class _AnswersLate:
    """A runtime stand-in: `say` answers only once its deadline has passed (before the
    batch looks again), anything else never."""

    call_timeout = WAIT

    def _submit(
        self, spec: Any, ctx: Any, validated: Any, args: Any, reply: Any, deadline: float, **_: Any
    ) -> None:
        if spec.name == "say":
            while time.monotonic() <= deadline:
                time.sleep(0.005)
            reply.set(ToolResult.ok(args["text"]))


def test_an_answer_that_comes_in_past_the_batchs_end_times_out_the_others(
    rt: Runtime,
) -> None:
    options = BatchOptions(parallel=True, timeout=50)
    result, rolled_back = _run(_AnswersLate(), rt, options, within=WAIT)
    assert [(r.id, r.status, r.data, r.error) for r in result.results] == [
        ("h", "failed", None, OpError("timeout", "the batch ran out of time")),
        ("s", "success", "x", None),
    ]
    assert rolled_back is False


def test_an_operation_the_batch_gave_up_on_is_refused_saying_why(rt: Runtime) -> None:
    ops = [
        {"id": "h", "tool": "held", "arguments": {}},
        {"id": "s", "tool": "say", "arguments": {"text": "x"}},  # queued behind `h`
    ]
    result = batch(rt, ops, parallel=True, timeout=300)
    assert [r["status"] for r in result.structured["results"]] == ["failed", "failed"]
    Extra.gate.set()
    rt.call("undone_now", ctx_args("s1"))  # queued behind both
    recent = rt.call("get_recent_context", ctx_args("s1", limit=5, tool_filter="say"))
    (said,) = recent.structured["operations"]
    assert (said["tool"], said["is_error"], said["metadata"]) == (
        "say",
        True,
        {"error": "not run: the batch gave up on it before it started"},
    )


class Box(msgspec.Struct):
    w: int


class Kinds(Server):
    """Arguments of every kind the unified listing names."""

    name = "kinds"
    scope = Scope.SESSION

    @tool(read_only=True)
    def shapes(
        self,
        ctx: ToolContext,
        box: Box,
        anything: Any,
        names: list[str],
        bare: list,  # type: ignore[type-arg]
        maybe: int | None = None,
    ) -> dict[str, Any]:
        """Takes every kind
        of argument.

        Details the listing leaves out."""
        return {}

    @tool(read_only=True)
    def nothing(self, ctx: ToolContext) -> dict[str, Any]:
        """No arguments."""
        return {}


def test_the_unified_listing_names_each_action_with_its_arguments_and_summary() -> None:
    with Runtime(servers=[Kinds]) as every:
        plain = {t["name"]: t for t in every.list_tools()}["batch"]["description"]
    with Runtime(servers=[Kinds], tools="unified") as unified:
        listed = {t["name"]: t for t in unified.list_tools()}
    assert list(listed) == ["batch", "save_preset", "list_presets", "run_preset"]
    head, catalog = listed["batch"]["description"].split(
        "\n\nCategories and actions (category: action{arguments}, ? = optional):\n"
    )
    assert head == plain
    kinds, history = catalog.split("\n")
    assert kinds == (
        "- kinds: shapes{box: object, anything: any, names: string[], bare: any[], "
        "maybe?: integer|null} (Takes every kind of argument.); nothing{} (No arguments.)"
    )
    assert history.startswith(
        "- history: get_recent_context{limit?: integer, tool_filter?: string|string[]|null} "
        "(Recent operations of this conversation, newest first: "
    )
