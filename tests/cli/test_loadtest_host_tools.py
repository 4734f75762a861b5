"""``ctxactors loadtest --server MODULE:CLASS --mix ...``: the mix names host tools, whose
arguments are made up from their types and whose answers must not be errors."""

from __future__ import annotations

import datetime
import json
import os
import threading
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest
from mcp_support import TEST_PATH
from test_loadtest import parse

from ctxactors import Scope, Server, ToolContext, ToolError, tool
from ctxactors.cli.loadtest import command as loadtest
from ctxactors.cli.loadtest.host_tools import arguments_for

HERE = f"{Path(__file__).stem}"


class Tally(Server):
    """Counts what each thread of a conversation sent; refuses a label of another context."""

    name = "tally"
    scope = Scope.THREAD
    calls: list[tuple[str, int]] = []
    lock = threading.Lock()

    @tool
    def tally(
        self,
        ctx: ToolContext,
        label: Annotated[str, msgspec.Meta(min_length=1, max_length=80)],
        weight: Annotated[int, msgspec.Meta(ge=1, le=5)],
        note: str | None = None,
    ) -> dict[str, Any]:
        """Count one call."""
        who = f"{ctx.session_id}/{ctx.assistant_id}/{ctx.thread_id or '-'}#"
        if not label.startswith(who):
            raise ToolError(f"label {label!r} is not {who}...")
        with Tally.lock:
            Tally.calls.append((label, weight))
        return {"label": label, "weight": weight}

    @tool
    def broken(self, ctx: ToolContext) -> dict[str, Any]:
        raise ToolError("broken on purpose")

    @tool
    def at(self, ctx: ToolContext, when: datetime.datetime) -> dict[str, Any]:
        return {"when": when.isoformat()}


def run_cli(tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    code = loadtest.run(parse(*argv, "--json", str(out)))
    return code, json.loads(out.read_text())


def test_a_host_tool_in_the_mix_is_called_with_its_context_s_label(tmp_path: Path) -> None:
    Tally.calls.clear()
    argv = ("--server", f"{HERE}:Tally", "--mix", "create_goal=1,tally=2")
    code, report = run_cli(tmp_path, *argv, "--sessions", "6", "--calls", "12", "--threads", "2")
    assert code == 0, report["violations"]
    assert report["passed"] and report["errors"] == {} and report["host_tools"] == ["tally"]
    assert report["workload_calls"] == 72
    labels = [label for label, _ in Tally.calls]
    assert 0 < len(labels) < 72 and len(set(labels)) == len(labels)
    # The label is the call's own context and sequence number; 1 to 5 by its bounds.
    assert all(label.split("#")[0].count("/") == 2 for label in labels)
    assert {weight for _, weight in Tally.calls} <= set(range(1, 6))


def test_a_host_tool_that_answers_with_errors_fails_the_run(tmp_path: Path) -> None:
    code, report = run_cli(
        tmp_path, "--server", f"{HERE}:Tally", "--mix", "broken", "--sessions", "2", "--calls", "2"
    )
    assert code == 1 and not report["passed"]
    assert report["violations_count"] == 4
    assert report["violations"][0].endswith("broken: unexpected error 'broken on purpose'")


def test_the_mix_names_only_tools_it_can_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert loadtest.run(parse("--mix", "tally=1")) == 2  # no --server: not a tool here
    assert capsys.readouterr().err == (
        "ctxactors loadtest: --mix: unknown tool 'tally' (choose from create_goal, add_todo, "
        "mark_todo, get_planning_state, create_playbook, or a tool of a --server class)\n"
    )
    assert loadtest.run(parse("--server", f"{HERE}:Tally", "--mix", "at=1")) == 2
    assert capsys.readouterr().err == (
        "ctxactors loadtest: --mix: host tool 'at' has a required argument of a type the load "
        "test can't make up (datetime); give it a default\n"
    )
    assert loadtest.run(parse("--server", f"{HERE}:Nope", "--mix", "tally")) == 2
    assert capsys.readouterr().err == (
        f"ctxactors loadtest: --server '{HERE}:Nope': module '{HERE}' has no attribute 'Nope'\n"
    )


def test_arguments_follow_the_bounds_of_their_types() -> None:
    make = arguments_for(Tally.tools["tally"])
    assert make("s/a/-#9", 9) == {"label": "s/a/-#9", "weight": 5}
    assert make("s/a/-#0", 0) == {"label": "s/a/-#0", "weight": 1}


@pytest.mark.timeout(120)
def test_a_restarted_server_serves_the_host_servers_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [TEST_PATH, os.environ.get("PYTHONPATH")]))
    )
    argv = ("--server", f"{HERE}:Tally", "--mix", "tally=1,create_goal=1", "--restart-every", "1")
    code, report = run_cli(tmp_path, *argv, "--sessions", "4", "--calls", "20", "--workers", "2")
    assert (code, report["violations"], report["restart_failure"]) == (0, [], None)
    assert report["host_tools"] == ["tally"]
