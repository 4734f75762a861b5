"""A principal's content cap holds across a restart: the ledger counts the stored sessions
of a principal the first time it adds content in the new process (each store's own count,
`StateStore.part_bytes`; real SQLite and a real Redis server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from state_support import redis_server

from ctxactors import Runtime
from ctxactors.servers.content import Content
from ctxactors.settings import ContentSettings, Settings
from ctxactors.state import (
    MemoryStore,
    RedisStore,
    SQLiteStore,
    StateKey,
    StateStore,
    StoreUnavailableError,
)
from ctxactors.testing import ManualClock, context_args

CAP = 10_000


CAPPED = Settings(content=ContentSettings(max_principal_bytes=CAP))


def add(rt: Runtime, principal: str | None, session: str, size: int) -> str:
    """The new item's id, or the refusal."""
    args = context_args(session, filename="f", content="x" * size)
    result = rt.call("add_content", args, principal=principal)
    return result.text if result.is_error else str(result.structured["id"])


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "sqlite":
        opened = SQLiteStore(tmp_path / "state.db")
        yield opened
        opened.close()
    else:
        with redis_server(tmp_path) as server:
            redis = RedisStore(server.url)
            yield redis
            redis.close()


def test_a_restart_counts_the_stored_sessions_of_a_principal(store: StateStore) -> None:
    with Runtime(servers=[Content], settings=CAPPED, store=store) as rt:
        assert add(rt, "al*ce", "s1", 4000) == "c1"  # a glob character: matched literally
        assert add(rt, "al*ce", "s2", 4000) == "c1"
        assert add(rt, "alice", "s1", 100) == "c1"  # another principal, a similar name
    stored = store.part_bytes("al*ce", ("content",))
    assert sorted(stored) == ["s1", "s2"]
    assert all(4000 < size < 4100 for size in stored.values())  # the text and its filename
    [(session, size)] = store.part_bytes("alice", ("content",)).items()
    assert session == "s1" and 100 < size < 200
    with Runtime(servers=[Content], settings=CAPPED, store=store) as rt:  # a restart
        held = stored["s1"] + stored["s2"]
        assert add(rt, "al*ce", "s3", 2000) == (
            f"this principal's content is {held:,} bytes across its sessions, 'f' needs 2,000 "
            f"more: the limit is {CAP:,} (CTXACTORS_CONTENT_MAX_PRINCIPAL_BYTES); delete "
            "something or end a session first"
        )
        assert add(rt, "alice", "s3", 9000) == "c1"  # counted on its own: 100 + 9,000
        # Ending a stored session gives its bytes back, as before a restart.
        assert rt.end_session("s1", principal="al*ce") == 0
        assert add(rt, "al*ce", "s3", 2000) == "c1"


class Counting(MemoryStore):
    """A memory store that records who it counts for, and is down for the first `down`
    counts."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.asked: list[str] = []
        self.down = 0

    def part_bytes(self, principal: str, key: StateKey) -> dict[str, int]:
        self.asked.append(principal)
        if self.down:
            self.down -= 1
            raise StoreUnavailableError("the store is restarting")
        return super().part_bytes(principal, key)


def test_the_store_is_asked_once_per_principal_and_again_after_it_failed() -> None:
    store = Counting()
    with Runtime(servers=[Content], settings=CAPPED, store=store) as rt:
        assert add(rt, "alice", "s1", 4000) == "c1"
    [stored] = store.part_bytes("alice", ("content",)).values()
    store.asked, store.down = [], 1
    with Runtime(servers=[Content], settings=CAPPED, store=store) as rt:  # a restart
        assert add(rt, "alice", "s2", 4000) == "c1"  # not counted: the store failed
        assert add(rt, "alice", "s3", 4000) == (
            f"this principal's content is {stored + 4000:,} bytes across its sessions, 'f' "
            f"needs 4,000 more: the limit is {CAP:,} (CTXACTORS_CONTENT_MAX_PRINCIPAL_BYTES); "
            "delete something or end a session first"
        )
        assert add(rt, "alice", "s3", 1000) == "c1"
        assert add(rt, "bob", "s1", 1000) == "c1"
        assert add(rt, "bob", "s2", 1000) == "c1"
    assert store.asked == ["alice", "alice", "bob"]


def test_a_session_stored_before_a_restart_counts_until_its_retention_ends() -> None:
    clock = ManualClock()
    store = MemoryStore(retention=100, clock=clock)
    with Runtime(servers=[Content], settings=CAPPED, store=store, clock=clock) as rt:
        assert add(rt, "alice", "s1", 6000) == "c1"
    [stored] = store.part_bytes("alice", ("content",)).values()
    with Runtime(servers=[Content], settings=CAPPED, store=store, clock=clock, ttl=10_000) as rt:
        refused = add(rt, "alice", "s2", 5000)
        assert refused.startswith(f"this principal's content is {stored:,} bytes")
        clock.advance(100)  # s1, never used since the restart, expires
        rt.reap()
        assert store.part_bytes("alice", ("content",)) == {}
        assert add(rt, "alice", "s2", 5000) == "c1"
