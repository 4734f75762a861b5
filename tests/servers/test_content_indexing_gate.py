"""One principal indexes content in at most ``content.max_principal_indexing`` sessions at
once (`ctxactors.servers.content_gate`): its other adds wait their turn, another
principal's don't, and callers with no principal are not gated. The content tools that
index are blocking tools, so the waiting holds no worker of the key pool.

Proved with the runtime's own gate held by the test, never by timing.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest

from ctxactors import Runtime, Settings
from ctxactors.servers.content import Content
from ctxactors.servers.content_gate import BACKGROUND_BYTES, NICE, IndexGate
from ctxactors.settings import ContentSettings
from ctxactors.testing import context_args, wait_until


def in_thread(target: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(target()))
    thread.start()
    return thread, out


def test_a_principals_second_index_build_waits_for_its_first_and_another_principals_does_not() -> (
    None
):
    with Runtime([Content]) as rt:
        gate = Content._gates[rt]
        assert gate.per_principal == 1  # the default
        add = {"filename": "f.txt", "content": "alpha beta gamma"}

        def call(principal: str | None, session: str, tool: str, **args: Any) -> Any:
            return rt.call(tool, context_args(session, **args), principal=principal)

        with gate.held("attacker"):  # as if one of its adds were indexing now
            waiting, got = in_thread(lambda: call("attacker", "s2", "add_content", **add))
            wait_until(lambda: gate.waiting("attacker") == 1)
            other = call("victim", "s1", "add_content", **add)
            assert other.structured == {"id": "c1", "filename": "f.txt"}
            anonymous = call(None, "s3", "add_content", **add)
            assert anonymous.structured == {"id": "c1", "filename": "f.txt"}
            assert waiting.is_alive() and gate.waiting("attacker") == 1
        waiting.join(30)
        assert got[0].structured == {"id": "c1", "filename": "f.txt"}
        assert gate.running("attacker") == 0 and gate.waiting("attacker") == 0
        found = call("attacker", "s2", "search_content", query="beta")
        assert found.structured is not None and found.structured["count"] == 1
        with gate.held("attacker"):  # a delete forgets the row from the index: gated too
            waiting, got = in_thread(lambda: call("attacker", "s2", "delete_content", id="c1"))
            wait_until(lambda: gate.waiting("attacker") == 1)
        waiting.join(30)
        assert got[0].structured == {"id": "c1", "filename": "f.txt", "deleted": True}


def test_the_gate_takes_its_bound_from_the_settings() -> None:
    settings = Settings(content=ContentSettings(max_principal_indexing=3))
    with Runtime([Content], settings=settings) as rt:
        assert Content._gates[rt].per_principal == 3


def test_the_gate_lets_per_principal_builds_in_at_once_and_refuses_a_bound_under_one() -> None:
    gate = IndexGate(2)
    inside, leave = threading.Event(), threading.Event()

    def third() -> None:
        with gate.held("p"):
            inside.set()
            leave.wait(30)

    with gate.held("p"), gate.held("p"), gate.held("q"):
        assert (gate.running("p"), gate.running("q")) == (2, 1)
        waiting, _ = in_thread(third)
        wait_until(lambda: gate.waiting("p") == 1)
        assert not inside.is_set()
    inside.wait(30)
    assert (gate.running("p"), gate.waiting("p"), gate.running("q")) == (1, 0, 0)
    leave.set()
    waiting.join(30)
    assert gate.running("p") == 0
    with pytest.raises(ValueError, match="per_principal must be at least 1, got 0"):
        IndexGate(0)


def where_and_how_nice() -> tuple[int, int, int]:
    tid = threading.get_native_id()
    return tid, os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a nice value per thread: Linux")
def test_a_large_build_runs_on_a_thread_of_lower_priority_and_a_small_one_where_it_was_asked() -> (
    None
):
    gate = IndexGate(1)
    mine = where_and_how_nice()
    assert gate.build("p", BACKGROUND_BYTES - 1, where_and_how_nice) == mine
    tid, nice, policy = gate.build("p", BACKGROUND_BYTES, where_and_how_nice)
    assert tid != mine[0] and nice == min(mine[1] + NICE, 19)
    # Its caller's policy, not SCHED_IDLE: it holds the GIL, and an idle thread waits for
    # the CPU behind anything, a tenant's idle sandboxes included, while every server thread
    # waits on it. (Its caller's, not SCHED_OTHER: the mutation runs are idle-class whole.)
    assert policy == mine[2]
    assert gate.build(None, BACKGROUND_BYTES, where_and_how_nice)[1] == nice  # not gated, still low
    with pytest.raises(ZeroDivisionError):  # the build's own failure reaches its caller
        gate.build("p", BACKGROUND_BYTES, lambda: 1 // 0)
    assert gate.running("p") == 0
