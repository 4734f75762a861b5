"""Planning: goals and todos for one thread of one assistant in one session."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ctxactors.compensation import Compensation
from ctxactors.context import ToolContext
from ctxactors.results import ToolError, ToolResult
from ctxactors.tools import Scope, Server, pick, tool

NonEmpty = Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)]


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

    def __init__(self) -> None:
        self.goals: dict[str, dict[str, Any]] = {}
        self.todos: dict[str, dict[str, Any]] = {}
        self._next = 0

    def snapshot(self) -> PlanningState:
        return PlanningState(
            [Goal(**g) for g in self.goals.values()],
            [Todo(**t) for t in self.todos.values()],
            self._next,
        )

    def restore(self, state: PlanningState) -> None:
        self.goals = {g.id: msgspec.structs.asdict(g) for g in state.goals}
        self.todos = {t.id: msgspec.structs.asdict(t) for t in state.todos}
        self._next = state.next

    def _new_id(self, prefix: str) -> str:
        self._next += 1
        return f"{prefix}{self._next}"

    # Undos for transactional batches (ids are never handed out again).
    def _remove_goal(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        self.goals.pop(result["id"], None)

    def _remove_todo(self, ctx: ToolContext, args: Any, result: dict[str, Any]) -> None:
        self.todos.pop(result["id"], None)

    def _done_before(self, ctx: ToolContext, args: Any) -> bool | None:
        todo = self.todos.get(args.todo_id)
        return None if todo is None else bool(todo["done"])

    def _restore_done(
        self, ctx: ToolContext, args: Any, result: dict[str, Any], before: bool | None
    ) -> None:
        todo = self.todos.get(args.todo_id)
        if todo is not None and before is not None:
            todo["done"] = before

    @tool(compensate=_remove_goal, extract=pick(created_goal="id"))
    def create_goal(self, ctx: ToolContext, goal: NonEmpty) -> dict[str, Any]:
        """Create a goal to work towards. Returns its id."""
        goal_id = self._new_id("g")
        record = {"id": goal_id, "goal": goal}
        self.goals[goal_id] = record
        return dict(record)

    @tool(compensate=_remove_todo, extract=pick(created_todo="id", goal_id="goal_id"))
    def add_todo(
        self, ctx: ToolContext, name: NonEmpty, goal_id: str | None = None
    ) -> dict[str, Any]:
        """Add a todo, optionally under an existing goal (by its id)."""
        if goal_id is not None and goal_id not in self.goals:
            raise ToolError(f"goal {goal_id!r} not found")
        todo_id = self._new_id("t")
        record = {"id": todo_id, "name": name, "goal_id": goal_id, "done": False}
        self.todos[todo_id] = record
        return dict(record)

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
        todo["done"] = done
        return dict(todo)

    @tool(read_only=True)
    def get_planning_state(self, ctx: ToolContext) -> dict[str, Any]:
        """All goals and todos of this conversation thread."""
        return {
            "goals": [dict(g) for g in self.goals.values()],
            "todos": [dict(t) for t in self.todos.values()],
        }
