"""The batch tool: checking, order, references, conditions, parallelism, dedup, timeouts,
transactional rollback, presets, and the unified tool listing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from batch_support import WAIT, Probe, batch, probe_runtime, state, statuses

from ctxactors import Runtime
from ctxactors.batch import engine as batch_engine
from ctxactors.servers import BUILTIN
from ctxactors.testing import wait_until


@pytest.fixture
def rt() -> Iterator[Runtime]:
    yield from probe_runtime()


# -- references, order, conditions -----------------------------------------------------


def test_references_create_goal_then_todos_under_it(rt: Runtime) -> None:
    result = batch(
        rt,
        [
            {"id": "g", "tool": "create_goal", "arguments": {"goal": "Learn Rust"}},
            {"id": "a", "tool": "add_todo", "arguments": {"name": "book", "goal_id": "${g.id}"}},
            {
                "id": "b",
                "category": "planning",
                "action": "add_todo",
                "arguments": {"name": "Todo for ${g.goal}", "goal_id": "${g.id}"},
            },
            {"id": "m", "tool": "mark_todo", "arguments": {"todo_id": "${a.id}"}},
        ],
    )
    assert not result.is_error
    assert result.structured is not None
    assert result.structured["summary"] == {
        "total": 4,
        "successful": 4,
        "failed": 0,
        "skipped": 0,
        "rolledBack": 0,
        "executionTime": result.structured["summary"]["executionTime"],
    }
    planning = state(rt, "get_planning_state")
    assert planning["goals"] == [{"id": "g1", "goal": "Learn Rust"}]
    assert planning["todos"] == [
        {"id": "t2", "name": "book", "goal_id": "g1", "done": True},
        {"id": "t3", "name": "Todo for Learn Rust", "goal_id": "g1", "done": False},
    ]


def test_failed_dependency_skips_dependents_with_reason_and_single_failures_are_not_errors(
    rt: Runtime,
) -> None:
    result = batch(
        rt,
        [
            {"id": "bad", "tool": "add_todo", "arguments": {"name": "x", "goal_id": "nope"}},
            {"id": "dep", "tool": "create_goal", "arguments": {"goal": "y"}, "dependsOn": ["bad"]},
            {"id": "ref", "tool": "mark_todo", "arguments": {"todo_id": "${dep.id}"}},
            {"id": "free", "tool": "create_goal", "arguments": {"goal": "z"}},
        ],
    )
    assert not result.is_error  # one operation failing is reported per operation
    assert statuses(result) == {
        "bad": "failed",
        "dep": "skipped",
        "ref": "skipped",
        "free": "success",
    }
    by_id = {r["id"]: r for r in result.structured["results"]}  # type: ignore[index]
    assert by_id["bad"]["error"] == {"code": "tool_error", "message": "goal 'nope' not found"}
    assert by_id["dep"]["error"]["code"] == "dependency_failed"
    assert "'bad'" in by_id["dep"]["error"]["message"]
    assert by_id["ref"]["error"]["code"] == "dependency_skipped"


def test_conditions_run_on_the_named_outcome(rt: Runtime) -> None:
    result = batch(
        rt,
        [
            {"id": "ok", "tool": "create_goal", "arguments": {"goal": "a"}},
            {"id": "bad", "tool": "fail"},
            {
                "id": "s1",
                "tool": "put",
                "arguments": {"value": "1"},
                "condition": {"ifSuccess": "ok"},
            },
            {
                "id": "s2",
                "tool": "put",
                "arguments": {"value": "2"},
                "condition": {"ifSuccess": "bad"},
            },
            {
                "id": "f1",
                "tool": "put",
                "arguments": {"value": "3"},
                "condition": {"ifFailed": "bad"},
            },
            {
                "id": "f2",
                "tool": "put",
                "arguments": {"value": "4"},
                "condition": {"ifFailed": "ok"},
            },
        ],
    )
    assert statuses(result) == {
        "ok": "success",
        "bad": "failed",
        "s1": "success",
        "s2": "skipped",
        "f1": "success",
        "f2": "skipped",
    }
    assert state(rt, "items_now")["items"] == ["1", "3"]


def test_order_is_topological_not_input_order(rt: Runtime) -> None:
    result = batch(
        rt,
        [
            {"id": "c", "tool": "put", "arguments": {"value": "c"}, "dependsOn": ["b"]},
            {"id": "b", "tool": "put", "arguments": {"value": "b"}, "dependsOn": ["a"]},
            {"id": "a", "tool": "put", "arguments": {"value": "a"}},
        ],
    )
    assert set(statuses(result).values()) == {"success"}
    assert state(rt, "items_now")["items"] == ["a", "b", "c"]


# -- checking the whole batch first ---------------------------------------------------


@pytest.mark.parametrize(
    ("operations", "expected"),
    [
        ([{"id": "x", "tool": "no_such_tool"}], "operation 1 ('x'): unknown tool 'no_such_tool'"),
        ([{"id": "p", "tool": "put", "arguments": {"value": "v"}}], "duplicate id 'p'"),
        ([{"id": "x", "tool": "items_now", "dependsOn": ["ghost"]}], "depends on unknown 'ghost'"),
        ([{"id": "x", "tool": "batch", "arguments": {"operations": []}}], "no nesting"),
        ([{"id": "x", "tool": "run_preset", "arguments": {"name": "a"}}], "no nesting"),
        ([{"id": "x", "tool": "put", "arguments": {"value": 3}}], "operation 1 ('x'): invalid"),
        ([{"id": "x", "tool": "put", "arguments": {}}], "missing required field `value`"),
        (
            [{"id": "x", "tool": "put", "arguments": {"value": "${p.value}", "colour": 1}}],
            "operation 1 ('x'): invalid arguments for 'put': unknown colour",
        ),
        (
            [{"id": "x", "tool": "add_todo", "arguments": {"goal_id": "${p.value}"}}],
            "operation 1 ('x'): invalid arguments for 'add_todo': missing name",
        ),
        ([{"id": "x", "category": "content", "action": "put"}], "in category 'probe'"),
        ([{"id": "x"}], "give `tool`, or `category` and `action`"),
        (
            [{"id": "x", "tool": "put", "arguments": {"value": "v"}, "condition": {}}],
            "exactly one of ifSuccess/ifFailed",
        ),
    ],
)
def test_a_bad_operation_rejects_the_batch_naming_it_and_nothing_runs(
    rt: Runtime, operations: list[dict[str, Any]], expected: str
) -> None:
    first = {"id": "p", "tool": "put", "arguments": {"value": "first"}}
    result = batch(rt, [first, *operations])
    assert result.is_error
    assert expected in result.text
    assert state(rt, "items_now")["items"] == []


def test_cycles_and_size_are_refused(rt: Runtime) -> None:
    cyclic = [
        {"id": "a", "tool": "put", "arguments": {"value": "a"}, "dependsOn": ["b"]},
        {"id": "b", "tool": "put", "arguments": {"value": "${a.value}"}},
    ]
    result = batch(rt, cyclic)
    assert result.is_error and "cycle" in result.text and "a" in result.text
    too_many = [{"tool": "items_now"}] * 101
    result = batch(rt, too_many)
    assert result.is_error and "at most 100 operations, got 101" in result.text
    assert Probe.reads == 0


def test_transactional_batch_with_a_tool_without_compensation_is_refused(rt: Runtime) -> None:
    ops = [
        {"id": "ok", "tool": "put", "arguments": {"value": "v"}},
        {"id": "raw", "tool": "no_undo"},
        {"id": "read", "tool": "items_now"},  # read-only tools need none
    ]
    result = batch(rt, ops, transactional=True)
    assert result.is_error
    assert "operation 1 ('raw'): 'no_undo' has no compensation" in result.text
    assert state(rt, "items_now")["items"] == []


# -- context and isolation -------------------------------------------------------------


def test_a_batch_cannot_reach_another_session_or_assistant(rt: Runtime) -> None:
    rt.call("put", {"value": "secret", "__sessionId": "victim"})
    result = rt.call(
        "batch",
        {
            "__sessionId": "attacker",
            "__assistantId": "a1",
            "operations": [
                {
                    "id": "r",
                    "tool": "items_now",
                    "arguments": {"__sessionId": "victim", "__session_id": "victim"},
                },
                {
                    "id": "w",
                    "tool": "put",
                    "arguments": {"value": "evil", "__sessionId": "victim", "__assistantId": "x"},
                },
            ],
        },
    )
    data = {r["id"]: r["data"] for r in result.structured["results"]}  # type: ignore[index]
    assert data["r"] == {"items": [], "session": "attacker"}
    assert state(rt, "items_now", "victim")["items"] == ["secret"]
    assert state(rt, "items_now", "attacker", __assistantId="a1")["items"] == ["evil"]


# -- parallel --------------------------------------------------------------------------


def test_parallel_operations_on_different_keys_truly_overlap(rt: Runtime) -> None:
    Probe.barrier = threading.Barrier(3, timeout=WAIT)  # passes only if all 3 wait at once
    ops = [{"id": f"m{i}", "tool": f"meet{i}", "arguments": {"value": str(i)}} for i in range(3)]
    result = batch(rt, ops, parallel=True)
    assert statuses(result) == {"m0": "success", "m1": "success", "m2": "success"}


def test_parallel_keeps_order_on_one_key_and_respects_max_concurrency(rt: Runtime) -> None:
    same_key = [
        {"id": f"p{i}", "tool": "put", "arguments": {"value": str(i), "sleep": 0.01}}
        for i in range(5)
    ]
    result = batch(rt, same_key, parallel=True)
    assert set(statuses(result).values()) == {"success"}
    assert state(rt, "items_now")["items"] == ["0", "1", "2", "3", "4"]

    # Each operation waits at a barrier of two: it passes only when two run at once, so a
    # sequential run fails; the cap keeps a third from ever joining them.
    Probe.peak = 0
    Probe.barrier = threading.Barrier(2, timeout=WAIT)
    spread = [{"id": f"q{i}", "tool": f"meet{i}", "arguments": {"value": str(i)}} for i in range(6)]
    result = batch(rt, spread, parallel=True, maxConcurrency=2)
    assert statuses(result) == {f"q{i}": "success" for i in range(6)}
    assert Probe.peak == 2


def test_many_concurrent_parallel_batches_keep_every_session_exact(rt: Runtime) -> None:
    errors: list[BaseException] = []

    def run(session: str) -> None:
        try:
            ops: list[dict[str, Any]] = [
                {"id": "g", "tool": "create_goal", "arguments": {"goal": session}}
            ]
            ops += [
                {
                    "id": f"t{i}",
                    "tool": "add_todo",
                    "arguments": {"name": f"{session}-{i}", "goal_id": "${g.id}"},
                }
                for i in range(5)
            ]
            ops += [
                {"id": f"p{i}", "tool": f"put{i % 2}", "arguments": {"value": f"{session}-{i}"}}
                for i in range(4)
            ]
            result = batch(rt, ops, session=session, parallel=True)
            assert set(statuses(result).values()) == {"success"}
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    sessions = [f"s{i}" for i in range(12)]
    threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * WAIT)
    assert not errors, errors
    for s in sessions:
        planning = state(rt, "get_planning_state", s)
        assert planning["goals"] == [{"id": "g1", "goal": s}]
        assert sorted(t["name"] for t in planning["todos"]) == [f"{s}-{i}" for i in range(5)]
        assert {t["goal_id"] for t in planning["todos"]} == {"g1"}
        assert state(rt, "items0", s)["items"] == [f"{s}-0", f"{s}-2"]
        assert state(rt, "items1", s)["items"] == [f"{s}-1", f"{s}-3"]


# -- read-only dedup -------------------------------------------------------------------


def test_identical_reads_run_once_only_when_nothing_ran_between_them(rt: Runtime) -> None:
    read = {"tool": "items_now"}
    result = batch(
        rt,
        [
            {"id": "r1", **read},
            {"id": "r2", **read},
            {"id": "other", "tool": "items1"},  # any other operation ends the sharing
            {"id": "r3", **read},
            {"id": "w", "tool": "put", "arguments": {"value": "v"}},
            {"id": "r4", **read},
            {"id": "r5", **read},
        ],
        includeMetadata=True,
    )
    results = {r["id"]: r for r in result.structured["results"]}  # type: ignore[index]
    assert Probe.reads == 4  # r1, other, r3, r4
    empty = {"items": [], "session": "s1"}
    assert results["r1"]["data"] == results["r2"]["data"] == results["r3"]["data"] == empty
    assert results["r4"]["data"] == results["r5"]["data"] == {"items": ["v"], "session": "s1"}
    dedup = {i: r["metadata"]["deduplicated"] for i, r in results.items()}
    assert dedup == {
        "r1": False,
        "r2": True,
        "other": False,
        "r3": False,
        "w": False,
        "r4": False,
        "r5": True,
    }


def test_parallel_duplicate_reads_share_one_run(rt: Runtime) -> None:
    ops = [{"id": f"r{i}", "tool": "items_now"} for i in range(5)]
    result = batch(rt, ops, parallel=True)
    assert set(statuses(result).values()) == {"success"}
    assert Probe.reads == 1


# -- timeouts --------------------------------------------------------------------------


def test_an_operation_over_its_timeout_fails_and_the_rest_go_on(rt: Runtime) -> None:
    result = batch(
        rt,
        [
            {"id": "slow", "tool": "put", "arguments": {"value": "s", "sleep": 1.0}, "timeout": 50},
            {"id": "next", "tool": "create_goal", "arguments": {"goal": "g"}},
        ],
    )
    by_id = {r["id"]: r for r in result.structured["results"]}  # type: ignore[index]
    assert by_id["slow"]["status"] == "failed"
    assert by_id["slow"]["error"]["code"] == "timeout"
    assert by_id["next"]["status"] == "success"


def test_the_batch_timeout_skips_what_has_not_run(rt: Runtime) -> None:
    result = batch(
        rt,
        [
            {"id": "a", "tool": "put", "arguments": {"value": "a", "sleep": 0.3}},
            {"id": "b", "tool": "put", "arguments": {"value": "b"}},
            {"id": "c", "tool": "put", "arguments": {"value": "c"}},
        ],
        timeout=100,
    )
    by_id = {r["id"]: r for r in result.structured["results"]}  # type: ignore[index]
    assert by_id["a"]["status"] == "failed" and by_id["a"]["error"]["code"] == "timeout"
    assert by_id["b"]["status"] == by_id["c"]["status"] == "skipped"
    assert by_id["b"]["error"]["code"] == "batch_timeout"
    # `a` still finishes in its actor; b and c never run
    wait_until(lambda: state(rt, "items_now")["items"] == ["a"], WAIT)
    time.sleep(0.05)
    assert state(rt, "items_now")["items"] == ["a"]


# -- transactional rollback ------------------------------------------------------------


def test_rollback_restores_planning_and_content_exactly(rt: Runtime) -> None:
    rt.call("create_goal", {"goal": "keep", "__sessionId": "s1"})
    rt.call("add_todo", {"name": "open", "__sessionId": "s1"})
    rt.call("add_content", {"filename": "a.txt", "content": "alpha", "__sessionId": "s1"})
    rt.call("add_content", {"filename": "b.txt", "content": "beta\x00nul", "__sessionId": "s1"})
    rt.call("add_content", {"filename": "c.txt", "content": "gamma", "__sessionId": "s1"})
    before_planning = state(rt, "get_planning_state")
    before_content = state(rt, "list_content")
    before_search = rt.call("search_content", {"query": "beta", "__sessionId": "s1"}).structured
    ops = [
        {"id": "g", "tool": "create_goal", "arguments": {"goal": "new"}},
        {"id": "t", "tool": "add_todo", "arguments": {"name": "n", "goal_id": "${g.id}"}},
        {"id": "m", "tool": "mark_todo", "arguments": {"todo_id": "t2"}},
        {"id": "c", "tool": "add_content", "arguments": {"filename": "d.txt", "content": "delta"}},
        {"id": "d", "tool": "delete_content", "arguments": {"id": "c2"}},
        {"id": "p", "tool": "create_playbook", "arguments": {"name": "pb"}},
        {"id": "boom", "tool": "fail", "dependsOn": ["m", "c", "d", "t", "p"]},
        {"id": "never", "tool": "create_goal", "arguments": {"goal": "x"}, "dependsOn": ["boom"]},
    ]
    result = batch(rt, ops, transactional=True)
    assert result.is_error
    assert statuses(result) == {
        "g": "rolled_back",
        "t": "rolled_back",
        "m": "rolled_back",
        "c": "rolled_back",
        "d": "rolled_back",
        "p": "rolled_back",
        "boom": "failed",
        "never": "skipped",
    }
    assert result.structured["summary"]["rolledBack"] == 6  # type: ignore[index]
    assert state(rt, "get_planning_state") == before_planning
    assert state(rt, "list_content") == before_content
    assert state(rt, "list_playbooks") == {"playbooks": []}
    assert rt.call("read_content", {"id": "c2", "__sessionId": "s1"}).structured == {
        "id": "c2",
        "filename": "b.txt",
        "content": "beta\x00nul",
    }
    assert rt.call("search_content", {"query": "beta", "__sessionId": "s1"}).structured == (
        before_search
    )
    assert state(rt, "search_content", query="delta")["count"] == 0
    # Ids are never reused after a rollback.
    later = rt.call("create_goal", {"goal": "later", "__sessionId": "s1"}).structured
    assert later == {"id": "g5", "goal": "later"}  # g3 and t4 went to the rolled-back batch


def test_rollback_runs_in_reverse_order_and_compensations_are_not_observed(
    rt: Runtime,
) -> None:
    seen: list[str] = []
    rt.add_observer(lambda ctx, spec, args, result: seen.append(spec.name))
    ops = [
        {"id": "a", "tool": "put", "arguments": {"value": "a"}},
        {"id": "b", "tool": "put1", "arguments": {"value": "b"}},
        {"id": "c", "tool": "put", "arguments": {"value": "c"}},
        {"id": "x", "tool": "fail", "dependsOn": ["a", "b", "c"]},
    ]
    result = batch(rt, ops, transactional=True)
    assert result.is_error
    assert Probe.undone == ["c", "b", "a"]
    wait_until(lambda: "batch" in seen, WAIT)
    assert sorted(seen) == ["batch", "fail", "put", "put", "put1"]


def test_a_write_that_times_out_and_finishes_later_is_compensated(rt: Runtime) -> None:
    ops = [
        {"id": "slow", "tool": "put", "arguments": {"value": "late", "sleep": 0.3}, "timeout": 50},
        {"id": "fast", "tool": "put1", "arguments": {"value": "fast"}},
    ]
    result = batch(rt, ops, transactional=True, parallel=True)
    assert result.is_error
    assert statuses(result) == {"slow": "failed", "fast": "rolled_back"}
    wait_until(lambda: "late" in Probe.undone, WAIT)
    assert sorted(Probe.undone) == ["fast", "late"]
    assert state(rt, "items_now")["items"] == []
    assert state(rt, "items1")["items"] == []


def test_a_transaction_stopped_by_the_batch_timeout_is_rolled_back(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch's budget runs out between two operations, with `a`'s reply already in:
    # nothing failed, yet the transaction is incomplete, so `a` must be undone.
    wait = batch_engine.BatchRun._wait

    def slow_wait(self: Any, deadline: float) -> None:
        wait(self, deadline)
        time.sleep(max(deadline - time.monotonic(), 0.0) + 0.01)

    monkeypatch.setattr(batch_engine.BatchRun, "_wait", slow_wait)
    ops = [
        {"id": "a", "tool": "put", "arguments": {"value": "a"}},
        {"id": "b", "tool": "put", "arguments": {"value": "b"}, "dependsOn": ["a"]},
    ]
    result = batch(rt, ops, transactional=True, timeout=200)
    assert result.is_error
    assert statuses(result) == {"a": "rolled_back", "b": "skipped"}
    assert state(rt, "items_now")["items"] == []


def test_a_successful_transactional_batch_is_kept(rt: Runtime) -> None:
    result = batch(
        rt, [{"id": "a", "tool": "put", "arguments": {"value": "a"}}], transactional=True
    )
    assert not result.is_error and statuses(result) == {"a": "success"}
    assert state(rt, "items_now")["items"] == ["a"]


# -- presets ---------------------------------------------------------------------------


def test_presets_save_list_run_with_params_per_assistant(rt: Runtime) -> None:
    me = {"__sessionId": "s1", "__assistantId": "a1"}
    saved = rt.call(
        "save_preset",
        {
            **me,
            "name": "plan",
            "params": ["topic", "n"],
            "operations": [
                {"id": "g", "tool": "create_goal", "arguments": {"goal": "Learn {{topic}}"}},
                {
                    "id": "t",
                    "tool": "add_todo",
                    "arguments": {"name": "{{topic}} x{{n}}", "goal_id": "${g.id}"},
                },
                {"id": "p", "tool": "put", "arguments": {"value": "{{topic}}", "sleep": "{{n}}"}},
            ],
        },
    )
    assert saved.structured == {"name": "plan", "params": ["n", "topic"], "replaced": False}
    listed = rt.call("list_presets", me).structured
    assert listed == {"presets": [{"name": "plan", "params": ["n", "topic"], "operations": 3}]}
    assert rt.call("list_presets", {"__sessionId": "s1", "__assistantId": "a2"}).structured == {
        "presets": []
    }
    ran = rt.call("run_preset", {**me, "name": "plan", "params": {"topic": "Rust", "n": 0}})
    assert not ran.is_error, ran.text
    planning = rt.call("get_planning_state", me).structured
    assert planning["goals"] == [{"id": "g1", "goal": "Learn Rust"}]  # type: ignore[index]
    assert planning["todos"][0]["name"] == "Rust x0"  # type: ignore[index]
    other = rt.call("run_preset", {"__sessionId": "s1", "__assistantId": "a2", "name": "plan"})
    assert other.is_error and "preset 'plan' not found" in other.text
    missing = rt.call("run_preset", {**me, "name": "plan", "params": {"topic": "x"}})
    assert missing.is_error and "missing ['n']" in missing.text


def test_preset_placeholders_must_be_declared_and_nesting_is_refused(rt: Runtime) -> None:
    me = {"__sessionId": "s1", "__assistantId": "a1"}
    undeclared = rt.call(
        "save_preset",
        {**me, "name": "x", "operations": [{"tool": "put", "arguments": {"value": "{{v}}"}}]},
    )
    assert undeclared.is_error and "undeclared params: v" in undeclared.text
    nested = rt.call(
        "save_preset",
        {**me, "name": "x", "operations": [{"tool": "run_preset", "arguments": {"name": "x"}}]},
    )
    assert nested.is_error and "no nesting" in nested.text
    assert rt.call("list_presets", me).structured == {"presets": []}


# -- unified tool listing --------------------------------------------------------------


def test_unified_mode_lists_batch_and_presets_naming_every_action(rt: Runtime) -> None:
    with Runtime(servers=[*BUILTIN, Probe], tools="unified") as unified:
        listed = {t["name"]: t for t in unified.list_tools()}
        assert set(listed) == {"batch", "save_preset", "list_presets", "run_preset"}
        description = listed["batch"]["description"]
        for name, spec in unified.tools.items():
            if spec.server.name not in ("batch", "presets"):
                assert f"{name}{{" in description
                assert f"- {spec.server.name}: " in description
        assert "add_todo{name: string, goal_id?: string|null}" in description
        # The same calls run in both modes.
        direct = unified.call("create_goal", {"goal": "g", "__sessionId": "s"})
        assert direct.structured == {"id": "g1", "goal": "g"}
    assert {t["name"] for t in rt.list_tools()} >= {"batch", "create_goal", "put"}
    with pytest.raises(ValueError, match="'all' or 'unified'"):
        Runtime(tools="some")


def test_concurrent_transactional_batches_keep_exactly_the_committed_ones(rt: Runtime) -> None:
    """Sixteen transactional batches on one session at once; every odd one fails at the end.

    Each batch writes to one of six probe lanes and to the shared session-scoped content
    store, so rollbacks interleave with other batches' writes on the same keys.
    """
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            ops: list[dict[str, Any]] = [
                {"id": "p", "tool": f"put{i % 6}", "arguments": {"value": f"v{i}"}},
                {
                    "id": "c",
                    "tool": "add_content",
                    "arguments": {"filename": f"f{i}", "content": "x"},
                },
                {"id": "g", "tool": "create_goal", "arguments": {"goal": f"g{i}"}},
            ]
            if i % 2:
                ops.append({"id": "boom", "tool": "fail", "dependsOn": ["p", "c", "g"]})
            result = batch(rt, ops, parallel=bool(i % 4 < 2), transactional=True)
            assert result.is_error == bool(i % 2), result.text
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * WAIT)
    assert not errors, errors
    files = sorted(item["filename"] for item in state(rt, "list_content")["items"])
    assert files == sorted(f"f{i}" for i in range(0, 16, 2))
    goals = sorted(g["goal"] for g in state(rt, "get_planning_state")["goals"])
    assert goals == sorted(f"g{i}" for i in range(0, 16, 2))
    for lane in range(6):
        expected = sorted(f"v{i}" for i in range(lane, 16, 6) if i % 2 == 0)
        assert sorted(state(rt, f"items{lane}")["items"]) == expected


def test_a_reference_to_a_missing_value_fails_that_operation(rt: Runtime) -> None:
    result = batch(
        rt,
        [
            {"id": "g", "tool": "create_goal", "arguments": {"goal": "a"}},
            {"id": "t", "tool": "add_todo", "arguments": {"name": "${g.nope.deeper}"}},
            {"id": "u", "tool": "add_todo", "arguments": {"name": "${g.id}"}, "dependsOn": ["t"]},
        ],
    )
    by_id = {r["id"]: r for r in result.structured["results"]}  # type: ignore[index]
    assert by_id["t"]["status"] == "failed"
    assert by_id["t"]["error"] == {
        "code": "invalid_arguments",
        "message": "reference ${g.nope.deeper}: no value at g.nope",
    }
    assert by_id["u"]["status"] == "skipped"
    assert state(rt, "get_planning_state")["todos"] == []
