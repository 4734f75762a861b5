"""A restart reads no stored session: ``ctxactors serve``'s startup (open the SQLite store,
construct the runtime with every built-in server) runs no statement over the stored sessions,
so it costs the same with ten thousand of them or a million (`scripts/bench_restart.py`
times it), and a session's first call reads that session's own rows only.

Every statement SQLite runs on the store's file is recorded (the expanded SQL, values in
place), so a scan anywhere (a count, an index of sessions, a retention purge or a cache
warmed at startup) shows, whatever its code path."""

from __future__ import annotations

import argparse
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxactors import Runtime
from ctxactors.cli import serve
from ctxactors.state import open_store

SESSIONS = 12


def fill(data: Path) -> None:
    """Stored sessions made as a host makes them: a goal, a todo, a document, their history."""
    store = open_store("sqlite", data_dir=data, retention=3600)
    assert store is not None
    with Runtime(store=store) as rt:
        for i in range(SESSIONS):
            c = {"__sessionId": f"s{i}", "__assistantId": "a1"}
            rt.call("create_goal", {"goal": f"goal of s{i}", **c})
            rt.call("add_todo", {"name": "write it", "goal_id": "g1", **c})
            rt.call("add_content", {"filename": "notes.md", "content": f"notes of s{i}", **c})
    store.close()


def trace_store(monkeypatch: pytest.MonkeyPatch, db: Path) -> list[str]:
    """Each statement run on connections to `db` (the store's, its checkpointer's), as run."""
    statements: list[str] = []
    connect: Callable[..., sqlite3.Connection] = sqlite3.connect

    def tracing(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = connect(database, *args, **kwargs)
        if Path(database) == db:
            connection.set_trace_callback(statements.append)
        return connection

    monkeypatch.setattr(sqlite3, "connect", tracing)
    return statements


def serve_runtime(data: Path) -> Runtime:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return serve.build_runtime(parser.parse_args(["--data-dir", str(data)]))


def sessions_named(statements: list[str]) -> set[str]:
    """The session ids in the statements (a session is stored as the JSON ``[null,"id"]``)."""
    return {m for s in statements for m in re.findall(r'\[null,"([^"]*)"\]', s)}


def test_startup_reads_no_stored_session_and_a_first_call_reads_only_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    fill(data)
    statements = trace_store(monkeypatch, data / "state.db")
    rt = serve_runtime(data)
    try:
        at_startup = list(statements)
        # Opening is settings and the schema (CREATE ... IF NOT EXISTS), nothing that reads
        # a table's rows; the checkpointer's PRAGMAs may run meanwhile.
        assert at_startup, "the store's statements were not traced"
        assert [
            s for s in at_startup if not s.lstrip().upper().startswith(("PRAGMA", "CREATE"))
        ] == []
        assert all("IF NOT EXISTS" in s for s in at_startup if s.lstrip().startswith("CREATE"))

        statements.clear()
        c = {"__sessionId": "s7", "__assistantId": "a1"}
        state = rt.call("get_planning_state", c).structured
        assert state == {
            "goals": [{"id": "g1", "goal": "goal of s7"}],
            "todos": [{"id": "t2", "name": "write it", "goal_id": "g1", "done": False}],
        }
        listed = rt.call("list_content", c).structured
        assert listed is not None and [i["filename"] for i in listed["items"]] == ["notes.md"]
        assert sessions_named(statements) == {"s7"}
        assert not [s for s in statements if "FROM" in s.upper() and "WHERE" not in s.upper()]
    finally:
        rt.close()
        if rt.store is not None:
            rt.store.close()
