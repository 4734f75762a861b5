"""The stored operation history: each record encoded once, the store re-read only when it
must be, the written form (compressed, the first format still read), a stale write merged,
a call read back after a restart made into its record with the tool's own extractor."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

import ctxactors.history_store as history_store_module
import ctxactors.servers.history as history_module
from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.durable import Durability
from ctxactors.errors import ToolError
from ctxactors.history_store import KEY, HistorySaver, Stored, StoredCall, unpack
from ctxactors.servers import Planning
from ctxactors.servers.history import OperationRecord, SessionHistory, runtime_config
from ctxactors.settings import Cap
from ctxactors.state import (
    MemoryStore,
    Outcome,
    SessionRef,
    SQLiteStore,
    StateStore,
    StoreUnavailableError,
    Write,
)
from ctxactors.testing import context_args as ctx_args
from ctxactors.testing import wait_until

S = "s1"
A = "a1"
SESSION = (None, S)


class Notes(Server):
    """Plain text results and failures (the planning tools return structured ones)."""

    name = "notes"
    scope = Scope.SESSION

    @tool
    def note(self, ctx: ToolContext, text: str) -> str:
        """Echo a note as plain text."""
        return f"noted: {text}"

    @tool
    def fail(self, ctx: ToolContext, why: str) -> str:
        """Always fails."""
        raise ToolError(f"refused: {why}")


def call(rt: Runtime, tool_name: str, **args: Any) -> Any:
    return rt.call(tool_name, ctx_args(S, A, **args))


def stored(store: StateStore) -> list[Any]:
    """What the store holds for the session's history, each record without its time."""
    record = store.load(SESSION, KEY)
    assert record is not None
    items = [item for item, _ in unpack(record.data)]
    return [
        msgspec.structs.astuple(item)[1:] if isinstance(item, StoredCall) else item.op
        for item in items
    ]


def recent(rt: Runtime) -> list[tuple[str, dict[str, Any], bool, dict[str, Any]]]:
    ops = call(rt, "get_recent_context", limit=50).structured["operations"]
    return [(op["tool"], op["arguments"], op["is_error"], op["metadata"]) for op in ops]


