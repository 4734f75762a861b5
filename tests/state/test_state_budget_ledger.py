"""The state budget's ledger beside its saves: what another process wrote (`adjust`)
moves the count of its own session only, what is charged and not yet answered is reported
in flight, and a refusal is worded whatever a purge did meanwhile.

On a `MemoryStore` (the ledger reads it once per principal): the store's own counting is
tested in test_principal_store_budget."""

from __future__ import annotations

import threading

import pytest
from structlog.testing import capture_logs

from ctxactors.settings import Cap
from ctxactors.state import MemoryStore, StoreUnavailableError, Write
from ctxactors.state_budget import RECOUNTERS, StateBudget
from ctxactors.testing import ManualClock, wait_until

SETTING = "CTXACTORS_STATE_MAX_PRINCIPAL_BYTES"
KEY = ("blobs",)


def budget_over(store: MemoryStore, cap: int = 1000) -> StateBudget:
    return StateBudget(store, Cap(SETTING, cap))


def test_another_writers_bytes_move_only_their_own_sessions_count() -> None:
    store = MemoryStore()
    store.write([Write(("alice", "s1"), KEY, b"x" * 100, 0), Write(("alice", "s2"), KEY, b"y", 0)])
    budget = budget_over(store)
    # Not counted here yet: nothing to correct, and no store query (the first charge reads).
    budget.adjust(("alice", "s1"), 50)
    assert budget.held("alice") is None
    assert budget.charge(("alice", "s1"), 10) is True
    assert budget.held("alice") == 111
    budget.adjust(("alice", "s1"), 40)  # another process grew s1's state
    budget.adjust(("alice", "s3"), 7)  # and stored a session this process never saw
    budget.adjust(("alice", "s2"), 0)
    budget.adjust((None, "s1"), 500)  # no principal: not counted
    assert budget.held("alice") == 158
    # Each session's own share: ending one frees exactly what it holds.
    budget.deleted(("alice", "s3"))
    assert budget.held("alice") == 151
    budget.deleted(("alice", "s1"))
    assert budget.held("alice") == 1
    budget.adjust(("alice", "s2"), -1)
    assert budget.held("alice") == 0


def test_what_is_charged_counts_in_flight_until_the_store_answers() -> None:
    budget = budget_over(MemoryStore())
    assert budget.in_flight("alice") == 0
    assert budget.charge(("alice", "s1"), 300) is True
    assert budget.charge(("alice", "s1"), 200) is True
    assert budget.charge(("alice", "s2"), 100) is True
    assert budget.charge(("bob", "s1"), 50) is True
    assert budget.in_flight("alice") == 600
    budget.landed(("alice", "s1"), 300, kept=True)
    assert budget.in_flight("alice") == 300
    budget.landed(("alice", "s2"), 100, kept=False)  # refused: given back
    assert budget.in_flight("alice") == 200
    assert budget.held("alice") == 500
    budget.landed(("alice", "s1"), 200, kept=True)
    assert (budget.in_flight("alice"), budget.in_flight("bob")) == (0, 50)
    assert budget.held("alice") == 500


def test_a_refusal_is_worded_after_a_purge_forgot_the_count() -> None:
    budget = budget_over(MemoryStore(), cap=1000)
    assert budget.charge(("alice", "s1"), 900) is True
    assert budget.charge(("alice", "s1"), 200) is False
    assert budget.refused("alice", 200) == (
        f"this principal's stored state would grow to 1,100 bytes: the limit is 1,000 ({SETTING})"
    )
    budget.forget()  # the retention purge, between the refusal and its message
    assert budget.refused("alice", 200) == (
        f"this principal's stored state would grow to 200 bytes: the limit is 1,000 ({SETTING})"
    )
    assert budget.refused(None, 5) == (
        f"this principal's stored state would grow to 5 bytes: the limit is 1,000 ({SETTING})"
    )


