"""Chat messages in the OpenAI chat-completions format, as msgspec types.

One definition gives decoding (from a model server's reply or a saved history), encoding
(the request body) and validation. Messages are frozen: a history is append-only, and a
message that has to be shortened for a window is a new message, so a token count cached
for a message stays true for as long as the message exists.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

Role = Literal["system", "user", "assistant", "tool"]

_encode = msgspec.json.Encoder().encode


class FunctionCall(msgspec.Struct, frozen=True):
    """The function a tool call invokes; `arguments` is the JSON text the model produced."""

    name: str
    arguments: str = "{}"


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call of an assistant message; its result answers with the same `id`.

    `id` may arrive empty from servers that don't number their calls; `ChatSession` gives
    such calls an id before they enter the history.
    """

    id: str = ""
    function: FunctionCall
    type: Literal["function"] = "function"

    @classmethod
    def new(
        cls, name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str = ""
    ) -> ToolCall:
        """A tool call with a fresh id unless one is given; dict arguments become JSON."""
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = _encode(arguments).decode()
        return cls(id=id or f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name, arguments))


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """One chat message: ``system``, ``user``, ``assistant`` (maybe with `tool_calls`) or
    ``tool`` (the result of the call named by `tool_call_id`).

    Unset fields are left out of the JSON, which is what OpenAI-compatible servers expect
    (an empty ``tool_calls`` list is refused by some, so it is normalized to None).
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.tool_calls is not None and not self.tool_calls:
            msgspec.structs.force_setattr(self, "tool_calls", None)

    @classmethod
    def system(cls, content: str) -> Message:
        return cls("system", content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: str | None = None, tool_calls: Iterable[ToolCall] = ()) -> Message:
        return cls("assistant", content, tuple(tool_calls) or None)

    @classmethod
    def tool(cls, tool_call_id: str, content: str, *, name: str | None = None) -> Message:
        return cls("tool", content, tool_call_id=tool_call_id, name=name)

    @property
    def text(self) -> str:
        """The content, or "" when there is none (an assistant message with only calls)."""
        return self.content or ""

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> Message:
        return _decode_message(data)


_decode_message = msgspec.json.Decoder(Message).decode
_decode_messages = msgspec.json.Decoder(list[Message]).decode


def encode_messages(messages: Iterable[Message]) -> bytes:
    """A JSON array of messages, as sent in a chat-completions request."""
    return _encode(list(messages))


def decode_messages(data: bytes | str) -> list[Message]:
    """Messages from a JSON array; raises `msgspec.ValidationError` naming the bad path."""
    return _decode_messages(data)


def to_builtins(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Messages as plain dicts (for an HTTP client that builds its own JSON)."""
    return [msgspec.to_builtins(m) for m in messages]
