"""The batch tool's types, and turning a list of operations into a checked plan.

The msgspec types here are the batch tool's argument and result types: the published
``inputSchema`` and the validation both come from them. `make_plan` checks a whole batch
before anything runs (unknown tools, duplicate ids, unknown dependencies, cycles, size,
nesting, missing compensations, each operation's arguments), and any problem rejects the
batch with a `ToolError` naming the operation.
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import msgspec

from ctxactors.batch.compensation import Compensation, as_compensation
from ctxactors.batch.pending import Placement, holds_placeholder, pending_problems
from ctxactors.batch.template import REFERENCES, Path, Template
from ctxactors.context import ToolContext, clean_args
from ctxactors.errors import CtxActorsError, ToolError
from ctxactors.tools import ToolSpec

OpId = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
Millis = Annotated[int, msgspec.Meta(ge=1, le=3_600_000)]


class Condition(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """Run an operation only on the outcome of another: give exactly one of the two."""

    if_success: Annotated[
        OpId | None, msgspec.Meta(description="run only if this operation succeeded")
    ] = None
    if_failed: Annotated[
        OpId | None, msgspec.Meta(description="run only if this operation failed")
    ] = None


class Operation(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """One tool call of a batch."""

    tool: Annotated[str | None, msgspec.Meta(description="tool name (or category+action)")] = None
    category: Annotated[str | None, msgspec.Meta(description="server name")] = None
    action: Annotated[str | None, msgspec.Meta(description="tool name within category")] = None
    id: Annotated[OpId | None, msgspec.Meta(description="name for dependsOn/${id.path}")] = None
    arguments: Annotated[
        dict[str, Any],
        msgspec.Meta(description='tool arguments; "${opId.path}" inserts an earlier result'),
    ] = {}
    depends_on: Annotated[
        list[OpId], msgspec.Meta(max_length=1000, description="ids that must succeed first")
    ] = []
    condition: Condition | None = None
    # No context field (session, assistant, thread): an operation runs with exactly the
    # batch caller's context, and msgspec refuses any such field as unknown.
    timeout: Annotated[Millis | None, msgspec.Meta(description="this operation's limit, ms")] = None


class BatchOptions(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """How the whole batch runs."""

    parallel: Annotated[bool, msgspec.Meta(description="run independent operations at once")] = (
        False
    )
    transactional: Annotated[
        bool, msgspec.Meta(description="on any failure undo what succeeded")
    ] = False
    timeout: Annotated[Millis | None, msgspec.Meta(description="whole batch limit, ms")] = None
    include_metadata: bool = False
    max_concurrency: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None


class OpError(msgspec.Struct):
    code: str
    message: str


class OpMetadata(msgspec.Struct, rename="camel"):
    started_ms: float
    duration_ms: float
    deduplicated: bool = False


class OpResult(msgspec.Struct, omit_defaults=True):
    """What became of one operation: status is success, failed, skipped or rolled_back."""

    id: str
    tool: str
    status: str
    data: Any = None
    error: OpError | None = None
    metadata: OpMetadata | None = None


class Summary(msgspec.Struct, rename="camel"):
    total: int
    successful: int
    failed: int
    skipped: int
    rolled_back: int
    execution_time: float  # ms


class BatchResult(msgspec.Struct):
    summary: Summary
    results: list[OpResult]


class Step:
    """One operation after checking: the tool, its context, and what it waits for."""

    __slots__ = (
        "index",
        "id",
        "spec",
        "args",
        "validated",
        "ctx",
        "needs",
        "after",
        "condition",
        "timeout",
        "compensation",
    )

    def __init__(
        self, index: int, op_id: str, spec: ToolSpec, args: dict[str, Any], ctx: ToolContext
    ) -> None:
        self.index = index
        self.id = op_id
        self.spec = spec
        self.args = args
        self.validated: Any = None  # None while the arguments hold references
        self.ctx = ctx
        self.needs: set[str] = set()  # must have succeeded (dependsOn + references)
        self.after: set[str] = set()  # must have finished (needs + the condition's op)
        self.condition: Condition | None = None
        self.timeout: float | None = None  # seconds
        self.compensation: Compensation | None = None


def references(value: Any) -> set[str]:
    """The operation ids referenced anywhere inside an argument value."""
    return {op_id for op_id, _ in REFERENCES.keys(value)}


def make_plan(
    operations: list[Operation],
    tools: Mapping[str, ToolSpec],
    ctx: ToolContext,
    *,
    excluded: frozenset[str],
    max_operations: int,
    transactional: bool = False,
    placeholders: Template[Any] | None = None,
) -> list[Step]:
    """Check a batch as a whole and return its steps in input order.

    `excluded` names the servers whose tools may not appear in a batch (the batch and
    preset tools themselves: a nested batch is refused). An argument whose value holds a
    reference, or one of `placeholders` (a preset's ``{{param}}``, filled when it runs), is
    checked by name now and by value once filled; every other argument is checked now.
    """
    if not operations:
        raise ToolError("a batch needs at least one operation")
    if len(operations) > max_operations:
        raise ToolError(
            f"a batch may hold at most {max_operations} operations, got {len(operations)}"
        )
    templates = [REFERENCES, *([placeholders] if placeholders else [])]

    def placement(text: str) -> Placement:
        if any(t.whole(text) is not None for t in templates):
            return "whole"
        return "inside" if any(t.keys(text) for t in templates) else None

    steps: list[Step] = []
    seen: dict[str, int] = {}
    for index, op in enumerate(operations):
        where = f"operation {index} ({op.id!r})" if op.id else f"operation {index}"
        spec = _resolve_tool(op, tools, where)
        if spec.server.name in excluded:
            raise ToolError(f"{where}: {spec.name!r} can't run inside a batch (no nesting)")
        op_id = op.id if op.id is not None else f"#{index}"
        if op_id in seen:
            raise ToolError(f"{where}: duplicate id {op_id!r} (also operation {seen[op_id]})")
        seen[op_id] = index
        step = _schedule(Step(index, op_id, spec, clean_args(op.arguments), ctx), op, where)
        if transactional and step.compensation is None and not spec.read_only:
            raise ToolError(
                f"{where}: {spec.name!r} has no compensation, so it can't run in a "
                "transactional batch"
            )
        _check_arguments(step, where, placement)
        steps.append(step)
    _check_order(steps)
    return steps


def _schedule(step: Step, op: Operation, where: str) -> Step:
    """`step` with what it waits for, its timeout and its compensation (from `op`).

    Its context is exactly the batch call's own; reserved fields inside the arguments
    were dropped."""
    step.needs = set(op.depends_on) | references(step.args)
    step.condition = op.condition
    step.after = set(step.needs)
    if op.condition is not None:
        given = [c for c in (op.condition.if_success, op.condition.if_failed) if c]
        if len(given) != 1:
            raise ToolError(f"{where}: a condition names exactly one of ifSuccess/ifFailed")
        step.after.add(given[0])
    step.timeout = None if op.timeout is None else op.timeout / 1000
    step.compensation = as_compensation(step.spec.compensate)
    return step


def _check_arguments(step: Step, where: str, placement: Callable[[str], Placement]) -> None:
    """Validate the arguments now, or, while placeholders are in them, all that is known
    before they are filled (they are validated again once filled)."""
    if not holds_placeholder(step.args, placement):
        try:
            step.validated = step.spec.validate(step.args)
        except CtxActorsError as exc:
            raise ToolError(f"{where}: {exc}") from None
    else:
        _check_known(step.spec, step.args, where, placement)


def _check_order(steps: list[Step]) -> None:
    """Every step waits only for other, known steps, and the waits form no cycle."""
    ids = {step.id for step in steps}
    for step in steps:
        for other in sorted(step.after):
            if other not in ids:
                raise ToolError(
                    f"operation {step.index} ({step.id!r}) depends on unknown {other!r}"
                )
            if other == step.id:
                raise ToolError(f"operation {step.index} ({step.id!r}) depends on itself")
    try:
        graphlib.TopologicalSorter({s.id: s.after for s in steps}).prepare()
    except graphlib.CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        raise ToolError(f"the operations' dependencies form a cycle: {cycle}") from None


def _check_known(
    spec: ToolSpec, args: Mapping[str, Any], where: str, placement: Callable[[str], Placement]
) -> None:
    """Check what can be checked before the placeholders are filled in: every name, each
    value without a placeholder, and the shape around them (`batch_pending`)."""
    fields = msgspec.structs.fields(spec.args_type)
    unknown = sorted(set(args) - {f.encode_name for f in fields})
    missing = [f.encode_name for f in fields if f.required and f.encode_name not in args]
    problems = []
    if unknown:
        problems.append(f"unknown {', '.join(unknown)}")
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    for field in fields:
        value = args.get(field.encode_name, _ABSENT)
        if value is not _ABSENT:
            problems += pending_problems(value, field.type, field.encode_name, placement)
    if problems:
        raise ToolError(f"{where}: invalid arguments for {spec.name!r}: {'; '.join(problems)}")


_ABSENT = object()


def _resolve_tool(op: Operation, tools: Mapping[str, ToolSpec], where: str) -> ToolSpec:
    name = op.tool if op.tool is not None else op.action
    if name is None:
        raise ToolError(f"{where}: give `tool`, or `category` and `action`")
    if op.tool is not None and op.action is not None and op.action != op.tool:
        raise ToolError(f"{where}: `tool` {op.tool!r} and `action` {op.action!r} disagree")
    spec = tools.get(name)
    if spec is None:
        raise ToolError(f"{where}: unknown tool {name!r}")
    if op.category is not None and op.category != spec.server.name:
        raise ToolError(
            f"{where}: {name!r} is in category {spec.server.name!r}, not {op.category!r}"
        )
    return spec


class BadReference(ToolError):
    """A `${opId.path}` that names no value in that operation's result."""


def resolve(value: Any, results: Mapping[str, Any]) -> Any:
    """The value with every reference replaced from the finished operations' data.

    A string that is exactly one reference becomes the referenced value (any type); a
    reference inside a longer string is replaced by the value's text.
    """
    return REFERENCES.fill(value, lambda ref: lookup(ref, results))


def lookup(ref: Path, results: Mapping[str, Any]) -> Any:
    """The value a reference names, or `BadReference` saying where the path ends."""
    op_id, path = ref
    value = results.get(op_id)
    walked = op_id
    for part in path:
        walked += "." + part
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise BadReference(f"reference ${{{'.'.join((op_id, *path))}}}: no value at {walked}")
    return value
