#!/usr/bin/env python3
"""What each framework integration (`ctxactors.integrations`) adds to a tool call.

Beside it, what the framework itself spends on one. Per framework (OpenAI Agents SDK,
LangChain/LangGraph, pydantic-ai), on one conversation of a `Runtime([Counter])` (one integer
of session state; the tool ``bump``), each in µs:

- ``A``, bare acall: ``await runtime.acall("bump", {}, meta=..., session_fallback=None)``,
  the call the integration makes, with its ``_meta`` built once beforehand;
- ``N``, native no-op: the framework's own async tool that returns at once, called through
  the framework's own tool-invocation entry point: the Agents SDK's `invoke_function_tool`
  with a real SDK `ToolContext`, LangChain's ``tool.ainvoke(ToolCall, config)`` (what
  LangGraph's `ToolNode` calls), pydantic-ai's ``ToolManager.handle_call`` (argument
  validation and execution, as an agent run does);
- ``I``, integration: the integration's ``bump`` tool through that same entry point, with the
  conversation passed as that framework passes it (the run context, the config's
  ``thread_id``, the run's deps);
- ``F``, the framework's own per-tool-call overhead: an agent run whose fake model makes K
  calls of the native no-op (one call a turn), minus a run whose model answers at once,
  over K: what one more model turn and tool call cost the framework with a model that costs
  nothing (a replaying `agents.models.interface.Model`, a scripted LangChain chat model in a
  LangGraph model/`ToolNode` loop, pydantic-ai's `FunctionModel`). Their fakes, not
  `agents.testing.ScriptedModel`: it deep-copies the whole input at every turn, a cost of
  the fake, not the framework.

The integration's overhead is ``I - N - A``: what a call through the integration costs beyond
the framework's cost for any tool (``N``) and the runtime's own call (``A``), i.e. the glue
(reading the conversation, building ``_meta``, turning the `ToolResult` into the framework's
result) plus any difference in how the framework treats our tool (its JSON-schema arguments)
from a native one. It can come out below zero: a framework may do less for our tool than for
a native one (LangChain does not validate a JSON-schema ``args_schema``). Target: under 10% of
``F``. ``I - A`` is printed too: everything a host pays over a bare acall, the framework's
dispatch included.

Each figure is taken twice: as the whole process's CPU time per call (`time.process_time`:
the caller's thread and the runtime's workers; other processes on a shared machine don't
stretch it, so the verdict uses it) and as wall-clock time. A, N and I run back to back as
batches of ``--calls`` sequential calls, in an order that rotates round by round; the
overhead is the median over rounds of each round's own ``I - N - A`` (so drift between
rounds cancels), the other figures the median of the rounds. At the end each conversation's
counter must equal the number of ``bump`` calls made in it, so the integration really ran
the tool in its conversation. One process, pinned to one CPU unless ``--no-pin``.

    python scripts/bench_integrations.py [--calls 2000] [--rounds 5] [--tool-calls 10]
        [--runs 20] [--framework openai-agents --framework langchain ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bench_actors import Counter  # the same one-integer session server

from ctxactors import Runtime, ToolContext
from ctxactors.integrations._conversation import meta_of
from ctxactors.logs import configure_logging

TARGET_PERCENT = 10.0

Call = Callable[[], Awaitable[Any]]


@dataclass
class Subject:
    """One framework's three ways to make a tool call, and its agent runs.

    `run(n)` prepares (untimed) an agent run whose model calls the native no-op `n` times and
    returns the call that runs it; that call returns how many tool results the run produced.
    """

    package: str  # the distribution whose version is reported
    native: Call
    integrated: Call
    run: Callable[[int], Callable[[], Awaitable[int]]]


# Each framework is imported by its own function below, so `--framework` runs with only that
# framework installed and `--help` (which bench_all.py asks) imports none of them.


def openai_agents(runtime: Runtime, ctx: ToolContext) -> Subject:
    """The OpenAI Agents SDK: `tools(runtime)` called as the runner calls a function tool."""
    from agents import (
        Agent,
        RunConfig,
        Runner,
        ToolCallOutputItem,
        Usage,
        function_tool,
        set_tracing_disabled,
    )
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call
    from agents.tool import invoke_function_tool
    from agents.tool_context import ToolContext as SDKToolContext

    from ctxactors.integrations.openai_agents import tools

    set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI

    @function_tool
    async def noop() -> str:
        """Do nothing."""
        return '{"n":1}'  # what the integration returns: the result's JSON text

    (bump,) = tools(runtime, ["bump"])

    def tool_context(name: str) -> SDKToolContext[Any]:
        # The runner hands each call a ToolContext wrapping the run's context, here the
        # conversation; one per call there, one per tool here (its cost would fall on N
        # and I alike).
        return SDKToolContext(ctx, tool_name=name, tool_call_id="c1", tool_arguments="{}")

    native_ctx, bump_ctx = tool_context("noop"), tool_context("bump")

    async def native() -> Any:
        return await invoke_function_tool(function_tool=noop, context=native_ctx, arguments="{}")

    async def integrated() -> Any:
        return await invoke_function_tool(function_tool=bump, context=bump_ctx, arguments="{}")

    class Replay(Model):
        """A model that costs nothing: it hands back the responses it was made with."""

        def __init__(self, responses: list[ModelResponse]) -> None:
            self._responses: Iterator[ModelResponse] = iter(responses)

        async def get_response(self, *_: Any, **__: Any) -> ModelResponse:
            return next(self._responses)

        def stream_response(self, *_: Any, **__: Any) -> Any:
            raise NotImplementedError

    def response(output: Any) -> ModelResponse:
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    config = RunConfig(tracing_disabled=True)

    def run(n: int) -> Callable[[], Awaitable[int]]:
        turns = [response(function_call("noop", {}, call_id=f"c{i}")) for i in range(n)]
        agent = Agent(
            name="bench", model=Replay([*turns, response(assistant_message("done"))]), tools=[noop]
        )

        async def go() -> int:
            result = await Runner.run(agent, "go", context=ctx, max_turns=n + 2, run_config=config)
            return sum(isinstance(item, ToolCallOutputItem) for item in result.new_items)

        return go

    return Subject("openai-agents", native, integrated, run)


def langchain(runtime: Runtime, ctx: ToolContext) -> Subject:
    """LangChain and LangGraph: `tools(runtime)` called as LangGraph's `ToolNode` calls one."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from ctxactors.integrations.langchain import tools

    @tool
    async def noop() -> dict[str, int]:
        """Do nothing."""
        return {"n": 1}  # what the integration returns: the structured result

    (bump,) = tools(runtime, ["bump"])
    config: RunnableConfig = {"configurable": {"thread_id": ctx.session_id}}
    native_call = {"type": "tool_call", "id": "c1", "name": "noop", "args": {}}
    bump_call = {"type": "tool_call", "id": "c1", "name": "bump", "args": {}}

    async def native() -> Any:
        return await noop.ainvoke(native_call, config)

    async def integrated() -> Any:
        return await bump.ainvoke(bump_call, config)

    class Scripted(BaseChatModel):
        """A model that costs nothing: the first message says how many tool calls to make."""

        def _generate(self, messages: list[BaseMessage], *_: Any, **__: Any) -> ChatResult:
            step = sum(isinstance(m, AIMessage) for m in messages)
            if step < int(str(messages[0].content)):
                call = {"name": "noop", "args": {}, "id": f"c{step}"}
                reply = AIMessage(content="", tool_calls=[call], id=f"m{step}")
            else:
                reply = AIMessage(content="done", id=f"m{step}")
            return ChatResult(generations=[ChatGeneration(message=reply)])

        async def _agenerate(self, messages: list[BaseMessage], *_: Any, **__: Any) -> ChatResult:
            return self._generate(messages)

        @property
        def _llm_type(self) -> str:
            return "scripted"

    model = Scripted()

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    # The loop LangGraph's prebuilt ReAct agent is: the model, then its tool calls, again.
    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([noop]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    agent = graph.compile()

    def run(n: int) -> Callable[[], Awaitable[int]]:
        inputs: MessagesState = {"messages": [HumanMessage(content=str(n), id="h")]}
        run_config: RunnableConfig = {**config, "recursion_limit": 2 * n + 5}

        async def go() -> int:
            state = await agent.ainvoke(inputs, run_config)
            return sum(isinstance(m, ToolMessage) for m in state["messages"])

        return go

    return Subject("langchain-core", native, integrated, run)


def pydantic_ai(runtime: Runtime, ctx: ToolContext) -> Subject:
    """pydantic-ai: `toolset(runtime)` called as an agent run's `ToolManager` calls a tool."""
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.tool_manager import ToolManager
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai.usage import RequestUsage, RunUsage

    from ctxactors.integrations.pydantic_ai import toolset

    async def noop() -> dict[str, int]:
        """Do nothing."""
        return {"n": 1}  # what the integration returns: the structured result

    # The run's context as the agent makes it: the conversation is the run's deps.
    run_ctx = RunContext(deps=ctx, model=TestModel(), usage=RunUsage())
    managers: dict[str, Any] = {}

    async def call(name: str, tools: Any) -> Any:
        if name not in managers:  # an agent prepares its ToolManager once a run step
            managers[name] = await ToolManager(tools).for_run_step(run_ctx)
        return await managers[name].handle_call(ToolCallPart(name, {}, tool_call_id="c1"))

    native_tools, bump_tools = FunctionToolset([noop]), toolset(runtime, ["bump"])

    async def native() -> Any:
        return await call("noop", native_tools)

    async def integrated() -> Any:
        return await call("bump", bump_tools)

    # Set usage, or FunctionModel estimates it from every message of the run (the fake's
    # cost, not the framework's).
    usage = RequestUsage(input_tokens=1, output_tokens=1)

    def script(n: int) -> Callable[[list[ModelMessage], AgentInfo], Awaitable[ModelResponse]]:
        async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            step = sum(isinstance(m, ModelResponse) for m in messages)
            if step < n:
                return ModelResponse(
                    parts=[ToolCallPart("noop", {}, tool_call_id=f"c{step}")], usage=usage
                )
            return ModelResponse(parts=[TextPart("done")], usage=usage)

        return respond

    agents: dict[int, Agent[ToolContext, str]] = {}

    def run(n: int) -> Callable[[], Awaitable[int]]:
        if n not in agents:
            agents[n] = Agent(FunctionModel(script(n)), deps_type=ToolContext, tools=[noop])
        agent = agents[n]

        async def go() -> int:
            result = await agent.run("go", deps=ctx)
            return sum(
                isinstance(part, ToolReturnPart)
                for message in result.all_messages()
                for part in getattr(message, "parts", ())
            )

        return go

    return Subject("pydantic-ai-slim", native, integrated, run)


FRAMEWORKS: dict[str, Callable[[Runtime, ToolContext], Subject]] = {
    "openai-agents": openai_agents,
    "langchain": langchain,
    "pydantic-ai": pydantic_ai,
}


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def spent(since: tuple[float, float], per: int) -> dict[str, float]:
    """µs per `per` of wall time and of the whole process's CPU time since `since`."""
    wall, cpu = clocks()
    return {"wall": (wall - since[0]) / per * 1e6, "cpu": (cpu - since[1]) / per * 1e6}


async def per_call(call: Call, calls: int) -> dict[str, float]:
    """µs per call of `calls` sequential calls."""
    gc.collect()
    started = clocks()
    for _ in range(calls):
        await call()
    return spent(started, calls)


async def per_tool_call(subject: Subject, tool_calls: int, runs: int) -> dict[str, float]:
    """µs per tool call the framework spends: (a K-call run - a run with none) / K."""
    totals = {n: {"wall": 0.0, "cpu": 0.0} for n in (tool_calls, 0)}
    for _ in range(runs):
        for n, total in totals.items():
            go = subject.run(n)
            gc.collect()
            started = clocks()
            made = await go()
            for clock, us in spent(started, 1).items():
                total[clock] += us
            assert made == n, f"the run made {made} tool calls, not {n}"
    return {c: (totals[tool_calls][c] - totals[0][c]) / runs / tool_calls for c in ("wall", "cpu")}


async def bench_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One framework: its rounds, their medians, and the check that every bump counted."""
    with Runtime([Counter]) as runtime:
        ctx = ToolContext(session_id=f"bench-{name}")
        meta = meta_of(ctx)

        async def bare() -> Any:
            return await runtime.acall("bump", {}, meta=meta, session_fallback=None)

        subject = FRAMEWORKS[name](runtime, ctx)
        variants: dict[str, Call] = {
            "acall": bare,
            "native": subject.native,
            "integration": subject.integrated,
        }
        warm = max(args.calls // 10, 10)
        for call in variants.values():  # warm up: imports, caches, the conversation's actor
            await per_call(call, warm)
        await per_tool_call(subject, args.tool_calls, 2)
        bumps = 2 * warm
        # What is alive now (three frameworks' modules) stays: the collection before each
        # batch and run then walks only what the measured calls left, in milliseconds.
        gc.collect()
        gc.freeze()

        rounds: list[dict[str, dict[str, float]]] = []
        order = list(variants)
        for r in range(args.rounds):
            figures = {}
            for variant in order[r % 3 :] + order[: r % 3]:  # rotate who goes first
                figures[variant] = await per_call(variants[variant], args.calls)
            figures["framework"] = await per_tool_call(subject, args.tool_calls, args.runs)
            figures["overhead"] = {
                c: figures["integration"][c] - figures["native"][c] - figures["acall"][c]
                for c in ("wall", "cpu")
            }
            rounds.append(figures)
            bumps += 2 * args.calls

        counted = (await bare()).structured
        assert counted == {"n": bumps + 1}, f"{name}: {counted}, expected {bumps + 1} bumps"

    result: dict[str, Any] = {"version": importlib.metadata.version(subject.package)}
    for clock in ("cpu", "wall"):
        median = {key: statistics.median(r[key][clock] for r in rounds) for key in rounds[0]}
        percent = median["overhead"] / median["framework"] * 100
        result[clock] = {
            "acall_us": round(median["acall"], 1),
            "native_us": round(median["native"], 1),
            "integration_us": round(median["integration"], 1),
            "integration_minus_acall_us": round(median["integration"] - median["acall"], 1),
            "overhead_us": round(median["overhead"], 1),
            "framework_per_tool_call_us": round(median["framework"], 1),
            "overhead_percent_of_framework": round(percent, 1),
            "rounds_overhead_us": [round(r["overhead"][clock], 1) for r in rounds],
            "rounds_framework_us": [round(r["framework"][clock], 1) for r in rounds],
        }
    result["meets_target"] = result["cpu"]["overhead_percent_of_framework"] < TARGET_PERCENT
    return result


def print_report(report: dict[str, Any]) -> None:
    print(
        f"integration overhead per tool call: {report['calls']} calls a batch, agent runs of "
        f"{report['tool_calls']} tool calls (x{report['runs']} a round), median of "
        f"{report['rounds']} rounds, "
        + ("pinned to one CPU" if report["pinned_cpu"] is not None else "unpinned")
    )
    columns = ("A acall", "N native", "I integ.", "I-A", "I-N-A", "F frmwk", "% of F")
    for clock, title in (
        ("cpu", "process CPU µs (the verdict: other processes on the machine don't stretch it)"),
        ("wall", "wall-clock µs"),
    ):
        print(f"\n{title}")
        print(f"{'':24}" + "".join(f"{c:>10}" for c in columns))
        for name, result in report["results"].items():
            r = result[clock]
            figures = (
                r["acall_us"],
                r["native_us"],
                r["integration_us"],
                r["integration_minus_acall_us"],
                r["overhead_us"],
                r["framework_per_tool_call_us"],
            )
            label = f"{name} {result['version']}"
            verdict = ""
            if clock == "cpu":
                target = f"under {TARGET_PERCENT:g}% of F"
                verdict = f"   {target}: " + ("ok" if result["meets_target"] else "OVER TARGET")
            print(
                f"{label:24}"
                + "".join(f"{v:>10.1f}" for v in figures)
                + f"{r['overhead_percent_of_framework']:>9.1f}%{verdict}"
            )
            print(f"{'':24}   per round I-N-A {r['rounds_overhead_us']}")
            print(f"{'':24}   per round F     {r['rounds_framework_us']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per batch")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (median shown)")
    parser.add_argument("--tool-calls", type=int, default=10, help="K: tool calls an agent run")
    parser.add_argument("--runs", type=int, default=20, help="agent runs of each kind a round")
    parser.add_argument(
        "--framework", action="append", choices=sorted(FRAMEWORKS), help="only these (repeat)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--no-pin", action="store_true", help="don't pin to one CPU")
    args = parser.parse_args()
    pin = not args.no_pin and hasattr(os, "sched_setaffinity")
    if pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    configure_logging(level="warning", force=True)
    results = {
        name: asyncio.run(bench_one(name, args))
        for name in FRAMEWORKS
        if args.framework is None or name in args.framework
    }
    report = {
        "benchmark": "integrations",
        "calls": args.calls,
        "rounds": args.rounds,
        "tool_calls": args.tool_calls,
        "runs": args.runs,
        "target_percent_of_framework": TARGET_PERCENT,
        "pinned_cpu": min(os.sched_getaffinity(0)) if pin else None,
        "results": results,
    }
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
