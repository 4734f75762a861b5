"""Group commit's promises to the saves waiting their turn: a save taken back is never
written, and nothing else is lost or answered twice on its account."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from ctxactors.state import GroupCommit, MemoryStore, Outcome, StoreError, Write
from ctxactors.testing import wait_until

S1 = ("alice", "s1")


class HeldStore(MemoryStore):
    """A memory store whose writes wait for `gate` (once open, it stays open), recording
    each batch's keys."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.inside = threading.Event()
        self.batches: list[list[tuple[str | None, ...]]] = []

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        self.batches.append([w.key for w in writes])
        self.inside.set()
        assert self.gate.wait(30)
        return super().write(writes)


def test_a_withdrawn_save_is_never_written_nor_answered() -> None:
    store = HeldStore()
    commit = GroupCommit(store)
    leader = Write(S1, ("lead",), b"0", 0)
    first = threading.Thread(target=commit.save, args=(leader,))
    first.start()
    assert store.inside.wait(30)
    answered: dict[str, Outcome | StoreError] = {}
    kept = Write(S1, ("kept",), b"1", 0)
    taken = Write(S1, ("taken",), b"2", 0)
    commit.submit(kept, lambda o: answered.__setitem__("kept", o))
    commit.submit(taken, lambda o: answered.__setitem__("taken", o))
    # The one being written can't be taken back, nor a write never submitted.
    assert commit.withdraw(leader) is False
    assert commit.withdraw(Write(S1, ("taken",), b"2", 0)) is False  # equal, not the same
    assert commit.withdraw(taken) is True
    assert commit.withdraw(taken) is False  # gone already
    store.gate.set()
    first.join(30)
    wait_until(lambda: "kept" in answered)
    commit.close()
    assert answered == {"kept": 1}
    assert store.batches == [[("lead",)], [("kept",)]]
    assert store.load(S1, ("taken",)) is None


def test_the_writer_thread_keeps_no_process_alive() -> None:
    """Saves written behind their callers go to a writer thread: a daemon, so a process
    whose embedder never closes the store still exits."""
    store = HeldStore()
    commit = GroupCommit(store)
    first = threading.Thread(target=commit.save, args=(Write(S1, ("lead",), b"0", 0),))
    first.start()
    assert store.inside.wait(30)
    answered: list[Outcome | StoreError] = []
    commit.submit(Write(S1, ("behind",), b"1", 0), answered.append)
    store.gate.set()
    first.join(30)
    wait_until(lambda: answered == [1])
    writers = [t for t in threading.enumerate() if t.name == "ctxactors-group-commit"]
    assert writers != [] and all(t.daemon for t in writers)
    commit.close()


def test_a_save_without_a_timeout_waits_as_long_as_the_store_takes() -> None:
    store = HeldStore()
    commit = GroupCommit(store)
    first = threading.Thread(target=commit.save, args=(Write(S1, ("lead",), b"0", 0),))
    first.start()
    assert store.inside.wait(30)
    got: list[int | BaseException] = []

    def patient() -> None:
        try:
            got.append(commit.save(Write(S1, ("patient",), b"1", 0)))
        except BaseException as exc:  # noqa: BLE001 - what the test reports
            got.append(exc)

    waiter = threading.Thread(target=patient)
    waiter.start()
    wait_until(lambda: len(commit._queue) == 1)  # noqa: SLF001 - the one way to see it queued
    # The store stays busy for a while (a lower bound: a slow machine makes it longer):
    # past any short internal wait a save without a timeout might have had.
    held_since = time.monotonic()
    wait_until(lambda: time.monotonic() - held_since > 2.5, timeout=30, interval=0.1)
    assert got == []
    store.gate.set()
    waiter.join(30)
    first.join(30)
    commit.close()
    assert got == [1]
    assert store.load(S1, ("patient",)) is not None
