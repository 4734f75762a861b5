"""The batch tool at its edges: context, hostile references, memory, time, stale reads, presets.

Each test here failed on the batch as it was before issue 13 was fixed.
"""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from batch_support import WAIT, Probe, batch, by_id, probe_runtime, state, statuses
from hypothesis import given
from hypothesis import strategies as st
from test_http_api import call, error_of

from ctxactors import Runtime
from ctxactors.batch.template import PLACEHOLDERS, REFERENCES
from ctxactors.errors import CallTimeoutError, InvalidArgumentsError
from ctxactors.settings import BatchSettings, Settings
from ctxactors.testing import serve_app
from ctxactors.transports.http import create_app

MiB = 1 << 20


@pytest.fixture
def rt(rt_settings: Settings) -> Iterator[Runtime]:
    yield from probe_runtime(settings=rt_settings)


T1 = {"__sessionId": "s1", "__assistantId": "a1", "__threadId": "t1"}
T2 = {"__sessionId": "s1", "__assistantId": "a1", "__threadId": "t2"}


# -- 1. an operation runs with exactly the caller's context ------------------------------


def test_an_operation_naming_a_thread_is_refused_and_a_batch_stays_in_its_thread(
    rt: Runtime,
) -> None:
    rt.call("create_goal", {**T1, "goal": "t1's secret"})
    for field in ("thread", "threadId", "sessionId", "assistantId"):
        op = {"tool": "create_goal", "arguments": {"goal": "x"}, field: "t1"}
        with pytest.raises(InvalidArgumentsError) as refused:
            rt.call("batch", {**T2, "operations": [{"tool": "get_planning_state"}, op]})
        assert f"unknown field `{field}` - at `$.operations[1]`" in str(refused.value)
    ran = rt.call(
        "batch",
        {
            **T2,
            "operations": [
                {"id": "r", "tool": "get_planning_state", "arguments": {"__threadId": "t1"}},
                {
                    "id": "w",
                    "tool": "create_goal",
                    "arguments": {"goal": "mine", "__thread_id": "t1"},
                },
            ],
        },
    )
    assert by_id(ran)["r"]["data"] == {"goals": [], "todos": []}
    assert rt.call("get_planning_state", T1).structured == {
        "goals": [{"id": "g1", "goal": "t1's secret"}],
        "todos": [],
    }
    assert rt.call("get_planning_state", T2).structured == {
        "goals": [{"id": "g1", "goal": "mine"}],
        "todos": [],
    }


def test_a_preset_runs_in_the_thread_that_runs_it_and_cannot_name_another(rt: Runtime) -> None:
    rt.call("create_goal", {**T1, "goal": "t1's secret"})
    with pytest.raises(InvalidArgumentsError, match=r"unknown field `thread`"):
        rt.call(
            "save_preset",
            {**T1, "name": "steal", "operations": [{"tool": "get_planning_state", "thread": "t1"}]},
        )
    saved = rt.call(
        "save_preset",
        {
            **T1,  # saved from t1: presets are kept per assistant, run in the runner's thread
            "name": "look",
            "params": ["g"],
            "operations": [
                {"id": "r", "tool": "get_planning_state"},
                {"id": "w", "tool": "create_goal", "arguments": {"goal": "{{g}}"}},
            ],
        },
    )
    assert not saved.is_error, saved.text
    ran = rt.call("run_preset", {**T2, "name": "look", "params": {"g": "from t2"}})
    assert by_id(ran)["r"]["data"] == {"goals": [], "todos": []}
    assert rt.call("get_planning_state", T1).structured["goals"] == [  # type: ignore[index]
        {"id": "g1", "goal": "t1's secret"}
    ]
    assert rt.call("get_planning_state", T2).structured["goals"] == [  # type: ignore[index]
        {"id": "g1", "goal": "from t2"}
    ]


# -- 2. scanning is linear in the input ----------------------------------------------------

HOSTILE = 1_400_000  # "${a" * HOSTILE is 4.2 MB; the old regex needed ~3 s at 8,000


