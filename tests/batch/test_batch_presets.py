"""Presets pinned to exact values: kept across a restart of the runtime (order, options,
sizes), the per-preset and per-assistant byte bounds at their edges, and the argument text
that filling params builds, counted per preset and towards the batch's own bound."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxactors import Runtime
from ctxactors.settings import BatchSettings, Settings
from ctxactors.state import SQLiteStore
from ctxactors.testing import context_args as ctx_args


def call(rt: Runtime, tool: str, **args: Any) -> Any:
    return rt.call(tool, ctx_args("s", "a1", **args))


GOAL = {"tool": "create_goal", "arguments": {"goal": "{{g}}"}}
FAIL = {"tool": "mark_todo", "arguments": {"todo_id": "missing"}}
# A preset's size is the JSON of [operations as given, params, options]: GOAL's is
ONE_GOAL = len('[[{"tool":"create_goal","arguments":{"goal":"{{g}}"}}],["g"],null]')
# and GOAL then FAIL, transactional:
TX = len(
    '[[{"tool":"create_goal","arguments":{"goal":"{{g}}"}},'
    '{"tool":"mark_todo","arguments":{"todo_id":"missing"}}],["g"],'
    '{"parallel":false,"transactional":true,"timeout":null,"includeMetadata":false,'
    '"maxConcurrency":null}]'
)


@pytest.fixture
def rt(rt_settings: Settings) -> Iterator[Runtime]:
    with Runtime(call_timeout=20, settings=rt_settings) as runtime:
        yield runtime


def test_presets_their_order_options_and_sizes_survive_a_restart(tmp_path: Path) -> None:
    # Room for both presets, one byte short of another GOAL.
    limit = Settings(batch=BatchSettings(max_presets_bytes=TX + 2 * ONE_GOAL - 1))
    with Runtime(store=SQLiteStore(tmp_path / "state.db"), settings=limit) as rt:
        tx = call(
            rt,
            "save_preset",
            name="tx",
            operations=[GOAL, FAIL],
            params=["g"],
            options={"transactional": True},
        )
        assert tx.structured == {"name": "tx", "params": ["g"], "replaced": False}
        assert not call(rt, "save_preset", name="one", operations=[GOAL], params=["g"]).is_error
    with Runtime(store=SQLiteStore(tmp_path / "state.db"), settings=limit) as rt:
        assert call(rt, "list_presets").structured == {
            "presets": [
                {"name": "tx", "params": ["g"], "operations": 2},
                {"name": "one", "params": ["g"], "operations": 1},
            ]
        }
        ran = call(rt, "run_preset", name="tx", params={"g": "Rust"})
        assert ran.is_error  # still transactional: the failing step undid the goal
        assert [r["status"] for r in ran.structured["results"]] == ["rolled_back", "failed"]
        assert call(rt, "get_planning_state").structured["goals"] == []
        # The restored presets' sizes still count towards the assistant's bound.
        over = call(rt, "save_preset", name="two", operations=[GOAL], params=["g"])
        assert over.text == (
            f"the assistant's presets would hold {TX + 2 * ONE_GOAL} bytes, over the limit of "
            f"{TX + 2 * ONE_GOAL - 1} (CTXACTORS_BATCH_MAX_PRESETS_BYTES); preset 'two' not saved"
        )


@pytest.mark.parametrize(
    "rt_settings",
    [Settings(batch=BatchSettings(max_preset_bytes=ONE_GOAL, max_presets_bytes=2 * ONE_GOAL))],
)
def test_the_byte_bounds_are_inclusive_and_a_replaced_preset_counts_once(rt: Runtime) -> None:
    for name in ("p1", "p2"):  # each exactly at the preset bound; together at the total's
        saved = call(rt, "save_preset", name=name, operations=[GOAL], params=["g"])
        assert saved.structured == {"name": name, "params": ["g"], "replaced": False}
    again = call(rt, "save_preset", name="p2", operations=[GOAL], params=["g"])
    assert again.structured == {"name": "p2", "params": ["g"], "replaced": True}
    over = call(rt, "save_preset", name="p3", operations=[GOAL], params=["g"])
    assert over.text == (
        f"the assistant's presets would hold {3 * ONE_GOAL} bytes, over the limit of "
        f"{2 * ONE_GOAL} (CTXACTORS_BATCH_MAX_PRESETS_BYTES); preset 'p3' not saved"
    )
    bigger = [{"tool": "create_goal", "arguments": {"goal": "{{g}}!"}}]
    big = call(rt, "save_preset", name="p1", operations=bigger, params=["g"])
    assert big.text == (
        f"preset 'p1' is {ONE_GOAL + 1} bytes, over the limit of {ONE_GOAL} "
        "(CTXACTORS_BATCH_MAX_PRESET_BYTES); not saved"
    )
    listed = call(rt, "list_presets").structured["presets"]
    assert [p["name"] for p in listed] == ["p1", "p2"]


# Two operations, each building 10 bytes from {{g}}: 20 in all.
TWO = [{"id": "a", **GOAL}, GOAL]
TEN = "x" * 10


@pytest.mark.parametrize("rt_settings", [Settings(batch=BatchSettings(max_expanded_bytes=20))])
def test_filling_params_exactly_up_to_the_bound_runs(rt: Runtime) -> None:
    assert not call(rt, "save_preset", name="p", operations=TWO, params=["g"]).is_error
    ran = call(rt, "run_preset", name="p", params={"g": TEN})
    assert [r["status"] for r in ran.structured["results"]] == ["success", "success"]


@pytest.mark.parametrize("rt_settings", [Settings(batch=BatchSettings(max_expanded_bytes=19))])
def test_filling_params_counts_every_operation_and_names_the_one_past_the_bound(
    rt: Runtime,
) -> None:
    assert not call(rt, "save_preset", name="p", operations=TWO, params=["g"]).is_error
    refused = call(rt, "run_preset", name="p", params={"g": TEN})
    assert refused.text == (
        "preset 'p': filling its params would build 20 bytes of arguments by operation 1, "
        "over the limit of 19 (CTXACTORS_BATCH_MAX_EXPANDED_BYTES); nothing ran"
    )
    assert call(rt, "get_planning_state").structured["goals"] == []


@pytest.mark.parametrize("rt_settings", [Settings(batch=BatchSettings(max_expanded_bytes=19))])
def test_the_params_filled_in_count_towards_the_batchs_own_bound(rt: Runtime) -> None:
    ops = [
        {"id": "a", **GOAL},
        {"id": "b", "tool": "create_goal", "arguments": {"goal": "${a.goal}"}},
    ]
    assert not call(rt, "save_preset", name="p", operations=ops, params=["g"]).is_error
    ran = call(rt, "run_preset", name="p", params={"g": TEN})
    results = {r["id"]: r for r in ran.structured["results"]}
    assert results["a"]["status"] == "success"
    assert results["b"]["error"] == {
        "code": "too_large",
        "message": "operation 1 ('b'): its references would build 10 bytes of arguments, 10 "
        "were built before it, over the batch's limit of 19 (CTXACTORS_BATCH_MAX_EXPANDED_BYTES)",
    }
