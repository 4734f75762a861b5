"""Playbooks: named step lists, shared by a session's store but owned per assistant."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ctxactors.context import ToolContext
from ctxactors.results import ToolError
from ctxactors.tools import Scope, Server, pick, tool

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Steps = Annotated[
    list[Annotated[str, msgspec.Meta(max_length=10_000)]], msgspec.Meta(max_length=200)
]


class Playbook(msgspec.Struct):
    id: str
    name: str
    agent_id: str | None
    steps: list[str]


class PlaybooksState(msgspec.Struct):
    """What a session's playbooks key saves: the playbooks in order, each assistant's
    selection (as pairs: an assistant may be None), and the id counter."""

    playbooks: list[Playbook]
    selected: list[tuple[str | None, str]]
    next: int


class Playbooks(Server):
    """Each playbook belongs to the assistant that created it; only that one may use it.

    The key is the session, so ownership is enforced by the handler from the caller's
    context (which the model can't forge), not by separate stores.
    """

    name = "playbooks"
    scope = Scope.SESSION
    State = PlaybooksState

    def __init__(self) -> None:
        self.playbooks: dict[str, dict[str, Any]] = {}
        self.selected: dict[str | None, str] = {}  # assistant -> playbook id
        self._next = 0

    def snapshot(self) -> PlaybooksState:
        return PlaybooksState(
            [Playbook(**p) for p in self.playbooks.values()],
            list(self.selected.items()),
            self._next,
        )

    def restore(self, state: PlaybooksState) -> None:
        self.playbooks = {p.id: msgspec.structs.asdict(p) for p in state.playbooks}
        self.selected = dict(state.selected)
        self._next = state.next

    def _remove_playbook(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        """Undo of create_playbook for transactional batches (the id is not reused)."""
        self.playbooks.pop(result["id"], None)

    @tool(compensate=_remove_playbook, extract=pick(created_playbook="id", name="name"))
    def create_playbook(self, ctx: ToolContext, name: Name, steps: Steps = []) -> dict[str, Any]:  # noqa: B006 - msgspec copies empty defaults
        """Create a playbook (a named list of steps) owned by the calling assistant."""
        self._next += 1
        playbook_id = f"pb{self._next}"
        record = {
            "id": playbook_id,
            "name": name,
            "agent_id": ctx.assistant_id,
            "steps": list(steps),
        }
        self.playbooks[playbook_id] = record
        return _copy(record)

    @tool(read_only=True)
    def list_playbooks(self, ctx: ToolContext) -> dict[str, Any]:
        """The calling assistant's playbooks."""
        mine = [
            _copy(p)
            for p in self.playbooks.values()
            if ctx.assistant_id is None or p["agent_id"] == ctx.assistant_id
        ]
        return {"playbooks": mine}

    @tool(
        idempotent=True,
        extract=lambda args, r: {"selected_playbook": (r.structured or {})["selected"]["id"]},
    )
    def select_playbook(self, ctx: ToolContext, id: str) -> dict[str, Any]:
        """Select one of the calling assistant's playbooks to follow."""
        playbook = self.playbooks.get(id)
        if playbook is None:
            raise ToolError(f"playbook {id!r} not found")
        if playbook["agent_id"] != ctx.assistant_id:
            raise ToolError(f"playbook {id!r} does not belong to assistant {ctx.assistant_id!r}")
        self.selected[ctx.assistant_id] = id
        return {"selected": _copy(playbook)}


def _copy(playbook: dict[str, Any]) -> dict[str, Any]:
    return {**playbook, "steps": list(playbook["steps"])}