@pytest.mark.timeout(20)
def test_reference_scanning_of_a_4_mb_hostile_argument_is_linear(rt: Runtime) -> None:
    hostile = "${a" * HOSTILE
    assert REFERENCES.keys(hostile) == []
    assert REFERENCES.keys(hostile + "}") == [("a", ())]  # the last one is complete
    assert PLACEHOLDERS.keys("{{a" * HOSTILE) == []
    assert PLACEHOLDERS.keys("{{ " * HOSTILE + "{{b}}") == ["b"]
    result = batch(
        rt,
        [
            {"id": "r", "tool": "put", "arguments": {"value": "v"}},
            {"id": "x", "tool": "put", "arguments": {"value": "${r.value}" + hostile}},
        ],
    )
    assert statuses(result) == {"r": "success", "x": "success"}
    assert by_id(result)["x"]["data"]["value"] == "v" + hostile
    refused = batch(rt, [{"id": "y", "tool": "put", "arguments": {"value": hostile + "}"}}])
    assert refused.is_error
    assert "operation 0 ('y') depends on unknown 'a'" in refused.text


@given(st.text(alphabet="${}. \nab1", max_size=60))
def test_filling_each_reference_with_its_own_text_gives_back_the_input(text: str) -> None:
    def same(ref: tuple[str, tuple[str, ...]]) -> str:
        return "${" + ".".join((ref[0], *ref[1])) + "}"

    assert REFERENCES.fill(text, same) == text
    found = REFERENCES.keys(text)
    assert REFERENCES.filled_size(text, lambda ref: len(same(ref))) == (len(text) if found else 0)
    for op_id, path in found:
        assert same((op_id, path)) in text
        assert all(part and not set(part) & set("${} \n.") for part in (op_id, *path))


# -- 3. what references and params build is bounded before it is built ---------------------


