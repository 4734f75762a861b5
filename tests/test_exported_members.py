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
import ctxactors.state

EXPORTED = [
    "CallTimeoutError",
    "ContextBudgetError",
    "CtxActorsError",
    "DuplicateToolError",
    "InvalidArgumentsError",
    "ModelError",
    "Runtime",
    "RuntimeClosedError",
    "SandboxUnavailableError",
    "Scope",
    "Server",
    "ServerDefinitionError",
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
