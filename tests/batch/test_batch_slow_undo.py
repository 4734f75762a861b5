"""A transactional batch whose rollback meets a slow undo still answers by its deadline.

The undo of `Gated`'s "slow" entry waits on an event the test opens (never a sleep): the
batch must answer while it is still blocked, report it (and every undo sent after it) as
not confirmed rather than `rolled_back`, confirm the undos sent before it, and keep each
key's calls in order: a call sent after the answer runs after that key's undos.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from batch_support import WAIT, Probe, batch, by_id, probe_runtime, state

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.errors import CallTimeoutError

UNCONFIRMED = {
    "code": "compensation_failed",
    "message": "the compensation was not confirmed before the batch's deadline",
}


class Gated(Server):
    """Entries on a key of their own; undoing "slow" waits until the test opens `gate`."""

    name = "gated"
    scope = Scope.THREAD

    gate: ClassVar[threading.Event] = threading.Event()
    undoing: ClassVar[threading.Event] = threading.Event()  # the slow undo has started
    log: ClassVar[list[str]] = []  # undos done and reads run on the key, in order

    def __init__(self) -> None:
        self.entries: list[str] = []

    def _undo_add(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        if result["value"] == "slow":
            Gated.undoing.set()
            Gated.gate.wait(3 * WAIT)  # the bound only ends a test that failed to open it
        self.entries.remove(result["value"])
        Gated.log.append(f"undone {result['value']}")

    @tool(compensate=_undo_add)
    def gated_add(self, ctx: ToolContext, value: str) -> dict[str, Any]:
        """Add an entry."""
        self.entries.append(value)
        return {"value": value}

    @tool(read_only=True)
    def gated_look(self, ctx: ToolContext) -> dict[str, Any]:
        """The entries."""
        Gated.log.append("look")
        return {"entries": list(self.entries)}


@pytest.fixture
def rt() -> Iterator[Runtime]:
    Gated.gate, Gated.undoing, Gated.log = threading.Event(), threading.Event(), []
    runtime = probe_runtime(extra=[Gated])
    try:
        yield next(runtime)
    finally:
        Gated.gate.set()  # before the runtime closes: its worker is held by the undo
        runtime.close()


def _results(result: Any) -> dict[str, dict[str, Any]]:
    return {
        op_id: {k: v for k, v in r.items() if k not in ("id", "duration", "metadata")}
        for op_id, r in by_id(result).items()
    }


def _summary(result: Any) -> dict[str, int]:
    assert result.structured is not None
    return {k: v for k, v in result.structured["summary"].items() if k != "executionTime"}


def _assert_key_waits_for_the_undo(rt: Runtime, undone: list[str]) -> None:
    """The batch has answered while the slow undo still blocks: a call on its key queues
    behind it (and behind the undos sent after it), and runs once the gate opens."""
    assert Gated.undoing.is_set() and not Gated.gate.is_set()
    assert Gated.log == []  # no undo on the gated key has finished
    # A read sent now can't overlap the undo: it waits, so its caller gives up (expected;
    # a run that overlapped would answer at once). It still runs later, in order.
    with pytest.raises(CallTimeoutError):
        rt.call("gated_look", {"__sessionId": "s1"}, timeout=0.2)
    Gated.gate.set()
    assert state(rt, "gated_look") == {"entries": []}
    assert Gated.log == [*(f"undone {v}" for v in undone), "look", "look"]


def _gated(value: str) -> dict[str, Any]:
    """The result of a `gated_add` whose undo was not confirmed."""
    return {
        "tool": "gated_add",
        "status": "success",
        "data": {"value": value},
        "error": UNCONFIRMED,
    }


def test_parallel_rollback_answers_while_an_undo_blocks_and_says_which_were_confirmed(
    rt: Runtime,
) -> None:
    # In parallel: `a`, `b` and "early" (on the gated key); then "slow" (gated) after them;
    # then `c` and `d` after it; `f` fails last. Undone newest first: `c` and `d` are
    # confirmed; the undo of "slow" blocks, so the batch stops waiting at its deadline and
    # sends the rest without waiting: "early" (behind "slow" on its key), `a` and `b`.
    ops = [
        {"id": "a", "tool": "put0", "arguments": {"value": "a"}},
        {"id": "b", "tool": "put1", "arguments": {"value": "b"}},
        {"id": "early", "tool": "gated_add", "arguments": {"value": "early"}},
        {
            "id": "slow",
            "tool": "gated_add",
            "arguments": {"value": "slow"},
            "dependsOn": ["a", "b", "early"],
        },
        {"id": "c", "tool": "put2", "arguments": {"value": "c"}, "dependsOn": ["slow"]},
        {"id": "d", "tool": "put3", "arguments": {"value": "d"}, "dependsOn": ["slow"]},
        {"id": "f", "tool": "fail", "arguments": {}, "dependsOn": ["c", "d"]},
    ]
    # The rollback waits until half a margin (0.5 s) past the batch's own 3 s: well before
    # the caller's 10 s. The gate stays closed until the answer is in.
    result = batch(rt, ops, call_timeout=WAIT, parallel=True, transactional=True, timeout=3000)
    assert result.is_error

    def put(n: int, value: str, status: str) -> dict[str, Any]:
        data = {"value": value, "n": 1, "thread": None}
        done = {"tool": f"put{n}", "status": status, "data": data}
        return done if status == "rolled_back" else {**done, "error": UNCONFIRMED}

    assert _results(result) == {
        "a": put(0, "a", "success"),
        "b": put(1, "b", "success"),
        "early": _gated("early"),
        "slow": _gated("slow"),
        "c": put(2, "c", "rolled_back"),
        "d": put(3, "d", "rolled_back"),
        "f": {
            "tool": "fail",
            "status": "failed",
            "error": {"code": "tool_error", "message": "boom"},
        },
    }
    assert _summary(result) == {
        "total": 7,
        "successful": 4,
        "failed": 1,
        "skipped": 0,
        "rolledBack": 2,
    }
    # Every undo was sent before the answer: a call on each lane runs after its undo.
    assert [state(rt, f"items{n}")["items"] for n in range(4)] == [[], [], [], []]
    # Newest first across keys up to the blocked undo, the rest after it.
    assert sorted(Probe.undone[:2]) == ["c", "d"] and sorted(Probe.undone[2:]) == ["a", "b"]
    _assert_key_waits_for_the_undo(rt, ["slow", "early"])


def test_a_batch_out_of_time_answers_before_its_caller_stops_waiting(rt: Runtime) -> None:
    # The batch uses all of its caller's 5 s (`block` holds its key until the test opens
    # Probe's gate): it ends 0.5 s before the caller's deadline, and its rollback, whose undo
    # blocks, waits 0.25 s more at most. Waiting up to the caller's deadline (or for ever)
    # would leave the caller with no answer at all.
    ops = [
        {"id": "slow", "tool": "gated_add", "arguments": {"value": "slow"}},
        {"id": "blk", "tool": "block", "arguments": {"value": "v"}},
    ]
    try:
        result = batch(rt, ops, call_timeout=5.0, transactional=True)
    finally:
        Probe.gate.set()
    assert _results(result) == {
        "slow": _gated("slow"),
        "blk": {
            "tool": "block",
            "status": "failed",
            "error": {"code": "timeout", "message": "the batch ran out of time"},
        },
    }
    _assert_key_waits_for_the_undo(rt, ["slow"])
