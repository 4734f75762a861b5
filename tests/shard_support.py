"""A shard body run in-process on a real Redis, and a host server whose calls take their time.

`Shard`'s methods are coroutines and its logic is plain Python, so the tests run it as a
plain object on one event loop (as a Ray async actor does), with no Ray cluster: mutmut's
coverage sees it there, and a test can hold a call in flight while the layout changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from ctxactors import Scope, Server, ToolContext, tool
from ctxactors.context import SessionKey
from ctxactors.ray._hashing import owner
from ctxactors.ray._shard import Shard, ShardConfig

LEDGER = "shard_support:Ledger"  # its import path, as a ShardConfig names servers


class LedgerState(msgspec.Struct):
    entries: list[str]


class Ledger(Server):
    """A session's list of entries; `append` may first sleep, to be in flight for a while."""

    name = "ledger"
    scope = Scope.SESSION
    State = LedgerState

    def __init__(self) -> None:
        self.entries: list[str] = []

    def snapshot(self) -> LedgerState:
        return LedgerState(list(self.entries))

    def restore(self, state: LedgerState) -> None:
        self.entries = list(state.entries)

    @tool
    def append(self, ctx: ToolContext, entry: str, seconds: float = 0.0) -> dict[str, Any]:
        """Sleep `seconds`, then add `entry`."""
        time.sleep(seconds)
        self.entries.append(entry)
        return {"entries": self.entries}

    @tool(read_only=True)
    def entries_of(self, ctx: ToolContext) -> dict[str, Any]:
        """The entries so far."""
        return {"entries": self.entries}


def session_owned(wanted: dict[int, int], principal: str | None = None, prefix: str = "s") -> str:
    """A session id whose owner is ``wanted[count]`` for each shard count given."""
    for i in range(100_000):
        session: SessionKey = (principal, f"{prefix}{i}")
        if all(owner(session, count) == index for count, index in wanted.items()):
            return session[1]
    raise LookupError(f"no session of {prefix}0..{prefix}99999 is owned as {wanted}")


@contextmanager
def running_shard(index: int, config: ShardConfig) -> Iterator[Shard]:
    """`Shard(index, config)`, its runtime closed however the test ends."""
    shard = Shard(index, config)
    try:
        yield shard
    finally:
        shard.runtime.close()
