"""A recount of a principal's stored bytes (after a purge, or once per retention period on
Redis) loses no save still on its way to the store, and holds up no other principal.

A gated store (a real SQLite file or a real redis-server behind it) holds chosen writes
and recounts open, so each test opens exactly the window it means: a save charged before
the purge and written after the recount's read, saves answered while the read is under
way, and one principal's slow recount beside another's first save. Every test ends with
the count equal to what the store holds."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from budget_support import Blobs, settled, stored

from ctxactors import Runtime
from ctxactors.settings import HistorySettings, Settings, StateSettings
from ctxactors.state import Outcome, SessionRef, StateStore, Write
from ctxactors.state_budget import StateBudget
from ctxactors.testing import context_args, wait_until

THREADS = 8


class Gate:
    """A point where a store's thread waits until the test opens it."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def pass_through(self) -> None:
        self.reached.set()
        if not self.opened.wait(30):
            raise TimeoutError("the test never opened this gate")


class GatedStore:
    """A real store whose writes of chosen sessions wait at `writes`, and whose recounts
    of chosen principals wait at `reads` once the store has answered them."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.retention = store.retention
        self.writes: dict[SessionRef, Gate] = {}
        self.reads: dict[str, Gate] = {}

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        for write in writes:
            gate = self.writes.get(write.session)
            if gate is not None:
                gate.pass_through()
        return self.store.write(writes)

    def principal_bytes(self, principal: str) -> dict[str, int]:
        stored = self.store.principal_bytes(principal)
        gate = self.reads.get(principal)
        if gate is not None:
            gate.pass_through()  # read: whatever lands now, the read missed
        return stored

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


Gated = tuple[Runtime, GatedStore, StateBudget]


@pytest.fixture
def gated(open_store: Callable[[], Any]) -> Iterator[Gated]:
    store = GatedStore(open_store())
    # The histories are written when the test flushes them: no write it didn't mean.
    settings = Settings(
        state=StateSettings(max_principal_bytes=1 << 20), history=HistorySettings(write_delay=3600)
    )
    rt = Runtime([Blobs], store=store, settings=settings)  # type: ignore[arg-type]
    assert rt.durability is not None
    try:
        yield rt, store, rt.durability.budget
    finally:
        for gate in [*store.writes.values(), *store.reads.values()]:
            gate.opened.set()  # a failed test must not leave the runtime's threads waiting
        rt.close()


def put(rt: Runtime, principal: str, session: str, size: int) -> None:
    result = rt.call("put", context_args(session, size=size), principal=principal)
    assert not result.is_error, result.text


def in_background(work: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - failed in the test, not the thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


Worker = tuple[threading.Thread, list[BaseException]]


def hold_a_save(rt: Runtime, store: GatedStore, size: int) -> tuple[int, Gate, Worker]:
    """Alice's count with one session stored, and her save of `size` characters to
    another session held as the store writes it (charged, in flight)."""
    put(rt, "alice", "s0", 500)
    before = settled(rt, "alice")
    held = store.writes[("alice", "s1")] = Gate()
    writer = in_background(lambda: put(rt, "alice", "s1", size))
    wait_until(held.reached.is_set)
    return before, held, writer


def joined(*workers: Worker) -> None:
    for thread, errors in workers:
        thread.join()
        assert not errors, errors


def test_a_purge_keeps_the_charges_of_saves_in_flight(
    gated: Gated,
) -> None:
    rt, store, budget = gated
    # One save held as the store writes it, and many more queued behind it: all charged.
    before, held, writer = hold_a_save(rt, store, 1000)
    workers = [writer]
    workers += [
        in_background(lambda s=f"s{n}": put(rt, "alice", s, 1000))  # type: ignore[misc]
        for n in range(2, THREADS + 1)
    ]
    flying = THREADS * stored(1000)
    wait_until(lambda: budget.held("alice") == before + flying)
    # The purge forgets every count, and alice's next save recounts her from the store,
    # which holds none of those saves yet: still in flight, they count.
    budget.forget()  # what `Durability.purge` does once the store expired some session
    workers.append(in_background(lambda: put(rt, "alice", "s0", 400)))  # queued behind too
    wait_until(lambda: budget.held("alice") is not None)
    assert budget.held("alice") == before + flying + stored(400) - stored(500)
    held.opened.set()
    joined(*workers)
    assert budget.held("alice") == before + flying + stored(400) - stored(500)
    settled(rt, "alice")


def test_saves_answered_while_the_store_is_read_count(
    gated: Gated,
) -> None:
    rt, store, budget = gated
    before, held, writer = hold_a_save(rt, store, 3000)
    # The purge; alice's next save recounts, and her held save lands once the store has
    # been read (the read missed it) but before the recount is done.
    budget.forget()
    reading = store.reads["alice"] = Gate()
    recount = in_background(lambda: put(rt, "alice", "s2", 200))
    wait_until(reading.reached.is_set)
    held.opened.set()
    joined(writer)
    reading.opened.set()
    joined(recount)
    assert budget.held("alice") == before + stored(3000) + stored(200)
    settled(rt, "alice")


def test_one_principals_recount_holds_up_no_other(gated: Gated) -> None:
    rt, store, budget = gated
    slow = store.reads["bob"] = Gate()  # bob's recount: a long Redis scan, say
    bob = in_background(lambda: put(rt, "bob", "s1", 100))
    wait_until(slow.reached.is_set)
    done = [in_background(lambda n=n: put(rt, f"p{n}", "s1", 100)) for n in range(THREADS)]  # type: ignore[misc]
    wait_until(lambda: not any(thread.is_alive() for thread, _ in done))
    joined(*done)
    assert all(budget.held(f"p{n}") is not None for n in range(THREADS))
    assert budget.held("bob") is None  # still being read
    slow.opened.set()
    joined(bob)
    for principal in ["bob", *(f"p{n}" for n in range(THREADS))]:
        settled(rt, principal)
