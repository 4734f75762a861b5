"""The store contract, the same for memory, a real SQLite file and a real redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from state_support import RedisServer, redis_server

from ctxactors.state import (
    GroupCommit,
    MemoryStore,
    Outcome,
    Pending,
    Record,
    RedisStore,
    SQLiteStore,
    StaleStateError,
    StateStore,
    StoreUnavailableError,
    Write,
)
from ctxactors.state._checkpoint import BACKSTOP_PAGES
from ctxactors.state._sqlite import RESERVE_BYTES
from ctxactors.testing import ManualClock, wait_until

S1 = (None, "s1")
PLAN = ("planning", "a1", None)


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    made: StateStore
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "state.db")
    else:
        server: RedisServer = request.getfixturevalue("redis")
        made = RedisStore(server.url, prefix=f"t{os.urandom(4).hex()}")
    try:
        yield made
    finally:
        made.close()


def test_a_save_creates_then_advances_the_revision(store: StateStore) -> None:
    assert store.load(S1, PLAN) is None
    assert store.write([Write(S1, PLAN, b"one", 0)]) == [1]
    assert store.write([Write(S1, PLAN, b"two", 1)]) == [2]
    record = store.load(S1, PLAN)
    assert record is not None and (record.revision, record.data) == (2, b"two")


def test_a_stale_writer_is_refused_and_the_newer_state_stays(store: StateStore) -> None:
    store.write([Write(S1, PLAN, b"v1", 0)])
    assert store.write([Write(S1, PLAN, b"fresh", 1)]) == [2]
    (outcome,) = store.write([Write(S1, PLAN, b"stale", 1)])  # loaded rev 1, store has 2
    assert isinstance(outcome, StaleStateError)
    assert (outcome.expected, outcome.current) == (1, 2)
    (created_twice,) = store.write([Write(S1, PLAN, b"again", 0)])
    assert isinstance(created_twice, StaleStateError) and created_twice.current == 2
    record = store.load(S1, PLAN)
    assert record is not None and record.data == b"fresh"


def test_each_write_of_a_batch_has_its_own_outcome(store: StateStore) -> None:
    other = ("playbooks",)
    outcomes = store.write(
        [Write(S1, PLAN, b"a", 0), Write(S1, other, b"b", 5), Write(S1, PLAN, b"c", 1)]
    )
    assert outcomes[0] == 1 and outcomes[2] == 2
    assert isinstance(outcomes[1], StaleStateError)
    assert store.load(S1, other) is None


def test_a_batch_of_updates_has_each_its_own_outcome(store: StateStore) -> None:
    # Every write updates a key that exists (SQLite writes such a batch in one statement,
    # and write by write when one compare-and-set fails).
    keys = [("k", str(n)) for n in range(4)]
    assert store.write([Write(S1, k, b"v1", 0) for k in keys]) == [1, 1, 1, 1]
    assert store.write([Write(S1, k, b"v2", 1) for k in keys]) == [2, 2, 2, 2]
    outcomes = store.write(
        [Write(S1, k, b"v3", 1 if n == 2 else 2) for n, k in enumerate(keys)]  # k2 is stale
    )
    assert outcomes[:2] == [3, 3] and outcomes[3] == 3
    assert isinstance(outcomes[2], StaleStateError) and outcomes[2].current == 2
    stored = [store.load(S1, k) for k in keys]
    assert [(r.revision, r.data) for r in stored if r is not None] == [
        (3, b"v3"),
        (3, b"v3"),
        (2, b"v2"),
        (3, b"v3"),
    ]


def test_keys_and_sessions_are_tuples_not_joined_strings(store: StateStore) -> None:
    store.write([Write((None, "a::b"), ("c",), b"x", 0)])
    assert store.load((None, "a"), ("b::c",)) is None
    assert store.load(("p", "a::b"), ("c",)) is None  # another principal's session
    assert store.load((None, "a::b"), ("c",)) is not None


def test_delete_session_forgets_only_that_session(store: StateStore) -> None:
    s2 = ("principal-b", "s1")
    store.write([Write(S1, PLAN, b"a", 0), Write(S1, ("content",), b"b", 0)])
    store.write([Write(s2, PLAN, b"other", 0)])
    assert store.delete_session(S1) == 2
    assert store.load(S1, PLAN) is None and store.load(S1, ("content",)) is None
    kept = store.load(s2, PLAN)
    assert kept is not None and kept.data == b"other"


def test_a_delete_write_removes_one_key(store: StateStore) -> None:
    store.write([Write(S1, PLAN, b"a", 0)])
    assert store.write([Write(S1, PLAN, None, 1)]) == [0]
    assert store.load(S1, PLAN) is None


DOCS = ("content",)


def test_parts_are_written_with_their_key_and_read_back_with_it(store: StateStore) -> None:
    first = Write(S1, DOCS, b"n2", 0, (("c1", b"one"), ("c2", b"two")))
    assert store.write([first]) == [1]
    # A later save carries only what changed: c2 replaced, c1 untouched, c3 new.
    assert store.write([Write(S1, DOCS, b"n3", 1, (("c2", b"TWO"), ("c3", b"three")))]) == [2]
    assert store.write([Write(S1, DOCS, b"n3", 2, (("c1", None),))]) == [3]
    record = store.load(S1, DOCS)
    assert record is not None
    assert (record.revision, record.data, record.parts) == (
        3,
        b"n3",
        {"c2": b"TWO", "c3": b"three"},
    )
    plain = store.write([Write(S1, PLAN, b"p", 0)])
    assert plain == [1] and store.load(S1, PLAN) == Record(1, b"p", {})


def test_a_stale_save_writes_none_of_its_parts(store: StateStore) -> None:
    store.write([Write(S1, DOCS, b"n1", 0, (("c1", b"one"),))])
    (stale,) = store.write([Write(S1, DOCS, b"n2", 0, (("c1", None), ("c2", b"two")))])
    assert isinstance(stale, StaleStateError)
    record = store.load(S1, DOCS)
    assert record is not None and (record.data, record.parts) == (b"n1", {"c1": b"one"})


def test_deleting_a_key_or_its_session_deletes_its_parts(store: StateStore) -> None:
    store.write([Write(S1, DOCS, b"n", 0, (("c1", b"one"),)), Write(S1, PLAN, b"p", 0)])
    assert store.write([Write(S1, DOCS, None, 1)]) == [0]
    assert store.write([Write(S1, DOCS, b"again", 0)]) == [1]
    assert store.load(S1, DOCS) == Record(1, b"again", {})
    store.write([Write(S1, DOCS, b"more", 1, (("c9", b"nine"),))])
    assert store.delete_session(S1) == 2
    assert store.write([Write(S1, DOCS, b"fresh", 0)]) == [1]
    assert store.load(S1, DOCS) == Record(1, b"fresh", {})


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_retention_forgets_a_session_after_its_last_use(kind: str, tmp_path: Path) -> None:
    now = [1_000_000.0]
    store: StateStore = (
        MemoryStore(retention=60, clock=lambda: now[0])
        if kind == "memory"
        else SQLiteStore(tmp_path / "r.db", retention=60, clock=lambda: now[0])
    )
    store.write([Write(S1, PLAN, b"a", 0), Write((None, "s2"), PLAN, b"b", 0)])
    now[0] += 45
    assert store.load(S1, PLAN) is not None  # a load is a use: s1 starts a new hour
    now[0] += 30
    assert store.purge() == 1  # s2 was last used 75 s ago
    assert store.load((None, "s2"), PLAN) is None
    assert store.load(S1, PLAN) is not None
    now[0] += 61
    assert store.load(S1, PLAN) is None
    store.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_touch_starts_a_sessions_retention_again(kind: str, tmp_path: Path) -> None:
    now = [1_000_000.0]
    store: StateStore = (
        MemoryStore(retention=60, clock=lambda: now[0])
        if kind == "memory"
        else SQLiteStore(tmp_path / "r.db", retention=60, clock=lambda: now[0])
    )
    store.write([Write(S1, PLAN, b"a", 0), Write((None, "s2"), PLAN, b"b", 0)])
    now[0] += 45
    store.touch([S1, (None, "never-stored")])
    now[0] += 30
    assert store.purge() == 1  # s2, untouched for 75 s; s1 was touched 30 s ago
    assert store.load(S1, PLAN) is not None
    assert store.load((None, "never-stored"), PLAN) is None
    store.close()


def test_a_redis_touch_starts_the_sessions_expiry_again(redis: RedisServer) -> None:
    import redis as redis_lib

    client = redis_lib.Redis.from_url(redis.url)
    store = RedisStore(redis.url, retention=30, prefix="touch")
    store.write([Write(S1, PLAN, b"a", 0)])
    client.pexpire('touch:[null,"s1"]', 2_000)  # as if 28 s had passed
    store.touch([S1])
    assert client.pttl('touch:[null,"s1"]') > 5_000
    store.close()


def test_redis_expires_a_session_itself(redis: RedisServer) -> None:
    import redis as redis_lib

    store = RedisStore(redis.url, retention=30, prefix="ttl")
    store.write([Write(S1, PLAN, b"a", 0)])
    ttl = redis_lib.Redis.from_url(redis.url).pttl('ttl:[null,"s1"]')
    assert 0 < ttl <= 30_000
    store.close()


def test_group_commit_writes_concurrent_saves_together(store: StateStore) -> None:
    commit = GroupCommit(store)
    threads, per_thread = 16, 40
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        key = ("k", str(n))
        barrier.wait()
        try:
            for revision in range(per_thread):
                data = f"{n}:{revision + 1}".encode()
                assert commit.save(Write(S1, key, data, revision)) == revision + 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    commit.close()
    assert errors == []
    assert commit.saves == threads * per_thread
    for n in range(threads):
        record = store.load(S1, ("k", str(n)))
        assert record is not None and record.data == f"{n}:{per_thread}".encode()


def test_group_commit_answers_every_save_of_a_failed_batch(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    commit = GroupCommit(store)
    store.close()  # every transaction now fails: a store that is down
    with pytest.raises(StoreUnavailableError):
        commit.save(Write(S1, PLAN, b"a", 0), timeout=10)
    commit.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        commit.save(Write(S1, PLAN, b"a", 0), timeout=10)


class GatedStore(MemoryStore):
    """A memory store whose first write waits for `gate`, recording each batch's size and
    the thread that wrote it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.inside = threading.Event()
        self.batches: list[tuple[int, str]] = []

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        self.batches.append((len(writes), threading.current_thread().name))
        self.inside.set()
        assert self.gate.wait(30)
        return super().write(writes)


