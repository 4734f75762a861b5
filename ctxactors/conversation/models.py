"""Chat models: the protocol a `ChatSession` talks to, an OpenAI-compatible HTTP client,
and a scripted model for tests and demos.

A model receives the prompt (system prompt first) and the tool definitions as the runtime
lists them (MCP dicts: ``name``, ``description``, ``inputSchema``); each implementation
turns them into its own wire format.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from ctxactors.conversation._extra import require
from ctxactors.conversation.messages import Message
from ctxactors.errors import ModelError

if TYPE_CHECKING:
    import httpx

ToolDefinition = dict[str, Any]
Step = Message | Callable[[list[Message], list[ToolDefinition]], Message]


@runtime_checkable
class ChatModel(Protocol):
    """Something that answers a prompt with one assistant message (maybe with tool calls)."""

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolDefinition]) -> Message: ...

    async def acomplete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> Message: ...


def openai_tools(tools: Iterable[ToolDefinition]) -> list[dict[str, Any]]:
    """MCP tool definitions in the chat-completions ``tools`` format."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description") or "",
                "parameters": tool.get("inputSchema") or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


class ScriptedModel:
    """A model that replies from a script, and records every prompt it was sent.

    Each step is a reply `Message`, or a callable ``(messages, tools) -> Message`` for a
    reply that depends on the prompt (a tool call that uses an id from a result, say).
    `prompts` holds every message list received, system prompt included, in order; `tools`
    the tool definitions sent with the last one. Raises `ModelError` when the script is
    spent, so a test that loops longer than planned fails loudly.
    """

    def __init__(self, steps: Iterable[Step]) -> None:
        self._steps = list(steps)
        self._next = 0
        self._lock = threading.Lock()
        self.prompts: list[list[Message]] = []
        self.tools: list[ToolDefinition] = []

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolDefinition]) -> Message:
        with self._lock:
            if self._next >= len(self._steps):
                raise ModelError(f"the script has only {len(self._steps)} steps")
            step = self._steps[self._next]
            self._next += 1
            prompt = list(messages)
            self.prompts.append(prompt)
            self.tools = list(tools)
        return step(prompt, list(tools)) if callable(step) else step

    async def acomplete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> Message:
        return self.complete(messages, tools)

    @property
    def remaining(self) -> int:
        return len(self._steps) - self._next


class _Choice(msgspec.Struct):
    message: Message
    finish_reason: str | None = None


class _Completion(msgspec.Struct):
    choices: list[_Choice]


_decode_completion = msgspec.json.Decoder(_Completion).decode
_encode = msgspec.json.Encoder().encode


class OpenAICompatibleModel:
    """A model behind ``/v1/chat/completions`` with tools: a hosted API, vLLM, Ollama, ...

    `base_url` is the server's root or its ``/v1`` prefix (``http://localhost:11434/v1``).
    `options` go into every request body as they are (``temperature``, ``max_tokens``).
    One sync and one async connection pool are opened on first use; `close`/`aclose`
    release them. Needs ``httpx``, from the ``[conversation]`` extra.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self._http = require("httpx", "ctxactors.conversation.OpenAICompatibleModel")
        root = base_url.rstrip("/")
        self.url = (
            f"{root}/chat/completions" if root.endswith("/v1") else f"{root}/v1/chat/completions"
        )
        self.model = model
        self.options = dict(options or {})
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = timeout
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None

    def _body(self, messages: Sequence[Message], tools: Sequence[ToolDefinition]) -> bytes:
        body: dict[str, Any] = {**self.options, "model": self.model, "messages": list(messages)}
        if tools:
            body["tools"] = openai_tools(tools)
        return _encode(body)

    def _reply(self, response: httpx.Response) -> Message:
        if response.status_code >= 400:
            raise ModelError(f"{self.url} answered {response.status_code}: {response.text[:500]}")
        try:
            completion = _decode_completion(response.content)
        except msgspec.DecodeError as exc:
            raise ModelError(f"{self.url} sent an unexpected body: {exc}") from None
        if not completion.choices:
            raise ModelError(f"{self.url} sent no choices")
        return completion.choices[0].message

    def complete(self, messages: Sequence[Message], tools: Sequence[ToolDefinition]) -> Message:
        if self._client is None:
            self._client = self._http.Client(timeout=self._timeout, headers=self._headers)
        try:
            response = self._client.post(self.url, content=self._body(messages, tools))
        except self._http.HTTPError as exc:
            raise ModelError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        return self._reply(response)

    async def acomplete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition]
    ) -> Message:
        if self._aclient is None:
            self._aclient = self._http.AsyncClient(timeout=self._timeout, headers=self._headers)
        try:
            response = await self._aclient.post(self.url, content=self._body(messages, tools))
        except self._http.HTTPError as exc:
            raise ModelError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        return self._reply(response)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None
        self.close()