def test_ending_a_session_frees_its_bytes_and_drops_its_saves_in_flight_only() -> None:
    budget = budget_over(MemoryStore())
    assert budget.charge(("alice", "s1"), 100) is True
    assert budget.charge(("alice", "s2"), 30) is True
    budget.deleted(("alice", "never-stored"))  # ended with nothing stored: frees nothing
    assert (budget.held("alice"), budget.in_flight("alice")) == (130, 130)
    budget.deleted(("alice", "s1"))  # ended behind its save still on its way
    assert (budget.held("alice"), budget.in_flight("alice")) == (30, 30)
    # That save's answer comes after the end: it no longer counts, taken or not.
    budget.landed(("alice", "s1"), 100, kept=False)
    assert (budget.held("alice"), budget.in_flight("alice")) == (30, 30)
    budget.landed(("alice", "s2"), 30, kept=True)
    assert (budget.held("alice"), budget.in_flight("alice")) == (30, 0)
    budget.deleted(("alice", "s2"))
    budget.deleted((None, "s2"))
    assert (budget.held("alice"), budget.in_flight("alice")) == (0, 0)


class HeldCounts(MemoryStore):
    """A memory store whose `principal_bytes` waits for `gate`, noting who is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.counting: list[str] = []

    def principal_bytes(self, principal: str) -> dict[str, int]:
        self.counting.append(principal)
        assert self.gate.wait(30)
        return super().principal_bytes(principal)


def recount_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "ctxactors-recount"}


def test_at_most_two_recounts_run_at_once_and_the_rest_wait_their_turn() -> None:
    """A history flusher's writes for many principals not counted yet: their store
    queries run on at most `RECOUNTERS` threads, not one each."""
    store = HeldCounts()
    budget = budget_over(store)
    before = recount_threads()
    principals = [f"p{i}" for i in range(5)]
    for p in principals:
        assert budget.charge_counted((p, "s"), 10) is None  # not counted yet: later
    assert budget.charge_counted(("p0", "s"), 10) is None  # asked again: still once
    assert RECOUNTERS == 2
    try:
        wait_until(lambda: len(store.counting) == 2)
        assert len(recount_threads() - before) == 2
        # Daemons: a recount stuck in a slow store keeps no process from exiting.
        assert all(t.daemon for t in recount_threads() - before)
    finally:
        store.gate.set()
    wait_until(lambda: all(budget.held(p) == 0 for p in principals))
    assert sorted(store.counting) == principals  # each counted once
    wait_until(lambda: recount_threads() - before == set())  # gone once none is wanted
    assert budget.charge_counted(("p3", "s"), 10) is True
    assert budget.held("p3") == 10


def test_a_recount_thread_the_os_refused_is_started_again_on_the_next_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The OS refuses a thread once (out of threads, a pids limit): the write that wanted
    it fails, and the next write of that principal starts its recount after all."""
    store = HeldCounts()
    budget = budget_over(store)
    before = recount_threads()
    start = threading.Thread.start
    refused: list[str] = []

    def refuse_once(thread: threading.Thread) -> None:
        if thread.name == "ctxactors-recount" and not refused:
            refused.append(thread.name)
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refuse_once)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        budget.charge_counted(("alice", "s"), 10)
    assert budget.charge_counted(("alice", "s"), 10) is None  # counted on a thread now
    wait_until(lambda: store.counting == ["alice"])
    store.gate.set()
    wait_until(lambda: budget.held("alice") == 0)
    assert budget.charge_counted(("alice", "s"), 10) is True
    # The refused thread is not counted as running: two recounts run at once again.
    store.gate = threading.Event()
    wait_until(lambda: recount_threads() - before == set())
    for p in ("bob", "carol", "dave"):
        assert budget.charge_counted((p, "s"), 1) is None
    wait_until(lambda: sorted(store.counting) == ["alice", "bob", "carol"])
    assert len(recount_threads() - before) == 2
    store.gate.set()
    wait_until(lambda: all(budget.held(p) == 0 for p in ("bob", "carol", "dave")))


class FailingCounts(MemoryStore):
    """A memory store whose `principal_bytes` fails while `failure` is set (an outage, or a
    bug) and is otherwise held at `gate` once the store has been read."""

    def __init__(self) -> None:
        super().__init__()
        self.failure: dict[str, BaseException] = {}
        self.read = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def principal_bytes(self, principal: str) -> dict[str, int]:
        failure = self.failure.get(principal)
        if failure is not None:
            raise failure
        stored = super().principal_bytes(principal)
        self.read.set()
        assert self.gate.wait(30)
        return stored