def _writing(commit: GroupCommit, store: GatedStore) -> threading.Thread:
    """A save by a thread named "first", held inside the store until its gate opens."""
    first = threading.Thread(
        target=commit.save, args=(Write(S1, ("k", "0"), b"0", 0),), name="first"
    )
    first.start()
    assert store.inside.wait(30)
    return first


def _queued(commit: GroupCommit, n: int) -> None:
    # The queue is the one way to see a caller is waiting.
    wait_until(lambda: len(commit._queue) >= n, 30, interval=0.001)  # noqa: SLF001


def test_a_lone_save_is_written_in_its_callers_thread() -> None:
    store = GatedStore()
    store.gate.set()
    commit = GroupCommit(store)
    assert commit.save(Write(S1, PLAN, b"a", 0)) == 1
    assert store.batches == [(1, threading.current_thread().name)]


def test_saves_queued_behind_a_write_go_together_written_by_one_of_their_callers() -> None:
    store = GatedStore()
    commit = GroupCommit(store)
    first = _writing(commit, store)
    callbacks: list[object] = []
    commit.submit(Write(S1, ("k", "cb"), b"cb", 0), callbacks.append)
    waiters = [
        threading.Thread(target=commit.save, args=(Write(S1, ("k", n), b"x", 0),), name=n)
        for n in ("w1", "w2")
    ]
    for w in waiters:
        w.start()
    _queued(commit, 3)
    store.gate.set()
    for t in (first, *waiters):
        t.join(30)
    assert callbacks == [1]
    assert [size for size, _ in store.batches] == [1, 3]
    assert store.batches[0][1] == "first" and store.batches[1][1] in ("w1", "w2")
    assert (commit.batches, commit.saves) == (2, 4)
    assert all(store.load(S1, ("k", n)) is not None for n in ("0", "cb", "w1", "w2"))


