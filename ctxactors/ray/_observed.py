"""The front end's call wrappers (metrics, tracing) around a call that a shard runs.

An embedded runtime runs each call's body, wrapped by `Runtime.add_call_wrapper`'s wrappers,
in the key's actor. Through the Ray backend the key's actor is in another process, so the
front end wraps a stand-in body instead: it is wrapped in the caller's thread (where the
wrappers read the trace context and the start time, as embedded) and run when the shard's
answer arrives, returning that answer. The wrappers thus see one call per tool call, with
its outcome and its whole round trip; the stand-in passed as the "server" carries
`started_ns`, when the call was sent, for a span that should cover the round trip.
"""

from __future__ import annotations

import time
from typing import Any

from ctxactors.context import ToolContext
from ctxactors.logs import lazy_logger
from ctxactors.results import ToolResult
from ctxactors.tools import ToolSpec

_log = lazy_logger("ctxactors.ray")


class ObservedReply:
    """A reply slot that passes the shard's answer through the call wrappers, then on."""

    __slots__ = ("_reply", "_body", "_answer", "deadline", "started_ns")

    def __init__(
        self, reply: Any, spec: ToolSpec, ctx: ToolContext, wrappers: tuple[Any, ...]
    ) -> None:
        self._reply = reply
        self.deadline: float | None = getattr(reply, "deadline", None)
        self.started_ns = time.time_ns()
        self._answer: Any = None
        body: Any = self._answered
        for wrapper in wrappers:
            body = wrapper(body, spec, ctx)
        self._body = body

    def _answered(self, remote: Any) -> ToolResult:
        answer = self._answer
        if isinstance(answer, ToolResult):
            return answer
        # An error the caller gets raised (the shard died, no answer in time): a failed call.
        return ToolResult.from_exception(answer)

    def set(self, answer: Any) -> None:
        self._answer = answer
        try:
            self._body(self)
        except Exception:  # noqa: BLE001 - a broken wrapper must not keep the answer back
            _log.error("call_wrapper_failed", exc_info=True)
        self._reply.set(answer)
