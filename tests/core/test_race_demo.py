"""scripts/race_demo.py: the old design really races, ctxactors never does."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "race_demo.py"


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("race_demo", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["race_demo"] = module  # msgspec resolves the Structs' annotations through it
    spec.loader.exec_module(module)
    return module


def test_the_unlucky_order_puts_alices_goal_in_bobs_plan(demo: ModuleType) -> None:
    steps = demo.four_steps()
    assert "create_goal('alice: learn Rust')  -> stored in bob's plan" in steps[2]


def test_old_model_is_faithful_when_requests_do_not_overlap(demo: ModuleType) -> None:
    """One client at a time: the old design is correct, so any wrong count is the race."""
    work = demo.Workload(["alice", "bob", "carol"], rounds=5, hop=0.0, concurrent=False)
    counts = demo.run_old(work)
    assert counts.wrong == 0 and counts.goals == 30 and counts.checks == 60
    assert counts.sessions_with_foreign_goals == 0 and counts.states == 3


def test_concurrent_old_design_goes_wrong_and_ctxactors_does_not(demo: ModuleType) -> None:
    work = demo.Workload(["alice", "bob", "carol", "dave"], rounds=10, hop=0.0005)
    for _ in range(5):  # the race is a race: on a loaded machine, give it a few tries
        old = demo.run_old(work)
        if old.wrong_session and old.foreign_allowed + old.own_refused:
            break
    assert old.wrong_session > 0
    assert old.foreign_allowed + old.own_refused > 0
    assert old.sessions_with_foreign_goals > 0
    new = demo.run_ctxactors(work)
    assert new.wrong == 0
    assert (new.goals, new.checks, new.states) == (80, 160, 8)


def test_main_prints_counts_and_exits_zero(
    demo: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--sessions", "3", "--rounds", "4", "--hop-ms", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "create_goal ran against the wrong session" in out
    assert "ctxactors: 0 - none, by construction." in out
