"""``ctxactors loadtest``: it passes on a correct runtime and catches cross-talk and lost state."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp_support import free_port

from ctxactors.cli.loadtest import command as loadtest
from ctxactors.cli.loadtest.options import LoadOptions
from ctxactors.cli.loadtest.targets import EmbeddedTarget, TransportError
from ctxactors.cli.loadtest.workload import Outcome, PlannedCall, PlaybookBook, Unit, parse_mix
from ctxactors.context import ToolContext
from ctxactors.testing import serve_app


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loadtest.add_arguments(parser)
    return parser.parse_args([*argv, "--no-progress"])


def run_cli(tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    code = loadtest.run(parse(*argv, "--json", str(out)))
    return code, json.loads(out.read_text())


@pytest.mark.parametrize(
    "argv",
    [
        ("--sessions", "40", "--calls", "30", "--workers", "6"),
        ("--sessions", "30", "--calls", "24", "--async", "--threads", "2", "--assistants", "3"),
    ],
)
def test_clean_run_passes_with_exact_counts(tmp_path: Path, argv: tuple[str, ...]) -> None:
    code, report = run_cli(tmp_path, *argv)
    assert code == 0, report["violations"]
    assert report["passed"] and report["violations_count"] == 0 and report["errors"] == {}
    sessions, calls = report["sessions"], report["calls_per_session"]
    assert report["workload_calls"] == sessions * calls
    units = sessions * report["assistants"] * max(report["threads"], 1)
    assert report["planning_keys"] == units
    # one state read per unit, one playbook list per assistant, at most one probe per session
    lists = sessions * report["assistants"]
    assert units + lists <= report["verification_calls"] <= units + lists + sessions
    # one planning key per unit and one playbook store per session, nothing else
    assert report["actors"]["spawned"] == units + sessions
    assert report["actors"]["reaped"] == 0 and report["state_resets_seen"] == 0
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["p99"] <= report["latency_ms"]["max"]
    assert report["peak_rss_mb"] > 0


def test_eviction_under_load_stays_exact(tmp_path: Path) -> None:
    """A tiny actor cap passivates keys mid-run; every reset is seen and accounted for."""
    code, report = run_cli(tmp_path, "--sessions", "30", "--calls", "20", "--max-actors", "6")
    assert code == 0, report["violations"]
    assert report["expect_reaping"]
    # tool error results (an item of a retired incarnation) are answers, not extra calls;
    # no cross-assistant probe when state may be reset
    assert report["verification_calls"] == 30 * 2 + 30 * 2
    assert report["actors"]["evicted"] > 0
    assert 0 < report["state_resets_seen"] <= report["actors"]["evicted"]
    assert report["actors"]["peak_live"] <= 6 + 8  # the cap, plus at most one busy per worker


class Broken(EmbeddedTarget):
    """The embedded runtime with a fault injected: `tamper` sees the n-th call first."""

    def __init__(self) -> None:
        super().__init__(ttl=3600.0, max_actors=1000, call_timeout=30.0)
        self.calls = 0

    def tamper(self, n: int, tool: str, ctx: ToolContext) -> ToolContext:
        raise NotImplementedError

    def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        self.calls += 1
        return super().call(tool, args, self.tamper(self.calls, tool, ctx))


class CrossTalk(Broken):
    """A broken router: one session's goals land on another session's key."""

    def tamper(self, n: int, tool: str, ctx: ToolContext) -> ToolContext:
        if ctx.session_id.endswith("s00003") and tool == "create_goal":
            return ToolContext(ctx.session_id[:-1] + "4", ctx.assistant_id, ctx.thread_id)
        return ctx


class StateLoss(Broken):
    """A runtime that silently drops a session's state halfway through."""

    def tamper(self, n: int, tool: str, ctx: ToolContext) -> ToolContext:
        if n == 150:
            self.runtime.end_session(ctx.session_id)
        return ctx


class Flaky(Broken):
    """Every 7th call fails in transit, the way a dropped connection would."""

    def tamper(self, n: int, tool: str, ctx: ToolContext) -> ToolContext:
        if n % 7 == 0:
            raise TransportError("HTTP 502", "bad gateway")
        return ctx


