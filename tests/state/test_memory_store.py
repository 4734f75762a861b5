"""The in-memory store's own promises beside the shared contract (test_state_store): what
a principal's recount sees (its own live sessions only, their exact sizes) and that
counting refreshes no retention."""

from __future__ import annotations

from ctxactors.state import MemoryStore, Write
from ctxactors.testing import ManualClock

KEY = ("content",)
STATE = ("planning", "a", "t")


def test_a_recount_sees_the_principals_live_sessions_only_and_refreshes_none() -> None:
    clock = ManualClock()
    store = MemoryStore(retention=100, clock=clock)
    store.write(
        [
            Write(("alice", "old"), KEY, b"x", 0, (("f1", b"12345"),)),
            Write(("alice", "old"), STATE, b"abc", 0),
            Write(("bob", "b1"), KEY, b"x", 0, (("f1", b"123"),)),
        ]
    )
    clock.advance(60)
    store.write(
        [
            Write(("alice", "new"), KEY, b"xy", 0, (("f1", b"1"), ("f2", b"22"))),
            Write(("alice", "bare"), KEY, b"x", 0),  # no parts: not in part_bytes
        ]
    )
    assert store.part_bytes("alice", KEY) == {"old": 5, "new": 3}
    assert store.principal_bytes("alice") == {"old": 4, "new": 2, "bare": 1}
    assert store.part_bytes("alice", ("other",)) == {}
    clock.advance(40)  # "old" last used 100 s ago: expired, whoever counts
    assert store.part_bytes("alice", KEY) == {"new": 3}
    assert store.principal_bytes("alice") == {"new": 2, "bare": 1}
    assert store.principal_bytes("bob") == {}
    assert store.purge() == 2  # the recounts kept neither "old" nor bob's alive
    assert store.load(("alice", "old"), KEY) is None
