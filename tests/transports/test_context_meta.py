"""The conversation ids real MCP hosts send in ``_meta``: the carriers (issue 26, part 2).

A host that sends its own conversation id on every ``tools/call`` (VS Code's chat
``vscode.conversationId``, OpenCode's ``sessionID``, Codex's ``threadId``; or a key given to
``ctxactors serve --context-meta KEY=ROLE``) keeps its conversations apart with no
ctxactors-specific setup, over stateless HTTP too. A carrier is ``_meta``, which the model
can't write, so it follows the ``ctxactors/*`` rules: when any is present it alone is the
context and every ``__*`` argument is dropped as spoofing; for each part of the context the
first key present gives it, ``ctxactors/*`` first, then the carriers in their order.

Over stdio, a call that names no conversation still shares the session ``default``, but the
runtime warns once (naming the fix), and ``--session-fallback refuse`` refuses it instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_support import Whoami, http_server, serve_env, stdio_params
from structlog.testing import capture_logs

from ctxactors import InvalidArgumentsError, Runtime
from ctxactors.cli import main
from ctxactors.context import (
    DEFAULT_CARRIERS,
    NO_SESSION_MESSAGE,
    SHARED_SESSION_FIX,
    Carriers,
    read_context,
)
from ctxactors.settings import HOST_CONTEXT_META, Settings, assign
from ctxactors.testing import wait_until

pytestmark = pytest.mark.timeout(120)

SESSION, ASSISTANT, THREAD = "ctxactors/sessionId", "ctxactors/assistantId", "ctxactors/threadId"
VSCODE, OPENCODE, CODEX = "vscode.conversationId", "sessionID", "threadId"
CUSTOM = "acme.example/conversation"  # what a host of our own might send
# The conversations each test keeps apart, with the goals each one adds (in order).
GOALS = {"alpha": ["a1"], "beta": ["b1", "b2"], "gamma": ["c1", "c2", "c3"]}


def context(
    session: str, assistant: str | None = None, thread: str | None = None
) -> dict[str, Any]:
    return {"session": session, "assistant": assistant, "thread": thread, "principal": None}


def planning_state(goals: list[str]) -> dict[str, Any]:
    return {"goals": [{"id": f"g{i}", "goal": g} for i, g in enumerate(goals, 1)], "todos": []}


# -- every carrier over stateless streamable HTTP, against a real `ctxactors serve` ---------


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    with http_server("--context-meta", f"{CUSTOM}=session") as (url, _proc):
        yield url


@pytest.mark.parametrize("key", [VSCODE, OPENCODE, CODEX, CUSTOM])
def test_a_carrier_keeps_three_conversations_apart_over_stateless_http(
    served: str, key: str
) -> None:
    ids = {name: f"{key}:{name}" for name in GOALS}  # this key's own conversations

    async def converse(client: Client, name: str) -> None:
        for goal in GOALS[name]:
            # The model also wrote an __sessionId: beside the carrier it is dropped unread.
            args = {"goal": goal, "__sessionId": "forged"}
            result = await client.call_tool("create_goal", args, meta={key: ids[name]})
            assert not result.is_error, result.content

    async def main() -> tuple[str, dict[str, Any], Any, Any]:
        async with Client(served) as client:  # protocol 2026-07-28: no MCP session at all
            async with anyio.create_task_group() as tg:
                for name in GOALS:
                    tg.start_soon(converse, client, name)
            states = {
                name: (
                    await client.call_tool("get_planning_state", {}, meta={key: ids[name]})
                ).structured_content
                for name in GOALS
            }
            forged = await client.call_tool("get_planning_state", {}, meta={SESSION: "forged"})
            bare = await client.call_tool("create_goal", {"goal": "nobody's"})
            return client.protocol_version, states, forged.structured_content, bare

    version, states, forged, bare = anyio.run(main)
    assert version == "2026-07-28"
    assert states == {name: planning_state(goals) for name, goals in GOALS.items()}
    assert forged == planning_state([])  # the forged session never got a call
    # Without any context a stateless server still refuses, naming the carriers' option.
    assert bare.is_error and bare.content[0].text == NO_SESSION_MESSAGE
    assert "--context-meta" in NO_SESSION_MESSAGE


# -- precedence, in the embedded runtime -----------------------------------------------------


@pytest.fixture
def rt() -> Iterator[Runtime]:
    with Runtime(servers=[Whoami]) as runtime:
        yield runtime


def whoami(runtime: Runtime, meta: dict[str, Any] | None, **arguments: Any) -> Any:
    return runtime.call("whoami", arguments, meta=meta).structured


def test_the_default_carriers_are_the_verified_hosts_keys_after_ctxactors() -> None:
    assert HOST_CONTEXT_META == (
        (VSCODE, "session"),
        (OPENCODE, "session"),
        (CODEX, "session"),
    )
    assert DEFAULT_CARRIERS == Carriers((SESSION, VSCODE, OPENCODE, CODEX), (ASSISTANT,), (THREAD,))
    # Not carriers: VS Code's per-request id, Codex's turn metadata (an object, shared by
    # a conversation's sub-agents), and the unaccepted SEP drafts' keys.
    for key in ("vscode.requestId", "x-codex-turn-metadata", "sessionId", "progressToken"):
        assert key not in (k for keys in DEFAULT_CARRIERS for k in keys)


def test_the_docs_tables_name_exactly_the_default_carriers_in_order() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    serving = (docs / "serving.md").read_text(encoding="utf-8")
    section = serving.split("### The conversation ids MCP hosts send", 1)[1].split("\n#", 1)[0]
    # The rows whose first cell is code: the header's (`_meta` key) and one per key.
    rows = [row.split("|") for row in section.splitlines() if row.startswith("| `")][1:]
    assert tuple((r[1].strip(" `"), r[2].strip()) for r in rows) == HOST_CONTEXT_META
    clients = (docs / "integrations.md").read_text(encoding="utf-8")
    read_by_default = re.findall(
        r"^\| [^|]+ \| `_meta` `([^`]+)`.*\| nothing: read by default", clients, re.M
    )
    assert read_by_default == [key for key, _ in HOST_CONTEXT_META]


def test_ctxactors_meta_beats_a_carrier_and_they_combine_across_roles(rt: Runtime) -> None:
    assert whoami(rt, {VSCODE: "vs", SESSION: "ours"}) == context("ours")
    both = {VSCODE: "vs", ASSISTANT: "planner", THREAD: "t1"}
    assert whoami(rt, both) == context("vs", "planner", "t1")


def test_of_two_carriers_the_first_configured_wins(rt: Runtime) -> None:
    assert whoami(rt, {CODEX: "codex", VSCODE: "vs", OPENCODE: "oc"}) == context("vs")
    assert whoami(rt, {CODEX: "codex", OPENCODE: "oc"}) == context("oc")
    reordered = Settings(context_meta=((CODEX, "session"), (VSCODE, "session")))
    with Runtime(servers=[Whoami], settings=reordered) as other:
        assert whoami(other, {VSCODE: "vs", CODEX: "codex"}) == context("codex")


def test_a_null_carrier_is_absent(rt: Runtime) -> None:
    assert whoami(rt, {VSCODE: None, OPENCODE: "oc"}) == context("oc")
    assert whoami(rt, {VSCODE: None}, __sessionId="injected") == context("injected")


def test_a_carrier_drops_every_context_argument_as_spoofing(rt: Runtime) -> None:
    with capture_logs() as logs:
        got = whoami(rt, {OPENCODE: "oc"}, __sessionId="forged", __assistantId="evil")
    assert got == context("oc")  # not even the assistant comes from the arguments
    dropped = [e for e in logs if e["event"] == "spoofed_context_dropped"]
    assert [(e["fields"], e["session_id"]) for e in dropped] == [
        (["__assistantId", "__sessionId"], "oc")
    ]


@pytest.mark.parametrize("bad", [3, ["s"], {"id": "s"}, True])
def test_a_non_string_carrier_is_refused_naming_it(rt: Runtime, bad: object) -> None:
    with pytest.raises(InvalidArgumentsError, match=f"_meta field '{CODEX}' must be a string"):
        rt.call("whoami", {}, meta={CODEX: bad})


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("", "must be 1 to 256 characters"),
        ("x" * 257, "must be 1 to 256 characters"),
        (" padded", "starts or ends with a space or tab"),
        ("line\nbreak", "contains the character '\\n', which no header carries"),
    ],
)
def test_a_carrier_that_is_no_id_is_refused_as_ctxactors_meta_is(
    rt: Runtime, bad: str, reason: str
) -> None:
    with pytest.raises(InvalidArgumentsError) as refused:
        rt.call("whoami", {}, meta={VSCODE: bad})
    assert str(refused.value) == f"_meta field '{VSCODE}' {reason}"
    with pytest.raises(InvalidArgumentsError) as ours:
        rt.call("whoami", {}, meta={SESSION: bad})
    assert str(ours.value) == f"_meta field '{SESSION}' {reason}"


def test_a_later_carrier_is_not_read_once_an_earlier_one_names_the_role(rt: Runtime) -> None:
    # Another host's key holding something else can't break a call whose session is named.
    assert whoami(rt, {VSCODE: "vs", CODEX: 42}) == context("vs")
    assert whoami(rt, {SESSION: "ours", VSCODE: ["not", "an", "id"]}) == context("ours")


def test_carriers_for_the_assistant_and_the_thread(rt: Runtime) -> None:
    settings = Settings(context_meta=(("acme/agent", "assistant"), ("acme/branch", "thread")))
    with Runtime(servers=[Whoami], settings=settings) as custom:
        meta = {"acme/agent": "planner", "acme/branch": "b2", SESSION: "s"}
        assert whoami(custom, meta) == context("s", "planner", "b2")
        # An assistant alone decides the context: the session is the fallback, not __*.
        got = whoami(custom, {"acme/agent": "planner"}, __sessionId="forged")
        assert got == context("default", "planner")
        assert whoami(custom, {VSCODE: "vs"}, __sessionId="injected") == context("injected")


def test_no_carriers_leaves_only_ctxactors_meta(rt: Runtime) -> None:
    with Runtime(servers=[Whoami], settings=Settings(context_meta=())) as bare:
        assert whoami(bare, {VSCODE: "vs"}, __sessionId="injected") == context("injected")
        assert whoami(bare, {SESSION: "ours"}) == context("ours")


def test_read_context_reads_the_carriers_it_is_given() -> None:
    custom = Carriers.of([("k", "session")])
    assert custom == Carriers((SESSION, "k"), (ASSISTANT,), (THREAD,))
    ctx, spoofed, defaulted = read_context({"__sessionId": "x"}, {"k": "s"}, carriers=custom)
    assert (ctx.session_id, spoofed, defaulted) == ("s", ["__sessionId"], False)
    ctx, spoofed, defaulted = read_context({}, {VSCODE: "vs"}, carriers=custom)
    assert (ctx.session_id, spoofed, defaulted) == ("default", None, True)
    assert read_context({}, {VSCODE: "vs"})[0].session_id == "vs"  # default: the hosts' keys
    with pytest.raises(ValueError, match="role must be session, assistant or thread"):
        Carriers.of([("k", "conversation")])


# -- the settings field, its variable, and serve's options -----------------------------------


def test_the_settings_field_defaults_to_the_hosts_keys_and_its_variable_replaces_them() -> None:
    assert Settings.from_env({}).context_meta == HOST_CONTEXT_META
    given = Settings.from_env({"CTXACTORS_CONTEXT_META": f" {CUSTOM}=session, acme/a=assistant"})
    assert given.context_meta == ((CUSTOM, "session"), ("acme/a", "assistant"))
    assert Settings.from_env({"CTXACTORS_CONTEXT_META": "none"}).context_meta == ()
    assert assign(Settings(), ["context_meta=k=thread"]).context_meta == (("k", "thread"),)
    assert Settings.from_env({}).session_fallback == "default"
    refuse = Settings.from_env({"CTXACTORS_SESSION_FALLBACK": "Refuse"})
    assert refuse.session_fallback == "refuse"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "CTXACTORS_CONTEXT_META",
            "vscode",
            "CTXACTORS_CONTEXT_META: 'vscode': expected KEY=ROLE (ROLE: session|assistant|thread)",
        ),
        (
            "CTXACTORS_CONTEXT_META",
            "k=conversation",
            "CTXACTORS_CONTEXT_META: 'k=conversation': ROLE must be session, assistant or thread",
        ),
        (
            "CTXACTORS_CONTEXT_META",
            "a b=session",
            "CTXACTORS_CONTEXT_META: 'a b' is not an MCP _meta key name",
        ),
        (
            "CTXACTORS_CONTEXT_META",
            "ctxactors/threadId=session",
            "CTXACTORS_CONTEXT_META: 'ctxactors/threadId': the ctxactors/ keys are always read",
        ),
        (
            "CTXACTORS_CONTEXT_META",
            "k=session,k=thread",
            "CTXACTORS_CONTEXT_META: 'k' is given two roles, session and thread",
        ),
        (
            "CTXACTORS_SESSION_FALLBACK",
            "shared",
            "CTXACTORS_SESSION_FALLBACK must be default or refuse, got 'shared'",
        ),
    ],
)
def test_a_bad_variable_is_refused_naming_it(variable: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        Settings.from_env({variable: value})
    assert str(refused.value) == message


def test_settings_built_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match="'k' is given two roles, session and thread"):
        Settings(context_meta=(("k", "session"), ("k", "thread")))
    with pytest.raises(ValueError, match="the ctxactors/ keys are always read"):
        Settings(context_meta=((SESSION, "session"),))


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            ["--context-meta", "vscode"],
            "argument --context-meta: 'vscode': expected KEY=ROLE (ROLE: session|assistant|thread)",
        ),
        (
            ["--context-meta", "k=owner"],
            "argument --context-meta: 'k=owner': ROLE must be session, assistant or thread",
        ),
        (["--context-meta", "/k=session"], "argument --context-meta: '/k' is not an MCP _meta"),
        (["--session-fallback", "shared"], "argument --session-fallback: invalid choice"),
    ],
)
def test_serve_refuses_a_bad_option_naming_it(
    flag: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", *flag])
    assert exited.value.code == 2
    assert f"ctxactors serve: error: {message}" in capsys.readouterr().err


def test_serve_refuses_one_key_given_two_roles() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ctxactors.cli", "serve"]
        + ["--context-meta", "k=session", "--context-meta", "k=thread"],
        env=serve_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last == "ctxactors serve: --context-meta: 'k' is given two roles, session and thread"


def test_serve_adds_its_keys_to_the_settings_and_can_give_one_another_role() -> None:
    params = stdio_params(
        "--server",
        "mcp_support:Whoami",
        "--context-meta",
        "threadId=thread",
        "--context-meta",
        "acme/agent=assistant",
    )
    # The variable replaces the hosts' keys; the flags add to what it gives.
    variable = f"{CODEX}=session,{CUSTOM}=session"
    params.env = {**(params.env or {}), "CTXACTORS_CONTEXT_META": variable}
    calls: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({SESSION: "s", CODEX: "t1", "acme/agent": "planner"}, {}),
        ({CUSTOM: "mine"}, {}),
        ({VSCODE: "vs"}, {"__sessionId": "injected"}),  # no longer a carrier
    ]

    async def main() -> list[Any]:
        async with Client(params) as client:
            return [
                (await client.call_tool("whoami", args, meta=meta)).structured_content  # type: ignore[arg-type]
                for meta, args in calls
            ]

    assert anyio.run(main) == [
        context("s", "planner", "t1"),
        context("mine"),
        context("injected"),
    ]


# -- one warning for the shared `default`, or refusal ----------------------------------------


def test_calls_from_many_threads_that_fall_back_warn_once() -> None:
    start = threading.Barrier(8)

    def caller(rt: Runtime) -> None:
        start.wait()
        for _ in range(5):
            assert not rt.call("create_goal", {"goal": "shared"}).is_error

    with capture_logs() as logs, Runtime() as rt:
        threads = [threading.Thread(target=caller, args=(rt,)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        goals = rt.call("get_planning_state", {"__sessionId": "default"}).structured["goals"]
    assert len(goals) == 40  # all in `default`
    assert [e["fix"] for e in logs if e["event"] == "no_session_id"] == [SHARED_SESSION_FIX]


def _log_file(params: Any) -> Path:
    log = Path(tempfile.mkdtemp(prefix="ctxactors-test-log-")) / "serve.log"
    params.env = {
        **(params.env or {}),
        "CTXACTORS_LOG_FILE": str(log),
        "CTXACTORS_LOG_LEVEL": "info",
        "CTXACTORS_LOG_FORMAT": "json",
    }
    return log


def _events(log: Path) -> list[dict[str, Any]]:
    """The server's log lines, once it has logged its last one (``stopped``)."""

    def stopped() -> list[dict[str, Any]]:
        if not log.exists():
            return []
        lines = [json.loads(line) for line in log.read_text().splitlines() if line]
        return lines if any(e["event"] == "stopped" for e in lines) else []

    return wait_until(stopped, 30)


