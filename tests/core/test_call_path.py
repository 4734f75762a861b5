"""The routed call's fast paths decide exactly as the general ones they stand in for."""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxactors import Runtime, Scope, Server, Settings, ToolContext, tool
from ctxactors.context import clean_args, read_context, split_context
from ctxactors.errors import CallTimeoutError, InvalidArgumentsError
from ctxactors.logs import configure_logging, flush_logs
from ctxactors.settings import ActorSettings
from ctxactors.testing import context_args as ctx_args
from ctxactors.testing import wait_until

WAIT = 10.0

# -- the context and the clean arguments, in one pass ---------------------------------------

_ids = st.sampled_from(["s1", "a b", " s", "s ", "", "\t", "é", "x" * 257, "s\x00"])
_values = st.none() | _ids | st.integers(0, 2) | st.booleans()
_names = st.sampled_from(
    [
        "__sessionId",
        "__session_id",
        "__assistantId",
        "__assistant_id",
        "__threadId",
        "__thread_id",
        "__x",
        "goal",
        "_single",
    ]
)
_metas = st.none() | st.dictionaries(
    st.sampled_from(["ctxactors/sessionId", "ctxactors/threadId", "progressToken"]),
    _values,
    max_size=3,
)


def _outcome(call: Any) -> Any:
    try:
        return call()
    except InvalidArgumentsError as exc:
        return ("refused", str(exc))


@settings(max_examples=800, deadline=None)
@given(
    st.dictionaries(_names | st.integers(0, 2), _values, max_size=6),
    _metas,
    st.sampled_from(["default", None]),
    st.none() | st.sampled_from(["alice"]),
)
def test_split_context_is_read_context_and_clean_args(
    arguments: dict[Any, Any],
    meta: dict[str, Any] | None,
    fallback: str | None,
    principal: str | None,
) -> None:
    def general() -> Any:
        ctx, spoofed, defaulted = read_context(
            arguments, meta, principal=principal, fallback=fallback
        )
        return ctx, clean_args(arguments), spoofed, defaulted

    def fast() -> Any:
        return split_context(arguments, meta, principal=principal, fallback=fallback)

    assert _outcome(fast) == _outcome(general)


# -- the reply slot a thread reuses ----------------------------------------------------------


class Held(Server):
    """Answers `hold` only once its gate opens."""

    name = "held"
    scope = Scope.SESSION
    gate = threading.Event()

    @tool
    def hold(self, ctx: ToolContext, tag: str) -> dict[str, Any]:
        """Wait for the gate."""
        assert Held.gate.wait(WAIT)
        return {"tag": tag}

    @tool
    def echo(self, ctx: ToolContext, tag: str) -> dict[str, Any]:
        """Answer at once."""
        return {"tag": tag}


def test_a_late_reply_lands_in_its_abandoned_slot_never_in_a_later_call_of_the_thread() -> None:
    Held.gate.clear()
    with Runtime([Held]) as rt:
        with pytest.raises(CallTimeoutError):
            rt.call("hold", ctx_args("s1", tag="late"), timeout=0.05)
        assert rt.call("echo", ctx_args("s2", tag="first")).structured == {"tag": "first"}
        Held.gate.set()
        wait_until(lambda: rt.stats()["inflight"] == 0)  # the late reply has been handed over
        for n in range(3):  # the same thread's next calls each get their own answer
            assert rt.call("echo", ctx_args("s2", tag=f"n{n}")).structured == {"tag": f"n{n}"}


# -- the actor threads' scheduling -----------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_actor_threads_are_scheduled_as_batch_work_and_the_callers_thread_is_untouched() -> None:
    before = os.sched_getscheduler(0)
    thread_per_key = Settings(actors=ActorSettings(scheduler="thread"))
    with Runtime([Held], settings=thread_per_key) as rt:
        assert rt.call("echo", ctx_args("s1", tag="x")).structured == {"tag": "x"}
        [entry] = rt._registry._entries.values()
        assert entry.thread is not None and entry.thread.native_id is not None
        assert os.sched_getscheduler(entry.thread.native_id) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == before


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_pool_workers_are_scheduled_as_batch_work_and_the_callers_thread_is_untouched() -> None:
    before = os.sched_getscheduler(0)
    with Runtime([Held]) as rt:

        async def main() -> Any:  # from a loop: the call goes to a worker, not run here
            return await rt.acall("echo", ctx_args("s1", tag="x"))

        assert asyncio.run(main()).structured == {"tag": "x"}
        workers = [t for t in threading.enumerate() if "-worker-" in t.name]
        assert workers and all(t.native_id is not None for t in workers)
        assert {os.sched_getscheduler(t.native_id or 0) for t in workers} == {os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == before


# -- the call's log line ---------------------------------------------------------------------


def _call_lines(out: io.StringIO) -> list[dict[str, Any]]:
    flush_logs()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return [line for line in lines if line["event"] == "tool_call"]


def test_the_writers_call_line_is_the_one_the_generic_chain_writes() -> None:
    out = io.StringIO()
    configure_logging(file=out, force=True)
    with Runtime([Held]) as rt:
        rt.call("echo", ctx_args("s1", "a1", "t1", tag="x"), principal="alice")
        # A bound context variable sends the line through structlog's own chain.
        with structlog.contextvars.bound_contextvars(request="r1"):
            rt.call("echo", ctx_args("s1", "a1", "t1", tag="x"), principal="alice")
    fast, generic = _call_lines(out)
    for line in (fast, generic):
        assert line.pop("duration_ms") >= 0
        assert line.pop("timestamp").endswith("Z")
    assert (
        list(fast)
        == list(generic)
        == [
            "logger",
            "principal",
            "session_id",
            "assistant_id",
            "thread_id",
            "tool",
            "outcome",
            "event",
            "level",
        ]
    )
    assert (
        fast
        == generic
        == {
            "logger": "ctxactors",
            "principal": "alice",
            "session_id": "s1",
            "assistant_id": "a1",
            "thread_id": "t1",
            "tool": "echo",
            "outcome": "ok",
            "event": "tool_call",
            "level": "info",
        }
    )


def test_every_call_line_of_many_threads_is_written() -> None:
    out = io.StringIO()
    configure_logging(file=out, force=True)
    with Runtime([Held]) as rt:

        def calls(session: str) -> None:
            for n in range(200):
                rt.call("echo", ctx_args(session, tag=str(n)))

        threads = [threading.Thread(target=calls, args=(f"s{t}",)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
    lines = _call_lines(out)
    assert len(lines) == 800
    assert {line["session_id"] for line in lines} == {"s0", "s1", "s2", "s3"}
    assert all(line["outcome"] == "ok" for line in lines)