def test_saves_written_behind_their_callers_are_written_by_the_writer_thread() -> None:
    store = GatedStore()
    commit = GroupCommit(store)
    first = _writing(commit, store)
    answered: list[object] = []
    # The store is busy: each is queued with its callback, and the caller goes on at once.
    queued = [Pending(Write(S1, ("k", n), n.encode(), 0), answered.append) for n in "ab"]
    assert [commit.write_or_queue(p) for p in queued] == [False, False]
    assert answered == [] and [p.outcome for p in queued] == [None, None]
    store.gate.set()
    first.join(30)
    wait_until(lambda: len(answered) == 2, 30, interval=0.001)
    # first wrote its own save and left the rest to the writer thread (its caller, a key
    # actor, has its own next call to run), which wrote them together.
    assert store.batches == [(1, "first"), (2, "ctxactors-group-commit")]
    assert answered == [1, 1]
    # Idle again: the next save is written at once, in its caller's thread, no callback.
    never: list[object] = []
    now = Pending(Write(S1, ("k", "c"), b"c", 0), never.append)
    assert commit.write_or_queue(now) is True and now.outcome == 1
    assert store.batches[-1] == (1, threading.current_thread().name) and never == []
    # Written by its caller, it is not left in a cycle with its batch (the GC's work).
    assert now.batch is None
    commit.close()
    refused = Pending(Write(S1, ("k", "d"), b"d", 0), never.append)
    assert commit.write_or_queue(refused) is True and never == []
    assert isinstance(refused.outcome, StoreUnavailableError) and "closed" in str(refused.outcome)


def test_a_save_that_times_out_while_queued_is_never_written() -> None:
    store = GatedStore()
    commit = GroupCommit(store)
    first = threading.Thread(target=commit.save, args=(Write(S1, PLAN, b"a", 0),))
    first.start()
    assert store.inside.wait(30)
    with pytest.raises(TimeoutError) as late:
        commit.save(Write(S1, ("late",), b"late", 0), timeout=0.05)
    assert str(late.value) == "the state store did not confirm the save in time"
    store.gate.set()
    first.join(30)
    commit.close()
    assert store.load(S1, ("late",)) is None
    assert [size for size, _ in store.batches] == [1]


