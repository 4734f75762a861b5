"""Messages: the OpenAI chat format, JSON round trips, and what a server may send back."""

from __future__ import annotations

import json

import msgspec
import pytest

from ctxactors.conversation import (
    FunctionCall,
    Message,
    ToolCall,
    decode_messages,
    encode_messages,
)

pytestmark = pytest.mark.timeout(10)


def conversation() -> list[Message]:
    call = ToolCall.new("create_goal", {"goal": "Learn Rust"}, id="call_1")
    return [
        Message.system("You plan things."),
        Message("user", "Plan my week", name="dana"),
        Message.assistant("Creating a goal.", [call]),
        Message.tool("call_1", '{"id":"g1","goal":"Learn Rust"}'),
        Message.assistant("Done: g1."),
    ]


def test_json_round_trip_keeps_every_field() -> None:
    messages = conversation()
    assert decode_messages(encode_messages(messages)) == messages
    for message in messages:
        assert Message.from_json(message.to_json()) == message


def test_wire_format_is_openai_chat_format() -> None:
    wire = json.loads(encode_messages(conversation()))
    assert wire[1] == {"role": "user", "content": "Plan my week", "name": "dana"}
    assert wire[2] == {
        "role": "assistant",
        "content": "Creating a goal.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "create_goal", "arguments": '{"goal":"Learn Rust"}'},
            }
        ],
    }
    assert wire[3] == {
        "role": "tool",
        "content": '{"id":"g1","goal":"Learn Rust"}',
        "tool_call_id": "call_1",
    }


def test_server_reply_with_null_content_empty_calls_and_extra_fields_decodes() -> None:
    body = b"""[{"role": "assistant", "content": null, "tool_calls": [], "refusal": null},
                {"role": "assistant", "tool_calls": [{"id": "c9",
                 "function": {"name": "get_planning_state", "arguments": "{}"}}]}]"""
    plain, calling = decode_messages(body)
    assert plain.tool_calls is None and plain.content is None and plain.text == ""
    assert calling.tool_calls == (ToolCall(id="c9", function=FunctionCall("get_planning_state")),)
    assert Message.assistant(None, []).tool_calls is None


def test_bad_messages_are_refused_with_the_path() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\[0\]\.role"):
        decode_messages(b'[{"role": "robot", "content": "hi"}]')
    with pytest.raises(msgspec.ValidationError, match="content"):
        decode_messages(b'[{"role": "user", "content": 5}]')


def test_tool_call_ids_are_fresh_and_dict_arguments_become_json() -> None:
    a = ToolCall.new("add_todo", {"name": "milk", "goal_id": None})
    b = ToolCall.new("add_todo")
    assert a.id != b.id and a.id.startswith("call_")
    assert json.loads(a.function.arguments) == {"name": "milk", "goal_id": None}
    assert b.function.arguments == "{}"


def test_messages_are_frozen_and_hashable() -> None:
    message = conversation()[2]
    with pytest.raises(AttributeError):
        message.content = "changed"  # type: ignore[misc]
    assert {message: 1}[Message.from_json(message.to_json())] == 1
