"""What one call leaves on the thread that ran it never reaches another call: a context
variable a tool sets (a structlog binding, a tracing context) stays out of every other key's
calls on the same pool worker, and a call run in place on a tool's thread (a tool calling
another key) leaves that tool's `caller_deadline` as it was, and a key whose call in place
is interrupted (Ctrl-C in the caller's thread) goes on serving.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest

from ctxactors import Runtime, Scope, Server, Settings, ToolContext, caller_deadline, tool
from ctxactors.settings import ActorSettings
from ctxactors.testing import context_args

pytestmark = pytest.mark.timeout(60)

_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


class Leaky(Server):
    """Tools that set and read a context variable, and one that calls another key."""

    name = "leaky"
    scope = Scope.SESSION
    runtime: Runtime | None = None

    @tool
    def remember(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Set the context variable (as a tool binding its log context would)."""
        _tenant.set(value)
        return {"thread": threading.get_ident()}

    @tool
    def recall(self, ctx: ToolContext) -> dict[str, Any]:
        """What the context variable holds here."""
        return {"value": _tenant.get(), "thread": threading.get_ident()}

    @tool
    def call_other(self, ctx: ToolContext, other: str) -> dict[str, Any]:
        """Call another key from inside this tool; the deadline before and after."""
        before = caller_deadline()
        assert Leaky.runtime is not None
        Leaky.runtime.call("recall", context_args(other))
        return {"before": before, "after": caller_deadline()}


def test_a_context_variable_a_tool_sets_never_reaches_another_keys_call_on_its_worker() -> None:
    async def run(rt: Runtime) -> list[dict[str, Any]]:
        # From a running loop: every call goes to the one worker, none runs in place.
        for session in ("alpha", "beta", "gamma"):
            await rt.acall("remember", context_args(session, value=f"{session}-secret"))
        return [
            (await rt.acall("recall", context_args(s))).structured
            for s in ("delta", "alpha", "beta")
        ]

    with Runtime([Leaky], settings=Settings(actors=ActorSettings(workers=1))) as rt:
        seen = asyncio.run(run(rt))
    assert len({r["thread"] for r in seen}) == 1  # one worker ran them all
    assert [r["value"] for r in seen] == [None, None, None]


@pytest.mark.parametrize("how", ["in place", "on a worker"])
def test_a_call_run_in_place_inside_a_tool_leaves_that_tools_deadline(how: str) -> None:
    with Runtime([Leaky], settings=Settings(actors=ActorSettings(workers=1))) as rt:
        Leaky.runtime = rt
        args = context_args("outer", other="inner")
        if how == "in place":
            result = rt.call("call_other", args).structured
        else:
            result = asyncio.run(rt.acall("call_other", args)).structured
    assert result is not None and result["before"] is not None
    assert result["after"] == result["before"]


def test_a_key_whose_call_in_place_is_interrupted_after_its_reply_still_serves() -> None:
    # Ctrl-C (KeyboardInterrupt) may land anywhere in the caller's thread, here in the
    # call's log line after the reply: it reaches the caller, and the key must not stay
    # marked as running (every later call of it would wait out its timeout).
    with Runtime([Leaky], call_timeout=5.0) as rt:
        rt.call("remember", context_args("alpha", value="x"))  # the key exists
        host = rt._host
        log_call = host.log_call

        def interrupted(*args: Any) -> None:
            host.log_call = log_call
            raise KeyboardInterrupt

        host.log_call = interrupted
        with pytest.raises(KeyboardInterrupt):
            rt.call("recall", context_args("alpha"))
        assert rt.call("recall", context_args("alpha")).structured["value"] is None
