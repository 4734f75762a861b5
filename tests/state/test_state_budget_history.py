"""``state.max_principal_bytes`` covers the history a session writes behind its calls.

A principal at its budget that opens session after session (many threads at once) stores
no new history: every call still gets its result, and its record stays in the session's
live history (``get_recent_context`` reads it), while the store and the count stay
exactly where they were; another principal's histories are written as before. Ending a
session makes room, and the refused session's next write carries all its records. A real
SQLite file and a real redis-server."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from budget_support import Blobs, settled
from structlog.testing import capture_logs

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.history_store import KEY as HISTORY
from ctxactors.servers.history import History
from ctxactors.settings import Cap, HistorySettings, Settings, StateSettings
from ctxactors.state import StateStore
from ctxactors.testing import context_args

SETTING = "CTXACTORS_STATE_MAX_PRINCIPAL_BYTES"
THREADS, SESSIONS, CALLS = 8, 4, 3  # per thread: new sessions, and calls in each


class Echo(Server):
    """A server with no state: its calls store nothing but their history."""

    name = "echo"
    scope = Scope.SESSION

    @tool(read_only=True)
    def echo(self, ctx: ToolContext, word: str) -> dict[str, Any]:
        """Say `word` back."""
        return {"word": word}


def runtime(store: StateStore) -> Runtime:
    # The history is written only when the test flushes it: nothing moves between.
    settings = Settings(
        state=StateSettings(max_principal_bytes=20_000), history=HistorySettings(write_delay=3600)
    )
    rt = Runtime([Blobs, Echo, History], store=store, settings=settings)
    assert rt.durability is not None
    rt.durability.budget.cap = settings.state.cap("max_principal_bytes")  # as `serve` does
    return rt


def call(rt: Runtime, principal: str, session: str, tool_name: str, **args: Any) -> Any:
    return rt.call(tool_name, context_args(session, **args), principal=principal)


def recent(rt: Runtime, principal: str, session: str) -> list[str]:
    result = call(rt, principal, session, "get_recent_context")
    assert not result.is_error, result.text
    # Newest first, as ``get_recent_context`` answers: oldest first here.
    return [op["arguments"]["word"] for op in reversed(result.structured["operations"])]


def in_threads(work: Callable[[int], None], threads: int = THREADS) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def run(n: int) -> None:
        try:
            barrier.wait()
            work(n)
        except BaseException as exc:  # noqa: BLE001 - failed in the test, not the thread
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors


def test_a_principal_at_its_budget_stores_no_new_session_history(
    open_store: Callable[[], Any],
) -> None:
    with runtime(open_store()) as rt:
        assert rt.durability is not None
        store, budget = rt.durability.store, rt.durability.budget
        assert not call(rt, "alice", "s0", "put", size=8000).is_error
        full = settled(rt, "alice")
        # Alice holds exactly her budget (no growth fits); bob, with the same budget, has
        # room for all his sessions.
        budget.cap = Cap(SETTING, full)
        new = [f"n{t}-{i}" for t in range(THREADS) for i in range(SESSIONS)]

        def open_sessions(t: int, principal: str) -> None:
            for i in range(SESSIONS):
                for c in range(CALLS):
                    word = f"{principal}-{t}-{i}-{c}"
                    result = call(rt, principal, f"n{t}-{i}", "echo", word=word)
                    assert not result.is_error, result.text
                    assert result.structured == {"word": word}  # the result is never lost

        with capture_logs() as logs:
            in_threads(lambda t: open_sessions(t, "alice"))
            in_threads(lambda t: open_sessions(t, "bob"))
            rt.durability.flush()
        for session in new:
            assert store.load(("alice", session), HISTORY) is None, session
            assert store.load(("bob", session), HISTORY) is not None, session
        assert settled(rt, "alice") == full
        assert store.principal_bytes("alice") == {"s0": full}
        assert settled(rt, "bob") == sum(store.principal_bytes("bob").values())
        assert sorted(store.principal_bytes("bob")) == sorted(new)
        # Each refused session told once, in the budget's own words, to alice only.
        refusals = [e for e in logs if e["event"] == "history_not_saved"]
        assert sorted(e["session"] for e in refusals) == sorted(new)
        assert {e["principal"] for e in refusals} == {"alice"}
        for event in refusals:
            assert event["error"].startswith("this principal's stored state would grow to ")
            assert event["error"].endswith(
                f": the limit is {full:,} ({SETTING}); this session's history is kept "
                "in memory only until a write fits"
            )
        # The records stay in each live session's history.
        for t in range(THREADS):
            for i in range(SESSIONS):
                words = [f"alice-{t}-{i}-{c}" for c in range(CALLS)]
                assert recent(rt, "alice", f"n{t}-{i}") == words
        rt.durability.flush()
        assert settled(rt, "alice") == full  # reading them stored nothing either

        # Over its budget, a shrink and ending a session are taken; then the refused
        # session's next write fits, and carries every record it kept.
        assert not call(rt, "alice", "s0", "put", size=10).is_error
        rt.end_session("s0", principal="alice")
        assert settled(rt, "alice") == 0
        assert not call(rt, "alice", "n0-0", "echo", word="after").is_error
        held = settled(rt, "alice")
        record = store.load(("alice", "n0-0"), HISTORY)
        assert record is not None and held == len(record.data)
        assert store.principal_bytes("alice") == {"n0-0": held}
    with runtime(open_store()) as rt:  # what the store kept: a restart reads it back
        words = [f"alice-0-0-{c}" for c in range(CALLS)]
        assert recent(rt, "alice", "n0-0") == [*words, "after"]
        assert recent(rt, "alice", "n0-1") == []
