"""The batch tool (many operations in one call) and named, parameterised presets of batches.

A batch runs inside the actor of its own key (the caller's session, assistant and thread)
and hands each operation to that operation's key with `Runtime.submit`, with the batch
call's own context, so a batch can reach nothing its caller couldn't reach with direct
calls. Presets live per assistant (``Scope.ASSISTANT``) and run inside the presets actor
the same way. Neither tool may appear inside a batch, so no actor ever waits on itself.

Limits (environment, read at import): ``CTXACTORS_BATCH_MAX_OPERATIONS`` (100 operations a
batch, at most 1000) and ``CTXACTORS_BATCH_MAX_PRESETS`` (100 presets per assistant).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import msgspec

from ctxactors.batch_engine import BatchRun
from ctxactors.batch_plan import BatchOptions, Operation, make_plan
from ctxactors.context import ToolContext
from ctxactors.results import ToolError, ToolResult
from ctxactors.settings import env_int
from ctxactors.tools import Scope, Server, ToolSpec, tool

Operations = Annotated[list[Operation], msgspec.Meta(max_length=1000)]
PresetName = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"^[\w.-]+$")]
ParamName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]

# Servers whose tools can't run inside a batch (a nested batch would wait on itself).
EXCLUDED = frozenset({"batch", "presets"})


def run_batch(
    runtime: Any,
    ctx: ToolContext,
    operations: list[Operation],
    options: BatchOptions | None,
    max_operations: int,
) -> ToolResult:
    """Check and run one batch; an error result only when it was rejected or rolled back."""
    options = options or BatchOptions()
    steps = make_plan(
        operations,
        runtime.tools,
        ctx,
        excluded=EXCLUDED,
        max_operations=max_operations,
        transactional=options.transactional,
    )
    result, rolled_back = BatchRun(runtime, steps, options).execute()
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
    max_operations: ClassVar[int] = env_int("CTXACTORS_BATCH_MAX_OPERATIONS", 100)

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    @classmethod
    def create(cls, runtime: Any) -> Batch:
        return cls(runtime)

    @tool(destructive=True, open_world=True)
    def batch(
        self, ctx: ToolContext, operations: Operations, options: BatchOptions | None = None
    ) -> ToolResult:
        """Run many tool calls in one call. Each operation names a `tool` (or `category` +
        `action`) and its `arguments`; `dependsOn` lists ids that must succeed first;
        `condition` {ifSuccess|ifFailed: id} runs it on another's outcome; a string
        argument "${id.path}" is replaced by that operation's result value. Options:
        `parallel` runs independent operations at once, `transactional` undoes everything
        if any operation fails, `timeout` (ms) bounds the batch. Returns a summary and a
        result per operation (success, failed, skipped or rolled_back)."""
        return run_batch(self._runtime, ctx, operations, options, self.max_operations)


class _Preset(msgspec.Struct):
    name: str
    operations: list[Operation]
    params: list[str]
    options: BatchOptions | None


PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class Presets(Server):
    """Named, parameterised batches kept per assistant (``{{param}}`` placeholders)."""

    name = "presets"
    scope = Scope.ASSISTANT
    max_presets: ClassVar[int] = env_int("CTXACTORS_BATCH_MAX_PRESETS", 100)

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self._presets: dict[str, _Preset] = {}

    @classmethod
    def create(cls, runtime: Any) -> Presets:
        return cls(runtime)

    @tool(idempotent=True)
    def save_preset(
        self,
        ctx: ToolContext,
        name: PresetName,
        operations: Operations,
        params: list[ParamName] = [],  # noqa: B006 - msgspec copies empty defaults
        options: BatchOptions | None = None,
    ) -> dict[str, Any]:
        """Save a batch under a name to run again with run_preset. Strings in the
        operations may hold {{param}} placeholders; list every one in `params`."""
        used = _placeholders(msgspec.to_builtins(operations))
        undeclared = sorted(used - set(params))
        if undeclared:
            raise ToolError(f"preset {name!r} uses undeclared params: {', '.join(undeclared)}")
        make_plan(
            operations,
            self._runtime.tools,
            ctx,
            excluded=EXCLUDED,
            max_operations=Batch.max_operations,
            transactional=bool(options and options.transactional),
            check_arguments=not params,
        )
        replaced = name in self._presets
        if not replaced and len(self._presets) >= self.max_presets:
            raise ToolError(f"at most {self.max_presets} presets per assistant; none saved")
        self._presets[name] = _Preset(name, list(operations), sorted(set(params)), options)
        return {"name": name, "params": sorted(set(params)), "replaced": replaced}

    @tool(read_only=True)
    def list_presets(self, ctx: ToolContext) -> dict[str, Any]:
        """The calling assistant's presets: name, params and number of operations."""
        presets = [
            {"name": p.name, "params": list(p.params), "operations": len(p.operations)}
            for p in self._presets.values()
        ]
        return {"presets": presets}

    @tool(destructive=True, open_world=True)
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
        filled = _fill(msgspec.to_builtins(preset.operations), params)
        operations = msgspec.convert(filled, list[Operation])
        return run_batch(self._runtime, ctx, operations, preset.options, Batch.max_operations)


def _placeholders(value: Any) -> set[str]:
    if isinstance(value, str):
        return set(PLACEHOLDER.findall(value))
    if isinstance(value, dict):
        return set().union(*map(_placeholders, value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*map(_placeholders, value)) if value else set()
    return set()


def _fill(value: Any, params: Mapping[str, Any]) -> Any:
    """Replace placeholders: a string that is exactly one keeps the param's type."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole:
            return params[whole.group(1)]
        return PLACEHOLDER.sub(lambda m: _text(params[m.group(1)]), value)
    if isinstance(value, dict):
        return {k: _fill(v, params) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, params) for v in value]
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


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
