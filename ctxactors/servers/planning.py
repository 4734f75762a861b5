"""Planning: goals and todos for one thread of one assistant in one session.

Limits (`ctxactors.settings.PlanningSettings`, from the runtime's settings):
``CTXACTORS_PLANNING_MAX_GOALS`` and ``CTXACTORS_PLANNING_MAX_TODOS`` (1,000 each per key),
``CTXACTORS_MAX_TEXT_BYTES`` (64 KiB per goal or todo name) and
``CTXACTORS_PLANNING_MAX_BYTES`` (8 MiB of text per key). Over a limit the call is refused
with a message naming it, and nothing already stored changes.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec.structs import asdict

from ctxactors.batch.compensation import Compensation
from ctxactors.bounds import AnswerBudget, check_text, text_size
from ctxactors.context import ToolContext
from ctxactors.errors import ToolError
from ctxactors.results import ToolResult
from ctxactors.settings import DEFAULTS, Cap, Settings
from ctxactors.tools import Scope, Server, pick, tool

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


def _todo_outcome(args: dict[str, Any], result: ToolResult) -> dict[str, Any]:
    todo = result.structured or {}
    return {("completed_todo" if todo.get("done") else "reopened_todo"): todo.get("id")}


class Goal(msgspec.Struct):
    id: str
    goal: str


class Todo(msgspec.Struct):
    id: str
    name: str
    goal_id: str | None
    done: bool


class PlanningState(msgspec.Struct):
    """What a planning key saves: its goals and todos in order, and the id counter."""

    goals: list[Goal]
    todos: list[Todo]
    next: int


class Planning(Server):
    """Goals and the todos under them. Ids are never reused within a key."""

    name = "planning"
    scope = Scope.THREAD
    State = PlanningState

    @classmethod
    def create(cls, runtime: Any) -> Planning:
        return cls(runtime.settings)

    def __init__(self, settings: Settings = DEFAULTS) -> None:
        self.settings = settings
        self.max_goals = settings.planning.cap("max_goals")
        self.max_todos = settings.planning.cap("max_todos")
        self.max_bytes = settings.planning.cap("max_bytes")
        self.max_text_bytes = settings.cap("max_text_bytes")
        # Kept as the State's own structs, so a snapshot (taken after every changing call)
        # is two lists, not a struct built per item.
        self.goals: dict[str, Goal] = {}
        self.todos: dict[str, Todo] = {}
        self._next = 0
        self._bytes = 0  # UTF-8 bytes of every goal and todo name kept

    def snapshot(self) -> PlanningState:
        # Shares the structs: it is encoded at once, in this actor's thread.
        return PlanningState(list(self.goals.values()), list(self.todos.values()), self._next)

    def restore(self, state: PlanningState) -> None:
        self.goals = {g.id: g for g in state.goals}
        self.todos = {t.id: t for t in state.todos}
        self._next = state.next
        # The byte cap counts what is kept: a reloaded key must not start from zero.
        self._bytes = sum(text_size(g.goal) for g in state.goals) + sum(
            text_size(t.name) for t in state.todos
        )

    def _new_id(self, prefix: str) -> str:
        self._next += 1
        return f"{prefix}{self._next}"

    def _admit(self, kind: str, kept: dict[str, Any], cap: Cap, text: str) -> int:
        """The text's size if one more `kind` fits every limit; else `ToolError`."""
        if len(kept) >= cap.value:
            raise ToolError(cap.exceeded(f"this thread already has {len(kept):,} {kind}s"))
        size = check_text(self.max_text_bytes, f"the {kind}", text)
        if self._bytes + size > self.max_bytes.value:
            total = f"{self._bytes + size:,}"
            raise ToolError(
                self.max_bytes.exceeded(f"this thread's goals and todos would hold {total} bytes")
            )
        return size

    # Undos for transactional batches (ids are never handed out again).
    def _remove_goal(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        goal = self.goals.pop(result["id"], None)
        if goal is not None:
            self._bytes -= text_size(goal.goal)

    def _remove_todo(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        todo = self.todos.pop(result["id"], None)
        if todo is not None:
            self._bytes -= text_size(todo.name)

    def _done_before(self, ctx: ToolContext, args: Any) -> bool | None:
        todo = self.todos.get(args.todo_id)
        return None if todo is None else todo.done

    def _restore_done(
        self, ctx: ToolContext, args: Any, result: dict[str, Any], before: bool | None
    ) -> None:
        todo = self.todos.get(args.todo_id)
        if todo is not None and before is not None:
            todo.done = before

    @tool(compensate=_remove_goal, extract=pick(created_goal="id"))
    def create_goal(self, ctx: ToolContext, goal: NonEmpty) -> dict[str, Any]:
        """Create a goal to work towards. Returns its id."""
        self._bytes += self._admit("goal", self.goals, self.max_goals, goal)
        goal_id = self._new_id("g")
        record = self.goals[goal_id] = Goal(goal_id, goal)
        return asdict(record)

    @tool(compensate=_remove_todo, extract=pick(created_todo="id", goal_id="goal_id"))
    def add_todo(
        self, ctx: ToolContext, name: NonEmpty, goal_id: str | None = None
    ) -> dict[str, Any]:
        """Add a todo, optionally under an existing goal (by its id)."""
        if goal_id is not None and goal_id not in self.goals:
            raise ToolError(f"goal {goal_id!r} not found")
        self._bytes += self._admit("todo", self.todos, self.max_todos, name)
        todo_id = self._new_id("t")
        record = self.todos[todo_id] = Todo(todo_id, name, goal_id, False)
        return asdict(record)

    @tool(
        idempotent=True,
        compensate=Compensation(_restore_done, before=_done_before),
        extract=_todo_outcome,
    )
    def mark_todo(self, ctx: ToolContext, todo_id: str, done: bool = True) -> dict[str, Any]:
        """Mark a todo done (or not done again with done=false)."""
        todo = self.todos.get(todo_id)
        if todo is None:
            raise ToolError(f"todo {todo_id!r} not found")
        todo.done = done
        return asdict(todo)

    @tool(read_only=True)
    def get_planning_state(self, ctx: ToolContext) -> dict[str, Any]:
        """All goals and todos of this conversation thread (the first ones, with
        `truncated` and the totals, if they don't all fit in one answer)."""
        budget = AnswerBudget(self.settings.max_answer_bytes)
        goals = budget.take(asdict(g) for g in self.goals.values())
        todos = budget.take(asdict(t) for t in self.todos.values())
        return budget.mark(
            {"goals": goals, "todos": todos},
            total_goals=len(self.goals),
            total_todos=len(self.todos),
        )
