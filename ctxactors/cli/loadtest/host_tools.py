"""Host tools in the load test's mix: the tools of ``--server`` classes, with arguments made
up from their types.

The checker has a model of the planning and playbook tools only; a host tool's state is the
host's own, so its answers are checked for one thing: that they are not errors. Its
arguments are made from its args type (`msgspec.inspect`), required fields only (the others
keep their defaults): a string is the call's label (``session/assistant/thread#n``, so the
host's state says who wrote it), a number the call's sequence number, within the field's
bounds. A tool with a required argument of a type that can't be made up this way is refused
when the options are read, as is one whose made-up arguments its own validation refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import msgspec.inspect as mi

from ctxactors.cli.main import import_server
from ctxactors.errors import InvalidArgumentsError
from ctxactors.tools import ToolSpec

# (the call's label, its sequence number) -> the call's arguments
Arguments = Callable[[str, int], dict[str, Any]]


def host_tools(servers: Iterable[str]) -> dict[str, ToolSpec]:
    """The tools of the ``--server`` classes by name; `ValueError` for one that can't load."""
    tools: dict[str, ToolSpec] = {}
    for spec in servers:
        tools.update(import_server(spec).tools)
    return tools


def arguments_for(spec: ToolSpec) -> Arguments:
    """How to make `spec`'s arguments for one call; `ValueError` when they can't be made."""
    info = mi.type_info(spec.args_type)
    assert isinstance(info, mi.StructType)
    required = [field for field in info.fields if field.required]

    def make(text: str, seq: int) -> dict[str, Any]:
        return {field.encode_name: _value(field.type, text, seq) for field in required}

    try:
        spec.validate(make("check#1", 1))
    except _Unsupported as exc:
        raise ValueError(
            f"--mix: host tool {spec.name!r} has a required argument of a type the load test "
            f"can't make up ({exc}); give it a default"
        ) from None
    except InvalidArgumentsError as exc:
        raise ValueError(
            f"--mix: host tool {spec.name!r}: made-up arguments refused: {exc}"
        ) from None
    return make


class _Unsupported(Exception):
    pass


def _value(kind: mi.Type, text: str, seq: int) -> Any:
    if isinstance(kind, mi.Metadata):
        return _value(kind.type, text, seq)
    if isinstance(kind, mi.StrType | mi.AnyType):
        if isinstance(kind, mi.StrType) and kind.pattern is not None:
            raise _Unsupported(f"a string matching {kind.pattern!r}")
        low = getattr(kind, "min_length", None) or 0
        high = getattr(kind, "max_length", None)
        text = text.ljust(low, "_")
        return text if high is None else text[:high]
    if isinstance(kind, mi.IntType | mi.FloatType):
        return _number(kind, seq)
    if isinstance(kind, mi.BoolType):
        return True
    if isinstance(kind, mi.NoneType):
        return None
    if isinstance(kind, mi.LiteralType):
        return kind.values[0]
    if isinstance(kind, mi.EnumType):
        return next(iter(kind.cls)).value
    if isinstance(kind, mi.UnionType):
        options = [t for t in kind.types if not isinstance(t, mi.NoneType)]
        return None if len(options) < len(kind.types) else _value(options[0], text, seq)
    if isinstance(kind, mi.CollectionType):
        return [_value(kind.item_type, text, seq) for _ in range(kind.min_length or 0)]
    if isinstance(kind, mi.DictType):
        return {}
    if isinstance(kind, mi.StructType | mi.DataclassType | mi.TypedDictType):
        return {f.encode_name: _value(f.type, text, seq) for f in kind.fields if f.required}
    raise _Unsupported(type(kind).__name__.removesuffix("Type").lower())


def _number(kind: mi.IntType | mi.FloatType, seq: int) -> int | float:
    """`seq` within the field's bounds (a float field gets it as a float)."""
    value: float = seq
    if kind.ge is not None:
        value = max(value, kind.ge)
    if kind.gt is not None:
        value = max(value, kind.gt + 1)
    if kind.le is not None:
        value = min(value, kind.le)
    if kind.lt is not None:
        value = min(
            value,
            kind.lt - 1 if isinstance(kind, mi.IntType) else math.nextafter(kind.lt, -math.inf),
        )
    return int(value) if isinstance(kind, mi.IntType) else float(value)
