"""Fake models for the documentation's examples, each the framework's own test double.

The pages' examples run in the suite (see the top-level ``conftest.py``); the ones that
drive a framework's agent get their model from here through a hidden block
(``<!-- invisible-code-block: python ... -->``), so the visible example reads as a host
would write it. Every fake model calls the tools it is given, in order, then answers with
the last tool output it read: the example's assertions check what the tools did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Call = tuple[str, dict[str, Any]]


def agents_model(*calls: Call) -> Any:
    """The Agents SDK's `ScriptedModel`: one function call a turn, then the last output."""
    from agents import set_tracing_disabled
    from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

    set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI

    def answer(call: ModelCall) -> list[Any]:
        outputs = [
            item["output"]
            for item in (call.input if isinstance(call.input, list) else [])
            if isinstance(item, Mapping) and item.get("type") == "function_call_output"
        ]
        last = outputs[-1] if outputs else ""
        text = last if isinstance(last, str) else "".join(part["text"] for part in last)
        return [assistant_message(text)]

    steps: list[Any] = [
        [function_call(name, args, call_id=f"call-{i}")] for i, (name, args) in enumerate(calls)
    ]
    return ScriptedModel([*steps, ModelStep.respond(answer)])


def langchain_model(*calls: Call) -> Any:
    """langchain-core's `FakeMessagesListChatModel` (with ``bind_tools``, which agents call):
    one tool call a turn, then "done"."""
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage

    class ToolCallingFake(FakeMessagesListChatModel):
        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
            return self

    replies: list[Any] = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{i}"}])
        for i, (name, args) in enumerate(calls)
    ]
    return ToolCallingFake(responses=[*replies, AIMessage(content="done")])


def pydantic_ai_model(*calls: Call) -> Any:
    """pydantic-ai's `FunctionModel`: turn i makes call i (counted from the run's prompt, so
    a run that continues a history starts its script again), then the last tool output."""
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        start = max(
            i
            for i, m in enumerate(messages)
            if isinstance(m, ModelRequest) and any(isinstance(p, UserPromptPart) for p in m.parts)
        )
        turn = sum(isinstance(m, ModelResponse) for m in messages[start:])
        if turn < len(calls):
            name, args = calls[turn]
            return ModelResponse(parts=[ToolCallPart(name, args)])
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(str(returns[-1].content) if returns else "done")])

    return FunctionModel(script)
