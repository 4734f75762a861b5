"""The history flusher never recounts a principal's stored bytes itself (issue 27, finding
6): it writes every principal's histories, so one principal's slow recount (a Redis SCAN
after a purge) held there would hold up everyone's. A history whose principal isn't counted
yet has its count made on a recounting thread, and is written on a later pass."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from budget_support import Blobs
from test_state_budget_recount import Gate, GatedStore, put

from ctxactors import Runtime
from ctxactors.errors import StoreUnavailableError
from ctxactors.history_store import KEY
from ctxactors.settings import HistorySettings, Settings, StateSettings
from ctxactors.testing import context_args, wait_until


def recounters() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ctxactors-recount"]


def flushing(open_store: Callable[[], Any]) -> tuple[Runtime, GatedStore]:
    """A runtime on a gated store whose histories are written 50 ms behind the calls."""
    store = GatedStore(open_store())
    settings = Settings(
        state=StateSettings(max_principal_bytes=1 << 20), history=HistorySettings(write_delay=0.05)
    )
    return Runtime([Blobs], store=store, settings=settings), store  # type: ignore[arg-type]


def stored_bytes(store: GatedStore, principal: str) -> int:
    return sum(store.principal_bytes(principal).values())


def test_bobs_recount_does_not_hold_up_alices_history(open_store: Callable[[], Any]) -> None:
    """Bob's first history write needs his stored bytes, read from the store (held here at
    a gate): alice's history is written meanwhile, and bob's once his count is in; each
    principal's count is then what the store holds, and no recounting thread is left."""
    rt, store = flushing(open_store)
    assert rt.durability is not None
    budget = rt.durability.budget
    slow = store.reads["bob"] = Gate()
    try:
        result = rt.call("get", context_args("b1"), principal="bob")  # read-only: no key save
        assert not result.is_error
        wait_until(slow.reached.is_set)  # bob counted, on a recounting thread
        put(rt, "alice", "a1", 100)
        # The flusher's next passes write alice's history while bob's count is held.
        wait_until(lambda: store.load(("alice", "a1"), KEY) is not None)
        assert not slow.opened.is_set()
        assert store.load(("bob", "b1"), KEY) is None  # waits for bob's count
        assert budget.held("bob") is None
        assert [t.is_alive() for t in recounters()] == [True]  # bob's, nobody else's
        slow.opened.set()
        wait_until(lambda: store.load(("bob", "b1"), KEY) is not None)
        store.reads.clear()
        rt.durability.flush()  # nothing in flight: the counts are what the store holds
        bob = store.load(("bob", "b1"), KEY)
        assert bob is not None
        assert budget.held("bob") == stored_bytes(store, "bob") == len(bob.data)
        assert budget.held("alice") == stored_bytes(store, "alice")
        wait_until(lambda: not recounters())  # the recounting thread ends with its work
    finally:
        slow.opened.set()
        rt.close()


def test_a_failed_recount_is_tried_again_by_a_later_pass(open_store: Callable[[], Any]) -> None:
    """A recount the store fails (down for a moment) is logged on the recounting thread,
    and the history's next pass asks for it again: written once the store answers."""
    rt, store = flushing(open_store)
    assert rt.durability is not None
    failures = [2]
    read = store.store.principal_bytes

    def flaky(principal: str) -> dict[str, int]:
        if principal == "bob" and failures[0]:
            failures[0] -= 1
            raise StoreUnavailableError("down for a moment")
        return read(principal)

    store.store.principal_bytes = flaky  # type: ignore[method-assign]
    try:
        assert not rt.call("get", context_args("b1"), principal="bob").is_error
        wait_until(lambda: store.load(("bob", "b1"), KEY) is not None)
        assert failures == [0]
        bob = store.load(("bob", "b1"), KEY)
        assert bob is not None
        rt.durability.flush()
        assert rt.durability.budget.held("bob") == len(bob.data)
    finally:
        rt.close()


def test_a_stale_count_is_charged_while_the_recount_runs(open_store: Callable[[], Any]) -> None:
    """Counted, but stale (once per retention period): bob's history is charged against his
    last count and written while his recount is held at a gate; the recount then counts
    what the store holds, that write among it, once."""
    rt, store = flushing(open_store)
    assert rt.durability is not None
    budget = rt.durability.budget
    slow = Gate()
    try:
        put(rt, "bob", "b1", 100)  # counted, and his history written
        wait_until(lambda: store.load(("bob", "b1"), KEY) is not None)
        rt.durability.flush()
        before = budget.held("bob")
        assert before == stored_bytes(store, "bob")
        now = budget._clock  # noqa: SLF001 - a retention period passes
        budget._clock = lambda: now() + 10 * (store.retention or 1.0)  # noqa: SLF001
        store.reads["bob"] = slow
        assert not rt.call("get", context_args("b2"), principal="bob").is_error
        wait_until(lambda: store.load(("bob", "b2"), KEY) is not None)  # not held by the gate
        wait_until(slow.reached.is_set)  # his recount, on a recounting thread
        b2 = store.load(("bob", "b2"), KEY)
        assert b2 is not None
        assert budget.held("bob") == before + len(b2.data)  # charged against the last count
        slow.opened.set()
        wait_until(lambda: not recounters())
        store.reads.clear()
        assert stored_bytes(store, "bob") == before + len(b2.data)
        # Never low. High by b2's save at most: a save the store wrote before the recount's
        # read but answered after it is counted twice until the next recount (state_budget's
        # known imprecision; seen under CI load on Redis, whose read is a SCAN).
        held, stored = budget.held("bob"), stored_bytes(store, "bob")
        assert held is not None and stored <= held <= stored + len(b2.data)
    finally:
        slow.opened.set()
        rt.close()
