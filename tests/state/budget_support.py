"""What the state-budget tests share: a durable server whose saves have a known size, and
the count checked against what the store holds."""

from __future__ import annotations

from typing import Any

from ctxactors import Runtime, Scope, Server, ToolContext, tool


class Blobs(Server):
    """A durable server holding one text per session."""

    name = "blobs"
    scope = Scope.SESSION
    State = str

    def __init__(self) -> None:
        self.text = ""

    def snapshot(self) -> str:
        return self.text

    def restore(self, state: str) -> None:
        self.text = state

    @tool
    def put(self, ctx: ToolContext, size: int, fill: str = "x") -> dict[str, Any]:
        """Keep `size` characters."""
        self.text = fill * size
        return {"size": size}

    @tool(read_only=True)
    def get(self, ctx: ToolContext) -> dict[str, Any]:
        """The text kept."""
        return {"text": self.text}


def stored(size: int) -> int:
    """The bytes a `put` of `size` characters stores (msgpack str header included)."""
    return size + (1 if size < 32 else 2 if size < 256 else 3)


def settled(rt: Runtime, principal: str) -> int:
    """The principal's count once the histories are written: exactly what the store holds
    (each key's state and each session's history)."""
    assert rt.durability is not None
    rt.durability.flush()
    stored = rt.durability.store.principal_bytes(principal)
    count = rt.durability.budget.held(principal)
    assert count == sum(stored.values()), (count, stored)
    return count
