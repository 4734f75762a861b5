"""``state.max_principal_bytes``: the store bytes of all of one principal's keys together.

A save that would take its principal past the budget is refused with a clear error and
changes nothing (the next read shows the old state); another principal keeps saving;
ending a session frees what it held (and always works over budget); a restarted runtime
recounts from the store (a real SQLite file, a real redis-server); many keys of one
principal saving at once are counted exactly."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from budget_support import Blobs, settled, stored

from ctxactors import Runtime
from ctxactors.cli import serve
from ctxactors.history_store import KEY as HISTORY
from ctxactors.settings import Cap, HistorySettings, Settings, StateSettings
from ctxactors.state import MemoryStore, StateStore
from ctxactors.testing import context_args

CAP = 2000
BLOB = 300  # what one `put` stores: msgpack of a 300-byte str is 303 bytes


def runtime(store: StateStore, cap: int = CAP) -> Runtime:
    # The history is written only when `settled` flushes it: the counts stay put between.
    settings = Settings(
        state=StateSettings(max_principal_bytes=cap), history=HistorySettings(write_delay=3600)
    )
    rt = Runtime([Blobs], store=store, settings=settings)
    # The runtime makes its durability with the default cap (`ctxactors._runtime` is
    # frozen): given here, as `serve` does.
    assert rt.durability is not None
    rt.durability.budget.cap = settings.state.cap("max_principal_bytes")
    return rt


def put(rt: Runtime, principal: str | None, session: str, size: int, fill: str = "x") -> Any:
    return rt.call("put", context_args(session, size=size, fill=fill), principal=principal)


def text(rt: Runtime, principal: str | None, session: str) -> str:
    result = rt.call("get", context_args(session), principal=principal)
    assert not result.is_error, result.text
    return str(result.structured["text"])


def held(rt: Runtime, principal: str) -> int | None:
    assert rt.durability is not None
    return rt.durability.budget.held(principal)


def test_over_budget_save_is_refused_and_changes_nothing(open_store: Callable[[], Any]) -> None:
    with runtime(open_store()) as rt:
        for session in ("s1", "s2", "s3"):
            assert not put(rt, "alice", session, BLOB, fill="a").is_error
        room = CAP - settled(rt, "alice")
        refused = put(rt, "alice", "s3", BLOB + room + 1, fill="b")  # one byte too many
        assert refused.is_error
        assert refused.text == (
            "not saved: this principal's stored state would grow to 2,001 bytes: the limit "
            "is 2,000 (CTXACTORS_STATE_MAX_PRINCIPAL_BYTES); nothing was changed (end the "
            "sessions this principal no longer needs to free some)"
        )
        assert text(rt, "alice", "s3") == "a" * BLOB  # the old state, in memory...
        assert held(rt, "alice") == CAP - room
        assert put(rt, "alice", "s4", room + 1).is_error  # a new key: all its bytes count
        assert text(rt, "alice", "s4") == ""
        before = settled(rt, "alice")
        # A shrink is always taken; another principal, and no principal, keep saving.
        assert not put(rt, "alice", "s3", 10).is_error
        assert held(rt, "alice") == before - stored(BLOB) + stored(10)
        assert not put(rt, "bob", "s1", 1900).is_error
        assert held(rt, "bob") == stored(1900)
        assert not put(rt, None, "s9", 5000).is_error
        # Ending a session frees what it held, its history too.
        room = CAP - settled(rt, "alice")
        assert put(rt, "alice", "s5", room).is_error
        assert rt.durability is not None
        s1 = rt.durability.store.principal_bytes("alice")["s1"]
        before = settled(rt, "alice")
        rt.end_session("s1", principal="alice")
        assert held(rt, "alice") == before - s1
        assert not put(rt, "alice", "s5", room).is_error
        settled(rt, "alice")
    with runtime(open_store()) as rt:  # what the store kept
        assert text(rt, "alice", "s3") == "x" * 10
        assert text(rt, "alice", "s5") == "x" * room
        assert text(rt, "alice", "s1") == ""


def test_end_session_works_over_a_lowered_budget(open_store: Callable[[], Any]) -> None:
    with runtime(open_store()) as rt:
        for session in ("s1", "s2", "s3"):
            assert not put(rt, "alice", session, BLOB).is_error
    with runtime(open_store(), cap=500) as rt:  # already over the new budget
        assert put(rt, "alice", "s1", BLOB + 1).is_error
        assert settled(rt, "alice") > 3 * stored(BLOB)  # recounted from the store
        assert not put(rt, "alice", "s1", 1).is_error  # shrinking is taken
        assert rt.durability is not None
        settled(rt, "alice")
        s1 = rt.durability.store.principal_bytes("alice")["s1"]
        rt.end_session("s2", principal="alice")
        rt.end_session("s3", principal="alice")
        assert held(rt, "alice") == s1  # its blobs and its history, nothing else
        assert settled(rt, "alice") == s1
        assert not put(rt, "alice", "s2", 90).is_error
        settled(rt, "alice")


def test_restart_recounts_from_the_store(open_store: Callable[[], Any]) -> None:
    with runtime(open_store()) as rt:
        assert not put(rt, "alice", "s1", BLOB).is_error
        assert not put(rt, "alice", "s2", BLOB).is_error
        assert not put(rt, "alice-2", "s1", 600).is_error  # a neighbour in key order
        assert not put(rt, "bob", "s1", 900).is_error
    store = open_store()
    history = len(store.load(("alice", "s1"), HISTORY).data)
    assert store.principal_bytes("alice") == {
        "s1": stored(BLOB) + history,
        "s2": stored(BLOB) + history,
    }
    assert store.principal_bytes("alice-2") == {"s1": stored(600) + history}
    assert store.principal_bytes("carol") == {}
    with runtime(store) as rt:
        assert held(rt, "alice") is None  # not counted before its first save here
        room = CAP - 2 * (stored(BLOB) + history)
        refused = put(rt, "alice", "s3", room)  # `room` bytes and the str header
        assert refused.is_error, "a restart must not give the principal its budget again"
        assert held(rt, "alice") == CAP - room
        assert not put(rt, "alice", "s3", BLOB).is_error
        assert held(rt, "alice") == CAP - room + stored(BLOB)
        assert not put(rt, "alice", "s1", 10).is_error  # a loaded key: its delta
        assert held(rt, "alice") == CAP - room + stored(10)
        settled(rt, "alice")


def test_many_threads_count_exactly(open_store: Callable[[], Any]) -> None:
    """Keys of one principal saving at once, growing and shrinking: the budget is never
    overshot, a full budget refuses every growth, and the count is exact at the end."""
    threads, rounds, size = 16, 30, 50
    cap = threads * stored(size)  # room for every key at `size`, not a byte more
    with runtime(open_store(), cap=cap) as rt:
        errors: list[BaseException] = []
        full_refused = [False] * threads
        peak = [0]
        barrier = threading.Barrier(threads)

        def work(n: int) -> None:
            try:
                rounds_of(n)
            except BaseException as exc:  # noqa: BLE001 - failed in the test, not the thread
                errors.append(exc)
                barrier.abort()

        def rounds_of(n: int) -> None:
            barrier.wait()
            assert not put(rt, "alice", f"s{n}", size).is_error  # together exactly the cap
            barrier.wait()
            full_refused[n] = put(rt, "alice", f"s{n}", size + 1).is_error
            barrier.wait()
            for r in range(rounds):
                put(rt, "alice", f"s{n}", size + r % 7)  # refused when full
                peak[0] = max(peak[0], held(rt, "alice") or 0)
                put(rt, "alice", f"s{n}", size - 5 - r % 5)
            assert not put(rt, "alice", f"s{n}", size - 10).is_error  # below every round's

        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert not errors, errors
        assert all(full_refused)
        assert peak[0] <= cap
        last = size - 10
        assert held(rt, "alice") == threads * stored(last)  # no history written yet
        assert rt.durability is not None
        rt.durability.flush()
        store = rt.durability.store
        sessions = [("alice", f"s{n}") for n in range(threads)]
        for session in sessions:
            assert len(store.load(session, ("blobs",)).data) == stored(last)
            # No history fits the 160 bytes left: none is written (`history_store`).
            assert store.load(session, HISTORY) is None
        assert settled(rt, "alice") == threads * stored(last)
        # With room, the next write of each session's history carries all its records.
        rt.durability.budget.cap = Cap("CTXACTORS_STATE_MAX_PRINCIPAL_BYTES", 1 << 20)
        for n in range(threads):
            assert text(rt, "alice", f"s{n}") == "x" * last  # recorded too (a call)
        rt.durability.flush()
        histories = sum(len(store.load(session, HISTORY).data) for session in sessions)
        assert held(rt, "alice") == threads * stored(last) + histories
        assert settled(rt, "alice") == threads * stored(last) + histories


def test_memory_store_counts_what_a_principal_holds() -> None:
    with runtime(MemoryStore()) as rt:
        assert not put(rt, "alice", "s1", BLOB).is_error
        assert not put(rt, "alice", "s2", 10).is_error
        assert not put(rt, "bob", "s1", 20).is_error
        assert settled(rt, "alice") == sum(rt.durability.store.principal_bytes("alice").values())
        assert rt.durability.store.principal_bytes("bob")["s1"] > stored(20)


def test_serve_takes_the_budget_from_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CTXACTORS_STATE_MAX_PRINCIPAL_BYTES", "4096")
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    with serve.build_runtime(parser.parse_args(["--data-dir", str(tmp_path)])) as rt:
        assert rt.durability is not None
        assert rt.durability.budget.cap.value == 4096
        assert rt.durability.budget.cap.setting == "CTXACTORS_STATE_MAX_PRINCIPAL_BYTES"