def test_stdio_shares_default_and_warns_only_on_the_first_such_call() -> None:
    params = stdio_params()
    log = _log_file(params)

    async def main() -> tuple[Any, Any]:
        async with Client(params) as client:
            for goal in ("x", "y", "z"):
                assert not (await client.call_tool("create_goal", {"goal": goal})).is_error
            mine = {VSCODE: "vs"}
            await client.call_tool("create_goal", {"goal": "own"}, meta=mine)  # type: ignore[arg-type]
            shared = await client.call_tool("get_planning_state", {})
            own = await client.call_tool("get_planning_state", {}, meta=mine)  # type: ignore[arg-type]
            return shared.structured_content, own.structured_content

    shared, own = anyio.run(main)
    assert shared == planning_state(["x", "y", "z"])
    assert own == planning_state(["own"])
    warned = [e for e in _events(log) if e["event"] == "no_session_id"]
    assert len(warned) == 1  # four calls fell back to default; one line
    assert (warned[0]["tool"], warned[0]["fix"]) == ("create_goal", SHARED_SESSION_FIX)


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_stdio_session_fallback_refuse_refuses_as_http_does(how: str) -> None:
    params = stdio_params(*(["--session-fallback", "refuse"] if how == "flag" else []))
    if how == "variable":
        params.env = {**(params.env or {}), "CTXACTORS_SESSION_FALLBACK": "refuse"}
    log = _log_file(params)

    async def main() -> tuple[Any, Any]:
        async with Client(params) as client:
            bare = await client.call_tool("create_goal", {"goal": "x"})
            mine = {OPENCODE: "oc"}
            await client.call_tool("create_goal", {"goal": "own"}, meta=mine)  # type: ignore[arg-type]
            own = await client.call_tool("get_planning_state", {}, meta=mine)  # type: ignore[arg-type]
            return bare, own.structured_content

    bare, own = anyio.run(main)
    assert bare.is_error and bare.content[0].text == NO_SESSION_MESSAGE
    assert own == planning_state(["own"])
    assert [e for e in _events(log) if e["event"] == "no_session_id"] == []
