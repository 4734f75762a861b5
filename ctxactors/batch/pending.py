"""Checking an argument before its placeholders are filled (a preset's ``{{param}}``, a
batch's ``${op.path}``).

A placeholder that is a whole string becomes the filled value, of any type; one inside a
longer string leaves a string. So before filling, the rest is known: every value without
a placeholder, the lists and objects around the placeholders, and that a string with a
placeholder inside stays a string. `pending_problems` checks those against the
argument's type, as far as the type can be followed (a union of several containers, say,
is left to the check when the batch runs).
"""

from __future__ import annotations

import datetime
import decimal
import enum
import types
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

# Where a placeholder sits in a string: the whole of it, inside it, or nowhere.
Placement = Literal["whole", "inside", None]

# What msgspec builds from a JSON string, so a filled-in string may become one of them.
_FROM_TEXT: tuple[Any, ...] = (
    str,
    bytes,
    bytearray,
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
    decimal.Decimal,
    Any,
    object,
)
_SEQUENCES = (list, set, frozenset)


def pending_problems(
    value: Any, type_: Any, where: str, placement: Callable[[str], Placement]
) -> list[str]:
    """What is already wrong with `value` as a `type_`, whatever its placeholders become;
    each problem names its place (``steps[1]``). `placement` tells where a string holds a
    placeholder."""
    if not holds_placeholder(value, placement):
        try:
            msgspec.convert(value, type_, strict=True)
        except msgspec.ValidationError as exc:
            return [f"{exc} - in `{where}`"]
        return []
    base = _followed(type_)
    if isinstance(value, str):
        if placement(value) == "whole" or _takes_text(base):
            return []
        return [f"`{where}` will be text ({value!r} filled in), but it takes {_name(base)}"]
    if isinstance(value, list):
        items = _items(base, len(value))
        if items is None:
            return []
        return [
            problem
            for i, (item, item_type) in enumerate(zip(value, items, strict=True))
            for problem in pending_problems(item, item_type, f"{where}[{i}]", placement)
        ]
    if isinstance(value, dict):
        field_type = _field_types(base)
        if field_type is None:
            return []
        problems = []
        for key, item in value.items():
            item_type = field_type(key)
            if item_type is not None:  # an unknown key is the run-time check's to refuse
                problems += pending_problems(item, item_type, f"{where}.{key}", placement)
        return problems
    return []


def holds_placeholder(value: Any, placement: Callable[[str], Placement]) -> bool:
    """Whether a string anywhere in `value` holds a placeholder."""
    if isinstance(value, str):
        return placement(value) is not None
    if isinstance(value, dict):
        return any(holds_placeholder(v, placement) for v in value.values())
    if isinstance(value, list):
        return any(holds_placeholder(v, placement) for v in value)
    return False


def _followed(type_: Any) -> Any:
    """`type_` without its constraints, and ``T | None`` as ``T`` (a filled value that is
    a list or an object can only be the T)."""
    while get_origin(type_) is Annotated:
        type_ = get_args(type_)[0]
    if get_origin(type_) in (Union, types.UnionType):
        members = [m for m in get_args(type_) if m is not type(None)]
        if len(members) == 1:
            return _followed(members[0])
    return type_


def _takes_text(type_: Any) -> bool:
    if type_ in _FROM_TEXT:
        return True
    origin = get_origin(type_)
    if origin is Literal:
        return any(isinstance(choice, str) for choice in get_args(type_))
    if origin in (Union, types.UnionType):
        return any(_takes_text(_followed(m)) for m in get_args(type_))
    if isinstance(type_, type) and issubclass(type_, enum.Enum):
        return True
    return getattr(type_, "__supertype__", None) is not None  # a NewType: left to run time


def _items(type_: Any, length: int) -> list[Any] | None:
    """The type of each of `length` items, or None when `type_` is no list we can follow."""
    origin, args = get_origin(type_), get_args(type_)
    if origin in _SEQUENCES or type_ in _SEQUENCES:
        return [args[0] if args else Any] * length
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return [args[0]] * length
        return list(args) if len(args) == length else None
    return None


def _field_types(type_: Any) -> Callable[[str], Any] | None:
    """Each key's type for an object of `type_`, or None when it is not one we follow."""
    if isinstance(type_, type) and issubclass(type_, msgspec.Struct):
        return {f.encode_name: f.type for f in msgspec.structs.fields(type_)}.get
    if get_origin(type_) is dict or type_ is dict:
        args = get_args(type_)
        value_type = args[1] if len(args) == 2 else Any
        return lambda _key: value_type
    return None


def _name(type_: Any) -> str:
    return getattr(type_, "__name__", None) or repr(type_)
