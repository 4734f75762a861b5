"""Content is capped per principal, across all its sessions, not only per session."""

from __future__ import annotations

import msgspec

from ctxactors import Runtime
from ctxactors.servers.content import Content
from ctxactors.settings import Settings
from ctxactors.state import MemoryStore
from ctxactors.testing import ManualClock, context_args


def capped(total: int) -> Settings:
    settings = Settings.from_env()
    content = msgspec.structs.replace(settings.content, max_principal_bytes=total)
    return msgspec.structs.replace(settings, content=content)


def add(rt: Runtime, principal: str | None, session: str, size: int) -> object:
    result = rt.call(
        "add_content",
        context_args(session, filename="f", content="x" * size),
        principal=principal,
    )
    return result.text if result.is_error else result.structured["id"]


def refused(held: int, needs: int) -> str:
    return (
        f"this principal's content is {held:,} bytes across its sessions, 'f' needs {needs:,} "
        "more: the limit is 1,000 (CTXACTORS_CONTENT_MAX_PRINCIPAL_BYTES); delete something "
        "or end a session first"
    )


def test_a_principal_is_capped_across_its_sessions_and_no_one_else_is() -> None:
    with Runtime(servers=[Content], settings=capped(1000)) as rt:
        assert add(rt, "alice", "s1", 600) == "c1"
        assert add(rt, "alice", "s2", 500) == refused(600, 500)
        assert add(rt, "alice", "s2", 400) == "c1"
        assert add(rt, "alice", "s3", 1) == refused(1000, 1)
        # Other principals, and callers with no principal, have budgets of their own.
        assert add(rt, "bob", "s1", 900) == "c1"
        assert add(rt, None, "n1", 900) == "c1"
        assert add(rt, None, "n2", 900) == "c1"
        # Deleting, or ending a session (its content goes with it), gives room back.
        deleted = rt.call("delete_content", context_args("s1", id="c1"), principal="alice")
        assert not deleted.is_error
        assert add(rt, "alice", "s3", 500) == "c1"
        assert rt.end_session("s2", principal="alice") == 1
        assert add(rt, "alice", "s3", 400) == "c2"


def test_with_a_store_a_passivated_session_counts_until_it_is_ended() -> None:
    with Runtime(servers=[Content], settings=capped(1000), store=MemoryStore(), max_actors=1) as rt:
        assert add(rt, "alice", "s1", 600) == "c1"
        assert add(rt, "alice", "s2", 500) == refused(600, 500)  # s1 left memory, not the store
        assert not rt.has_session("s1", principal="alice")
        assert rt.end_session("s1", principal="alice") == 0
        assert add(rt, "alice", "s2", 500) == "c1"


def test_ending_one_session_gives_back_its_bytes_and_only_its_bytes() -> None:
    with Runtime(servers=[Content], settings=capped(1000)) as rt:
        assert add(rt, "alice", "s1", 600) == "c1"
        assert add(rt, "alice", "s2", 300) == "c1"
        assert rt.end_session("s1", principal="alice") == 1
        assert add(rt, "alice", "s3", 701) == refused(300, 701)  # s2 still counts
        assert add(rt, "alice", "s3", 700) == "c1"  # s1 no longer does


def test_with_a_store_a_session_counts_while_in_use_and_until_its_retention_ends() -> None:
    # The ledger ages sessions on the runtime's clock, as the store's retention does.
    clock = ManualClock()
    store = MemoryStore(retention=100, clock=clock)
    settings = capped(1000)
    with Runtime(
        servers=[Content], settings=settings, store=store, clock=clock, ttl=10_000, max_actors=1
    ) as rt:
        assert add(rt, "alice", "s1", 600) == "c1"
        clock.advance(100)
        rt.reap()  # s1 has a live actor: in use, so its retention starts again
        assert rt.has_session("s1", principal="alice")
        assert sorted(store.part_bytes("alice", ("content",))) == ["s1"]
        assert add(rt, "alice", "s2", 500) == refused(600, 500)  # s1 left memory now
        assert not rt.has_session("s1", principal="alice")
        clock.advance(99)
        rt.reap()
        assert sorted(store.part_bytes("alice", ("content",))) == ["s1"]
        assert add(rt, "alice", "s2", 500) == refused(600, 500)
        clock.advance(1)  # s1's retention ends: the store forgets it, and so does the cap
        rt.reap()
        assert store.part_bytes("alice", ("content",)) == {}
        assert add(rt, "alice", "s2", 500) == "c1"


def test_with_a_store_ending_sessions_that_never_held_content_ends_them() -> None:
    with Runtime(servers=[Content], settings=capped(1000), store=MemoryStore()) as rt:
        for principal, session in (("bob", "b1"), ("alice", "s1"), ("alice", "s2")):
            read = rt.call("read_content", context_args(session, id="c9"), principal=principal)
            assert read.is_error  # the session's actor is up, and it holds no content
        assert rt.end_session("b1", principal="bob") == 1  # bob never added content
        assert add(rt, "alice", "s1", 600) == "c1"
        assert rt.end_session("s2", principal="alice") == 1  # alice has, in s1 only
        assert add(rt, "alice", "s3", 401) == refused(600, 401)