def _peak_during(call: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_references_that_would_build_too_much_fail_their_operation_unbuilt(rt: Runtime) -> None:
    big = "x" * MiB
    ops: list[dict[str, Any]] = [{"id": "r", "tool": "put", "arguments": {"value": big}}]
    ops += [
        {"id": f"e{i}", "tool": "put", "arguments": {"value": "${r.value}" * 20}} for i in range(10)
    ]  # 200 references to 1 MiB: 200 MiB if built
    result, peak = _peak_during(lambda: batch(rt, ops))
    assert peak < 50_000_000, peak
    results = by_id(result)
    assert results["r"]["status"] == "success"
    for i in range(10):
        assert results[f"e{i}"]["status"] == "failed"
        assert results[f"e{i}"]["error"] == {
            "code": "too_large",
            "message": f"operation {i + 1} ('e{i}'): its references would build "
            f"{20 * MiB} bytes of arguments, 0 were built before it, over the batch's limit "
            f"of {8 * MiB} (CTXACTORS_BATCH_MAX_EXPANDED_BYTES)",
        }
    assert state(rt, "items_now")["items"] == [big]


@pytest.mark.parametrize("rt_settings", [Settings(batch=BatchSettings(max_expanded_bytes=1000))])
def test_the_expansion_bound_is_for_the_whole_batch(rt: Runtime) -> None:
    v = "é" * 150  # 300 bytes of UTF-8
    result = batch(
        rt,
        [
            {"id": "r", "tool": "put", "arguments": {"value": v}},
            {"id": "a", "tool": "put", "arguments": {"value": "${r.value}${r.value}"}},
            {"id": "b", "tool": "put", "arguments": {"value": "${r.value}"}},
            {"id": "c", "tool": "put", "arguments": {"value": "<${r.value}>"}},
            {"id": "d", "tool": "put", "arguments": {"value": "${a.value}"}, "dependsOn": ["c"]},
        ],
    )
    assert statuses(result) == {
        "r": "success",
        "a": "success",
        "b": "success",
        "c": "failed",
        "d": "skipped",
    }
    assert by_id(result)["c"]["error"]["message"] == (
        "operation 3 ('c'): its references would build 302 bytes of arguments, 900 were "
        "built before it, over the batch's limit of 1000 (CTXACTORS_BATCH_MAX_EXPANDED_BYTES)"
    )
    assert state(rt, "items_now")["items"] == [v, v + v, v]


def test_a_preset_whose_params_would_build_too_much_is_refused_before_filling(
    rt: Runtime,
) -> None:
    me = {"__sessionId": "s1", "__assistantId": "a1"}
    ops = [
        {"id": f"e{i}", "tool": "put", "arguments": {"value": "{{big}}" * 20}} for i in range(10)
    ]
    saved = rt.call("save_preset", {**me, "name": "fat", "params": ["big"], "operations": ops})
    assert not saved.is_error, saved.text
    big = "y" * MiB
    ran, peak = _peak_during(
        lambda: rt.call("run_preset", {**me, "name": "fat", "params": {"big": big}})
    )
    assert peak < 50_000_000, peak
    assert ran.is_error
    assert ran.text == (
        f"preset 'fat': filling its params would build {20 * MiB} bytes of arguments by "
        f"operation 0 ('e0'), over the limit of {8 * MiB} (CTXACTORS_BATCH_MAX_EXPANDED_BYTES); "
        "nothing ran"
    )
    assert state(rt, "items_now", __assistantId="a1")["items"] == []


@pytest.mark.parametrize("rt_settings", [Settings(batch=BatchSettings(max_result_bytes=2500))])
def test_a_batch_stops_starting_operations_once_its_results_pass_the_bound(rt: Runtime) -> None:
    ops = [{"id": f"p{i}", "tool": "put", "arguments": {"value": "v" * 1000}} for i in range(5)]
    result = batch(rt, ops)
    assert statuses(result) == {
        "p0": "success",
        "p1": "success",
        "p2": "success",
        "p3": "skipped",
        "p4": "skipped",
    }
    size = sum(len(msgspec.json.encode(by_id(result)[f"p{i}"]["data"])) for i in range(3))
    assert by_id(result)["p3"]["error"] == {
        "code": "batch_too_large",
        "message": f"the operations' results reached {size} bytes, over the batch's limit "
        "of 2500 (CTXACTORS_BATCH_MAX_RESULT_BYTES)",
    }
    assert len(state(rt, "items_now")["items"]) == 3


# -- 4. a batch ends before its caller gives up; nothing runs for a caller that has --------


@pytest.mark.parametrize("batch_timeout", [None, 60_000])
def test_a_batch_ends_before_its_caller_gives_up(rt: Runtime, batch_timeout: int | None) -> None:
    ops = [
        {"id": "a", "tool": "block", "arguments": {"value": "a"}},  # uses all of its time
        {"id": "b", "tool": "put1", "arguments": {"value": "b"}},
        {"id": "c", "tool": "put2", "arguments": {"value": "c"}},
    ]
    options = {} if batch_timeout is None else {"timeout": batch_timeout}
    result = batch(rt, ops, call_timeout=3.0, **options)  # no CallTimeoutError
    results = by_id(result)
    assert results["a"]["status"] == "failed"
    assert results["a"]["error"]["code"] == "timeout"
    assert results["b"]["error"]["code"] == results["c"]["error"]["code"] == "batch_timeout"
    assert statuses(result) == {"a": "failed", "b": "skipped", "c": "skipped"}
    Probe.gate.set()
    assert state(rt, "items_now")["items"] == []  # queued behind `a`: `a` has finished
    assert Probe.ran == ["a"]
    assert state(rt, "items1")["items"] == state(rt, "items2")["items"] == []


def test_an_operation_still_queued_when_the_batch_gives_up_never_runs(rt: Runtime) -> None:
    ops = [
        {"id": "a", "tool": "block", "arguments": {"value": "a"}},
        {"id": "b", "tool": "note", "arguments": {"value": "b"}},  # queued behind `a`
        {"id": "w", "tool": "put", "arguments": {"value": "w"}},  # queued behind `b`
    ]
    result = batch(rt, ops, parallel=True, timeout=500)
    assert statuses(result) == {"a": "failed", "b": "failed", "w": "failed"}
    assert {r["error"]["code"] for r in by_id(result).values()} == {"timeout"}
    Probe.gate.set()
    assert state(rt, "items_now")["items"] == []  # queued after all three
    assert Probe.ran == ["a"]


def test_a_batch_whose_caller_gave_up_before_it_started_runs_nothing(rt: Runtime) -> None:
    first: list[Any] = []
    holder = threading.Thread(
        target=lambda: first.append(
            batch(rt, [{"id": "a", "tool": "block", "arguments": {"value": "a"}}])
        )
    )
    holder.start()
    assert Probe.entered.wait(WAIT)  # the batch key's actor is busy with the first batch
    late = [
        {"id": "b1", "tool": "note", "arguments": {"value": "b1"}},
        {"id": "b2", "tool": "put1", "arguments": {"value": "b2"}},
    ]
    with pytest.raises(CallTimeoutError):
        batch(rt, late, call_timeout=0.3, transactional=True)
    Probe.gate.set()
    holder.join(3 * WAIT)
    assert statuses(first[0]) == {"a": "success"}
    after = batch(rt, [{"id": "c", "tool": "note", "arguments": {"value": "c"}}])
    assert statuses(after) == {"c": "success"}  # queued behind the abandoned batch
    assert Probe.ran == ["a", "c"]
    assert state(rt, "items1")["items"] == []


def test_a_transaction_cut_short_by_its_callers_deadline_is_rolled_back(rt: Runtime) -> None:
    ops = [
        {"id": "w", "tool": "put1", "arguments": {"value": "w"}},
        {"id": "a", "tool": "block", "arguments": {"value": "a"}, "dependsOn": ["w"]},
    ]
    result = batch(rt, ops, call_timeout=3.0, transactional=True)
    assert result.is_error
    assert statuses(result) == {"w": "rolled_back", "a": "failed"}
    assert by_id(result)["a"]["error"]["code"] == "timeout"
    assert state(rt, "items1")["items"] == []
    assert Probe.undone == ["w"]


# -- 5. no stale reads -----------------------------------------------------------------------


def test_a_read_after_another_operation_in_the_same_batch_sees_its_effect(rt: Runtime) -> None:
    recent = {"tool": "get_recent_context", "arguments": {"limit": 5}}
    result = batch(
        rt,
        [
            {"id": "h1", **recent},
            {"id": "w", "tool": "create_goal", "arguments": {"goal": "g"}},  # another key
            {"id": "h2", **recent},
            {"id": "x", "tool": "get_planning_state"},  # a read, yet the history shows it
            {"id": "h3", **recent},
            {"id": "i1", "tool": "items_now"},
            {"id": "p", "tool": "put", "arguments": {"value": "v"}},  # the same key
            {"id": "i2", "tool": "items_now"},
        ],
    )
    data = {i: r["data"] for i, r in by_id(result).items()}

    def tools(op: str) -> list[str]:
        return [o["tool"] for o in data[op]["operations"]]

    assert tools("h1") == []
    assert tools("h2") == ["create_goal"]
    assert tools("h3") == ["get_planning_state", "create_goal"]
    assert data["i1"]["items"] == []
    assert data["i2"]["items"] == ["v"]


# -- 6. presets: caps and checks when saved -------------------------------------------------

ME = {"__sessionId": "s1", "__assistantId": "a1"}


def _save(rt: Runtime, name: str, operations: list[Any], **extra: Any) -> Any:
    return rt.call("save_preset", {**ME, "name": name, "operations": operations, **extra})


@pytest.mark.parametrize(
    "rt_settings",
    [Settings(batch=BatchSettings(max_presets=3, max_preset_bytes=2000, max_presets_bytes=3000))],
)
def test_preset_count_and_size_are_capped_per_assistant(rt: Runtime) -> None:
    op = [{"tool": "put", "arguments": {"value": "v" * 1400}}]
    fat = _save(rt, "fat", [{"tool": "put", "arguments": {"value": "v" * 2000}}])
    assert fat.is_error
    assert fat.text.startswith("preset 'fat' is 20")
    assert fat.text.endswith(
        "bytes, over the limit of 2000 (CTXACTORS_BATCH_MAX_PRESET_BYTES); not saved"
    )
    assert not _save(rt, "p1", op).is_error
    assert not _save(rt, "p2", op).is_error
    third = _save(rt, "p3", op)
    assert (
        third.is_error
        and "over the limit of 3000 (CTXACTORS_BATCH_MAX_PRESETS_BYTES)" in third.text
    )
    small = [{"tool": "items_now"}]
    assert not _save(rt, "p3", small).is_error
    fourth = _save(rt, "p4", small)
    assert fourth.is_error and fourth.text == "at most 3 presets per assistant; none saved"
    replaced = _save(rt, "p1", small)  # replacing one is not adding one
    assert replaced.structured == {"name": "p1", "params": [], "replaced": True}
    with pytest.raises(InvalidArgumentsError, match="length <= 50"):
        _save(rt, "many", small, params=[f"p{i}" for i in range(51)])
    listed = rt.call("list_presets", ME).structured
    assert listed == {
        "presets": [
            {"name": "p1", "params": [], "operations": 1},
            {"name": "p2", "params": [], "operations": 1},
            {"name": "p3", "params": [], "operations": 1},
        ]
    }
    assert rt.call("list_presets", {**ME, "__assistantId": "a2"}).structured == {"presets": []}


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"value": 3, "sleep": "{{n}}"}, "Expected `str`, got `int` - in `value`"),
        ({"valu": "{{n}}"}, "unknown valu; missing value"),
        ({"value": "{{n}}", "sleep": "slow"}, "Expected `float`, got `str` - in `sleep`"),
        ({"value": "x", "{{n}}": 1}, "Object contains unknown field `{{n}}`"),
    ],
)
def test_a_preset_that_can_never_run_is_refused_when_saved(
    rt: Runtime, arguments: dict[str, Any], problem: str
) -> None:
    saved = _save(rt, "p", [{"id": "x", "tool": "put", "arguments": arguments}], params=["n"])
    assert saved.is_error
    assert saved.text == f"operation 0 ('x'): invalid arguments for 'put': {problem}"
    assert rt.call("list_presets", ME).structured == {"presets": []}