def test_a_recount_thread_logs_the_store_down_and_a_bug_each_with_its_principal() -> None:
    store = FailingCounts()
    store.failure = {
        "alice": StoreUnavailableError("the state store is down"),
        "bob": RuntimeError("a bug in the count"),
    }
    budget = budget_over(store)
    with capture_logs() as logs:
        assert budget.charge_counted(("alice", "s"), 10) is None
        wait_until(lambda: len(logs) == 1)
        assert budget.charge_counted(("bob", "s"), 10) is None
        wait_until(lambda: len(logs) == 2)
    assert logs == [
        {
            "logger": "ctxactors.state_budget",
            "event": "state_recount_failed",
            "principal": "alice",
            "error": "the state store is down",
            "log_level": "warning",
        },
        {
            "logger": "ctxactors.state_budget",
            "event": "state_recount_failed",
            "principal": "bob",
            "exc_info": True,  # the traceback of a bug reaches the reader
            "log_level": "error",
        },
    ]
    assert (budget.held("alice"), budget.held("bob")) == (None, None)  # asked again later


def test_a_recount_adds_a_sessions_save_in_flight_to_what_it_holds_stored() -> None:
    store = MemoryStore()
    store.write([Write(("alice", "s1"), KEY, b"x" * 100, 0)])
    budget = budget_over(store)
    assert budget.charge(("alice", "s1"), 50) is True  # s1 grows: on its way to the store
    budget.forget()  # the retention purge
    assert budget.charge(("alice", "s2"), 10) is True  # recounted: s1 is 100 stored + 50
    assert budget.held("alice") == 160
    budget.deleted(("alice", "s1"))  # its share, exactly
    assert budget.held("alice") == 10


def test_a_recount_adds_a_save_that_landed_while_the_store_was_read_to_what_it_holds() -> None:
    store = FailingCounts()
    store.write([Write(("alice", "s1"), KEY, b"x" * 100, 0)])
    budget = budget_over(store)
    assert budget.charge(("alice", "s1"), 50) is True
    budget.forget()
    store.read.clear()
    store.gate.clear()
    recount = threading.Thread(target=budget.charge, args=(("alice", "s2"), 10))
    recount.start()
    try:
        assert store.read.wait(30)  # the store is read (s1: 100), the recount not done yet
        # s1's save lands now: the read missed it.
        store.write([Write(("alice", "s1"), KEY, b"x" * 150, 1)])
        budget.landed(("alice", "s1"), 50, kept=True)
    finally:
        store.gate.set()
        recount.join(30)
    assert budget.held("alice") == 160
    assert store.principal_bytes("alice") == {"s1": 150}  # and s2's 10 still on its way
    budget.deleted(("alice", "s1"))
    assert budget.held("alice") == 10