def drive(target: Broken, *argv: str) -> dict[str, Any]:
    """One sender thread (a deterministic call order) through the load test's own checks."""
    options = LoadOptions.from_args(parse(*argv))
    units, books = loadtest.build_workload(options)
    metrics = loadtest.Metrics()
    try:
        loadtest.run_threads(target, units, books, 1, metrics)
        stats = target.stats()
    finally:
        target.close()
    return loadtest.build_report(options, target, units, books, metrics, 1.0, stats)


@pytest.mark.parametrize(("broken", "expect"), [(CrossTalk, "s00004/"), (StateLoss, "missing")])
def test_checker_names_the_session_and_the_difference(broken: type[Broken], expect: str) -> None:
    mix = "create_goal=1,add_todo=1"
    report = drive(broken(), "--sessions", "8", "--calls", "40", "--mix", mix)
    assert not report["passed"]
    assert any(expect in v and "session '" in v for v in report["violations"]), report["violations"]


def test_transport_errors_are_counted_by_kind_and_fail_the_run() -> None:
    target = Flaky()
    report = drive(target, "--sessions", "5", "--calls", "20")
    assert report["errors"] == {"HTTP 502": target.calls // 7}
    assert report["violations"] == []  # an unknown outcome is not taken for cross-talk
    assert not report["passed"]


def test_reset_rule_accepts_only_a_fresh_incarnation() -> None:
    ctx = ToolContext("s1", "a1")
    book = PlaybookBook("s1", ["a1"], allow_resets=True)
    unit = Unit(ctx, 0, parse_mix(None), 1, book, allow_resets=True)
    goal = PlannedCall("create_goal", {"goal": "s1/a1/-#1"}, ctx)
    unit.record(goal, Outcome({"id": "g1", "goal": "s1/a1/-#1"}, False))
    unit.record(goal, Outcome({"id": "g2", "goal": "s1/a1/-#1"}, False))
    unit.record(goal, Outcome({"id": "g1", "goal": "s1/a1/-#1"}, False))  # a fresh actor
    assert unit.resets == 1 and list(unit.goals) == ["g1"] and unit.violations == []
    unit.record(goal, Outcome({"id": "g7", "goal": "s1/a1/-#1"}, False))  # not fresh: wrong
    assert unit.violations == [
        "session 's1' (s1/a1/-) create_goal: returned id 'g7', expected 'g2' (its item 's1/a1/-#1' belongs to s1/a1/-)"
    ]
    foreign = {"goals": [{"id": "g1", "goal": "s1/a1/-#1"}, {"id": "g2", "goal": "s9/a1/-#4"}]}
    unit.record(unit.final_call(), Outcome({**foreign, "todos": []}, False))
    assert "foreign goal 'g2' from s9/a1/-" in unit.violations[-1]


def test_bad_options_are_refused_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert loadtest.run(parse("--mix", "create_goal=2,drop_tables=1")) == 2
    assert "unknown tool 'drop_tables'" in capsys.readouterr().err
    assert loadtest.run(parse("--sessions", "0")) == 2
    assert "--sessions must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["/mcp", ""])
def test_an_unreachable_url_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], path: str
) -> None:
    url = f"http://127.0.0.1:{free_port()}{path}"  # nothing listens there
    assert loadtest.run(parse("--url", url, "--sessions", "2", "--calls", "2")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ctxactors loadtest: cannot reach {url}: ")
    assert "Traceback" not in err and err.count("\n") == 1


def test_command_line_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "ctxactors.cli", "loadtest", "--sessions", "10", "--calls", "10"]
        + ["--no-progress", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict      PASS: 0 violations" in done.stdout
    assert "p50" in done.stdout and "peak RSS" in done.stdout
    assert json.loads(out.read_text())["workload_calls"] == 100


def keys_by_server(rt: Any) -> dict[str, int]:
    """Live keys of the servers the load test calls (one per session/assistant/thread)."""
    counts: dict[str, int] = {}
    for key in rt._registry.keys():
        if key[0] in ("planning", "playbooks"):
            counts[key[0]] = counts.get(key[0], 0) + 1
    return counts


def rest_front(rt: Any) -> Any:
    """A minimal REST front for the runtime (test double).

    Shapes follow the REST contract: POST /api/v1/tools/{name}, context in X-*-Id headers,
    the MCP result object as the body.
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from ctxactors.context import inject_context

    async def tool(request: Request) -> JSONResponse:
        h = request.headers
        ctx = ToolContext(h["x-session-id"], h.get("x-assistant-id"), h.get("x-thread-id"))
        result = await rt.acall(
            request.path_params["name"], inject_context(await request.json(), ctx)
        )
        return JSONResponse(result.to_mcp())

    return Starlette(routes=[Route("/api/v1/tools/{name}", tool, methods=["POST"])])


@pytest.mark.parametrize("use_async", [False, True])
def test_rest_target_over_loopback(tmp_path: Path, use_async: bool) -> None:
    from ctxactors import Runtime

    with Runtime() as rt:
        with serve_app(rest_front(rt)) as url:
            argv = ["--url", url, "--sessions", "10", "--calls", "12", "--workers", "4"]
            code, report = run_cli(tmp_path, *argv, *(["--async"] if use_async else []))
        assert code == 0, report
        assert report["target"] == f"REST API at {url}"
        assert report["workload_calls"] == 120 and report["errors"] == {}
        assert keys_by_server(rt) == {"planning": 10 * 2, "playbooks": 10}


def test_mcp_target_sends_context_in_meta() -> None:
    """The MCP client path, against an in-process low-level MCP server over the runtime."""
    import asyncio

    import mcp_types as types
    from mcp.server.lowlevel import Server as McpServer

    from ctxactors import Runtime
    from ctxactors.cli.loadtest.targets import McpTarget

    with Runtime() as rt:

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            result = await rt.acall(params.name, params.arguments, meta=params.meta)
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=result.text)],
                structured_content=result.structured,
                is_error=result.is_error,
            )

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(
                tools=[
                    types.Tool(name=t["name"], input_schema=t["inputSchema"])
                    for t in rt.list_tools()
                ]
            )

        server = McpServer("test", on_list_tools=list_tools, on_call_tool=call_tool)
        target = McpTarget(server, timeout=30.0)
        options = LoadOptions.from_args(parse("--sessions", "4", "--calls", "10", "--async"))
        units, books = loadtest.build_workload(options)
        metrics = loadtest.Metrics()
        asyncio.run(loadtest.run_tasks(target, units, books, 16, metrics))
        report = loadtest.build_report(options, target, units, books, metrics, 1.0, None)
        assert report["passed"], (report["violations"], report["error_samples"])
        assert keys_by_server(rt) == {"planning": 4 * 2, "playbooks": 4}  # the context arrived


def test_published_stats_are_read_when_the_server_has_them_and_none_otherwise() -> None:
    import httpx

    from ctxactors.cli.loadtest.targets import published_stats

    def answer(status: int, body: object) -> object:
        return lambda url: httpx.Response(status, json=body, request=httpx.Request("GET", url))

    def unreachable(url: str) -> httpx.Response:
        raise httpx.ConnectError("refused")

    stats = {"actors": 3, "spawned": 4}
    assert published_stats(answer(200, stats), "http://x") == stats  # type: ignore[arg-type]
    assert published_stats(answer(404, {"error": {}}), "http://x") is None  # type: ignore[arg-type]
    assert published_stats(answer(200, [1, 2]), "http://x") is None  # type: ignore[arg-type]
    assert published_stats(unreachable, "http://x") is None


def test_options_are_read_once_and_the_namespace_is_left_as_given(tmp_path: Path) -> None:
    args = parse("--sessions", "3", "--calls", "4", "--threads", "2", "--json", str(tmp_path / "r"))
    before = vars(args).copy()
    assert loadtest.run(args) == 0
    assert vars(args) == before  # the defaults were resolved in the options, not here
    options = LoadOptions.from_args(args)
    assert (options.ttl, options.max_actors, options.allow_resets) == (3600.0, 10_000, False)
    assert options.keys == 3 * 2 * 2 + 3
    assert (options.transport, options.use_async, options.progress) == ("rest", False, False)


def test_options_resolve_the_transport_reaping_and_the_actor_cap() -> None:
    mcp = LoadOptions.from_args(parse("--url", "http://h:1/mcp/", "--sessions", "2"))
    assert (mcp.url, mcp.transport, mcp.use_async) == ("http://h:1/mcp/", "mcp", True)
    rest = LoadOptions.from_args(parse("--url", "http://h:1/mcp", "--transport", "rest"))
    assert (rest.transport, rest.use_async, rest.allow_resets) == ("rest", False, False)
    capped = LoadOptions.from_args(parse("--max-actors", "5", "--sessions", "20000"))
    assert (capped.max_actors, capped.ttl, capped.allow_resets) == (5, 3600.0, True)
    big = LoadOptions.from_args(parse("--sessions", "20000", "--assistants", "1"))
    assert (big.max_actors, big.allow_resets) == (2 * 20000 + 16, False)
    assert LoadOptions.from_args(parse("--url", "http://h:1/", "--expect-reaping")).allow_resets
    with pytest.raises(ValueError, match="^--threads must not be negative$"):
        LoadOptions.from_args(parse("--threads", "-1"))


def test_options_carry_the_restarts_and_the_embedded_runtimes_settings() -> None:
    argv = ("--restart-every", "2", "--ttl", "5", "--transport", "mcp")
    chaos = LoadOptions.from_args(parse(*argv, "--set", "content.max_item_bytes=65536"))
    # Its own server, served over REST, whose state a TTL of the generator's does not reset.
    assert (chaos.restart_every, chaos.serve_store, chaos.url) == (2.0, "sqlite", None)
    assert (chaos.transport, chaos.use_async, chaos.allow_resets) == ("rest", False, False)
    assert chaos.settings.content.max_item_bytes == 65536
    with pytest.raises(ValueError, match="^--set content.max_item_bytes must be an integer, got"):
        LoadOptions.from_args(parse("--set", "content.max_item_bytes=lots"))


# -- --restart-every: a server killed and restarted under load ----------------------------


@pytest.mark.timeout(180)  # each restart is a server's start-up: seconds on a loaded machine
def test_a_server_restarted_under_load_loses_no_acknowledged_call(tmp_path: Path) -> None:
    code, report = run_cli(
        tmp_path, "--restart-every", "0.5", "--sessions", "10", "--calls", "40", "--workers", "4"
    )
    assert (code, report["passed"], report["violations"]) == (0, True, [])
    assert report["restarts"] >= 1 and report["restart_failure"] is None
    assert report["in_doubt_calls"] >= 0
    assert set(report["errors"]) <= {"ConnectError", "ReadError", "RemoteProtocolError"}


def test_restart_every_starts_its_own_server_only(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ("--restart-every", "1", "--url", "http://127.0.0.1:1"),
        ("--restart-every", "1", "--async"),
        ("--restart-every", "0"),
    ):
        assert loadtest.run(parse(*argv)) == 2
        assert "--restart-every takes a positive number of seconds" in capsys.readouterr().err


def _doubtful_unit() -> tuple[Unit, ToolContext]:
    ctx = ToolContext("s1", "a1")
    unit = Unit(ctx, 5, parse_mix(None), 1, PlaybookBook("s1", ["a1"], False), False, True)
    first = PlannedCall("create_goal", {"goal": "first"}, ctx)
    unit.record(first, Outcome({"id": "g1", "goal": "first"}, False))  # acknowledged
    unit.record(PlannedCall("create_goal", {"goal": "doubt"}, ctx), None)  # cut off
    assert unit.in_doubt == 1
    resync = unit.next_call()
    assert resync == PlannedCall("get_planning_state", {}, ctx, resync=True)
    unit.record(resync, None)  # the server is still down: read it back again
    assert unit.next_call() == resync and unit.in_doubt == 1
    return unit, ctx


G1 = {"id": "g1", "goal": "first"}


@pytest.mark.parametrize(
    ("goals", "model", "violation"),
    [
        ([G1], ["g1"], None),  # the call in doubt did not run
        ([G1, {"id": "g2", "goal": "doubt"}], ["g1", "g2"], None),  # it ran, whole
        ([], [], "missing goals ['g1', 'g2']"),  # an acknowledged goal lost
        ([G1, {"id": "g2", "goal": "dou"}], ["g1"], "g2: {'id': 'g2', 'goal': 'dou'}"),  # half
    ],
)
def test_a_call_in_doubt_may_be_present_or_absent_but_never_half(
    goals: list[dict[str, str]], model: list[str], violation: str | None
) -> None:
    unit, ctx = _doubtful_unit()
    read = PlannedCall("get_planning_state", {}, ctx, resync=True)
    unit.record(read, Outcome({"goals": goals, "todos": []}, False))
    assert unit.doubt is None and unit.next_call() is not None
    if violation is None:
        assert unit.violations == [] and list(unit.goals) == model
    else:
        [found] = unit.violations
        assert found.startswith("session 's1' (s1/a1/-) get_planning_state: after create_goal in")
        assert violation in found


def test_a_call_refused_before_it_was_sent_is_not_in_doubt() -> None:
    ctx = ToolContext("s1", "a1")
    unit = Unit(ctx, 5, parse_mix(None), 1, PlaybookBook("s1", ["a1"], False), False, True)
    refused = PlannedCall("create_goal", {"goal": "refused"}, ctx)
    unit.record(refused, None, refused=True)
    assert (unit.refused, unit.in_doubt, unit.doubt) == (1, 0, None)
    assert unit.next_call() == refused  # sent again, not read back
    unit.record(refused, Outcome({"id": "g1", "goal": "refused"}, False))  # g1: it never ran
    assert unit.violations == [] and list(unit.goals) == ["g1"]


class InDoubt(Broken):
    """A Ray deployment losing a shard: every 7th call that changes state runs and then its
    answer is lost, every 11th is lost before it runs; the server says both may or may not
    have run. (Reads are never in doubt: the Ray backend sends them again itself.)"""

    def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> Outcome:
        from ctxactors.cli.loadtest.targets import InDoubtError

        if tool in ("get_planning_state", "list_playbooks", "select_playbook"):
            return EmbeddedTarget.call(self, tool, args, ctx)
        self.calls += 1
        if self.calls % 11 == 0 and self.calls % 7:
            raise InDoubtError("shard 0 became unavailable during the call")
        outcome = EmbeddedTarget.call(self, tool, args, ctx)
        if self.calls % 7 == 0:
            raise InDoubtError("shard 0 became unavailable during the call")
        return outcome


def test_calls_a_server_says_are_in_doubt_are_checked_whole_and_pass_the_run() -> None:
    target = InDoubt()
    report = drive(target, "--sessions", "5", "--calls", "30", "--url", "http://ray-front-end")
    assert report["violations"] == []
    failed = report["errors"]["shard unavailable (in doubt)"]
    assert failed == target.calls // 7 + target.calls // 11 - target.calls // 77
    assert report["in_doubt_calls"] == failed
    assert report["passed"]


def test_shard_unavailable_is_a_503_over_rest_that_the_load_test_takes_as_in_doubt() -> None:
    import httpx

    from ctxactors.cli.loadtest.targets import InDoubtError, _from_http
    from ctxactors.errors import ShardUnavailableError
    from ctxactors.transports.http.failures import from_runtime_error

    refused = from_runtime_error(ShardUnavailableError("shard 1 became unavailable"))
    assert (refused.status, refused.code) == (503, "shard_unavailable")

    def reply(code: str) -> httpx.Response:
        body = {"error": {"code": code, "message": "shard 1 became unavailable"}}
        return httpx.Response(503, json=body)

    with pytest.raises(InDoubtError, match="shard 1 became unavailable"):
        _from_http(reply("shard_unavailable"))
    with pytest.raises(TransportError) as closed:  # a closed server ran nothing: not in doubt
        _from_http(reply("runtime_closed"))
    assert closed.value.kind == "HTTP 503"
