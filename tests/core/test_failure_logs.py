"""What the logs say about a call that failed: the handler's traceback at debug, the error
message on the call's own line (so ``ctxactors logs --errors`` shows it), and a line for a
context-less call that HTTP refuses."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_support import http_server

from ctxactors import Runtime, Server, ToolContext, ToolError, tool
from ctxactors.cli import logs as logtool
from ctxactors.logs import configure_logging, flush_logs
from ctxactors.testing import context_args, wait_until


class Fragile(Server):
    name = "fragile"

    @tool
    def divide(self, ctx: ToolContext, by: int) -> dict[str, Any]:
        return {"half": 1 // by}

    @tool
    def refuse(self, ctx: ToolContext) -> dict[str, Any]:
        raise ToolError("not today")

    @tool
    def shout(self, ctx: ToolContext) -> dict[str, Any]:
        raise ValueError("x" * 1000)


def logs_command(*argv: str) -> tuple[int, str, str]:
    """``ctxactors logs ARGV``: (exit status, standard output, standard error)."""
    parser = argparse.ArgumentParser()
    logtool.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    code = logtool.run(parser.parse_args(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def lines(path: Path) -> list[dict[str, Any]]:
    flush_logs()
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_calls(log: Path, level: str) -> None:
    configure_logging(file=str(log), level=level, force=True)
    with Runtime([Fragile]) as rt:
        assert rt.call("divide", context_args("s1", "a1", by=2)).structured == {"half": 0}
        assert rt.call("divide", context_args("s1", "a1", by=0)).is_error
        assert rt.call("refuse", context_args("s2")).is_error
        assert rt.call("shout", context_args("s3")).is_error


def test_a_raising_tool_is_logged_with_its_traceback_at_debug(tmp_path: Path) -> None:
    log = tmp_path / "debug.log"
    run_calls(log, "debug")
    raised = [line for line in lines(log) if line["event"] == "tool_raised"]
    # A `ToolError` is a refusal the tool meant: its message is the whole story.
    assert [(r["tool"], r["session_id"], r["assistant_id"]) for r in raised] == [
        ("divide", "s1", "a1"),
        ("shout", "s3", None),
    ]
    assert raised[0]["level"] == "debug"
    trace = raised[0]["exception"]
    assert trace.startswith("Traceback (most recent call last):")
    assert 'return {"half": 1 // by}' in trace
    assert trace.rstrip().endswith("ZeroDivisionError: integer division or modulo by zero")


def test_a_failed_call_s_line_carries_its_error_and_logs_errors_shows_it(tmp_path: Path) -> None:
    log = tmp_path / "info.log"
    run_calls(log, "info")
    written = lines(log)
    assert not [line for line in written if line["event"] == "tool_raised"]  # debug only
    calls = [
        (line["tool"], line["outcome"], line.get("error"))
        for line in written
        if line["event"] == "tool_call"
    ]
    assert calls == [
        ("divide", "ok", None),
        ("divide", "error", "ZeroDivisionError: integer division or modulo by zero"),
        ("refuse", "error", "not today"),
        ("shout", "error", f"ValueError: {'x' * 288}..."),  # the first 300 characters
    ]
    code, out, err = logs_command(str(log), "--errors")
    assert (code, err) == (0, "")
    shown = out.splitlines()
    assert len(shown) == 3
    assert shown[0].endswith("error  ZeroDivisionError: integer division or modulo by zero")
    assert "s1/a1/-" in shown[0] and "divide" in shown[0]
    assert shown[1].endswith("error  not today")
    assert shown[2].endswith(f"error  ValueError: {'x' * 288}...")


@pytest.mark.timeout(120)
def test_a_context_less_call_refused_over_http_leaves_a_warning(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {"CTXACTORS_LOG_FILE": str(log), "CTXACTORS_LOG_LEVEL": "info"}
    with http_server(env=env) as (url, _):

        async def call() -> Any:
            async with Client(url) as client:  # protocol 2026-07-28: no MCP session
                return await client.call_tool("list_content", {})

        refused = anyio.run(call)
        assert refused.is_error
        assert refused.content[0].text.startswith("no session given")
        assert wait_until(lambda: log.exists() and "no_session_refused" in log.read_text(), 10)
    [line] = [r for r in lines(log) if r["event"] == "no_session_refused"]
    # What is safe to say: which tool, and no id the client did not give.
    assert {k: v for k, v in line.items() if k != "timestamp"} == {
        "logger": "ctxactors",
        "event": "no_session_refused",
        "tool": "list_content",
        "principal": None,
        "level": "warning",
    }
