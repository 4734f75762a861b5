"""``ctxactors.testing``: what a host app uses to test its own tool servers."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

import ctxactors.testing
from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.testing import (
    ManualClock,
    await_until,
    context_args,
    context_meta,
    serve_app,
    wait_until,
)
from ctxactors.transports.http import create_app


class Notes(Server):
    name = "notes"
    scope = Scope.THREAD

    def __init__(self) -> None:
        self.notes: list[str] = []

    @tool
    def add_note(self, ctx: ToolContext, text: str) -> dict[str, Any]:
        """Keep a note."""
        self.notes.append(text)
        return {"notes": self.notes, "who": [ctx.session_id, ctx.assistant_id, ctx.thread_id]}


def test_the_public_names_are_pinned() -> None:
    assert ctxactors.testing.__all__ == [
        "ManualClock",
        "await_until",
        "context_args",
        "context_meta",
        "serve_app",
        "wait_until",
    ]


def test_a_manual_clock_moves_only_when_advanced_and_never_back() -> None:
    clock = ManualClock(start=5.0)
    assert clock() == 5.0
    clock.advance(2.5)
    assert clock() == 7.5
    with pytest.raises(ValueError, match=r"can't go back \(advance\(-1\)\)"):
        clock.advance(-1)
    assert clock() == 7.5


def test_a_manual_clock_drives_a_runtimes_reaping() -> None:
    clock = ManualClock()
    with Runtime([Notes], ttl=60, clock=clock) as rt:
        rt.call("add_note", context_args("s1", "a1", text="hi"))
        clock.advance(59)
        assert rt.reap() == 0
        clock.advance(2)
        assert rt.reap() == 1
        again = rt.call("add_note", context_args("s1", "a1", text="again"))
        assert again.structured == {"notes": ["again"], "who": ["s1", "a1", None]}


def test_context_args_and_context_meta_reach_the_tool_as_the_callers_context() -> None:
    assert context_args("s1", "a1", "t1", text="x") == {
        "text": "x",
        "__sessionId": "s1",
        "__assistantId": "a1",
        "__threadId": "t1",
    }
    assert context_meta("s1", "a1", "t1") == {
        "ctxactors/sessionId": "s1",
        "ctxactors/assistantId": "a1",
        "ctxactors/threadId": "t1",
    }
    with Runtime([Notes]) as rt:
        by_args = rt.call("add_note", context_args("s1", "a1", "t1", text="x"))
        by_meta = rt.call("add_note", {"text": "y"}, meta=context_meta("s2", "a2", "t2"))
    assert by_args.structured == {"notes": ["x"], "who": ["s1", "a1", "t1"]}
    assert by_meta.structured == {"notes": ["y"], "who": ["s2", "a2", "t2"]}


def test_wait_until_returns_the_first_truthy_value_once_another_thread_makes_it() -> None:
    box: list[int] = []
    go = threading.Event()

    def fill() -> None:
        go.wait()
        box.append(7)

    worker = threading.Thread(target=fill)
    worker.start()
    go.set()
    assert wait_until(lambda: list(box), timeout=10) == [7]
    worker.join()


def test_wait_until_says_what_it_waited_for_when_it_times_out() -> None:
    def nothing_yet() -> int:
        return 0

    with pytest.raises(TimeoutError) as caught:
        wait_until(nothing_yet, timeout=0, describe=lambda: "3 processes left")
    assert str(caught.value) == (
        "test_wait_until_says_what_it_waited_for_when_it_times_out.<locals>.nothing_yet "
        "was still 0 after 0 s: 3 processes left"
    )


def test_await_until_lets_the_event_loop_run_while_it_waits() -> None:
    async def main() -> str:
        box: list[str] = []
        asyncio.get_running_loop().call_soon(box.append, "done")
        return (await await_until(lambda: box, timeout=10))[0]

    assert asyncio.run(main()) == "done"
    with pytest.raises(TimeoutError, match="was still False after 0 s"):
        asyncio.run(await_until(lambda: False, timeout=0))


def test_serve_app_serves_real_http_until_the_block_ends() -> None:
    with Runtime([Notes]) as rt:
        with serve_app(create_app(rt)) as url:
            response = httpx.post(
                f"{url}/api/v1/tools/add_note",
                json={"text": "over http"},
                headers={"X-Session-Id": "s9", "X-Assistant-Id": "a9"},
            )
        assert response.status_code == 200
        assert response.json()["structuredContent"] == {
            "notes": ["over http"],
            "who": ["s9", "a9", None],
        }
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/healthz")
