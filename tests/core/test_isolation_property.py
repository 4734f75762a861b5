"""Property: no call ever shows a context what another context wrote and may not see.

A hypothesis state machine drives one embedded runtime with random calls from random
(session, assistant, thread) contexts of a small pool, so contexts collide all the time. The
context reaches the runtime by every route a host may use (`inject_context`, reserved
arguments in either spelling, `_meta` with or without the session), and every call carries
spoof attempts: forged ``__*`` arguments beside a `_meta` context, forged snake_case fields
beside the host's camelCase ones, forged fields in model output given to `inject_context`,
batch operations with a ``thread`` or another context field of their own, and ids (goals,
todos, playbooks, content) that belong to other contexts.

Every write stores a unique marker (``MK00001Z``). A model keeps what each context may see:
planning by the exact (session, assistant, thread) key; playbooks per session, their owner's
(and unowned ones anybody's); content per session; history by what the caller could have
seen itself (session-wide tools: own assistant's or no assistant's calls; tools keyed by
assistant or thread: its own key's calls only). The invariants checked after
each call: the result's whole JSON holds no marker the caller may not see, and where the
model is exact (planning state, content reads and searches, history) the result is exactly
what the model says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule
from served_support import McpHttpSession, no_traceback, served_http

from ctxactors import InvalidArgumentsError, Runtime, Scope, ToolContext, ToolResult, inject_context
from ctxactors.context import META_KEYS
from ctxactors.servers import Content, Planning, Playbooks
from ctxactors.settings import HistorySettings, Settings

# A failing property shrinks for a while before it reports its minimal example.
pytestmark = pytest.mark.timeout(300)

SESSIONS = ("s1", "s2")
ASSISTANTS = (None, "a1", "a2")
THREADS = (None, "t1", "t2")
CONTEXTS = [ToolContext(s, a, t) for s, a, t in itertools.product(SESSIONS, ASSISTANTS, THREADS)]
SPELLINGS = {
    "session_id": ("__sessionId", "__session_id"),
    "assistant_id": ("__assistantId", "__assistant_id"),
    "thread_id": ("__threadId", "__thread_id"),
}
# How the host hands the context over (see `deliver`).
CHANNELS = ("inject", "camel", "snake", "meta", "meta_no_session")
# What a spoofing batch operation carries besides its tool call.
BATCH_SPOOFS = (None, "thread", "field", "reserved_args")
CONTEXT_OP_FIELDS = ("session", "sessionId", "assistant", "assistantId", "threadId", "context")
MARKER = re.compile(r"MK\d{5}Z")
MAX_HISTORY = 10_000  # no history truncation in a test run: the model can be exact

SERVERS = [Planning, Playbooks, Content]
with Runtime(servers=SERVERS) as _rt:
    SCOPES = {name: spec.server.scope for name, spec in _rt.tools.items()}

contexts = st.sampled_from(CONTEXTS)
channels = st.sampled_from(CHANNELS)
READS = ["get_planning_state", "list_playbooks", "read_content", "search_content"]
WRITES = ["create_goal", "add_todo", "create_playbook", "select_playbook", "add_content"]
batch_tools = st.sampled_from([*WRITES, *READS, "get_recent_context"])
tools = st.sampled_from([*WRITES, "mark_todo", *READS, "get_recent_context"])
picks = st.integers(0, 40)  # an id (own or another key's: ids restart per key) or a marker
spoof_details = st.sampled_from(THREADS[1:] + CONTEXT_OP_FIELDS)


def markers_in(value: Any) -> set[str]:
    return set(MARKER.findall(msgspec.json.encode(value).decode()))


@dataclasses.dataclass
class Playbook:
    owner: str | None
    name: str
    steps: list[str]

    def record(self, playbook_id: str) -> dict[str, Any]:
        return {"id": playbook_id, "name": self.name, "agent_id": self.owner, "steps": self.steps}


@dataclasses.dataclass
class Recorded:
    """One call as the session history must hold it."""

    ctx: ToolContext
    tool: str
    markers: frozenset[str]


@dataclasses.dataclass
class Model:
    """What the runtime's state must be: per planning key, per session."""

    goals: dict[ToolContext, dict[str, str]] = dataclasses.field(default_factory=dict)
    todos: dict[ToolContext, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    playbooks: dict[str, dict[str, Playbook]] = dataclasses.field(default_factory=dict)
    content: dict[str, dict[str, tuple[str, str]]] = dataclasses.field(default_factory=dict)
    history: list[Recorded] = dataclasses.field(default_factory=list)

    def planning_markers(self, ctx: ToolContext) -> set[str]:
        found = set(self.goals.get(ctx, {}).values())
        return found | {t["name"] for t in self.todos.get(ctx, {}).values()}

    def playbook_visible(self, ctx: ToolContext, playbook: Playbook) -> bool:
        return playbook.owner is None or playbook.owner == ctx.assistant_id

    def playbook_markers(self, ctx: ToolContext) -> set[str]:
        found: set[str] = set()
        for playbook in self.playbooks.get(ctx.session_id, {}).values():
            if self.playbook_visible(ctx, playbook):
                found |= {playbook.name, *playbook.steps}
        return found

    def content_markers(self, ctx: ToolContext) -> set[str]:
        return markers_in(list(self.content.get(ctx.session_id, {}).values()))

    def history_visible(self, ctx: ToolContext, op: Recorded) -> bool:
        """What the caller could have seen by calling the tool itself: a session-wide
        tool's calls of its own assistant or of none; otherwise only its own key's."""
        if op.ctx.session_id != ctx.session_id:
            return False
        scope = SCOPES[op.tool]
        if scope is Scope.SESSION:
            return op.ctx.assistant_id in (None, ctx.assistant_id)
        if op.ctx.assistant_id != ctx.assistant_id:
            return False
        return scope is Scope.ASSISTANT or op.ctx.thread_id == ctx.thread_id

    def visible_history(self, ctx: ToolContext) -> list[Recorded]:
        return [op for op in reversed(self.history) if self.history_visible(ctx, op)]


class Leak(AssertionError):
    pass


class IsolationMachine(RuleBasedStateMachine):
    """Random calls from colliding contexts; every result is checked against the model."""

    routes: tuple[str, ...] = CHANNELS  # the channels the context may take (see `deliver`)
    batches = True
    spoofs: tuple[str | None, ...] = BATCH_SPOOFS  # what batch operations may try

    def __init__(self) -> None:
        super().__init__()
        self.connect()
        self.model = Model()
        self._markers = itertools.count(1)
        self.writer: dict[str, ToolContext] = {}  # marker -> who wrote it (for messages)

    def connect(self) -> None:
        limits = Settings(history=HistorySettings(max_operations=MAX_HISTORY))
        self.rt = Runtime(servers=SERVERS, settings=limits)

    def invoke(
        self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None
    ) -> ToolResult:
        return self.rt.call(tool, arguments, meta=meta)

    def teardown(self) -> None:
        self.rt.close()

    # -- calling -----------------------------------------------------------------------

    def marker(self, ctx: ToolContext) -> str:
        value = f"MK{next(self._markers):05d}Z"
        self.writer[value] = ctx
        return value

    def deliver(
        self, ctx: ToolContext, channel: str, forged: ToolContext, args: dict[str, Any]
    ) -> tuple[ToolContext, dict[str, Any], dict[str, Any] | None]:
        """The arguments and `_meta` a host sends for `ctx`, with forged context beside.

        Returns the context the call must run with: `ctx`, except that `_meta` without a
        session but with another context key falls back to the default session (the forged
        ``__sessionId`` argument must not be read, because `_meta` carries context).
        """
        forged_fields = {
            names[i % 2]: value
            for i, (attr, names) in enumerate(SPELLINGS.items())
            if (value := getattr(forged, attr)) is not None
        }
        if channel == "inject":  # the model wrote __* fields; the host's middleware drops them
            return ctx, inject_context({**args, **forged_fields, "__session_id": "x"}, ctx), None
        if channel in ("camel", "snake"):
            spelled = {
                SPELLINGS[attr][channel == "snake"]: value
                for attr in SPELLINGS
                if (value := getattr(ctx, attr)) is not None
            }
            if channel == "camel":  # the model's snake_case forgeries lose to the host's camel
                spelled = {
                    **{
                        SPELLINGS[a][1]: getattr(forged, a) or "x"
                        for a in SPELLINGS
                        if getattr(ctx, a)
                    },
                    **spelled,
                }
            return ctx, {**args, **spelled}, None
        meta = {META_KEYS[attr]: value for attr in META_KEYS if (value := getattr(ctx, attr))}
        if channel == "meta_no_session" and len(meta) > 1:
            del meta[META_KEYS["session_id"]]
            ctx = ToolContext("default", ctx.assistant_id, ctx.thread_id)
        spoofed = {**args, **forged_fields}
        for attr, names in SPELLINGS.items():  # both spellings, so neither may win
            spoofed.setdefault(names[1], getattr(forged, attr) or "forged")
        return ctx, spoofed, meta

    def call(
        self,
        ctx: ToolContext,
        channel: str,
        forged: ToolContext,
        tool: str,
        args: dict[str, Any],
    ) -> tuple[ToolContext, ToolResult]:
        ctx, arguments, meta = self.deliver(ctx, channel, forged, args)
        result = self.invoke(tool, arguments, meta)
        msgspec.json.encode(result.to_mcp())  # every result must be encodable
        return ctx, result

    # -- the checks ------------------------------------------------------------------------

    def allowed(self, ctx: ToolContext, tool: str, request: Any) -> set[str]:
        """The markers `ctx` may see in a result of `tool` (and what it sent itself)."""
        m = self.model
        if tool in ("create_goal", "add_todo", "mark_todo", "get_planning_state"):
            found = m.planning_markers(ctx)
        elif tool in ("create_playbook", "list_playbooks", "select_playbook"):
            found = m.playbook_markers(ctx)
        elif tool in ("add_content", "read_content", "search_content"):
            found = m.content_markers(ctx)
        elif tool == "get_recent_context":
            found = {mk for op in m.visible_history(ctx) for mk in op.markers}
        elif tool == "batch":  # a batch shows what its operations may show
            tools = ("get_planning_state", "list_playbooks", "read_content", "get_recent_context")
            found = set().union(*(self.allowed(ctx, t, None) for t in tools))
        else:
            found = set()
        return found | markers_in(request)

    def check_no_leak(self, ctx: ToolContext, tool: str, request: Any, observed: Any) -> None:
        leaked = markers_in(observed) - self.allowed(ctx, tool, request)
        if leaked:
            who = {mk: self.writer.get(mk) for mk in sorted(leaked)}
            raise Leak(f"{tool} from {ctx} showed markers it may not see: {who}\n{observed}")

    def expect(
        self,
        ctx: ToolContext,
        tool: str,
        args: dict[str, Any],
        ok: bool,
        data: Any,
        error: str,
        *,
        ran: bool = True,
    ) -> None:
        """Check one outcome against the model, then apply it (and record it if it `ran`)."""
        self.check_no_leak(ctx, tool, args, {"data": data, "error": error})
        handler = getattr(self, f"_expect_{tool}")
        handler(ctx, args, ok, data, error)
        if ran:
            self.record(ctx, tool, args)

    def record(self, ctx: ToolContext, tool: str, args: Any) -> None:
        if tool != "get_recent_context":  # asking is never recorded
            self.model.history.append(Recorded(ctx, tool, frozenset(markers_in(args))))

    def _expect_create_goal(self, ctx: ToolContext, args: Any, ok: bool, data: Any, _: str) -> None:
        assert ok and data["goal"] == args["goal"], data
        goals = self.model.goals.setdefault(ctx, {})
        assert data["id"] not in goals
        goals[data["id"]] = args["goal"]

    def _expect_add_todo(self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str) -> None:
        goal_id = args.get("goal_id")
        if goal_id is not None and goal_id not in self.model.goals.get(ctx, {}):
            assert not ok and err == f"goal {goal_id!r} not found", (ok, data, err)
            return
        assert ok, err
        assert data == {"id": data["id"], "name": args["name"], "goal_id": goal_id, "done": False}
        self.model.todos.setdefault(ctx, {})[data["id"]] = data

    def _expect_mark_todo(self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str) -> None:
        todo = self.model.todos.get(ctx, {}).get(args["todo_id"])
        if todo is None:
            assert not ok and err == f"todo {args['todo_id']!r} not found", (ok, data, err)
            return
        todo["done"] = True
        assert ok and data == todo, (data, todo, err)

    def _expect_get_planning_state(
        self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str
    ) -> None:
        goals = [{"id": i, "goal": g} for i, g in self.model.goals.get(ctx, {}).items()]
        todos = list(self.model.todos.get(ctx, {}).values())
        assert ok and data == {"goals": goals, "todos": todos}, (ctx, data, goals, todos, err)

    def _expect_create_playbook(
        self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str
    ) -> None:
        playbook = Playbook(ctx.assistant_id, args["name"], args["steps"])
        assert ok and data == playbook.record(data["id"]), (data, err)
        book = self.model.playbooks.setdefault(ctx.session_id, {})
        assert data["id"] not in book
        book[data["id"]] = playbook

    def _expect_list_playbooks(
        self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str
    ) -> None:
        assert ok, err
        book = self.model.playbooks.get(ctx.session_id, {})
        own = [p.record(i) for i, p in book.items() if p.owner == ctx.assistant_id]
        visible = [p.record(i) for i, p in book.items() if self.model.playbook_visible(ctx, p)]
        listed = data["playbooks"]
        # Exact for the caller's own; unowned ones may be listed to an assistant too.
        assert [p for p in listed if p["agent_id"] == ctx.assistant_id] == own, (ctx, listed)
        assert all(p in visible for p in listed), (ctx, listed, visible)

    def _expect_select_playbook(
        self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str
    ) -> None:
        playbook = self.model.playbooks.get(ctx.session_id, {}).get(args["id"])
        if playbook is None:
            assert not ok and err == f"playbook {args['id']!r} not found", (ok, data, err)
        elif playbook.owner == ctx.assistant_id:
            assert ok and data == {"selected": playbook.record(args["id"])}, (data, err)
        elif playbook.owner is not None:
            assert not ok and "does not belong to assistant" in err, (ctx, ok, data, err)
        elif ok:  # an unowned playbook: selectable or not, but never another's content
            assert data == {"selected": playbook.record(args["id"])}, data

    def _expect_add_content(
        self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str
    ) -> None:
        assert ok and data == {"id": data["id"], "filename": args["filename"]}, (data, err)
        items = self.model.content.setdefault(ctx.session_id, {})
        assert data["id"] not in items
        items[data["id"]] = (args["filename"], args["content"])

    def _expect_read_content(
        self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str
    ) -> None:
        item = self.model.content.get(ctx.session_id, {}).get(args["id"])
        if item is None:
            assert not ok and err == f"content {args['id']!r} not found", (ok, data, err)
        else:
            expected = {"id": args["id"], "filename": item[0], "content": item[1]}
            assert ok and data == expected, (data, expected, err)

    def _expect_search_content(
        self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str
    ) -> None:
        items = self.model.content.get(ctx.session_id, {})
        expected = [i for i, item in items.items() if any(args["query"] in v for v in item)]
        assert ok and [r["id"] for r in data["results"]] == expected, (ctx, data, expected, err)

    def _expect_get_recent_context(
        self, ctx: ToolContext, args: Any, ok: bool, data: Any, err: str
    ) -> None:
        assert ok, err
        expected = [(op.tool, op.markers) for op in self.model.visible_history(ctx)]
        got = [(op["tool"], frozenset(markers_in(op["arguments"]))) for op in data["operations"]]
        assert got == expected, (ctx, got, expected)

    def expect_call(
        self, ctx: ToolContext, channel: str, forged: ToolContext, tool: str, args: dict[str, Any]
    ) -> None:
        ctx, result = self.call(ctx, channel, forged, tool, args)
        self.expect(ctx, tool, args, not result.is_error, result.structured, result.text)

    # -- the operations --------------------------------------------------------------------

    def op_args(self, ctx: ToolContext, tool: str, pick: int) -> dict[str, Any]:
        """Arguments for `tool`; `pick` chooses an id (own or foreign: ids restart per key)
        or the marker to search for."""
        if tool == "search_content":
            return {"query": f"MK{pick:05d}Z"}  # any marker so far, whoever wrote it
        pick %= 6
        if tool == "create_goal":
            return {"goal": self.marker(ctx)}
        if tool == "add_todo":
            args: dict[str, Any] = {"name": self.marker(ctx)}
            if pick:
                args["goal_id"] = f"g{pick}"
            return args
        if tool == "mark_todo":
            return {"todo_id": f"t{pick}"}
        if tool == "create_playbook":
            return {"name": self.marker(ctx), "steps": [self.marker(ctx) for _ in range(pick)]}
        if tool == "select_playbook":
            return {"id": f"pb{pick}"}
        if tool == "add_content":
            return {"filename": self.marker(ctx) + ".txt", "content": "body " + self.marker(ctx)}
        if tool == "read_content":
            return {"id": f"c{pick}"}
        if tool == "get_recent_context":
            return {"limit": MAX_HISTORY}
        return {}

    @rule(ctx=contexts, channel=channels, forged=contexts, tool=tools, pick=picks)
    def direct_call(
        self, ctx: ToolContext, channel: str, forged: ToolContext, tool: str, pick: int
    ) -> None:
        channel = channel if channel in self.routes else self.routes[0]
        self.expect_call(ctx, channel, forged, tool, self.op_args(ctx, tool, pick))

    @precondition(lambda self: self.batches)
    @rule(
        ctx=contexts,
        channel=channels,
        forged=contexts,
        ops=st.lists(
            st.tuples(batch_tools, picks, st.sampled_from(BATCH_SPOOFS), spoof_details),
            min_size=1,
            max_size=4,
        ),
    )
    def batch(
        self,
        ctx: ToolContext,
        channel: str,
        forged: ToolContext,
        ops: list[tuple[str, int, str | None, str]],
    ) -> None:
        """A batch whose operations may try to leave the caller's context."""
        channel = channel if channel in self.routes else self.routes[0]
        effective, _, _ = self.deliver(ctx, channel, forged, {})
        operations = [
            self.batch_op(
                effective, forged, tool, pick, spoof if spoof in self.spoofs else None, detail
            )
            for tool, pick, spoof, detail in ops
        ]
        spoofed = any(
            set(op) - {"tool", "arguments"} or "__sessionId" in op["arguments"] for op in operations
        )
        args = {"operations": operations, "options": {"includeMetadata": True}}
        try:
            ctx, result = self.call(ctx, channel, forged, "batch", args)
        except InvalidArgumentsError:
            assert spoofed, "a batch without context fields was refused"
            return  # refused before anything ran: as a context field in an operation must be
        structured = result.structured
        if structured is None:  # refused by the plan check: recorded, nothing ran
            assert result.is_error and spoofed, result.text
            self.record(ctx, "batch", args)
            return
        for op, outcome in zip(operations, structured["results"], strict=True):
            metadata = outcome.get("metadata") or {}
            assert metadata.get("thread", ctx.thread_id) == ctx.thread_id, (ctx, outcome)
            assert outcome["status"] in ("success", "failed"), outcome
            error = (outcome.get("error") or {}).get("message", "")
            # A de-duplicated read ran once, but must give what a fresh read would.
            ran = not metadata.get("deduplicated", False)
            ok = outcome["status"] == "success"
            self.expect(ctx, op["tool"], op["arguments"], ok, outcome.get("data"), error, ran=ran)
        self.check_no_leak(ctx, "batch", args, result.to_mcp())
        self.record(ctx, "batch", args)

    def batch_op(
        self,
        ctx: ToolContext,
        forged: ToolContext,
        tool: str,
        pick: int,
        spoof: str | None,
        detail: str,
    ) -> dict[str, Any]:
        op: dict[str, Any] = {"tool": tool, "arguments": self.op_args(ctx, tool, pick)}
        if spoof == "thread":
            op["thread"] = detail if detail in THREADS else "t2"
        elif spoof == "field":
            op[detail if detail in CONTEXT_OP_FIELDS else "session"] = forged.session_id
        elif spoof == "reserved_args":
            op["arguments"].update({"__sessionId": forged.session_id, "__assistant_id": "a2"})
        return op


def machine(
    name: str,
    *,
    channels: tuple[str, ...] = CHANNELS,
    batches: bool = True,
    spoofs: tuple[str | None, ...] = BATCH_SPOOFS,
    examples: int = 150,
    steps: int = 50,
    base: type[IsolationMachine] = IsolationMachine,
) -> type[RuleBasedStateMachine]:
    """A variant of the machine that attacks through some routes only, so a failure names
    the route (and the fix that closes it)."""
    variant: Any = type(name, (base,), {"routes": channels, "batches": batches, "spoofs": spoofs})
    variant.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    return variant


# Context precedence: _meta wins over every __* argument; camelCase over snake_case.
TestContextRoutes = machine("ContextRoutes", batches=False).TestCase
# Batches run in exactly the caller's context (no thread or context field of their own).
TestBatchContext = machine("BatchContext", channels=("inject",)).TestCase
# Ownership: playbooks by owner, history by what the caller could see itself; ids of
# other keys find nothing of theirs.
TestOwnership = machine("Ownership", channels=("inject",), spoofs=(None,)).TestCase
# Everything at once.
TestIsolation = machine("Everything", examples=300).TestCase


class OverMcp(IsolationMachine):
    """The same calls through ``/mcp`` of a served process (raw JSON-RPC, one MCP session
    per example, so the session fallback is the example's own). The served process is
    shared, so the example's sessions get a unique prefix on the way out."""

    def connect(self) -> None:
        self.http = httpx.Client(base_url=served_base(), timeout=60.0)
        self.mcp = McpHttpSession(self.http)
        self.prefix = uuid.uuid4().hex[:12] + "-"

    def rename(self, fields: dict[str, Any] | None, names: tuple[str, ...]) -> Any:
        if fields is None:
            return None
        return {
            k: self.prefix + v if k in names and isinstance(v, str) else v
            for k, v in fields.items()
        }

    def invoke(
        self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None
    ) -> ToolResult:
        params: dict[str, Any] = {
            "name": tool,
            "arguments": self.rename(arguments, SPELLINGS["session_id"]),
        }
        if meta is not None:
            params["_meta"] = self.rename(meta, (META_KEYS["session_id"],))
        answer = self.mcp.rpc("tools/call", params)
        assert "result" in answer, answer
        found = answer["result"]
        result = ToolResult(found["content"], found.get("structuredContent"), found["isError"])
        if (
            result.is_error
            and result.structured is None
            and result.text.startswith("invalid arguments")
        ):
            raise InvalidArgumentsError(result.text)  # how MCP reports it to the model
        return result

    def teardown(self) -> None:
        for session in SESSIONS:
            self.http.delete(f"/api/v1/sessions/{self.prefix}{session}")
        self.mcp.close()
        self.http.close()


_served: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _shared_server() -> Iterator[None]:
    """Started by the first MCP example, stopped after the module's tests."""
    with contextlib.ExitStack() as stack:
        _served["stack"] = stack
        yield
        _served.clear()


def served_base() -> str:
    if "base" not in _served:
        env = {"CTXACTORS_HISTORY_MAX_OPERATIONS": str(MAX_HISTORY)}
        base, log = _served["stack"].enter_context(served_http(env))
        _served["stack"].callback(lambda: no_traceback(log.read_text(errors="replace")))
        _served["base"] = base
    base: str = _served["base"]
    return base


# Everything, through MCP over streamable HTTP.
TestIsolationOverMcp = machine("OverMcpEverything", examples=40, steps=30, base=OverMcp).TestCase
