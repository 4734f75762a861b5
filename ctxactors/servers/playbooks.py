"""Playbooks: named step lists, shared by a session's store but owned per assistant.

Limits (`ctxactors.settings.PlaybooksSettings`, from the runtime's settings):
``CTXACTORS_PLAYBOOKS_MAX_PLAYBOOKS`` (1,000 per session), ``CTXACTORS_PLAYBOOKS_MAX_STEPS``
(200 per playbook), ``CTXACTORS_MAX_TEXT_BYTES`` (64 KiB per step) and
``CTXACTORS_PLAYBOOKS_MAX_BYTES`` (8 MiB of names and steps per session). Over a limit the
call is refused with a message naming it, and nothing already stored changes.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ctxactors.bounds import AnswerBudget, check_texts, text_size
from ctxactors.context import ToolContext
from ctxactors.errors import ToolError
from ctxactors.settings import DEFAULTS, Settings
from ctxactors.tools import Scope, Server, pick, tool

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


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
    context (which the model can't forge), not by separate stores. A caller without an
    assistant is one more owner: it sees and selects only playbooks no assistant owns.
    """

    name = "playbooks"
    scope = Scope.SESSION
    State = PlaybooksState

    @classmethod
    def create(cls, runtime: Any) -> Playbooks:
        return cls(runtime.settings)

    def __init__(self, settings: Settings = DEFAULTS) -> None:
        self.settings = settings
        self.max_playbooks = settings.playbooks.cap("max_playbooks")
        self.max_steps = settings.playbooks.cap("max_steps")
        self.max_bytes = settings.playbooks.cap("max_bytes")
        self.max_text_bytes = settings.cap("max_text_bytes")
        self.playbooks: dict[str, dict[str, Any]] = {}
        self.selected: dict[str | None, str] = {}  # assistant -> playbook id
        self._next = 0
        self._bytes = 0  # UTF-8 bytes of every name and step kept

    def _size(self, name: str, steps: list[str]) -> int:
        """The playbook's size if it fits every limit; else `ToolError` naming the limit."""
        if len(self.playbooks) >= self.max_playbooks.value:
            have = len(self.playbooks)
            raise ToolError(self.max_playbooks.exceeded(f"this session has {have:,} playbooks"))
        if len(steps) > self.max_steps.value:
            raise ToolError(self.max_steps.exceeded(f"the playbook has {len(steps):,} steps"))
        size = text_size(name) + check_texts(self.max_text_bytes, "step", steps)
        if self._bytes + size > self.max_bytes.value:
            total = f"{self._bytes + size:,}"
            raise ToolError(
                self.max_bytes.exceeded(f"this session's playbooks would hold {total} bytes")
            )
        return size

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
        playbook = self.playbooks.pop(result["id"], None)
        if playbook is not None:
            self._bytes -= text_size(playbook["name"]) + sum(map(text_size, playbook["steps"]))

    @tool(compensate=_remove_playbook, extract=pick(created_playbook="id", name="name"))
    def create_playbook(
        self,
        ctx: ToolContext,
        name: Name,
        steps: list[str] = [],  # noqa: B006 - msgspec copies empty defaults
    ) -> dict[str, Any]:
        """Create a playbook (a named list of steps) owned by the calling assistant."""
        self._bytes += self._size(name, steps)
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
        """The calling assistant's playbooks (the first ones, with `truncated` and the
        total, if they don't all fit in one answer)."""
        mine = [p for p in self.playbooks.values() if p["agent_id"] == ctx.assistant_id]
        budget = AnswerBudget(self.settings.max_answer_bytes)
        return budget.mark({"playbooks": budget.take(map(_copy, mine))}, total=len(mine))

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