def count_encodings(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every encoding the history makes for the store, from now on, in order."""
    encoded: list[bytes] = []
    real = history_module._encode  # noqa: SLF001

    def counting(value: Any) -> bytes:
        encoded.append(real(value))
        return encoded[-1]

    monkeypatch.setattr(history_module, "_encode", counting)
    return encoded


def test_each_record_is_encoded_once_however_many_writes_carry_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    encoded = count_encodings(monkeypatch)
    store = SQLiteStore(tmp_path / "state.db")
    written: list[bytes] = []
    with Runtime(servers=[Planning], store=store) as rt:
        assert rt.durability is not None
        for n in range(3):
            call(rt, "create_goal", goal=f"goal {n}")
            rt.durability.flush()
            record = store.load(SESSION, KEY)
            assert record is not None
            written.append(record.data)
    # Three records, three encodings: each write reused the ones made before.
    assert len(encoded) == 3
    assert [[raw for _, raw in unpack(data)] for data in written] == [
        encoded[:1],
        encoded[:2],
        encoded[:3],
    ]
    store.close()


def test_a_record_the_bound_pushes_out_before_a_write_is_never_encoded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    encoded = count_encodings(monkeypatch)
    monkeypatch.setenv("CTXACTORS_HISTORY_MAX_OPERATIONS", "3")
    store = SQLiteStore(tmp_path / "state.db")
    with Runtime(servers=[Planning], store=store) as rt:
        assert rt.durability is not None
        for n in range(10):  # a busy session: ten calls before the history is written
            call(rt, "create_goal", goal=f"goal {n}")
        assert encoded == []  # nothing is encoded on a call's path
        rt.durability.flush()
        record = store.load(SESSION, KEY)
        assert record is not None
        # Only the three the bound kept were encoded, once each, and written.
        assert [raw for _, raw in unpack(record.data)] == encoded
        assert [s[2]["goal"] for s in stored(store)] == ["goal 7", "goal 8", "goal 9"]
    store.close()


def counting_store() -> tuple[MemoryStore, list[tuple[Any, Any]]]:
    """A memory store that lists each (session, key) it is asked to load."""
    store = MemoryStore()
    loads: list[tuple[Any, Any]] = []
    real_load = store.load

    def counting_load(session: Any, key: Any) -> Any:
        loads.append((session, key))
        return real_load(session, key)

    store.load = counting_load  # type: ignore[method-assign]
    return store, loads


def test_a_call_tells_the_flusher_once_and_reads_the_store_once() -> None:
    store, loads = counting_store()
    durable = Durability(store, flush_delay=3600)  # the flusher never writes by itself
    deferred: list[object] = []
    real_defer = durable.defer

    def counting_defer(session: Any, follower: Any) -> None:
        deferred.append(session)
        real_defer(session, follower)

    durable.defer = counting_defer  # type: ignore[method-assign]
    with Runtime(servers=[Planning]) as rt:  # only for real call results to record
        config = runtime_config(rt)
        captured: list[Any] = []
        rt.add_observer(lambda *seen: captured.append(seen), before_reply=True)
        call(rt, "create_goal", goal="g")
        for n in range(100):
            call(rt, "add_todo", name=f"todo {n}", goal_id="g1")
    history = SessionHistory(config, HistorySaver(durable, SESSION), rt.tools)
    for ctx, spec, args, result in captured:
        history.record(ctx, spec, args, result)
    assert deferred == [SESSION]  # the first record told the flusher; the rest found it told
    assert loads == [(SESSION, KEY)]  # the store was read on first use only
    durable.flush()
    assert len(stored(store)) == 50  # the bound
    assert stored(store)[-1] == (
        Scope.THREAD,
        "add_todo",
        {"name": "todo 99", "goal_id": "g1"},
        '{"id":"t101","name":"todo 99","goal_id":"g1","done":false}',
        False,
        True,
        A,
        None,
    )
    durable.close()


def test_with_the_store_down_the_calls_of_a_second_try_to_read_the_history_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    loads: list[float] = []
    down = True

    def failing_load(session: Any, key: Any) -> Any:
        loads.append(now[0])
        if down:
            raise StoreUnavailableError("down")
        return None

    store.load = failing_load  # type: ignore[method-assign]
    now = [1000.0]
    monkeypatch.setattr(history_store_module.time, "monotonic", lambda: now[0])
    durable = Durability(store, flush_delay=3600)
    with Runtime(servers=[Planning]) as rt:
        config = runtime_config(rt)
        captured: list[Any] = []
        rt.add_observer(lambda *seen: captured.append(seen), before_reply=True)
        for n in range(6):
            call(rt, "create_goal", goal=f"goal {n}")
    history = SessionHistory(config, HistorySaver(durable, SESSION), rt.tools)
    for ctx, spec, args, result in captured[:3]:
        history.record(ctx, spec, args, result)  # the store is down: one read, not three
    assert loads == [1000.0]
    now[0] = 1001.0  # a second later, and the store is back: the next call reads it
    down = False
    for ctx, spec, args, result in captured[3:]:
        history.record(ctx, spec, args, result)
    assert loads == [1000.0, 1001.0]
    assert len(history.current()) == 6  # nothing recorded meanwhile was lost
    durable.close()


def test_what_is_stored_per_call_and_read_back_after_a_restart(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    with Runtime(servers=[Planning, Notes], store=store) as rt:
        call(rt, "create_goal", goal="ship")
        call(rt, "note", text="plain")
        call(rt, "fail", why="no")
        call(rt, "add_todo", name="x" * 600, goal_id="g1")  # long: recorded at once
    assert stored(store) == [
        (
            Scope.THREAD,
            "create_goal",
            {"goal": "ship"},
            '{"id":"g1","goal":"ship"}',
            False,
            True,
            A,
            None,
        ),
        # A plain text result: its metadata can't need the text, so it is not stored.
        (Scope.SESSION, "note", {"text": "plain"}, "", False, False, A, None),
        (Scope.SESSION, "fail", {"why": "no"}, "refused: no", True, False, A, None),
        [
            "thread",
            {
                "timestamp": "",
                "tool": "add_todo",
                "arguments": {"name": f"{'x' * 500}… (600 chars)", "goal_id": "g1"},
                "is_error": False,
                "metadata": {"created_todo": "t2", "goal_id": "g1"},
                "assistant_id": A,
            },
        ],
    ]
    expected = [
        (
            "add_todo",
            {"name": f"{'x' * 500}… (600 chars)", "goal_id": "g1"},
            False,
            {"created_todo": "t2", "goal_id": "g1"},
        ),
        ("fail", {"why": "no"}, True, {"error": "refused: no"}),
        ("note", {"text": "plain"}, False, {}),
        ("create_goal", {"goal": "ship"}, False, {"created_goal": "g1"}),  # its extractor
    ]
    with Runtime(servers=[Planning, Notes], store=store) as rt:
        assert recent(rt) == expected
    # A runtime without the planning tools still reads them: generic metadata (ids).
    with Runtime(servers=[Notes], store=store) as rt:
        assert recent(rt)[-1] == ("create_goal", {"goal": "ship"}, False, {"id": "g1"})
    store.close()


def test_the_stored_history_is_compressed(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    with Runtime(servers=[Planning], store=store) as rt:
        call(rt, "create_goal", goal="ship the release")
        for n in range(60):
            call(rt, "add_todo", name=f"step {n} of the release", goal_id="g1")
    record = store.load(SESSION, KEY)
    assert record is not None
    assert record.data[:1] == b"z"
    assert len(record.data) < 1000  # 50 alike records: about 6 KB of msgpack
    with Runtime(servers=[Planning], store=store) as rt:
        names = [args["name"] for _, args, _, _ in recent(rt)]
        assert names == [f"step {n} of the release" for n in range(59, 9, -1)]
    store.close()


def test_a_history_in_the_first_format_still_loads(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    wall = time.time() - 10
    first = [  # as the first format wrote them: the whole history, plain msgpack
        Stored(
            wall + n,
            [Scope.THREAD, OperationRecord("", "create_goal", {"goal": g}, False, meta, A)],
        )
        for n, (g, meta) in enumerate(
            [("one", {"created_goal": "g1"}), ("two", {"created_goal": "g2"})]
        )
    ]
    data = msgspec.msgpack.encode(first)
    assert data[:1] == b"\x92"
    assert store.write([Write(SESSION, KEY, data, 0)]) == [1]
    with Runtime(servers=[Planning], store=store) as rt:
        assert recent(rt) == [
            ("create_goal", {"goal": "two"}, False, {"created_goal": "g2"}),
            ("create_goal", {"goal": "one"}, False, {"created_goal": "g1"}),
        ]
        call(rt, "create_goal", goal="three")
    record = store.load(SESSION, KEY)
    assert record is not None and record.revision == 2 and record.data[:1] == b"z"
    # The old records are carried over byte for byte, beside the new call.
    assert [raw for _, raw in unpack(record.data)][:2] == [msgspec.msgpack.encode(s) for s in first]
    with Runtime(servers=[Planning], store=store) as rt:
        assert [args["goal"] for _, args, _, _ in recent(rt)] == ["three", "two", "one"]
    store.close()


def test_an_unreadable_stored_history_is_replaced(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    assert store.write([Write(SESSION, KEY, b"z" + b"not zlib", 0)]) == [1]
    with capture_logs() as logs, Runtime(servers=[Planning], store=store) as rt:
        assert call(rt, "create_goal", goal="fresh").structured == {"id": "g1", "goal": "fresh"}
        assert recent(rt) == [("create_goal", {"goal": "fresh"}, False, {"created_goal": "g1"})]
    assert [entry for entry in logs if entry["log_level"] == "warning"] == [
        {
            "logger": "ctxactors.history",
            "event": "history_unreadable",
            "session": [None, S],
            "error": "Error -3 while decompressing data: incorrect header check",
            "log_level": "warning",
        }
    ]
    record = store.load(SESSION, KEY)
    assert record is not None and record.revision == 2
    assert [s[1] for s in stored(store)] == ["create_goal"]
    store.close()


def test_a_stale_history_write_reloads_and_merges(tmp_path: Path) -> None:
    one, two = SQLiteStore(tmp_path / "state.db"), SQLiteStore(tmp_path / "state.db")
    with (
        Runtime(servers=[Notes], store=one) as first,
        Runtime(servers=[Notes], store=two) as second,
    ):
        assert first.durability is not None and second.durability is not None
        call(first, "note", text="a")
        first.durability.flush()  # revision 1: [a]
        call(second, "note", text="b")  # second loads [a], adds b
        second.durability.flush()  # revision 2: [a, b]
        call(first, "note", text="c")  # first still expects revision 1
        # Refused as stale: re-read, merged and written again by the same flush, with no
        # later call needed (a session gone quiet after the refusal loses nothing).
        first.durability.flush()
        assert [s[2] for s in stored(one)] == [{"text": t} for t in "abc"]
        call(first, "note", text="d")
        first.durability.flush()
        assert [s[2] for s in stored(one)] == [{"text": t} for t in "abcd"]
        record = one.load(SESSION, KEY)
        assert record is not None and record.revision == 4
    one.close()
    two.close()


def test_a_stale_history_write_counts_what_the_other_writer_stored(tmp_path: Path) -> None:
    """Refused as stale, a history is read again: the bytes the other writer stored are
    counted to its principal, and the merged write after them."""
    one, two = SQLiteStore(tmp_path / "state.db"), SQLiteStore(tmp_path / "state.db")
    session = ("alice", S)

    def note(rt: Runtime, text: str) -> None:
        assert not rt.call("note", ctx_args(S, A, text=text), principal="alice").is_error

    def stored_bytes() -> int:
        record = one.load(session, KEY)
        assert record is not None
        return len(record.data)

    with (
        Runtime(servers=[Notes], store=one) as first,
        Runtime(servers=[Notes], store=two) as second,
    ):
        assert first.durability is not None and second.durability is not None
        note(first, "a")
        first.durability.flush()
        assert first.durability.budget.held("alice") == stored_bytes()
        note(second, "b" * 500)  # the other writer stores a longer history
        second.durability.flush()
        note(first, "c")  # refused as stale, read again, merged, written
        first.durability.flush()
        assert first.durability.budget.in_flight("alice") == 0
        assert first.durability.budget.held("alice") == stored_bytes()
    one.close()
    two.close()


def captured_calls(count: int) -> list[Any]:
    """`count` real calls (create_goal) as the history's recorder sees them."""
    with Runtime(servers=[Planning]) as rt:
        captured: list[Any] = []
        rt.add_observer(lambda *seen: captured.append(seen), before_reply=True)
        for n in range(count):
            call(rt, "create_goal", goal=f"goal {n}")
    return captured


def test_the_first_use_reads_the_store_whatever_the_clock_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The monotonic clock starts anywhere (0 in a fresh time namespace): no read is held
    # back before one has failed.
    monkeypatch.setattr(history_store_module.time, "monotonic", lambda: 0.5)
    store, loads = counting_store()
    durable = Durability(store, flush_delay=3600)
    calls = captured_calls(1)
    with Runtime(servers=[Planning]) as rt:
        config = runtime_config(rt)
    history = SessionHistory(config, HistorySaver(durable, SESSION), {})
    history.record(*calls[0])
    assert loads == [(SESSION, KEY)]
    durable.flush()
    assert [s[2]["goal"] for s in stored(store)] == ["goal 0"]
    durable.close()


def test_a_history_first_used_in_a_fresh_thread_reads_the_store_at_once() -> None:
    # Only a thread answering saves puts the read off; one that never wrote a save (a new
    # worker, say) is not one of them.
    store, loads = counting_store()
    durable = Durability(store, flush_delay=3600)
    calls = captured_calls(1)
    with Runtime(servers=[Planning]) as rt:
        config = runtime_config(rt)

    def first_use() -> None:
        SessionHistory(config, HistorySaver(durable, SESSION), {}).record(*calls[0])

    fresh = threading.Thread(target=first_use)
    fresh.start()
    fresh.join(30)
    assert loads == [(SESSION, KEY)]
    durable.close()


def test_a_history_first_used_while_answering_saves_does_not_hold_up_the_store() -> None:
    # A save's caller is answered (and its call recorded) in the thread that wrote the
    # batch. A history first used there must not wait for its previous incarnation's
    # writes: they are queued behind this very thread (every save stalled save_timeout).
    durable = Durability(MemoryStore(), save_timeout=60, flush_delay=3600)
    calls = captured_calls(2)
    with Runtime(servers=[Planning]) as rt:
        config = runtime_config(rt)
    previous = SessionHistory(config, HistorySaver(durable, SESSION), {})
    previous.record(*calls[0])  # the reaped incarnation's record, still to be written
    history = SessionHistory(config, HistorySaver(durable, SESSION), {})
    other: list[int] = []

    def answered(outcome: object) -> None:
        threading.Thread(
            target=lambda: other.append(durable.commit.save(Write((None, "x"), ("k",), b"1", 0)))
        ).start()
        history.record(*calls[1])  # in the writing thread, as a save's caller is answered

    durable.commit.submit(Write(SESSION, ("k",), b"1", 0), answered)
    # Not 60 s behind a drain: the other session's save is written at once.
    wait_until(lambda: other == [1], 30, interval=0.01)
    durable.flush()  # the flusher reads, merges and writes both incarnations' records
    assert [s[2]["goal"] for s in stored(durable.store)] == ["goal 0", "goal 1"]
    durable.close()


def test_a_history_write_under_way_lands_before_its_session_is_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_pack, go = threading.Event(), threading.Event()
    real = history_store_module.pack

    def slow_pack(records: list[bytes]) -> bytes:
        in_pack.set()
        go.wait(30)
        return real(records)

    monkeypatch.setattr(history_store_module, "pack", slow_pack)
    monkeypatch.setenv("CTXACTORS_HISTORY_WRITE_DELAY", "0.01")
    store = MemoryStore()
    # end_session has gone as far as it goes while the write is held: waiting for it
    # (the fix), or deleting the session (the bug: the write lands after the delete).
    reached = threading.Event()
    real_drain, real_delete = HistorySaver.drain, store.delete_session

    def drain(saver: HistorySaver, timeout: float) -> bool:
        reached.set()
        return real_drain(saver, timeout)

    def delete_session(session: Any) -> int:
        reached.set()
        return real_delete(session)

    monkeypatch.setattr(HistorySaver, "drain", drain)
    store.delete_session = delete_session  # type: ignore[method-assign]
    with Runtime(servers=[Notes], store=store) as rt:
        call(rt, "note", text="hi")
        assert in_pack.wait(30)  # the flusher took the history and is writing it
        ended = threading.Thread(target=rt.end_session, args=(S,))
        ended.start()
        assert reached.wait(30)
        go.set()
        ended.join(30)
        assert not ended.is_alive()
        assert rt.durability is not None
        rt.durability.flush()
    # The write landed before the delete, not after it: nothing of the session is back.
    assert store.load(SESSION, KEY) is None


def test_a_record_of_an_ended_session_is_never_written_back() -> None:
    # A call still in flight when its session ended is recorded after the end: the
    # ended session's history must not come back in the store.
    durable = Durability(MemoryStore(), flush_delay=3600)
    calls = captured_calls(3)
    with Runtime(servers=[Planning]) as rt:
        config = runtime_config(rt)
    history = SessionHistory(config, HistorySaver(durable, SESSION), {})
    history.record(*calls[0])  # read from the store (nothing there), waits for the flusher
    assert durable.delete_session(SESSION) == 0  # nothing of it stored yet
    history.record(*calls[1])
    history.record(*calls[2])
    assert len(history.current()) == 3  # kept in memory while the actor lives
    durable.close()  # the flusher's last pass: whatever waits for it is written now
    assert durable.store.load(SESSION, KEY) is None


def test_nothing_is_written_blind_while_the_store_cant_be_read() -> None:
    # The store takes writes but can't be read: what it holds is unknown, so the history
    # waits (a write would replace records another incarnation stored).
    store = MemoryStore()
    real_load = store.load

    def failing_load(session: Any, key: Any) -> Any:
        raise StoreUnavailableError("down")

    store.load = failing_load  # type: ignore[method-assign]
    durable = Durability(store, flush_delay=3600)
    calls = captured_calls(1)
    with Runtime(servers=[Planning]) as rt:
        config = runtime_config(rt)
    saver = HistorySaver(durable, SESSION)
    history = SessionHistory(config, saver, {})
    history.record(*calls[0])
    durable.flush()
    assert saver.drain(1) is False  # not written: the store can't be read now
    assert real_load(SESSION, KEY) is None
    assert len(history.current()) == 1
    durable.close()


class HeldWrites(MemoryStore):
    """A memory store counting the history writes it is given, the first held at `gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.reached = threading.Event()
        self.gate = threading.Event()

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        for write in writes:
            if write.key == KEY:
                self.writes += 1
                self.reached.set()
                assert self.gate.wait(30)
        return super().write(writes)


def test_one_history_write_at_a_time_per_session() -> None:
    store = HeldWrites()
    durable = Durability(store, flush_delay=3600)
    calls = captured_calls(2)
    with Runtime(servers=[Planning]) as rt:
        config = runtime_config(rt)
    saver = HistorySaver(durable, SESSION)
    history = SessionHistory(config, saver, {})
    history.record(*calls[0])
    first = threading.Thread(target=durable.flush)
    first.start()
    try:
        assert store.reached.wait(30)  # the first write, held in the store
        history.record(*calls[1])
        # A drain's flush: the newest records wait for the write under way, which can't
        # be answered (held): the drain gives up once its timeout has passed.
        assert saver.drain(0.1) is False
    finally:
        store.gate.set()
        first.join(30)
    assert saver.drain(30) is True  # everything written now
    assert store.writes == 2
    assert [s[2]["goal"] for s in stored(store)] == ["goal 0", "goal 1"]
    durable.close()


def test_records_made_while_a_write_is_under_way_are_written_by_the_flusher_after_it() -> None:
    store = HeldWrites()
    durable = Durability(store, flush_delay=0.01)  # the flusher alone writes here
    calls = captured_calls(2)
    with Runtime(servers=[Planning]) as rt:
        config = runtime_config(rt)
    history = SessionHistory(config, HistorySaver(durable, SESSION), {})
    history.record(*calls[0])
    try:
        assert store.reached.wait(30)  # the flusher's write, held in the store
        history.record(*calls[1])  # waits for that write to be answered
    finally:
        store.gate.set()
    wait_until(lambda: store.writes == 2)
    wait_until(lambda: [s[2]["goal"] for s in stored(store)] == ["goal 0", "goal 1"])
    durable.close()


def test_a_saver_not_bound_to_its_history_yet_has_nothing_to_write() -> None:
    # Made, and followed by the durable layer, before its history binds it: a flush or
    # the end of its session meanwhile passes it by.
    durable = Durability(MemoryStore(), flush_delay=3600)
    saver = HistorySaver(durable, SESSION)  # (followed weakly: kept alive here)
    durable.flush()
    assert durable.delete_session(SESSION) == 0
    assert saver.drain(1) is True
    assert durable.store.load(SESSION, KEY) is None
    durable.close()


class CountedBy(MemoryStore):
    """A memory store noting the thread of each principal count; `down` fails them."""

    def __init__(self) -> None:
        super().__init__()
        self.counted_by: list[str] = []
        self.down = False

    def principal_bytes(self, principal: str) -> dict[str, int]:
        self.counted_by.append(threading.current_thread().name)
        if self.down:
            raise StoreUnavailableError("down")
        return super().principal_bytes(principal)


ALICE = ("alice", S)


def noted_calls(texts: Sequence[str]) -> list[Any]:
    """Real calls of the note tool, each with its `text`, as the history's recorder sees them."""
    with Runtime(servers=[Notes]) as rt:
        captured: list[Any] = []
        rt.add_observer(lambda *seen: captured.append(seen), before_reply=True)
        for text in texts:
            call(rt, "note", text=text)
    return captured


def alices_history(durable: Durability, count: int = 1) -> SessionHistory:
    with Runtime(servers=[Notes]) as rt:
        config = runtime_config(rt)
    history = SessionHistory(config, HistorySaver(durable, ALICE), {})
    for seen in noted_calls([os.urandom(600).hex() for _ in range(count)]):
        history.record(*seen)
    return history


def test_a_flush_counts_a_principal_not_counted_yet_in_its_own_thread() -> None:
    # Not the flusher: `Durability.flush` (and end_session) count in the calling thread
    # and write, rather than wait for a recounting thread.
    store = CountedBy()
    durable = Durability(store, flush_delay=3600)
    history = alices_history(durable)
    durable.flush()
    assert store.counted_by == [threading.current_thread().name]
    record = store.load(ALICE, KEY)
    assert record is not None and len(unpack(record.data)) == 1
    assert durable.budget.held("alice") == len(record.data)
    assert len(history.current()) == 1
    durable.close()


def test_a_history_whose_principal_cant_be_counted_waits_for_the_count() -> None:
    store = CountedBy()
    store.down = True
    durable = Durability(store, flush_delay=3600)
    alices_history(durable)
    durable.flush()  # the count fails: nothing written, nothing raised
    assert store.load(ALICE, KEY) is None
    store.down = False
    durable.flush()
    record = store.load(ALICE, KEY)
    assert record is not None and len(unpack(record.data)) == 1
    durable.close()


def test_a_history_refused_after_a_taken_write_is_told_once(tmp_path: Path) -> None:
    store = MemoryStore()
    durable = Durability(
        store,
        flush_delay=3600,
        max_principal_bytes=Cap("CTXACTORS_STATE_MAX_PRINCIPAL_BYTES", 2000),
    )
    history = alices_history(durable)
    durable.flush()
    written = store.load(ALICE, KEY)
    assert written is not None and len(unpack(written.data)) == 1  # taken
    with capture_logs() as logs:
        # Each record about 300 bytes stored (its text clipped): the 7th goes over.
        for seen in noted_calls([os.urandom(600).hex() for _ in range(10)]):
            history.record(*seen)
            durable.flush()  # taken while it fits, then refused each time
    refusals = [entry for entry in logs if entry["event"] == "history_not_saved"]
    assert [(e["principal"], e["session"]) for e in refusals] == [ALICE]
    # Told what the principal would hold with it: what it holds and this write.
    told = refusals[0]["error"]
    figure = told.removeprefix("this principal's stored state would grow to ").split(" ")[0]
    grown = int(figure.replace(",", ""))
    assert 2000 < grown < 2000 + 400  # one more record (about 300 bytes) went over
    assert told.endswith(
        " bytes: the limit is 2,000 (CTXACTORS_STATE_MAX_PRINCIPAL_BYTES); this session's "
        "history is kept in memory only until a write fits"
    )
    record = store.load(ALICE, KEY)
    assert record is not None and len(record.data) <= 2000
    assert len(unpack(record.data)) < 11
    assert len(history.current()) == 11  # all kept in memory
    durable.close()


def test_a_refused_history_is_not_tried_again_until_its_next_record() -> None:
    # Over the budget, the flusher's write is refused once: the records wait for the next
    # one (which writes them all), not for pass after pass of the flusher.
    store = MemoryStore()
    durable = Durability(
        store, flush_delay=0.01, max_principal_bytes=Cap("CTXACTORS_STATE_MAX_PRINCIPAL_BYTES", 100)
    )
    charged: list[tuple[SessionRef, bool | None]] = []
    charge_counted = durable.budget.charge_counted

    def counting(session: SessionRef, delta: int) -> bool | None:
        charged.append((session, taken := charge_counted(session, delta)))
        return taken

    durable.budget.charge_counted = counting  # type: ignore[method-assign]
    alices_history(durable)  # one record, over 100 bytes
    wait_until(lambda: (ALICE, False) in charged)
    # Another session's record: a pass of the flusher, which writes it and nothing else.
    with Runtime(servers=[Notes]) as rt:
        config = runtime_config(rt)
    other = SessionHistory(config, HistorySaver(durable, SESSION), {})
    other.record(*noted_calls(["hi"])[0])
    wait_until(lambda: store.load(SESSION, KEY) is not None)
    assert [taken for session, taken in charged if session == ALICE and taken is not None] == [
        False
    ]
    assert store.load(ALICE, KEY) is None
    durable.close()


def test_stored_records_a_history_never_wrote_are_skipped_and_the_rest_read(
    tmp_path: Path,
) -> None:
    op = OperationRecord("", "note", {}, False, {}, None, None)
    good = Stored(time.time() - 5, [Scope.SESSION.value, msgspec.to_builtins(op)])
    records = [
        msgspec.msgpack.encode(good),
        msgspec.msgpack.encode(Stored(time.time(), ["no such scope", {}])),
        msgspec.msgpack.encode(Stored(time.time(), [Scope.SESSION.value, {"tool": 7}])),
        msgspec.msgpack.encode(Stored(1e300, [Scope.SESSION.value, {"tool": "note"}])),
        msgspec.msgpack.encode(Stored(float("nan"), [Scope.SESSION.value, {"tool": "note"}])),
    ]
    store = SQLiteStore(tmp_path / "state.db")
    assert store.write([Write(SESSION, KEY, history_store_module.pack(records), 0)]) == [1]
    with capture_logs() as logs, Runtime(servers=[Notes], store=store) as rt:
        # The one good record is read, beside the new call; reading the history works.
        call(rt, "note", text="now")
        assert [(tool, args) for tool, args, _, _ in recent(rt)] == [
            ("note", {"text": "now"}),
            ("note", {}),
        ]
    skipped = [e for e in logs if e["event"] == "history_record_unreadable"]
    assert [(e["logger"], e["log_level"]) for e in skipped] == [
        ("ctxactors.history", "warning")
    ] * 4
    # Each says why, for whoever reads the log (the last two: the record's time).
    errors = [e["error"] for e in skipped]
    assert "no such scope" in errors[0] and "tool" in errors[1]
    assert errors[2:] == [
        "a record's time is out of range: 1e+300",
        "a record's time is out of range: nan",
    ]
    store.close()


def test_a_long_argument_key_is_clipped_in_the_record() -> None:
    record = history_module.compact({"params": {"k" * 100_000: 1}})
    (key,) = record["params"]
    assert len(key) < 600 and key.startswith("k" * 500) and key.endswith("(100000 chars)")
    assert not history_module._flat_and_small({"k" * 501: 1})  # noqa: SLF001


def test_a_reloaded_history_shows_each_assistant_and_thread_what_it_saw_before(
    tmp_path: Path,
) -> None:
    long = "y" * 600  # a call with a long argument is stored as its record (`Stored`)
    ops = [{"tool": "note", "arguments": {"text": "in a preset"}}]
    calls: list[tuple[str, str | None, str | None, str, dict[str, Any]]] = [
        (S, A, "t1", "create_goal", {"goal": "A's t1 goal"}),  # per thread
        (S, A, "t1", "add_todo", {"name": long, "goal_id": "g1"}),
        (S, A, "t2", "create_goal", {"goal": "A's t2 goal"}),
        (S, A, "t1", "note", {"text": "A's note"}),  # the session's tool
        (S, A, "t2", "note", {"text": long}),
        (S, A, "t1", "save_preset", {"name": "p", "operations": ops}),  # per assistant
        (S, A, "t2", "list_presets", {}),
        (S, "B", "t1", "create_goal", {"goal": "B's goal"}),
        (S, "B", "t1", "note", {"text": "B's note"}),
        (S, None, None, "note", {"text": "everyone's note"}),  # no assistant: everyone's
        ("s2", A, "t1", "note", {"text": "s2's note"}),
    ]
    store = SQLiteStore(tmp_path / "state.db")
    with Runtime(servers=[Planning, Notes], store=store) as rt:
        for session, assistant, thread, tool_name, args in calls:
            result = rt.call(tool_name, ctx_args(session, assistant, thread, **args))
            assert not result.is_error, result.text
    # Both stored kinds are read back: a common call as the call, the others as records.
    record = store.load(SESSION, KEY)
    assert record is not None
    kinds = [
        "call" if isinstance(item, StoredCall) else "record" for item, _ in unpack(record.data)
    ]
    assert kinds == ["call", "record", "call", "call", "record", "record", *["call"] * 4]

    def seen(rt: Runtime, session: str, assistant: str | None, thread: str | None) -> list[Any]:
        """(tool, its first argument's first 12 characters, assistant, thread), newest first."""
        result = rt.call("get_recent_context", ctx_args(session, assistant, thread, limit=50))
        assert result.structured is not None, result.text
        return [
            (
                op["tool"],
                next(iter(op["arguments"].values()), "")[:12],
                op.get("assistant_id"),
                op.get("thread_id"),
            )
            for op in result.structured["operations"]
        ]

    everyone = ("note", "everyone's n", None, None)
    a_session = [
        everyone,
        ("list_presets", "", A, "t2"),
        ("save_preset", "p", A, "t1"),
        ("note", "yyyyyyyyyyyy", A, "t2"),
        ("note", "A's note", A, "t1"),
    ]
    with Runtime(servers=[Planning, Notes], store=store) as rt:  # every history read back
        assert seen(rt, S, A, "t1") == [
            *a_session,
            ("add_todo", "yyyyyyyyyyyy", A, "t1"),
            ("create_goal", "A's t1 goal", A, "t1"),
        ]
        assert seen(rt, S, A, "t2") == [*a_session, ("create_goal", "A's t2 goal", A, "t2")]
        assert seen(rt, S, "B", "t1") == [
            everyone,
            ("note", "B's note", "B", "t1"),
            ("create_goal", "B's goal", "B", "t1"),
        ]
        assert seen(rt, S, "B", "t2") == [everyone, ("note", "B's note", "B", "t1")]
        assert seen(rt, S, None, None) == [everyone]
        assert seen(rt, "s2", A, "t1") == [("note", "s2's note", A, "t1")]
        assert seen(rt, "s2", "B", "t1") == []
        assert seen(rt, "s3", A, "t1") == []
    store.close()


def test_a_stored_history_too_large_or_cut_short_is_no_history() -> None:
    import zlib

    from ctxactors.history_store import pack

    packed = pack([msgspec.msgpack.encode(Stored(1.0, ["s", "op"]))])
    assert [r for r, _ in unpack(packed)] == [Stored(1.0, ["s", "op"])]
    # A few kB that would inflate past 64 MiB (a bomb), and a history cut short.
    bomb = b"z" + zlib.compress(b"\x90" * (64 * 1024 * 1024 + 1), 9)
    for data in (bomb, packed[:-4]):
        with pytest.raises(ValueError) as refused:
            unpack(data)
        assert str(refused.value) == "a stored history too large or cut short"


def test_a_stored_wall_time_is_as_long_ago_on_the_runtimes_clock() -> None:
    from ctxactors.history_store import wall_to_clock

    ago = wall_to_clock(time.time() - 30.0, 1000.0)
    assert 969.0 < ago <= 970.0  # 30 s before the clock's now (less the microseconds since)


def test_records_read_back_after_a_restart_are_written_as_read_not_encoded_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    with Runtime(servers=[Planning], store=store) as rt:
        for n in range(3):
            call(rt, "create_goal", goal=f"goal {n}")
    before = store.load(SESSION, KEY)
    assert before is not None
    encoded = count_encodings(monkeypatch)
    with Runtime(servers=[Planning], store=store) as rt:  # a restart
        assert rt.durability is not None
        call(rt, "create_goal", goal="goal 3")
        rt.durability.flush()
    after = store.load(SESSION, KEY)
    assert after is not None
    assert len(encoded) == 1  # only the new record
    assert [raw for _, raw in unpack(after.data)] == [
        *(raw for _, raw in unpack(before.data)),
        *encoded,
    ]
    store.close()


class Refusing(MemoryStore):
    """A memory store whose writes fail while `down` is set (reads still work)."""

    down = False

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        if self.down:
            raise StoreUnavailableError("the disk is full")
        return super().write(writes)


def test_a_history_write_that_failed_is_merged_and_written_again_once_each() -> None:
    store = Refusing()
    with Runtime(servers=[Notes], store=store) as rt:
        assert rt.durability is not None
        call(rt, "note", text="a")
        rt.durability.flush()
        store.down = True
        call(rt, "note", text="b")
        rt.durability.flush()  # refused: the history re-reads [a] and keeps b after it
        assert [s[2] for s in stored(store)] == [{"text": "a"}]
        store.down = False
        rt.durability.flush()
        assert [s[2] for s in stored(store)] == [{"text": "a"}, {"text": "b"}]
        assert [args for _, args, _, _ in recent(rt)] == [{"text": "b"}, {"text": "a"}]