def test_redis_down_is_a_clear_error_and_recovery_is_automatic(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        store = RedisStore(server.url, timeout=2)
        store.write([Write(S1, PLAN, b"before", 0)])
        server.stop()
        with pytest.raises(StoreUnavailableError, match="Redis store unavailable"):
            store.write([Write(S1, PLAN, b"during", 1)])
        server.start()
        assert store.write([Write(S1, PLAN, b"after", 1)]) == [2]
        record = store.load(S1, PLAN)
        assert record is not None and record.data == b"after"
        store.close()


def test_redis_restart_keeps_every_acknowledged_save(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        store = RedisStore(server.url)
        commit = GroupCommit(store)
        for n in range(50):
            commit.save(Write(S1, ("k", str(n)), str(n).encode(), 0))
        server.stop(kill=True)  # SIGKILL: only what appendfsync always wrote survives
        server.start()
        for n in range(50):
            record = store.load(S1, ("k", str(n)))
            assert record is not None and record.data == str(n).encode()
        commit.close()
        store.close()


_WRITER = """
import sys
from ctxactors.state import GroupCommit, SQLiteStore, Write
store = SQLiteStore(sys.argv[1])
commit = GroupCommit(store)
import threading
out = threading.Lock()
def run(n):
    rev = 0
    while True:
        rev = commit.save(Write((None, "s"), ("k", str(n)), str(rev + 1).encode(), rev))
        with out:
            print(n, rev, flush=True)
for n in range(8):
    threading.Thread(target=run, args=(n,), daemon=True).start()
threading.Event().wait()
"""


def test_sqlite_keeps_every_acknowledged_save_across_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    acked: dict[str, int] = {}
    for _ in range(2000):  # read acknowledgements, then kill mid-stream
        n, rev = proc.stdout.readline().split()
        acked[n] = int(rev)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = SQLiteStore(db)
    for n, rev in acked.items():
        record = store.load((None, "s"), ("k", n))
        assert record is not None
        # Everything acknowledged is there (later saves may have landed unacknowledged).
        assert record.revision >= rev
        assert record.data == str(record.revision).encode()
    store.close()


def test_a_part_deleted_that_was_never_stored_is_no_error(store: StateStore) -> None:
    store.write([Write(S1, DOCS, b"n1", 0, (("c1", b"one"),))])
    assert store.write([Write(S1, DOCS, b"n2", 1, (("c7", None), ("c1", None)))]) == [2]
    assert store.load(S1, DOCS) == Record(2, b"n2", {})


def test_ending_a_session_never_stored_deletes_nothing(store: StateStore) -> None:
    store.write([Write(S1, PLAN, b"a", 0)])
    assert store.delete_session((None, "never")) == 0
    assert store.load(S1, PLAN) == Record(1, b"a", {})


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_two_sessions_parts_reloaded_from_one_store_stay_each_its_own(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    alice, bob = ("alice", "s1"), ("bob", "s1")  # one session id, two principals
    prefix = f"t{os.urandom(4).hex()}"

    def opened() -> StateStore:
        if kind == "sqlite":
            return SQLiteStore(tmp_path / "state.db")
        server: RedisServer = request.getfixturevalue("redis")
        return RedisStore(server.url, prefix=prefix)

    first = opened()
    assert first.write(
        [
            Write(alice, DOCS, b"a", 0, (("c1", b"alice one"), ("c2", b"alice two"))),
            Write(bob, DOCS, b"b", 0, (("c1", b"bob one"),)),
            Write((None, "s3"), DOCS, b"c", 0),
        ]
    ) == [1, 1, 1]
    first.close()
    again = opened()  # a restart: every session read back from the file / the server
    try:
        assert again.load(alice, DOCS) == Record(1, b"a", {"c1": b"alice one", "c2": b"alice two"})
        assert again.load(bob, DOCS) == Record(1, b"b", {"c1": b"bob one"})
        assert again.load((None, "s3"), DOCS) == Record(1, b"c", {})
        assert again.load(("carol", "s1"), DOCS) is None
    finally:
        again.close()


def timed(kind: str, tmp_path: Path, clock: ManualClock) -> StateStore:
    """A memory or SQLite store of a minute's retention on `clock`."""
    if kind == "memory":
        return MemoryStore(retention=60, clock=clock)
    return SQLiteStore(tmp_path / "r.db", retention=60, clock=clock)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_session_is_forgotten_exactly_at_its_retention(kind: str, tmp_path: Path) -> None:
    clock = ManualClock(1_000_000.0)
    store = timed(kind, tmp_path, clock)
    s2 = (None, "s2")
    store.write(
        [Write(S1, DOCS, b"a", 0, (("c1", b"one"),)), Write(s2, DOCS, b"b", 0, (("c2", b"two"),))]
    )
    clock.advance(60)
    assert store.load(S1, DOCS) is None  # a load finds it gone...
    assert store.purge() == 1  # ...and the purge forgets the other (S1 was just used)
    # Used again, the session starts from nothing: none of its old parts come back.
    assert store.write([Write(S1, DOCS, b"new", 0)]) == [1]
    assert store.write([Write(s2, DOCS, b"new", 0)]) == [1]
    assert store.load(S1, DOCS) == Record(1, b"new", {})
    assert store.load(s2, DOCS) == Record(1, b"new", {})
    store.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_purged_or_ended_session_is_counted_once(kind: str, tmp_path: Path) -> None:
    clock = ManualClock(1_000_000.0)
    store = timed(kind, tmp_path, clock)
    store.write([Write(S1, PLAN, b"a", 0), Write((None, "s2"), PLAN, b"b", 0)])
    assert store.delete_session(S1) == 1
    clock.advance(61)
    assert store.purge() == 1  # s2 only: S1 was ended already
    assert store.purge() == 0
    store.close()


def test_the_default_retention_is_an_hour_and_the_redis_prefix_ctxactors(
    tmp_path: Path, redis: RedisServer
) -> None:
    stores: list[StateStore] = [
        MemoryStore(),
        SQLiteStore(tmp_path / "state.db"),
        RedisStore(redis.url),
    ]
    assert [s.retention for s in stores] == [3600.0] * 3
    # Redis keeps each session in one hash under the prefix "ctxactors" by default.
    import redis as redis_lib

    session = (None, f"s{os.urandom(4).hex()}")
    stores[2].write([Write(session, PLAN, b"a", 0)])
    hashed = f'ctxactors:[null,"{session[1]}"]'
    assert redis_lib.Redis.from_url(redis.url).exists(hashed) == 1
    assert stores[2].delete_session(session) == 1
    for made in stores:
        made.close()


def test_a_closed_sqlite_store_says_it_is_unavailable(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    store.close()
    with pytest.raises(StoreUnavailableError) as refused:
        store.write([Write(S1, PLAN, b"a", 0)])
    assert str(refused.value) == ("SQLite store unavailable: Cannot operate on a closed database.")


def test_redis_down_fails_every_operation_clearly_and_never_purges(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        store = RedisStore(server.url, timeout=2)
        store.write([Write(S1, PLAN, b"a", 0)])
        assert store.purge() == 0  # Redis expires sessions itself
        assert store.load(S1, PLAN) == Record(1, b"a", {})
        server.stop()
        for failing in (
            lambda: store.delete_session(S1),
            lambda: store.load(S1, PLAN),
            lambda: store.touch([S1]),
        ):
            with pytest.raises(StoreUnavailableError) as refused:
                failing()
            # What it is, not where Redis is (that goes to the log): tenants read it.
            assert str(refused.value) == "Redis store unavailable: no connection to Redis"
        store.close()


def test_the_writer_thread_writes_each_burst_of_saves_behind_their_callers() -> None:
    store = GatedStore()
    commit = GroupCommit(store)
    answered: list[object] = []
    for burst in "12":
        store.gate.clear()
        store.inside.clear()
        first = threading.Thread(
            target=commit.save, args=(Write(S1, ("first", burst), b"0", 0),), name="first"
        )
        first.start()
        assert store.inside.wait(30)
        queued = [Pending(Write(S1, ("k", burst + n), b"x", 0), answered.append) for n in "ab"]
        assert [commit.write_or_queue(p) for p in queued] == [False, False]
        store.gate.set()
        first.join(30)
        wait_until(lambda: len(answered) == 2 * int(burst), 30, interval=0.001)  # noqa: B023
    assert answered == [1, 1, 1, 1]
    assert store.batches == [(1, "first"), (2, "ctxactors-group-commit")] * 2
    commit.close()


_LEFT_OPEN = """
import threading
from ctxactors.state import GroupCommit, MemoryStore, Pending, Write
class Held(MemoryStore):
    inside, gate = threading.Event(), threading.Event()
    def write(self, writes):
        self.inside.set()
        assert self.gate.wait(30)
        return super().write(writes)
store = Held()
commit = GroupCommit(store)
first = threading.Thread(target=commit.save, args=(Write((None, "s"), ("a",), b"a", 0),))
first.start()
assert store.inside.wait(30)
answered = threading.Event()
assert not commit.write_or_queue(Pending(Write((None, "s"), ("b",), b"b", 0), lambda _: answered.set()))
store.gate.set()
first.join()
assert answered.wait(30)
print("answered", flush=True)
"""


def test_a_group_commit_never_closed_does_not_keep_its_process_alive() -> None:
    # The writer thread started (a save written behind its caller); nobody closes the
    # commit. Here first (so this test is run against the writer's code), closed after...
    here: dict[str, Any] = {}
    exec(_LEFT_OPEN, here)  # noqa: S102 - the script below, in this process
    here["commit"].close()
    # ...then in a process of its own, never closed. The generous limit only bounds a
    # process that would never exit.
    ran = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "answered\n"


def test_a_batch_of_updates_with_a_delete_in_it_deletes_that_key(store: StateStore) -> None:
    other = ("other",)
    store.write([Write(S1, PLAN, b"p1", 0), Write(S1, other, b"o1", 0)])
    assert store.write([Write(S1, PLAN, b"p2", 1), Write(S1, other, None, 1)]) == [2, 0]
    assert store.load(S1, PLAN) == Record(2, b"p2", {})
    assert store.load(S1, other) is None
    # A batch of deletes only (as ending a key's sessions makes) deletes each.
    assert store.write([Write(S1, ("third",), b"t", 0)]) == [1]
    assert store.write([Write(S1, PLAN, None, 2), Write(S1, ("third",), None, 1)]) == [0, 0]
    assert store.load(S1, PLAN) is None and store.load(S1, ("third",)) is None


def test_empty_data_is_stored_as_it_is(store: StateStore) -> None:
    assert store.write([Write(S1, PLAN, b"", 0)]) == [1]
    assert store.load(S1, PLAN) == Record(1, b"", {})


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_session_ended_then_used_again_has_its_retention_again(kind: str, tmp_path: Path) -> None:
    clock = ManualClock(1_000_000.0)
    store = timed(kind, tmp_path, clock)
    store.write([Write(S1, PLAN, b"a", 0)])
    assert store.delete_session(S1) == 1
    store.write([Write(S1, PLAN, b"again", 0)])  # at once: the same instant
    clock.advance(60)
    assert store.purge() == 1
    assert store.load(S1, PLAN) is None
    store.close()


def test_a_save_with_no_time_limit_waits_as_long_as_the_store_takes() -> None:
    store = GatedStore()
    commit = GroupCommit(store)
    first = _writing(commit, store)
    saved: list[int] = []
    waiting = threading.Thread(target=lambda: saved.append(commit.save(Write(S1, PLAN, b"a", 0))))
    waiting.start()
    _queued(commit, 1)
    # Still waiting a good while later (a fixed time, as nothing would show it stopped
    # early; longer than a wait of a second).
    waiting.join(1.5)
    assert waiting.is_alive() and saved == []
    store.gate.set()
    for thread in (first, waiting):
        thread.join(30)
    assert saved == [1]
    commit.close()


def test_a_redis_that_never_answers_fails_within_the_stores_timeout() -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)  # never accepted: a connection waits, the next ones can't connect
        url = f"redis://127.0.0.1:{server.getsockname()[1]}/0"
        # Connected (the kernel queued it), the store waits for a reply that never comes.
        silent = RedisStore(url, timeout=0.5)
        with pytest.raises(
            StoreUnavailableError, match="^Redis store unavailable: Redis did not answer in time$"
        ):
            silent.load(S1, PLAN)
        # The queue is full now (that connection is never accepted): the next connection
        # can't even be made.
        unreachable = RedisStore(url, timeout=0.5)
        with pytest.raises(
            StoreUnavailableError, match="^Redis store unavailable: Redis did not answer in time$"
        ):
            unreachable.load(S1, PLAN)
        unreachable.close()
        silent.close()


def test_a_delete_of_a_key_never_saved_is_done_and_an_update_of_one_is_stale(
    store: StateStore,
) -> None:
    assert store.write([Write(S1, PLAN, None, 0)]) == [0]  # nothing to do: done
    (stale,) = store.write([Write(S1, PLAN, b"v4", 3)])
    assert isinstance(stale, StaleStateError) and (stale.expected, stale.current) == (3, 0)
    assert store.load(S1, PLAN) is None


def test_a_write_expecting_no_key_that_finds_one_is_stale_and_keeps_it(
    store: StateStore,
) -> None:
    # Revision 0 means "the key must not exist", for a delete as for a save: a writer that
    # never saw the key must not remove (nor overwrite) what another writer stored.
    assert store.write([Write(S1, PLAN, b"theirs", 0)]) == [1]
    delete, save = store.write([Write(S1, PLAN, None, 0), Write(S1, PLAN, b"mine", 0)])
    for outcome in (delete, save):
        assert isinstance(outcome, StaleStateError)
        assert (outcome.key, outcome.expected, outcome.current) == (PLAN, 0, 1)
    assert store.load(S1, PLAN) == Record(1, b"theirs")


def test_a_principals_byte_counts_cover_its_own_sessions_only(store: StateStore) -> None:
    """What the content ledger and the state budget recount from after a restart: each of
    the principal's sessions with its bytes, never another principal's (a similar name, a
    glob character, no principal at all)."""
    store.write(
        [
            Write(("alice", "s1"), DOCS, b"docs", 0, (("c1", b"one"), ("c2", b"two!!"))),
            Write(("alice", "s1"), PLAN, b"plan!", 0),
            Write(("alice", "s2"), DOCS, b"d", 0, (("c1", b"0123456789"),)),
            Write(("alice", "s3"), DOCS, b"no parts", 0),
            Write(("alic", "s1"), DOCS, b"x", 0, (("c1", b"not hers"),)),
            Write(("alice2", "s1"), DOCS, b"x", 0, (("c1", b"not hers"),)),
            Write(("al*ce", "s1"), DOCS, b"x", 0, (("c1", b"not hers"),)),
            Write(("alice+", "s1"), DOCS, b"x", 0, (("c1", b"not hers at all"),)),
            Write((None, "s1"), DOCS, b"x", 0, (("c1", b"nobody's"),)),
        ]
    )
    assert store.part_bytes("alice", DOCS) == {"s1": 8, "s2": 10}
    assert store.part_bytes("alice", PLAN) == {}
    assert store.part_bytes("al*ce", DOCS) == {"s1": 8}
    assert store.part_bytes("bob", DOCS) == {}
    assert store.principal_bytes("alice") == {"s1": 4 + 5, "s2": 1, "s3": 8}
    assert store.principal_bytes("al*ce") == {"s1": 1}
    assert store.principal_bytes("bob") == {}
    # A part deleted, a session ended: counted no more.
    assert store.write([Write(("alice", "s1"), DOCS, b"docs", 1, (("c2", None),))]) == [2]
    assert store.delete_session(("alice", "s2")) == 1
    assert store.part_bytes("alice", DOCS) == {"s1": 3}
    assert store.principal_bytes("alice") == {"s1": 4 + 5, "s3": 8}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_byte_counts_skip_expired_sessions_and_refresh_no_retention(
    kind: str, tmp_path: Path
) -> None:
    clock = ManualClock(1_000_000.0)
    store = timed(kind, tmp_path, clock)
    old, live = ("alice", "old"), ("alice", "live")
    store.write([Write(old, DOCS, b"old", 0, (("c1", b"1"),))])
    clock.advance(30)
    store.write([Write(live, DOCS, b"live!", 0, (("c1", b"22"),))])
    clock.advance(29.5)  # old was used 59.5 s ago: still in its minute
    assert store.part_bytes("alice", DOCS) == {"old": 1, "live": 2}
    assert store.principal_bytes("alice") == {"old": 3, "live": 5}
    clock.advance(0.5)  # exactly its retention: gone, though it was just counted
    assert store.part_bytes("alice", DOCS) == {"live": 2}
    assert store.principal_bytes("alice") == {"live": 5}
    clock.advance(30)  # counting live did not start its retention again either
    assert store.part_bytes("alice", DOCS) == {}
    assert store.principal_bytes("alice") == {}
    assert store.load(old, DOCS) is None and store.load(live, DOCS) is None
    store.close()


def test_a_redis_failure_tells_its_kind_and_logs_its_detail_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenants read the error (in a tool's result): its kind, never Redis's address; the
    operator's log has redis-py's own words, at most once a second, with the count of the
    failures not logged since."""
    import redis as redis_lib
    from structlog.testing import capture_logs

    from ctxactors.state import _redis

    guarded = RedisServer(tmp_path, password="right-pw")
    guarded.start()
    try:
        wrong = RedisStore(guarded.url.replace("right-pw", "wrong-pw"), timeout=2)
        with pytest.raises(StoreUnavailableError) as refused:
            wrong.load(S1, PLAN)
        assert str(refused.value) == "Redis store unavailable: Redis refused the credentials"
        wrong.close()
        store = RedisStore(guarded.url, prefix="kinds", timeout=2)
        # A session's hash that is not a hash (written by something else): Redis's code.
        redis_lib.Redis.from_url(guarded.url).set('kinds:[null,"s1"]', "not a hash")
        with pytest.raises(StoreUnavailableError) as refused:
            store.load(S1, PLAN)
        assert str(refused.value) == "Redis store unavailable: Redis answered WRONGTYPE"
    finally:
        guarded.stop(kill=True)
    clock = ManualClock(5000.0)
    monkeypatch.setattr(_redis, "time", type("Clock", (), {"monotonic": staticmethod(clock)}))
    down = RedisStore(guarded.url, timeout=2)
    with capture_logs() as logs:
        for advance in (0, 0.5, 0.25, 0.25, 0.5, 0.5, 1.0):  # exact in binary
            clock.advance(advance)
            for failing in (
                lambda: down.touch([S1]),
                lambda: down.write([Write(S1, PLAN, b"a", 0)]),
                lambda: down.part_bytes("alice", DOCS),
                lambda: down.principal_bytes("alice"),
            ):
                with pytest.raises(StoreUnavailableError) as refused:
                    failing()
                assert str(refused.value) == "Redis store unavailable: no connection to Redis"
    down.close()
    store.close()
    lines = [line for line in logs if line["event"] == "redis_unavailable"]
    # Logged at 0 s, 1.0 s (eleven not logged between: four failures a step), 2.0 s (seven)
    # and 3.0 s (three: the three after the 2.0 s one).
    assert [line["not_logged"] for line in lines] == [0, 11, 7, 3]
    assert all(f"127.0.0.1:{guarded.port}" in line["error"] for line in lines)
    assert {(line["logger"], line["store"]) for line in lines} == {("ctxactors.store", "redis")}
    assert all("right-pw" not in line["error"] for line in lines)


def test_only_the_kind_of_a_redis_error_is_told() -> None:
    import redis as redis_lib

    from ctxactors.state._redis import error_kind

    for exc, told in [
        (
            redis_lib.TimeoutError("Timeout reading from 10.0.0.7:6379"),
            "Redis did not answer in time",
        ),
        (
            redis_lib.AuthenticationError("invalid password for 10.0.0.7"),
            "Redis refused the credentials",
        ),
        (
            redis_lib.ConnectionError("Error 111 connecting to 10.0.0.7:6379"),
            "no connection to Redis",
        ),
        (redis_lib.ResponseError("NOPERM this user has no permissions"), "Redis answered NOPERM"),
        (redis_lib.ResponseError("OOM command not allowed"), "Redis answered OOM"),
        (redis_lib.ResponseError("Error running script at 10.0.0.7"), "Redis answered an error"),
        (redis_lib.ResponseError(""), "Redis answered an error"),
        (redis_lib.DataError("Invalid input of type: 'dict'"), "DataError"),
    ]:
        assert error_kind(exc) == told, exc


def test_sqlite_takes_full_or_normal_synchronous_in_any_case_and_nothing_else(
    tmp_path: Path,
) -> None:
    for i, synchronous in enumerate(["FULL", "full", "NORMAL", "normal"]):
        store = SQLiteStore(tmp_path / f"{i}.db", synchronous=synchronous)
        assert store.write([Write(S1, PLAN, b"a", 0)]) == [1]
        assert store.load(S1, PLAN) == Record(1, b"a", {})
        # The setting is the connection's own (SQLite keeps none in the file): 2 FULL, 1 NORMAL.
        setting = store._db.execute("PRAGMA synchronous").fetchone()  # noqa: SLF001
        assert setting == ((2,) if synchronous.upper() == "FULL" else (1,)), synchronous
        store.close()
    with pytest.raises(ValueError, match="^synchronous must be NORMAL or FULL, got 'OFF'$"):
        SQLiteStore(tmp_path / "off.db", synchronous="OFF")


def test_a_redis_that_stops_answering_a_connection_in_use_fails_within_the_timeout(
    tmp_path: Path,
) -> None:
    """Connected and answering, then stopped (a paused or wedged server): the next load
    fails clearly once the store's timeout has passed, and works again once it answers."""
    with redis_server(tmp_path) as server:
        assert server.proc is not None
        store = RedisStore(server.url, timeout=0.5)
        assert store.write([Write(S1, PLAN, b"one", 0)]) == [1]  # the connection is made
        failed: list[BaseException] = []

        def load() -> None:
            try:
                store.load(S1, PLAN)
            except BaseException as exc:  # noqa: BLE001 - what the test checks
                failed.append(exc)

        os.kill(server.proc.pid, signal.SIGSTOP)
        loading = threading.Thread(target=load)
        try:
            loading.start()
            # Generous: 0.5 s is the timeout (redis-py may retry a timed out read a few
            # times); without one the load would wait until the server answers again.
            wait_until(lambda: failed, 20)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
            loading.join(30)
        assert [str(exc) for exc in failed] == [
            "Redis store unavailable: Redis did not answer in time"
        ]
        assert store.load(S1, PLAN) == Record(1, b"one", {})  # and back once it answers
        store.close()


def test_a_redis_stores_default_timeout_is_five_seconds_to_connect_and_to_answer(
    redis: RedisServer,
) -> None:
    # What redis-py is given: the time a call waits on a wedged Redis before it fails is
    # too close to the machine's load to tell 5 s from 6 s by the clock.
    store = RedisStore(redis.url)
    kwargs = store._redis.get_connection_kwargs()  # noqa: SLF001 - what redis-py was given
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (5.0, 5.0)
    store.close()


def test_a_batch_redis_refuses_part_of_writes_none_of_it(redis: RedisServer) -> None:
    """One write of a batch that Redis refuses before running any (here its ACL: the user
    may not write that session's hash) fails the whole batch, and nothing of the batch is
    in Redis: a batch told it failed has changed nothing (its callers roll back)."""
    import redis as redis_lib

    admin = redis_lib.Redis.from_url(redis.url)
    admin.execute_command(
        "ACL", "SETUSER", "onlyok", "on", ">pw", "~batch:*ok*", "+@all", "-@dangerous"
    )
    url = f"redis://onlyok:pw@127.0.0.1:{redis.port}/0"
    store = RedisStore(url, prefix="batch")
    ok, other = (None, "ok"), (None, "other")
    with pytest.raises(StoreUnavailableError) as refused:
        store.write([Write(ok, PLAN, b"mine", 0), Write(other, PLAN, b"not mine", 0)])
    assert str(refused.value) == "Redis store unavailable: Redis answered an error"
    assert store.load(ok, PLAN) is None
    assert admin.keys("batch:*") == []
    assert store.write([Write(ok, PLAN, b"mine", 0)]) == [1]  # alone it is taken
    assert store.load(ok, PLAN) == Record(1, b"mine", {})
    store.close()
    admin.execute_command("ACL", "DELUSER", "onlyok")
    admin.close()


def test_a_redis_client_told_to_decode_replies_counts_the_same_bytes(redis: RedisServer) -> None:
    """Replies come as bytes unless the URL asks redis-py to decode them: a principal's
    counts read the same either way."""
    prefix = f"d{os.urandom(4).hex()}"
    plain = RedisStore(redis.url, prefix=prefix)
    decoding = RedisStore(f"{redis.url}?decode_responses=true", prefix=prefix)
    plain.write(
        [
            Write(("alice", "s1"), PLAN, b"x" * 10, 0, (("p1", b"y" * 3),)),
            Write(("alice", "s2"), PLAN, b"z" * 7, 0),
            Write(("bob", "s1"), PLAN, b"b" * 5, 0),
        ]
    )
    for store in (plain, decoding):
        assert store.principal_bytes("alice") == {"s1": 10, "s2": 7}
        assert store.part_bytes("alice", PLAN) == {"s1": 3}
    plain.close()
    decoding.close()


def test_a_sqlite_store_makes_the_directories_of_its_path(tmp_path: Path) -> None:
    path = tmp_path / "not" / "yet" / "state.db"  # a fresh --data-dir, say
    store = SQLiteStore(path)
    assert store.write([Write(S1, PLAN, b"one", 0)]) == [1]
    store.close()
    again = SQLiteStore(path)
    assert again.load(S1, PLAN) == Record(1, b"one", {})
    again.close()


def test_the_sqlite_writers_own_checkpoint_waits_for_half_the_reserve_of_wal(
    tmp_path: Path,
) -> None:
    """Past that many pages of WAL the writer checkpoints itself (the checkpointer
    thread's passes normally come first): half the reserve, at least 16 pages, at most
    `BACKSTOP_PAGES`."""
    page = 4096
    # (Past 80 MiB of reserve, BACKSTOP_PAGES caps it: not allocated here.)
    assert BACKSTOP_PAGES * 2 * page > RESERVE_BYTES
    for i, (reserve, pages) in enumerate(
        [(0, 16), (16 * page, 16), (2 * 100 * page, 100), (RESERVE_BYTES, 1024)]
    ):
        store = SQLiteStore(tmp_path / f"{i}.db", reserve_bytes=reserve)
        assert store._db.execute("PRAGMA page_size").fetchone() == (page,)  # noqa: SLF001
        backstop = store._db.execute("PRAGMA wal_autocheckpoint").fetchone()  # noqa: SLF001
        assert backstop == (pages,), reserve
        store.close()


def test_a_sqlite_write_that_fails_midway_keeps_nothing_and_the_store_goes_on(
    tmp_path: Path,
) -> None:
    """A batch that raises after its first write was made (here a caller's bug: a key that
    can't be encoded) is rolled back whole, and the next write starts afresh."""
    store = SQLiteStore(tmp_path / "state.db")
    try:
        with pytest.raises(TypeError):
            store.write([Write(S1, PLAN, b"a", 0), Write(S1, (object(),), b"b", 0)])  # type: ignore[arg-type]
        assert store.load(S1, PLAN) is None
        assert store.write([Write(S1, PLAN, b"a", 0)]) == [1]
        assert store.load(S1, PLAN) == Record(1, b"a", {})
    finally:
        store.close()
