"""`Durability` driven in-process, one promise at a time: a save the actor went on without
is settled before the key's next call (written, refused in time, or still being written),
its caller always answered; a server type new to the process gets its stored state as its
type; a principal's budget gets back what its refused saves were charged, and a save whose
principal can't be counted is refused; a stale save says so and is logged; a touch the
store refused is sent again; the retention purge's period and count; the peek at a
session's history sees what was written behind its last call."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.durable import Durability
from ctxactors.history_store import KEY as HISTORY_KEY
from ctxactors.history_store import StoredCall, unpack
from ctxactors.results import ToolResult
from ctxactors.servers import Planning
from ctxactors.servers.planning import Goal, PlanningState
from ctxactors.settings import Cap, HistorySettings, Settings
from ctxactors.state import (
    MemoryStore,
    Outcome,
    SessionRef,
    StateKey,
    StoreUnavailableError,
    Write,
)
from ctxactors.testing import ManualClock, wait_until
from ctxactors.testing import context_args as ctx_args

S = "s1"
A = "a1"
SESSION: SessionRef = (None, S)
PLAN: StateKey = ("planning", A, None)
OTHER: SessionRef = (None, "s2")
LOGGER = "ctxactors.durable"


class GatedStore(MemoryStore):
    """A memory store whose every write waits for a permit (`let_one`), and says which
    keys it is writing (`entered`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.permits = threading.Semaphore(0)
        self.entered: list[list[StateKey]] = []

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        self.entered.append([w.key for w in writes])
        assert self.permits.acquire(timeout=30)
        return super().write(writes)

    def let_one(self) -> None:
        self.permits.release()


def state(*goals: str) -> PlanningState:
    return PlanningState([Goal(f"g{i}", g) for i, g in enumerate(goals, 1)], [], len(goals) + 1)


def stored(store: MemoryStore) -> list[str] | None:
    return stored_of(store, SESSION)


def stored_of(store: MemoryStore, session: SessionRef) -> list[str] | None:
    record = store.load(session, PLAN)
    if record is None:
        return None
    return [g.goal for g in msgspec.msgpack.decode(record.data, type=PlanningState).goals]


class Keyed:
    """One planning key on a `Durability` over a gated store, its first save ("kept")
    written; `busy()` then holds the store inside another session's write."""

    def __init__(self) -> None:
        self.store = GatedStore()
        self.durability = Durability(self.store, flush_delay=600)
        self.server = Planning()
        self.key = Planning.scope.key("planning", ToolContext(S, A))
        self.answers: list[ToolResult] = []
        assert self.durability.load(self.server, self.key) is None
        self.server.restore(state("kept"))
        self.store.let_one()
        assert self.durability.save(self.server, self.key, ToolResult.ok("kept")) is not None
        self.busy_thread: threading.Thread | None = None

    def busy(self) -> None:
        write = Write(OTHER, PLAN, b"busy", 0)
        self.busy_thread = threading.Thread(target=self.durability.commit.save, args=(write,))
        self.busy_thread.start()
        wait_until(lambda: len(self.store.entered) == 2, 30, interval=0.001)

    def save_behind(self, *goals: str, then: Callable[[ToolResult], None] | None = None) -> None:
        """A changing call whose save goes on without the actor (the store is busy)."""
        self.server.restore(state(*goals))
        done = self.answers.append if then is None else then
        assert self.durability.save(self.server, self.key, ToolResult.ok("saved"), done) is None

    def goals(self) -> list[str]:
        return [g.goal for g in self.server.snapshot().goals]

    def close(self) -> None:
        for _ in range(4):  # whatever still waits for a permit goes through
            self.store.let_one()
        if self.busy_thread is not None:
            self.busy_thread.join(30)
        self.durability.close()


@pytest.fixture
def keyed() -> Iterator[Keyed]:
    made = Keyed()
    try:
        yield made
    finally:
        made.close()


def sync(keyed: Keyed) -> None:
    """Returns once the writing thread has answered every batch before this save."""
    keyed.store.let_one()
    keyed.durability.commit.save(Write(OTHER, ("sync",), b"x", 0))


def test_the_next_call_after_a_save_answered_behind_it_runs_on_the_saved_state(
    keyed: Keyed,
) -> None:
    keyed.busy()
    keyed.save_behind("kept", "second")
    keyed.store.let_one()  # the busy write
    wait_until(lambda: len(keyed.store.entered) == 3, 30, interval=0.001)
    keyed.store.let_one()  # the save behind, written by the writer thread
    wait_until(lambda: len(keyed.answers) == 1, 30, interval=0.001)
    sync(keyed)
    assert [(a.is_error, a.text) for a in keyed.answers] == [(False, "saved")]
    # Answered and settled before the next call: it runs at once on the saved state...
    keyed.durability.save_timeout = 30
    assert keyed.durability.load(keyed.server, keyed.key) is None
    assert keyed.goals() == ["kept", "second"]
    # ...and its own save is made on the revision the one behind got.
    keyed.server.restore(state("kept", "second", "third"))
    keyed.store.let_one()
    assert keyed.durability.save(keyed.server, keyed.key, ToolResult.ok(3)) is not None
    assert stored(keyed.store) == ["kept", "second", "third"]
    assert keyed.store.load(SESSION, PLAN).revision == 3  # type: ignore[union-attr]


def test_a_save_still_queued_when_the_next_call_stops_waiting_is_refused_and_rolled_back(
    keyed: Keyed,
) -> None:
    keyed.busy()
    keyed.save_behind("kept", "lost")
    keyed.durability.save_timeout = 0.2  # the next call waits this long for it
    assert keyed.durability.load(keyed.server, keyed.key) is None
    assert [a.is_error for a in keyed.answers] == [True]
    assert keyed.answers[0].text == (
        "the state store is unavailable (the state store did not confirm the save in time); "
        "nothing was changed, retry the call later"
    )
    assert keyed.goals() == ["kept"]  # rolled back before the call ran
    keyed.store.let_one()
    keyed.busy_thread.join(30)  # type: ignore[union-attr]
    sync(keyed)
    assert stored(keyed.store) == ["kept"]  # never written
    assert keyed.store.entered == [[PLAN], [PLAN], [("sync",)]]


def test_a_save_being_written_when_the_next_call_stops_waiting_is_waited_for(
    keyed: Keyed,
) -> None:
    keyed.busy()
    keyed.save_behind("kept", "second")
    keyed.store.let_one()
    # The writer thread is writing it now (the store holds it at the gate).
    wait_until(lambda: len(keyed.store.entered) == 3, 30, interval=0.001)
    keyed.durability.save_timeout = 0.2
    loaded: list[object] = []
    waiting = threading.Thread(
        target=lambda: loaded.append(keyed.durability.load(keyed.server, keyed.key))
    )
    waiting.start()
    # Past its own wait, it goes on waiting for the write under way: its outcome decides
    # the state the call runs on (a fixed time, as nothing would show it stopped early;
    # long enough for a wait of a second to have ended).
    waiting.join(1.5)
    assert waiting.is_alive() and keyed.answers == []
    keyed.store.let_one()
    waiting.join(30)
    assert loaded == [None]
    assert [(a.is_error, a.text) for a in keyed.answers] == [(False, "saved")]
    assert keyed.goals() == ["kept", "second"] and stored(keyed.store) == ["kept", "second"]


def test_a_call_waiting_for_the_save_behind_it_goes_on_as_soon_as_it_is_written(
    keyed: Keyed,
) -> None:
    keyed.busy()
    keyed.save_behind("kept", "second")
    keyed.durability.save_timeout = 30
    loaded: list[object] = []
    waiting = threading.Thread(
        target=lambda: loaded.append(keyed.durability.load(keyed.server, keyed.key))
    )
    waiting.start()
    slot = keyed.server._ctxactors_durable  # type: ignore[attr-defined]  # noqa: SLF001
    wait_until(lambda: slot.saving is None, 30, interval=0.001)  # it is waiting now
    keyed.store.let_one()
    keyed.store.let_one()
    # Well before its 30 s: woken by the answer, not by its own timeout.
    waiting.join(10)
    assert not waiting.is_alive() and loaded == [None]
    assert keyed.goals() == ["kept", "second"]


def test_a_caller_is_answered_even_when_answering_fails(keyed: Keyed) -> None:
    keyed.busy()
    keyed.save_behind("kept", "lost")

    def broken(*_: object) -> ToolResult:
        raise RuntimeError("no answer")

    keyed.durability.answer = broken  # type: ignore[method-assign]
    keyed.store.close()  # every write fails from now on: the answer is an error
    keyed.store.let_one()
    keyed.store.let_one()
    wait_until(lambda: len(keyed.answers) == 1, 30, interval=0.001)
    assert keyed.answers[0].text == (
        "the state store is unavailable (no answer); nothing was changed, retry the call later"
    )


def test_a_failing_callback_is_logged_and_the_key_goes_on() -> None:
    with capture_logs() as logs:
        keyed = Keyed()
        try:
            keyed.busy()
            called = threading.Event()
            failure = ValueError("the caller is gone")

            def gone(_: ToolResult) -> None:
                called.set()
                raise failure

            keyed.save_behind("kept", "second", then=gone)
            keyed.store.let_one()
            keyed.store.let_one()
            assert called.wait(30)
            sync(keyed)
            assert [e for e in logs if e["log_level"] == "error"] == [
                {
                    "logger": LOGGER,
                    "event": "save_callback_failed",
                    "exc_info": failure,
                    "log_level": "error",
                }
            ]
            keyed.durability.save_timeout = 30
            assert keyed.durability.load(keyed.server, keyed.key) is None
            assert keyed.goals() == ["kept", "second"]
            assert stored(keyed.store) == ["kept", "second"]
        finally:
            keyed.close()


def test_a_server_type_new_to_the_process_gets_its_stored_state_as_its_state_type() -> None:
    # Made here, so no load in this process has decoded its state before.
    class Meeting(msgspec.Struct):
        title: str
        notes: list[str]

    class Minutes(Server):
        name = "minutes"
        scope = Scope.SESSION
        State = Meeting

        def __init__(self) -> None:
            self.meeting = Meeting("", [])

        def snapshot(self) -> Meeting:
            return self.meeting

        def restore(self, state: Meeting) -> None:
            self.meeting = state

        @tool
        def note(self, ctx: ToolContext, text: str) -> None:
            """Add a note."""
            self.meeting.notes.append(text)

    store = MemoryStore()
    kept = Meeting("plan", ["one"])
    assert store.write([Write(SESSION, ("minutes",), msgspec.msgpack.encode(kept), 0)]) == [1]
    durability = Durability(store, flush_delay=600)
    try:
        for _ in range(2):  # the type's first load, and one after it
            server = Minutes()
            assert durability.load(server, Minutes.scope.key("minutes", ToolContext(S))) is None
            assert type(server.meeting) is Meeting and server.meeting == kept
    finally:
        durability.close()


def test_a_save_another_process_got_ahead_of_is_refused_says_so_and_is_logged(
    keyed: Keyed,
) -> None:
    # Another process's save of the key, on top of the revision this one loaded.
    keyed.store.let_one()
    assert keyed.store.write([Write(SESSION, PLAN, msgspec.msgpack.encode(state("rival")), 1)])
    keyed.server.restore(state("kept", "mine"))
    keyed.store.let_one()
    with capture_logs() as logs:
        refused = keyed.durability.save(keyed.server, keyed.key, ToolResult.ok("mine"))
    assert refused is not None and refused.text == (
        "not saved: state ['planning', 'a1', None] changed under this writer: it loaded "
        "revision 1, the store holds 2; reload before saving. Another process changed this "
        "state; it is reloaded from the store, so check it and retry the call"
    )
    assert [e for e in logs if e["log_level"] != "debug"] == [
        {
            "logger": LOGGER,
            "event": "stale_state",
            "session": [None, S],
            "key": ["planning", A, None],
            "error": "state ['planning', 'a1', None] changed under this writer: it loaded "
            "revision 1, the store holds 2; reload before saving",
            "log_level": "warning",
        }
    ]
    assert keyed.goals() == ["rival"] and stored(keyed.store) == ["rival"]  # reloaded


ALICE: SessionRef = ("alice", S)


class DownStore(GatedStore):
    """A gated memory store that fails the writes of the sessions in `down`, and the reads
    of principals' counts while `counts_down`."""

    def __init__(self) -> None:
        super().__init__()
        self.down: set[SessionRef] = set()
        self.counts_down = False

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        self.entered.append([w.key for w in writes])
        assert self.permits.acquire(timeout=30)
        if any(w.session in self.down for w in writes):
            raise StoreUnavailableError("down for a moment")
        return MemoryStore.write(self, writes)

    def principal_bytes(self, principal: str) -> dict[str, int]:
        if self.counts_down:
            raise StoreUnavailableError("down for a moment")
        return super().principal_bytes(principal)


def size(*goals: str) -> int:
    return len(msgspec.msgpack.encode(state(*goals)))


UNAVAILABLE = (
    "the state store is unavailable (down for a moment); nothing was changed, retry the call later"
)


def test_a_save_refused_behind_its_actor_gives_its_principal_its_bytes_back() -> None:
    store = DownStore()
    # Room for exactly one more goal of this size: kept only if the refused one's charge
    # was given back.
    cap = size("kept", "lost")
    durability = Durability(store, flush_delay=600, max_principal_bytes=Cap("CAP", cap))
    server = Planning()
    key = Planning.scope.key("planning", ToolContext(S, A, None, "alice"))
    answers: list[ToolResult] = []
    busy: threading.Thread | None = None
    try:
        assert durability.load(server, key) is None
        server.restore(state("kept"))
        store.let_one()
        assert durability.save(server, key, ToolResult.ok("kept")) is not None
        budget = durability.budget
        assert (budget.held("alice"), budget.in_flight("alice")) == (size("kept"), 0)
        busy = threading.Thread(target=durability.commit.save, args=(Write(OTHER, PLAN, b"", 0),))
        busy.start()
        wait_until(lambda: len(store.entered) == 2, 30, interval=0.001)  # the store is busy
        server.restore(state("kept", "lost"))
        assert durability.save(server, key, ToolResult.ok("lost"), answers.append) is None
        assert (budget.held("alice"), budget.in_flight("alice")) == (cap, cap - size("kept"))
        store.down.add(ALICE)
        store.let_one()
        store.let_one()  # the save behind: refused by the store
        wait_until(lambda: len(answers) == 1, 30, interval=0.001)
        assert answers[0].text == UNAVAILABLE
        assert (budget.held("alice"), budget.in_flight("alice")) == (size("kept"), 0)
        # The next call runs on the state as saved, and has the room the refused one had.
        store.down.clear()
        assert durability.load(server, key) is None
        assert [g.goal for g in server.snapshot().goals] == ["kept"]
        server.restore(state("kept", "gain"))
        store.let_one()
        taken = durability.save(server, key, ToolResult.ok("gain"))
        assert taken is not None and not taken.is_error, taken
        assert stored_of(store, ALICE) == ["kept", "gain"]
        assert (budget.held("alice"), budget.in_flight("alice")) == (cap, 0)
    finally:
        for _ in range(4):
            store.let_one()
        if busy is not None:
            busy.join(30)
        durability.close()


def test_a_save_whose_principal_cant_be_counted_is_refused_and_changes_nothing() -> None:
    store = DownStore()
    durability = Durability(store, flush_delay=600, max_principal_bytes=Cap("CAP", 10_000))
    server = Planning()
    key = Planning.scope.key("planning", ToolContext(S, A, None, "alice"))
    try:
        assert durability.load(server, key) is None
        store.counts_down = True  # the principal's first save here must read its count
        server.restore(state("lost"))
        refused = durability.save(server, key, ToolResult.ok("lost"))
        assert refused is not None and refused.text == UNAVAILABLE
        assert server.snapshot().goals == []  # rolled back
        assert stored_of(store, ALICE) is None and store.entered == []
        assert durability.budget.held("alice") is None
        store.counts_down = False  # the store is back: the call, retried, is saved
        server.restore(state("kept"))
        store.let_one()
        assert durability.save(server, key, ToolResult.ok("kept")) is not None
        assert stored_of(store, ALICE) == ["kept"]
        assert durability.budget.held("alice") == size("kept")
    finally:
        durability.close()


class Told:
    """A session listener recording what it is told."""

    def __init__(self) -> None:
        self.touches: list[list[SessionRef]] = []
        self.purges: list[float] = []

    def touched(self, sessions: list[SessionRef]) -> None:
        self.touches.append(sorted(sessions, key=str))

    def deleted(self, session: SessionRef) -> None:
        pass

    def purge(self, retention: float) -> None:
        self.purges.append(retention)


def test_the_purge_runs_at_most_once_per_period_and_says_what_it_forgot() -> None:
    clock = ManualClock(1000.0)
    store = MemoryStore(retention=100, clock=clock)
    store.write([Write(SESSION, PLAN, b"a", 0), Write(OTHER, PLAN, b"b", 0)])
    told = Told()
    with capture_logs() as logs:
        durability = Durability(store, clock=clock, flush_delay=600)
        durability.listen(told)
        try:
            clock.advance(100)  # both sessions past their retention now
            # Not yet: the period since the last purge (or the start) has not passed.
            for _ in range(2):
                assert durability.purge(every=101) == 0
            assert told.purges == []
            clock.advance(1)
            assert durability.purge(every=101) == 2  # exactly one period since the start
            assert told.purges == [100]
            assert [e for e in logs if e["event"] == "sessions_purged"] == [
                {"logger": LOGGER, "event": "sessions_purged", "sessions": 2, "log_level": "info"}
            ]
            assert durability.purge(every=0) == 0  # nothing left: nothing logged
            assert len([e for e in logs if e["event"] == "sessions_purged"]) == 1
            assert store.load(SESSION, PLAN) is None and store.load(OTHER, PLAN) is None
        finally:
            durability.close()


def test_a_used_session_is_touched_once_per_touch_period_across_purges() -> None:
    clock = ManualClock(1000.0)
    store = MemoryStore(retention=100, clock=clock)  # a touch at most once a second
    durability = Durability(store, clock=clock, flush_delay=600)
    told = Told()
    durability.listen(told)
    try:
        durability.used(SESSION)
        durability.flush()
        clock.advance(0.5)
        assert durability.purge(every=0) == 0  # touches what waits (nothing) and the live
        durability.used(SESSION)  # half a second after its touch: none again
        durability.flush()
        assert told.touches == [[SESSION], []]
        clock.advance(0.5)
        durability.used(SESSION)  # a second after: touched again
        durability.flush()
        assert told.touches == [[SESSION], [], [SESSION]]
    finally:
        durability.close()


class TouchDown(MemoryStore):
    """A memory store whose touches fail while `down`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.down = False

    def touch(self, sessions: Any) -> None:
        if self.down:
            raise StoreUnavailableError("down for a moment")
        super().touch(sessions)


def test_a_touch_the_store_refused_is_logged_and_sent_again_on_the_next_use() -> None:
    clock = ManualClock(1000.0)
    store = TouchDown(retention=100, clock=clock)  # a touch at most once a second
    durability = Durability(store, clock=clock, flush_delay=600)
    told = Told()
    durability.listen(told)
    failed = {
        "logger": LOGGER,
        "event": "touch_failed",
        "error": "down for a moment",
        "log_level": "warning",
    }
    try:
        with capture_logs() as logs:
            store.down = True
            durability.used(SESSION)
            durability.flush()
            assert [e for e in logs if e["log_level"] != "debug"] == [failed]
            store.down = False
            durability.used(SESSION)  # at once: the touch that failed is sent again
            durability.flush()
            assert told.touches == [[SESSION], [SESSION]]
            # A purge pass during an outage, sending the touch of a session used a period
            # ago (no longer remembered as touched): the pass still ends, and says why.
            store.down = True
            durability.used(OTHER)
            clock.advance(1)
            assert durability.purge(every=0) == 0
            assert told.touches == [[SESSION], [SESSION], [OTHER]]
            assert [e for e in logs if e["log_level"] != "debug"] == [failed, failed]
            store.down = False
            durability.used(OTHER)
            durability.flush()
            assert told.touches == [[SESSION], [SESSION], [OTHER], [OTHER]]
    finally:
        durability.close()


def test_the_peek_at_a_sessions_history_sees_its_last_call(tmp_path: Any) -> None:
    store = MemoryStore()
    # The history is written behind the calls, here not before 10 minutes.
    settings = Settings(history=HistorySettings(write_delay=600))
    with Runtime([Planning], store=store, settings=settings) as rt:
        assert rt.durability is not None
        answer = rt.call("create_goal", ctx_args(S, A, goal="one"))
        assert answer.structured == {"id": "g1", "goal": "one"}
        assert store.load(SESSION, HISTORY_KEY) is None  # not written yet
        record = rt.durability.load_written(SESSION, HISTORY_KEY)
        assert record is not None and record.revision == 1
        calls = [r for r, _ in unpack(record.data) if isinstance(r, StoredCall)]
        assert [c.tool for c in calls] == ["create_goal"]
        assert rt.durability.load_written(OTHER, HISTORY_KEY) is None  # no such session
        assert rt.durability.load_written(SESSION, ("planning", "nobody", None)) is None


def test_ending_a_session_never_used_deletes_nothing_and_leaves_no_trace() -> None:
    clock = ManualClock(1000.0)
    store = MemoryStore(retention=100, clock=clock)
    durability = Durability(store, clock=clock, flush_delay=600)
    try:
        assert durability.delete_session((None, "never")) == 0
        clock.advance(100)
        assert store.purge() == 0  # not even an empty session was left behind
    finally:
        durability.close()


def test_ending_a_session_while_the_store_stays_busy_fails_in_time(keyed: Keyed) -> None:
    keyed.busy()
    keyed.durability.save_timeout = 0.2  # how long the delete waits for what is queued
    with pytest.raises(StoreUnavailableError) as refused:
        keyed.durability.delete_session(SESSION)
    assert str(refused.value) == (
        "the state store did not answer: the state store did not confirm the save in time"
    )
    keyed.store.let_one()
    keyed.busy_thread.join(30)  # type: ignore[union-attr]
    assert stored(keyed.store) == ["kept"]  # not deleted: the caller may retry


class Settable(Server):
    """A state kept in its attributes, which a call may set to anything."""

    name = "settable"

    def __init__(self) -> None:
        self.value: Any = ""

    @tool
    def put_value(self, ctx: ToolContext, kind: str) -> dict[str, Any]:
        """Set the value: a text, or a lock (which can't be saved)."""
        self.value = threading.Lock() if kind == "lock" else kind
        return {"value": kind}

    @tool(read_only=True)
    def value_now(self, ctx: ToolContext) -> dict[str, Any]:
        """The value."""
        return {"value": self.value if isinstance(self.value, str) else "?"}


def test_a_state_that_cant_be_encoded_is_rolled_back_to_the_saved_one() -> None:
    with Runtime([Settable], store=MemoryStore()) as rt:
        assert not rt.call("put_value", ctx_args("s1", kind="one")).is_error
        refused = rt.call("put_value", ctx_args("s1", kind="lock"))
        assert (refused.is_error, refused.text) == (
            True,
            "not saved: the state of Settable can't be encoded (Encoding objects of type "
            "_thread.lock is unsupported); nothing was changed",
        )
        assert rt.call("value_now", ctx_args("s1")).structured == {"value": "one"}
        assert not rt.call("put_value", ctx_args("s1", kind="two")).is_error
        assert rt.call("value_now", ctx_args("s1")).structured == {"value": "two"}
