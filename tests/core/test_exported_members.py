"""The public surface is pinned: a name added to or dropped from `ctxactors` is a decision.

As httpx's ``tests/test_exported_members.py``: `__all__` is exactly this list, every name in
it resolves, and nothing public is left out of it. And every error is in one tree.
"""

from __future__ import annotations

import inspect

import ctxactors
import ctxactors.conversation
import ctxactors.errors
import ctxactors.sandbox
import ctxactors.servers
import ctxactors.state

EXPORTED = [
    "CallTimeoutError",
    "ContextBudgetError",
    "CtxActorsError",
    "DuplicateToolError",
    "InvalidArgumentsError",
    "ModelError",
    "NoConversationError",
    "Runtime",
    "RuntimeClosedError",
    "SandboxUnavailableError",
    "Scope",
    "Server",
    "ServerDefinitionError",
    "Settings",
    "ShardUnavailableError",
    "StaleStateError",
    "StoreError",
    "StoreUnavailableError",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "UnknownToolError",
    "caller_deadline",
    "clean_args",
    "inject_context",
    "pick",
    "tool",
]


def test_the_public_names_of_ctxactors_are_exactly_these_and_all_resolve() -> None:
    assert ctxactors.__all__ == EXPORTED
    for name in EXPORTED:
        assert getattr(ctxactors, name) is not None, name
    # Nothing public beyond __all__ but the submodules themselves.
    public = {
        name
        for name, value in vars(ctxactors).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(EXPORTED)


def test_every_error_is_in_one_tree_and_exported() -> None:
    errors = [
        value
        for value in vars(ctxactors.errors).values()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == "ctxactors.errors"
    ]
    assert sorted(e.__name__ for e in errors) == sorted(ctxactors.errors.__all__)
    for error in errors:
        assert issubclass(error, ctxactors.CtxActorsError), error
        assert getattr(ctxactors, error.__name__) is error
        assert error.__name__ in (ctxactors.errors.__doc__ or ""), error  # drawn in the tree


def test_errors_keep_their_old_homes_and_bases() -> None:
    # The same classes where they were raised before, with the bases they had then.
    assert ctxactors.conversation.ModelError is ctxactors.ModelError
    assert ctxactors.conversation.ContextBudgetError is ctxactors.ContextBudgetError
    assert ctxactors.state.StoreUnavailableError is ctxactors.StoreUnavailableError
    assert ctxactors.sandbox.SandboxUnavailableError is ctxactors.SandboxUnavailableError
    assert issubclass(ctxactors.ModelError, RuntimeError)
    assert issubclass(ctxactors.SandboxUnavailableError, RuntimeError)
    assert issubclass(ctxactors.ContextBudgetError, ValueError)
    assert issubclass(ctxactors.ServerDefinitionError, TypeError)
    assert issubclass(ctxactors.DuplicateToolError, ValueError)
    codes = {e.__name__: e.code for e in (ctxactors.StoreError, ctxactors.StaleStateError)}
    assert codes == {"StoreError": -32010, "StaleStateError": -32011}


def test_every_server_error_code_is_one_the_mcp_specification_leaves_to_servers() -> None:
    # -32000..-32019 are the server's, but for -32002; -32020..-32099 are the specification's.
    errors = [getattr(ctxactors.errors, name) for name in ctxactors.errors.__all__]
    codes = {e.__name__: e.code for e in errors}
    ours = set(range(-32019, -31999)) - {-32002}
    assert {code for code in codes.values() if -32099 <= code <= -32000} <= ours
    assert codes["RuntimeClosedError"] == -32014
    assert codes["ShardUnavailableError"] == -32013


SERVERS = ["ALWAYS", "BUILTIN", "Batch", "Content", "History", "Planning", "Playbooks"]
SERVERS += ["Presets", "Workspace", "builtins_named"]
CONVERSATION = [
    "LAST_USER_QUERY",
    "SHORTENED_MARK",
    "BPETokenCounter",
    "ChatModel",
    "ChatSession",
    "ContextBudgetError",
    "FunctionCall",
    "HeuristicTokenCounter",
    "Message",
    "ModelError",
    "OpenAICompatibleModel",
    "ScriptedModel",
    "TokenCounter",
    "ToolCall",
    "build_prompt",
    "build_system_prompt",
    "count_prompt",
    "decode_messages",
    "encode_messages",
    "is_shortened",
    "latest_user_message",
    "openai_tools",
    "select_messages_within_context",
    "shorten_text",
]


def test_the_public_names_of_the_servers_and_the_conversation_are_pinned_too() -> None:
    for module, names in ((ctxactors.servers, SERVERS), (ctxactors.conversation, CONVERSATION)):
        assert module.__all__ == names, module.__name__
        for name in names:
            assert getattr(module, name) is not None, name
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)
        }
        # `annotations` is the __future__ import, not a name of the module.
        assert public - {"annotations"} == set(names), module.__name__
