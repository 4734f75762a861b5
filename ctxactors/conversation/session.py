"""A conversation with one assistant: the agent loop between a model and the runtime.

The loop is written once, as a generator that yields what it needs (a model reply, the
results of some tool calls) and receives the answers; `send` and `asend` only differ in
how they fetch those answers. Every model call gets a prompt built by
`prompt.build_prompt`, so the user's request and complete tool steps survive any chain.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import msgspec

from ctxactors.context import ToolContext, inject_context
from ctxactors.conversation.messages import Message, ToolCall
from ctxactors.conversation.models import ChatModel, ModelError, ToolDefinition
from ctxactors.conversation.prompt import DEFAULT_RESTATE_SHARE, build_prompt
from ctxactors.conversation.tokens import BPETokenCounter, TokenCounter, count_prompt
from ctxactors.errors import CallTimeoutError, InvalidArgumentsError, UnknownToolError
from ctxactors.logs import get_logger
from ctxactors.results import ToolResult

# What a model can get wrong about a call, and can fix once it reads why: sent back to it
# as the call's result. Anything else (a closed runtime, a bug) propagates.
_CALL_ERRORS = (UnknownToolError, InvalidArgumentsError, CallTimeoutError)
_encode = msgspec.json.Encoder().encode


class ToolRuntime(Protocol):
    """The part of `ctxactors.Runtime` a session uses."""

    def list_tools(self) -> list[dict[str, Any]]: ...

    def call(self, tool: str, arguments: Mapping[str, Any] | str | None = None) -> ToolResult: ...

    async def acall(
        self, tool: str, arguments: Mapping[str, Any] | str | None = None
    ) -> ToolResult: ...


class _ModelTurn(msgspec.Struct, frozen=True):
    prompt: list[Message]


class _ToolTurn(msgspec.Struct, frozen=True):
    calls: tuple[ToolCall, ...]


_Loop = Generator[_ModelTurn | _ToolTurn, Any, str]


class ChatSession:
    """One conversation of one assistant, with tools from a runtime.

    `send`/`asend` take the user's text and return the assistant's final text. In between
    the model may call tools any number of times, up to `max_steps` model calls; each call
    goes through `inject_context` (the model never sees or sets the session) and the
    runtime, several calls of one reply concurrently. `max_context_tokens` bounds every
    prompt sent, system prompt included, counted with `counter` (exact BPE by default); the
    tool definitions are sent beside it and not counted. `history` holds the conversation
    without the system prompt, and may be given to resume one. A session is one
    conversation: send to it from one caller at a time (concurrent conversations are
    separate sessions).
    """

    def __init__(
        self,
        runtime: ToolRuntime,
        model: ChatModel,
        *,
        session_id: str,
        assistant_id: str | None,
        thread_id: str | None = None,
        system_prompt: str = "",
        extension: str = "",
        max_context_tokens: int = 16_000,
        max_steps: int = 20,
        counter: TokenCounter | None = None,
        restate_share: float = DEFAULT_RESTATE_SHARE,
        history: Iterable[Message] = (),
    ) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.runtime = runtime
        self.model = model
        self.context = ToolContext(session_id, assistant_id, thread_id)
        self.system_prompt = system_prompt
        self.extension = extension
        self.max_context_tokens = max_context_tokens
        self.max_steps = max_steps
        self.counter = counter if counter is not None else BPETokenCounter()
        self.restate_share = restate_share
        self.history: list[Message] = list(history)
        self._log = get_logger(
            "ctxactors.conversation",
            session_id=session_id,
            assistant_id=assistant_id,
            thread_id=thread_id,
        )

    def prompt(self) -> list[Message]:
        """What the model would be sent now."""
        return build_prompt(
            self.history,
            system_prompt=self.system_prompt,
            extension=self.extension,
            max_tokens=self.max_context_tokens,
            counter=self.counter,
            restate_share=self.restate_share,
        )

    # -- the loop, once ---------------------------------------------------------------------

    def _loop(self, text: str) -> _Loop:
        self.history.append(Message.user(text))
        for step in range(1, self.max_steps + 1):
            prompt = self.prompt()
            self._log.debug(
                "model_call",
                step=step,
                messages=len(prompt),
                tokens=count_prompt(prompt, self.counter),
                restated=not any(m.role == "user" for m in prompt),
            )
            reply = _checked_reply((yield _ModelTurn(prompt)))
            self.history.append(reply)
            if not reply.tool_calls:
                return reply.text
            results: list[Message] = yield _ToolTurn(reply.tool_calls)
            self.history.extend(results)
        note = (
            f"Stopped after {self.max_steps} model calls without a final answer; "
            "the tool results so far are in the conversation."
        )
        self.history.append(Message.assistant(note))
        return note

    # -- sync -------------------------------------------------------------------------------

    def send(self, text: str) -> str:
        """Send the user's message; return the assistant's final text."""
        loop = self._loop(text)
        try:
            request = next(loop)
            while True:
                if isinstance(request, _ModelTurn):
                    answer: Any = self.model.complete(request.prompt, self._tools())
                else:
                    answer = self._run_calls(request.calls)
                request = loop.send(answer)
        except StopIteration as done:
            return str(done.value)
        finally:
            loop.close()

    def _run_calls(self, calls: Sequence[ToolCall]) -> list[Message]:
        if len(calls) == 1:
            return [self._run_call(calls[0])]
        # Each call in its caller's context (a copy each): the host's trace goes with it.
        contexts = [contextvars.copy_context() for _ in calls]
        with ThreadPoolExecutor(max_workers=min(len(calls), 16)) as pool:
            return list(pool.map(lambda c, call: c.run(self._run_call, call), contexts, calls))

    def _run_call(self, call: ToolCall) -> Message:
        try:
            arguments = inject_context(call.function.arguments, self.context)
            with tool_call(call.id):  # the model's id of the call, for its span
                result = self.runtime.call(call.function.name, arguments)
        except _CALL_ERRORS as exc:
            return _error_message(call, exc)
        return _result_message(call, result)

    # -- async ------------------------------------------------------------------------------

    async def asend(self, text: str) -> str:
        """`send`, awaitable: the model and the tool calls are awaited, never blocked on."""
        loop = self._loop(text)
        try:
            request = next(loop)
            while True:
                if isinstance(request, _ModelTurn):
                    answer: Any = await self.model.acomplete(request.prompt, self._tools())
                else:
                    answer = list(await asyncio.gather(*map(self._arun_call, request.calls)))
                request = loop.send(answer)
        except StopIteration as done:
            return str(done.value)
        finally:
            loop.close()

    async def _arun_call(self, call: ToolCall) -> Message:
        try:
            arguments = inject_context(call.function.arguments, self.context)
            with tool_call(call.id):
                result = await self.runtime.acall(call.function.name, arguments)
        except _CALL_ERRORS as exc:
            return _error_message(call, exc)
        return _result_message(call, result)

    def _tools(self) -> list[ToolDefinition]:
        return self.runtime.list_tools()


def _checked_reply(reply: Any) -> Message:
    """The model's reply as it enters the history: an assistant message whose tool calls
    all have distinct ids (some servers leave them out)."""
    if not isinstance(reply, Message) or reply.role != "assistant":
        raise ModelError(f"a model must reply with an assistant message, got {reply!r}")
    if not reply.tool_calls:
        return reply
    seen: set[str] = set()
    calls = []
    for call in reply.tool_calls:
        if not call.id or call.id in seen:
            call = msgspec.structs.replace(call, id=f"call_{uuid.uuid4().hex[:24]}")
        seen.add(call.id)
        calls.append(call)
    return msgspec.structs.replace(reply, tool_calls=tuple(calls))


def _result_message(call: ToolCall, result: ToolResult) -> Message:
    text = result.text
    if not text and result.structured is not None:
        text = _encode(result.structured).decode()
    if result.is_error:
        text = f"Error: {text or 'the tool failed without a message'}"
    return Message.tool(call.id, text or "(no output)")


def _error_message(call: ToolCall, exc: Exception) -> Message:
    return Message.tool(call.id, f"Error: {exc}")


def tool_call(call_id: str | None) -> AbstractContextManager[None]:
    """`ctxactors.tracing.tool_call` when OpenTelemetry is in use; else nothing, so the
    conversation extra needs no OpenTelemetry (a runtime that traces has imported it)."""
    if "opentelemetry.trace" not in sys.modules:
        return nullcontext()
    from ctxactors.tracing import tool_call as naming

    return naming(call_id)
