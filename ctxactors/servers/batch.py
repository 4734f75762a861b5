"""The batch tool (many operations in one call) and named, parameterised presets of batches.

A batch runs inside the actor of its own key (the caller's session, assistant and thread)
and hands each operation to that operation's key with `Runtime.submit`, with the batch
call's own context, so a batch can reach nothing its caller couldn't reach with direct
calls. Presets live per assistant (``Scope.ASSISTANT``) and run inside the presets actor
the same way. Neither tool may appear inside a batch, so no actor ever waits on itself.

Limits (`ctxactors.settings.BatchSettings`, from the runtime's settings):
``CTXACTORS_BATCH_MAX_OPERATIONS`` (100 operations a
batch or preset, at most 1000), ``CTXACTORS_BATCH_MAX_EXPANDED_BYTES`` (8 MiB of argument
text that references and preset params may build in one run),
``CTXACTORS_BATCH_MAX_RESULT_BYTES`` (16 MiB of results, after which no operation starts),
``CTXACTORS_BATCH_MAX_PRESETS`` (100 presets per assistant),
``CTXACTORS_BATCH_MAX_PRESET_BYTES`` (64 KiB of JSON a preset) and
``CTXACTORS_BATCH_MAX_PRESETS_BYTES`` (1 MiB of presets per assistant).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from ctxactors._call import caller_deadline
from ctxactors.batch.engine import BatchRun
from ctxactors.batch.plan import BatchOptions, Operation, make_plan
from ctxactors.batch.template import PLACEHOLDERS, size_of
from ctxactors.context import ToolContext
from ctxactors.errors import ToolError
from ctxactors.results import ToolResult
from ctxactors.tools import Scope, Server, ToolSpec, tool

Operations = Annotated[list[Operation], msgspec.Meta(max_length=1000)]
PresetName = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"^[\w.-]+$")]
ParamName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
ParamNames = Annotated[list[ParamName], msgspec.Meta(max_length=50)]

# Servers whose tools can't run inside a batch (a nested batch would wait on itself).
EXCLUDED = frozenset({"batch", "presets"})


def run_batch(
    runtime: Any,
    ctx: ToolContext,
    operations: list[Operation],
    options: BatchOptions | None,
    *,
    expanded: int = 0,
) -> ToolResult:
    """Check and run one batch; an error result only when it was rejected or rolled back.

    `expanded` is the argument text its caller already built (a preset's filled params);
    it counts towards the batch's bound.
    """
    options = options or BatchOptions()
    limits = runtime.settings.batch
    steps = make_plan(
        operations,
        runtime.tools,
        ctx,
        excluded=EXCLUDED,
        max_operations=limits.max_operations,
        transactional=options.transactional,
    )
    run = BatchRun(
        runtime,
        steps,
        options,
        caller_deadline=caller_deadline(),
        max_expanded=limits.max_expanded_bytes,
        max_result=limits.max_result_bytes,
        expanded=expanded,
    )
    result, rolled_back = run.execute()
    structured = msgspec.to_builtins(result)
    if not rolled_back:
        return ToolResult.ok(structured)
    text = msgspec.json.encode(structured).decode()
    return ToolResult(
        content=[{"type": "text", "text": "batch rolled back: " + text}],
        structured=structured,
        is_error=True,
    )


class Batch(Server):
    """Runs a batch of operations for the caller's context (one actor per thread)."""

    name = "batch"
    scope = Scope.THREAD

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    @classmethod
    def create(cls, runtime: Any) -> Batch:
        return cls(runtime)

    @tool(destructive=True, open_world=True, blocking=True)  # waits for other keys' answers
    def batch(
        self, ctx: ToolContext, operations: Operations, options: BatchOptions | None = None
    ) -> ToolResult:
        """Run many tool calls in one call. Each operation names a `tool` (or `category` +
        `action`) and its `arguments`; `dependsOn` lists ids that must succeed first;
        `condition` {ifSuccess|ifFailed: id} runs it on another's outcome; a string
        argument "${id.path}" is replaced by that operation's result value. Options:
        `parallel` runs independent operations at once, `transactional` undoes everything
        if any operation fails, `timeout` (ms) bounds the batch. Every operation runs with
        this call's own context. Returns a summary and a result per operation (success,
        failed, skipped or rolled_back)."""
        return run_batch(self._runtime, ctx, operations, options)


class _Preset(msgspec.Struct):
    name: str
    operations: list[dict[str, Any]]  # as given, placeholders unfilled
    params: list[str]
    options: BatchOptions | None
    size: int  # bytes of JSON, for the per-assistant bound


class PresetsState(msgspec.Struct):
    """What an assistant's presets key saves: its presets in the order they were made."""

    presets: list[_Preset]


class Presets(Server):
    """Named, parameterised batches kept per assistant (``{{param}}`` placeholders)."""

    name = "presets"
    scope = Scope.ASSISTANT
    State = PresetsState

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self.limits = runtime.settings.batch
        self.max_presets = self.limits.max_presets
        self.max_preset_bytes = self.limits.max_preset_bytes
        self.max_total_bytes = self.limits.max_presets_bytes
        self._presets: dict[str, _Preset] = {}

    @classmethod
    def create(cls, runtime: Any) -> Presets:
        return cls(runtime)

    def snapshot(self) -> PresetsState:
        return PresetsState(list(self._presets.values()))

    def restore(self, state: PresetsState) -> None:
        self._presets = {p.name: p for p in state.presets}

    @tool(idempotent=True)
    def save_preset(
        self,
        ctx: ToolContext,
        name: PresetName,
        operations: Operations,
        params: ParamNames = [],  # noqa: B006 - msgspec copies empty defaults
        options: BatchOptions | None = None,
    ) -> dict[str, Any]:
        """Save a batch under a name to run again with run_preset. Strings in the
        operations may hold {{param}} placeholders; list every one in `params`. It is
        checked now as far as it can be without the params' values."""
        raw = msgspec.to_builtins(operations)
        size = len(msgspec.json.encode([raw, params, options]))
        if size > self.max_preset_bytes:
            raise ToolError(
                f"preset {name!r} is {size} bytes, over the limit of {self.max_preset_bytes} "
                "(CTXACTORS_BATCH_MAX_PRESET_BYTES); not saved"
            )
        undeclared = sorted(set(PLACEHOLDERS.keys(raw)) - set(params))
        if undeclared:
            raise ToolError(f"preset {name!r} uses undeclared params: {', '.join(undeclared)}")
        make_plan(
            operations,
            self._runtime.tools,
            ctx,
            excluded=EXCLUDED,
            max_operations=self.limits.max_operations,
            transactional=bool(options and options.transactional),
            placeholders=PLACEHOLDERS,
        )
        old = self._presets.get(name)
        if old is None and len(self._presets) >= self.max_presets:
            raise ToolError(f"at most {self.max_presets} presets per assistant; none saved")
        total = sum(p.size for p in self._presets.values()) - (old.size if old else 0) + size
        if total > self.max_total_bytes:
            raise ToolError(
                f"the assistant's presets would hold {total} bytes, over the limit of "
                f"{self.max_total_bytes} (CTXACTORS_BATCH_MAX_PRESETS_BYTES); "
                f"preset {name!r} not saved"
            )
        kept = sorted(set(params))
        self._presets[name] = _Preset(name, raw, kept, options, size)
        return {"name": name, "params": kept, "replaced": old is not None}

    @tool(read_only=True)
    def list_presets(self, ctx: ToolContext) -> dict[str, Any]:
        """The calling assistant's presets: name, params and number of operations."""
        presets = [
            {"name": p.name, "params": list(p.params), "operations": len(p.operations)}
            for p in self._presets.values()
        ]
        return {"presets": presets}

    @tool(destructive=True, open_world=True, blocking=True)  # waits for other keys' answers
    def run_preset(
        self,
        ctx: ToolContext,
        name: PresetName,
        params: dict[str, Any] = {},  # noqa: B006 - msgspec copies empty defaults
    ) -> ToolResult:
        """Run a saved preset as a batch, filling its {{param}} placeholders."""
        preset = self._presets.get(name)
        if preset is None:
            raise ToolError(f"preset {name!r} not found")
        missing = sorted(set(preset.params) - set(params))
        unknown = sorted(set(params) - set(preset.params))
        if missing or unknown:
            raise ToolError(
                f"preset {name!r} takes params {preset.params}; "
                f"missing {missing}, unknown {unknown}"
            )
        expanded = _filled_size(preset, params, self.limits.max_expanded_bytes)
        filled = PLACEHOLDERS.fill(preset.operations, params.__getitem__)
        operations = msgspec.convert(filled, list[Operation])
        return run_batch(self._runtime, ctx, operations, preset.options, expanded=expanded)


def _filled_size(preset: _Preset, params: Mapping[str, Any], limit: int) -> int:
    """The argument text filling the params would build, refused before it is built when
    it would pass the batch's bound (a big param used many times)."""
    sizes = {name: size_of(value) for name, value in params.items()}
    total = 0
    for index, op in enumerate(preset.operations):
        total += PLACEHOLDERS.filled_size(op, sizes.__getitem__)
        if total > limit:
            where = f"operation {index} ({op['id']!r})" if "id" in op else f"operation {index}"
            raise ToolError(
                f"preset {preset.name!r}: filling its params would build {total} bytes of "
                f"arguments by {where}, over the limit of {limit} "
                "(CTXACTORS_BATCH_MAX_EXPANDED_BYTES); nothing ran"
            )
    return total


# -- unified tool listing ----------------------------------------------------------------


def unified_definitions(tools: Mapping[str, ToolSpec]) -> list[dict[str, Any]]:
    """The batch and preset tools only; the batch description names every other tool.

    For hosts that would rather show the model one tool than dozens: every category
    (server) and action (tool) is listed with its arguments, and all of them stay callable.
    """
    catalog: dict[str, list[str]] = {}
    for spec in tools.values():
        if spec.server.name not in EXCLUDED:
            catalog.setdefault(spec.server.name, []).append(_signature(spec))
    lines = [f"- {server}: " + "; ".join(actions) for server, actions in catalog.items()]
    definitions = []
    for spec in tools.values():
        if spec.server.name not in EXCLUDED:
            continue
        definition = spec.definition()
        if spec.name == "batch":
            definition["description"] += (
                "\n\nCategories and actions (category: action{arguments}, ? = optional):\n"
                + "\n".join(lines)
            )
        definitions.append(definition)
    return definitions


def _signature(spec: ToolSpec) -> str:
    schema = spec.input_schema
    required = set(schema.get("required", ()))
    args = [
        f"{name}{'' if name in required else '?'}: {_type_name(prop)}"
        for name, prop in schema.get("properties", {}).items()
    ]
    summary = spec.description.split("\n\n")[0].replace("\n", " ")
    return f"{spec.name}{{{', '.join(args)}}} ({summary})"


def _type_name(prop: Mapping[str, Any]) -> str:
    if "anyOf" in prop:
        return "|".join(_type_name(p) for p in prop["anyOf"])
    if "$ref" in prop:
        return "object"
    kind = prop.get("type", "any")
    if kind == "array":
        return _type_name(prop.get("items", {})) + "[]"
    return str(kind)
