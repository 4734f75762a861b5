"""How a tool says what undoes it, for transactional batches.

A tool that changes state declares its undo with ``@tool(compensate=...)``. Two forms:

- a plain function ``undo(server, ctx, args, result) -> None``, enough when the call's own
  result says what to undo (``create_goal`` returned the id to remove);
- a `Compensation` whose ``before(server, ctx, args)`` runs inside the key's actor right
  before the tool and records what the tool is about to overwrite (``mark_todo``'s old
  ``done`` flag, ``delete_content``'s text); its ``undo`` then gets that record as a fifth
  argument.

`args` is the validated arguments object (attributes by field name) and `result` the
tool's structured result (a dict, or None). Both run in the key's own actor thread, so
they touch the server's state like any handler. An undo that raises is reported as a
failed rollback of that operation; the others still run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Undo = Callable[..., None]
Before = Callable[[Any, Any, Any], Any]


class Compensation:
    """An undo that needs the state from before the tool ran (see the module docstring)."""

    __slots__ = ("undo", "before")

    def __init__(self, undo: Undo, before: Before | None = None) -> None:
        self.undo = undo
        self.before = before

    def prepare(self, server: Any, ctx: Any, args: Any) -> Any:
        """Record what the undo will need; runs in the actor just before the tool."""
        return None if self.before is None else self.before(server, ctx, args)

    def __call__(self, server: Any, ctx: Any, args: Any, result: Any, prior: Any) -> None:
        """Undo one call (in the key's actor), given what `prepare` recorded."""
        if self.before is None:
            self.undo(server, ctx, args, result)
        else:
            self.undo(server, ctx, args, result, prior)


def as_compensation(value: Compensation | Undo | None) -> Compensation | None:
    """The `compensate=` option of a tool in one shape (None when it has none)."""
    if value is None or isinstance(value, Compensation):
        return value
    return Compensation(value)