def test_arguments_beside_references_are_checked_before_anything_runs(rt: Runtime) -> None:
    result = batch(
        rt,
        [
            {"id": "p", "tool": "put", "arguments": {"value": "v"}},
            {"id": "q", "tool": "put", "arguments": {"value": "${p.value}", "sleep": "slow"}},
        ],
    )
    assert result.is_error
    assert (
        "operation 1 ('q'): invalid arguments for 'put': Expected `float`, got `str` - in `sleep`"
        in result.text
    )
    assert state(rt, "items_now")["items"] == []


# -- the same over REST (the asynchronous call path) ----------------------------------------


def test_over_rest_a_batch_stays_in_its_thread_and_ends_before_the_call_times_out() -> None:
    for runtime in probe_runtime(call_timeout=3.0):
        with (
            serve_app(create_app(runtime)) as url,
            httpx.Client(base_url=url, timeout=3 * WAIT) as http,
        ):
            call(http, "create_goal", {"goal": "t1's secret"}, assistant="a1", thread="t1")
            steal = [{"id": "r", "tool": "get_planning_state", "thread": "t1"}]
            refused = call(http, "batch", {"operations": steal}, assistant="a1", thread="t2")
            assert error_of(refused, 400)["message"].endswith(
                "Object contains unknown field `thread` - at `$.operations[0]`"
            )
            ops = [
                {"id": "r", "tool": "get_planning_state"},
                {"id": "a", "tool": "block", "arguments": {"value": "a"}},
                {"id": "b", "tool": "put1", "arguments": {"value": "b"}},
            ]
            ran = call(http, "batch", {"operations": ops}, assistant="a1", thread="t2")
            assert ran.status_code == 200, ran.text  # not 504: the batch ended first
            results = {r["id"]: r for r in ran.json()["structuredContent"]["results"]}
            assert results["r"]["data"] == {"goals": [], "todos": []}
            assert results["a"]["error"]["code"] == "timeout"
            assert results["b"]["error"]["code"] == "batch_timeout"
            Probe.gate.set()
            assert state(runtime, "items_now", **T2)["items"] == []  # queued behind `a`
            assert Probe.ran == ["a"]
            assert state(runtime, "items1", **T2)["items"] == []