def test_a_count_is_stale_the_moment_its_retention_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that expires sessions itself (Redis) is recounted once per retention period,
    from the very moment it has passed."""
    store = MemoryStore(retention=60)
    budget = budget_over(store)
    clock = ManualClock()
    monkeypatch.setattr(budget, "_clock", clock)
    assert budget.charge(("alice", "s1"), 10) is True  # counted now: stale 60 s from now
    budget.landed(("alice", "s1"), 10, kept=True)
    store.write([Write(("alice", "s1"), KEY, b"x" * 10, 0)])
    # Another process stores a session meanwhile, which this one never hears of.
    store.write([Write(("alice", "s2"), KEY, b"y" * 500, 0)])
    clock.advance(59.5)
    assert budget.charge(("alice", "s1"), 5) is True  # not stale yet: no store read
    budget.landed(("alice", "s1"), 5, kept=True)
    assert budget.held("alice") == 15
    clock.advance(0.5)  # exactly the retention since the count
    assert budget.charge(("alice", "s1"), 5) is True
    # Recounted: what the store holds (the 5 just landed aren't written to it) and this save.
    assert budget.held("alice") == 10 + 500 + 5


def test_a_failed_recount_leaves_no_trace_in_the_next_one() -> None:
    """A save of a principal lands after a recount of it failed (the store down): the next
    recount, which reads that save from the store, counts it once."""
    store = FailingCounts()
    budget = budget_over(store)
    assert budget.charge(("alice", "s1"), 100) is True  # on its way to the store
    budget.forget()
    store.failure["alice"] = StoreUnavailableError("down")
    with pytest.raises(StoreUnavailableError, match="^down$"):
        budget.charge(("alice", "s2"), 10)
    store.write([Write(("alice", "s1"), KEY, b"x" * 100, 0)])
    budget.landed(("alice", "s1"), 100, kept=True)
    del store.failure["alice"]
    assert budget.charge(("alice", "s2"), 10) is True
    assert budget.held("alice") == 110


def test_a_refused_recount_thread_whose_principal_another_took_meanwhile_still_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The OS refuses a second recount thread while the first, finishing its principal,
    takes the new one from the queue: the write is told the OS's error, and the principal
    is counted by the thread that took it."""
    store = HeldCounts()
    budget = budget_over(store)
    assert budget.charge_counted(("p0", "s"), 10) is None
    wait_until(lambda: store.counting == ["p0"])  # the first thread, held in the store
    start = threading.Thread.start

    def refuse_after_the_first_took_it(thread: threading.Thread) -> None:
        if thread.name != "ctxactors-recount":
            start(thread)
            return
        store.gate.set()  # the first thread counts p0, then takes alice
        wait_until(lambda: store.counting == ["p0", "alice"])
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse_after_the_first_took_it)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        budget.charge_counted(("alice", "s"), 10)
    wait_until(lambda: budget.held("alice") == 0)
    assert budget.charge_counted(("alice", "s"), 10) is True
    assert (budget.held("alice"), budget.held("p0")) == (10, 0)


class PausingLock:
    """The budget's lock, pausing one thread once, just after its `after`-th release."""

    def __init__(self, lock: threading.Lock, thread: threading.Thread, after: int = 1) -> None:
        self.lock = lock
        self.thread: threading.Thread | None = thread
        self.releases = after
        self.paused = threading.Event()
        self.resume = threading.Event()

    def __enter__(self) -> bool:
        return self.lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(*exc)  # type: ignore[arg-type]
        if threading.current_thread() is self.thread:
            self.releases -= 1
            if not self.releases:
                self.thread = None
                self.paused.set()
                assert self.resume.wait(30)


class FirstCountHeld(MemoryStore):
    """A memory store whose first `principal_bytes` is held at `gate` once read, then
    answers or fails with `failure`."""

    def __init__(self, failure: BaseException | None) -> None:
        super().__init__()
        self.failure = failure
        self.first = True
        self.reached = threading.Event()
        self.gate = threading.Event()

    def principal_bytes(self, principal: str) -> dict[str, int]:
        stored = super().principal_bytes(principal)
        if self.first:
            self.first = False
            self.reached.set()
            assert self.gate.wait(30)
            if self.failure is not None:
                raise self.failure
        return stored


