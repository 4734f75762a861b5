"""Work queued by owner (a principal), taken round-robin between owners.

The scheduler's pools (`ctxactors._scheduler`) take their next actor from here, so one
principal with a thousand runnable keys waits its turn as a principal with one does: each
take serves the owner at the front of the line and sends it to the back if it has more.
Within one owner the order is first in, first out, so a single tenant (every call of an
embedded runtime, or of a server without authentication, has the owner None) is served
exactly as by a plain FIFO queue.

Not thread-safe by itself: the pool that owns one holds its own lock around every use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Items by owner; `take` goes round the owners that have some, one item each."""

    __slots__ = ("_by_owner", "_turns")

    def __init__(self) -> None:
        self._by_owner: dict[Hashable, deque[T]] = {}
        self._turns: deque[Hashable] = deque()  # owners with items, next first

    def __len__(self) -> int:
        return sum(len(items) for items in self._by_owner.values())

    def __bool__(self) -> bool:
        return bool(self._turns)

    def put(self, owner: Hashable, item: T) -> None:
        """Queue `item` behind `owner`'s earlier ones; a new owner joins the end of the line."""
        items = self._by_owner.get(owner)
        if items is None:
            self._by_owner[owner] = deque((item,))
            self._turns.append(owner)
        else:
            items.append(item)

    def take(self, prefer: Callable[[Hashable], bool] | None = None) -> tuple[Hashable, T]:
        """The oldest item of the owner whose turn it is, or of the first owner in the
        line that `prefer` picks (IndexError when empty)."""
        turns = self._turns
        if prefer is not None and len(turns) > 1:
            for i, owner in enumerate(turns):
                if prefer(owner):
                    return self._take_at(i, owner)
        return self._take_at(0, turns[0])

    def take_if(self, may: Callable[[Hashable], bool]) -> tuple[Hashable, T] | None:
        """As `take`, passing over owners for which `may` is false (they keep their place
        at the front of the line); None when no owner may."""
        for i, owner in enumerate(self._turns):
            if may(owner):
                return self._take_at(i, owner)
        return None

    def _take_at(self, i: int, owner: Hashable) -> tuple[Hashable, T]:
        items = self._by_owner[owner]
        item = items.popleft()
        turns = self._turns
        if i:
            del turns[i]
            if items:
                turns.append(owner)
        elif items:
            turns.rotate(-1)  # more to do: to the end of the line
        else:
            turns.popleft()
        if not items:
            del self._by_owner[owner]
        return owner, item
