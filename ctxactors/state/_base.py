"""What every state store is: saves guarded by a revision, sessions that expire.

A key actor's state outlives the actor only in a store. Three rules make that safe:

- one writer per key: a save names the revision its writer loaded and succeeds only if the
  store still holds that revision (compare-and-set in one statement or one script), so a
  stale incarnation (an old process, a second server on the same Redis) can never
  overwrite newer state;
- a session is the unit of retention and deletion: every key belongs to one
  ``(principal, session)``, which the store forgets `retention` seconds after its last
  write or load, or at once on `delete_session`;
- a batch of saves is written together (one transaction or pipeline), each with its own
  outcome, so group commit costs one round trip for many callers;
- a key may have parts (a content session's documents, one part each): a save carries only
  the parts that changed and writes them with the key, atomically and under the key's
  compare-and-set, so a large state costs what changed, not what it holds.

Keys and sessions are tuples encoded as JSON arrays, never joined strings: ``("a::b",
"c")`` and ``("a", "b::c")`` stay different.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Protocol

import msgspec

# The store's errors live with every other error; the stores import them from here.
from ctxactors.errors import StaleStateError as StaleStateError
from ctxactors.errors import StoreError as StoreError
from ctxactors.errors import StoreUnavailableError as StoreUnavailableError

# (principal, session id): the principal is None when the transport authenticated nobody.
SessionRef = tuple[str | None, str]
# Which state inside the session, e.g. ("planning", assistant, thread).
StateKey = tuple[str | None, ...]

_encode = msgspec.json.Encoder().encode


@functools.lru_cache(maxsize=4096)
def principal_prefix(principal: str) -> str:
    """What every encoded session of `principal` starts with (``["alice",``), and nothing
    else's: a JSON string ends at its closing quote."""
    return encode_ref((principal, ""))[: -len('""]')]


def encode_ref(value: SessionRef | StateKey) -> str:
    """An unambiguous text form of a session or key tuple (a JSON array).

    Cached: a store encodes the same few live keys on every save (three times per save in
    SQLite); bounded, so a flood of sessions only costs the cache its hits.
    """
    return _encode(value).decode()


# A part of a key's state, by name (a content item's id), and its bytes (None: delete it).
Part = tuple[str, bytes | None]


class Record(msgspec.Struct, frozen=True):
    """A stored state: its bytes, the revision that wrote them (1 for the first save) and
    its parts by name."""

    revision: int
    data: bytes
    parts: dict[str, bytes] = msgspec.field(default_factory=dict)


class Write(msgspec.Struct, frozen=True):
    """One save: `data` replaces the key's state (None deletes the key and all its parts)
    if the store still holds revision `expected` (0: the key must not exist); `parts` are
    written (or deleted) with it, or not at all."""

    session: SessionRef
    key: StateKey
    data: bytes | None
    expected: int
    parts: tuple[Part, ...] = ()


# What a store answers for each write of a batch: the new revision (0 after a delete), or
# the error of that write alone.
Outcome = int | StaleStateError


class StateStore(Protocol):
    """Where key state lives beyond its actor. Implementations are thread-safe."""

    retention: float

    def load(self, session: SessionRef, key: StateKey) -> Record | None:
        """The key's stored state (with every part), or None; refreshes the session's
        retention."""
        ...

    def touch(self, sessions: Iterable[SessionRef]) -> None:
        """Start these sessions' retention again now: they are in use (read by live actors),
        so the store must not forget them. Raises `StoreUnavailableError`."""
        ...

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        """Apply every write in one transaction or pipeline; one outcome per write.

        Raises `StoreUnavailableError` when the store can't be reached or written, in which
        case no write of the batch is visible.
        """
        ...

    def delete_session(self, session: SessionRef) -> int:
        """Forget every key of the session now; returns how many keys were removed."""
        ...

    def purge(self) -> int:
        """Forget sessions past their retention; returns how many sessions went."""
        ...

    def part_bytes(self, principal: str, key: StateKey) -> dict[str, int]:
        """Session id -> bytes of `key`'s parts, for each live session of `principal` that
        has any; refreshes no retention (the content ledger recounts with it after a
        restart)."""
        ...

    def principal_bytes(self, principal: str) -> dict[str, int]:
        """Session id -> bytes of its keys' states (parts not included: content counts
        those), for each live session of `principal`; refreshes no retention (the state
        budget recounts with it once per principal per process)."""
        ...

    def close(self) -> None: ...