@pytest.mark.parametrize("fails", [False, True], ids=["answered", "failed"])
def test_a_purge_between_a_recounts_lookup_and_its_lock_lets_two_recounts_end_well(
    monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """A purge drops the recount lock a first save has just looked up (not taken yet), so
    a second save of the principal recounts beside it and ends first: the first recount
    still ends as it would alone (counted, or the store's own error), nothing lost."""
    store = FirstCountHeld(StoreUnavailableError("down") if fails else None)
    budget = budget_over(store)
    outcome: list[object] = []

    def first_save() -> None:
        try:
            outcome.append(budget.charge(("alice", "s1"), 10))
        except StoreUnavailableError as exc:
            outcome.append(exc)

    first = threading.Thread(target=first_save)
    lock = PausingLock(budget._lock, first)  # noqa: SLF001
    monkeypatch.setattr(budget, "_lock", lock)
    first.start()
    try:
        assert lock.paused.wait(30)  # its recount lock looked up, not taken yet
        budget.forget()  # the retention purge: drops that lock, nobody holds it
        lock.resume.set()
        assert store.reached.wait(30)  # the first recount reads the store
        assert budget.charge(("alice", "s2"), 20) is True  # a second recount, beside it
    finally:
        lock.resume.set()
        store.gate.set()
        first.join(30)
    if fails:
        assert [str(exc) for exc in outcome] == ["down"]
        assert budget.held("alice") == 20
    else:
        assert outcome == [True]
        assert budget.held("alice") == 30
    assert budget.in_flight("alice") == 20 + (0 if fails else 10)


def test_a_save_of_no_bytes_lands_without_touching_the_others_in_flight() -> None:
    budget = budget_over(MemoryStore())
    assert budget.charge(("alice", "s1"), 100) is True
    assert budget.charge(("alice", "s1"), 0) is True  # no change: nothing counted
    budget.landed(("alice", "s1"), 0, kept=True)
    assert budget.in_flight("alice") == 100
    budget.landed(("alice", "s1"), 100, kept=True)
    assert (budget.in_flight("alice"), budget.held("alice")) == (0, 100)
    # Nothing is kept for saves answered: an entry per session would grow with sessions.
    assert budget._inflight == {}  # noqa: SLF001


def test_a_save_answered_after_its_principals_only_session_ended_is_ignored() -> None:
    budget = budget_over(MemoryStore())
    assert budget.charge(("alice", "s1"), 100) is True
    budget.deleted(("alice", "s1"))
    budget.landed(("alice", "s1"), 100, kept=False)
    assert (budget.held("alice"), budget.in_flight("alice")) == (0, 0)


def test_every_save_landing_while_the_store_is_read_counts() -> None:
    store = FailingCounts()
    store.write([Write(("alice", "s1"), KEY, b"x" * 100, 0)])
    budget = budget_over(store)
    assert budget.charge(("alice", "s1"), 30) is True
    assert budget.charge(("alice", "s1"), 20) is True
    budget.forget()
    store.read.clear()
    store.gate.clear()
    recount = threading.Thread(target=budget.charge, args=(("alice", "s2"), 10))
    recount.start()
    try:
        assert store.read.wait(30)  # read: s1 is 100; both saves land after it
        store.write([Write(("alice", "s1"), KEY, b"x" * 150, 1)])
        budget.landed(("alice", "s1"), 30, kept=True)
        budget.landed(("alice", "s1"), 20, kept=True)
    finally:
        store.gate.set()
        recount.join(30)
    assert budget.held("alice") == 160


def test_a_purge_between_the_two_reads_of_a_count_recounts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_charge` reads whether a principal is counted, then when its count goes stale: a
    purge in between (here: while the clock is read) leaves a principal counted no more,
    which is recounted."""
    budget = budget_over(MemoryStore())
    assert budget.charge(("alice", "s1"), 10) is True  # counted, in flight
    purged: list[bool] = []

    def purging_clock() -> float:
        if not purged:
            purged.append(True)
            budget.forget()
        return 1000.0

    monkeypatch.setattr(budget, "_clock", purging_clock)
    assert budget.charge(("alice", "s1"), 5) is True
    assert (budget.held("alice"), budget.in_flight("alice")) == (15, 15)


def test_a_save_the_store_refused_gives_back_its_own_sessions_share() -> None:
    budget = budget_over(MemoryStore())
    assert budget.charge(("alice", "s1"), 100) is True
    budget.landed(("alice", "s1"), 100, kept=True)
    assert budget.charge(("alice", "s1"), 50) is True
    budget.landed(("alice", "s1"), 50, kept=False)
    assert budget.held("alice") == 100
    budget.deleted(("alice", "s1"))  # frees exactly what s1 holds
    assert budget.held("alice") == 0


def test_a_purge_right_after_a_recount_has_the_principal_counted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    store.write([Write(("alice", "s0"), KEY, b"x" * 40, 0)])
    budget = budget_over(store)
    outcome: list[object] = []
    first = threading.Thread(target=lambda: outcome.append(budget.charge(("alice", "s1"), 10)))
    # Its recount takes the lock three times (its own lock, the landing, the count): the
    # purge comes after the third, before the charge takes the lock to count the save.
    lock = PausingLock(budget._lock, first, after=3)  # noqa: SLF001
    monkeypatch.setattr(budget, "_lock", lock)
    first.start()
    try:
        assert lock.paused.wait(30)
        assert budget.held("alice") == 40  # counted
        budget.forget()
    finally:
        lock.resume.set()
        first.join(30)
    assert outcome == [True]
    assert (budget.held("alice"), budget.in_flight("alice")) == (50, 10)
