"""Only what the JSON encoder can write gets in: arguments are checked before anything runs.

A call's arguments end up in JSON again: the operation history records them and tools put
them in results. A value msgspec's encoder refuses (a lone surrogate, which
``json.loads('"\\ud800"')`` gives a host; an object it does not know) would be stored and
then break every later answer that includes it (``get_planning_state``,
``get_recent_context``) for the whole session. A non-string object key would be written as
a string and read back as another key. Both are refused at validation.

Cost, on every call's path: a flat object of numbers and ASCII strings is proved safe with
no encoding at all (``str.isascii`` is O(1) in CPython, so a 4 MiB ASCII upload costs
nothing); anything else is encoded once by msgspec (C, about 0.05 µs for a small object).
Where an args type leaves values untyped (``Any``, a batch's operations), nested keys are
not checked by msgspec, which writes ``{1: 2}`` as ``{"1": 2}`` without complaint: there
the encoded arguments are decoded again and compared (C, about twice as fast as a walk in
Python). The walk that names the offending path runs only once something may be wrong.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ctxactors.results import ToolResult

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_SCALARS = frozenset({float, bool, type(None)})
_INT_BOUND = 1 << 64  # JSON numbers msgspec writes and reads back exactly
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError)  # UnicodeEncodeError is a ValueError
_MAX_SHOWN = 80  # characters of a key shown in a path
_CONTAINERS = (dict, list, tuple)  # a tuple: ``dict | list`` would build a union per check

# A path as a chain of (parent, step) pairs, formatted only when something is wrong.
_Path = tuple[Any, str | int] | None


def argument_problem(arguments: dict[str, Any], *, untyped: bool) -> str | None:
    """Why the encoder could not write `arguments` back, or None when it can.

    `untyped`: the args type holds values msgspec does not check (``Any``), so nested
    object keys must be checked here.
    """
    if _plain(arguments):
        return None
    try:
        encoded = _encode(arguments)
    except RecursionError:
        return "arguments are nested too deeply"
    except _ENCODE_ERRORS:
        return _locate(arguments, strings=True) or "arguments cannot be encoded as JSON"
    if untyped and not _reads_back(encoded, arguments):
        return _locate(arguments, strings=False)
    return None


def _reads_back(encoded: bytes, arguments: dict[str, Any]) -> bool:
    """True if `encoded` decodes to `arguments` again: then no key was written as a string.

    False can also mean a harmless difference (a tuple, NaN, bytes): the walk decides.
    """
    try:
        return bool(_decode(encoded) == arguments)
    except (msgspec.DecodeError, RecursionError):
        return False


def result_problem(result: ToolResult) -> str | None:
    """Why a handler's result can't be sent (or recorded), or None when it can."""
    try:
        _encode(result)
    except RecursionError:
        return "the result is nested too deeply"
    except _ENCODE_ERRORS as exc:
        return f"the result cannot be encoded as JSON ({printable(str(exc))})"
    return None


def printable(text: str) -> str:
    """`text` with lone surrogates escaped (``\\ud800``): safe in any message."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode()


def may_hold_untyped(args_type: Any) -> bool:
    """True if some value under `args_type` is left unchecked by msgspec (``Any``)."""
    seen: set[Any] = set()
    stack: list[Any] = [msgspec.inspect.type_info(args_type)]
    while stack:
        info = stack.pop()
        if isinstance(info, msgspec.inspect.AnyType):
            return True
        if hasattr(info, "fields"):  # struct, dataclass, TypedDict, NamedTuple
            if info.cls in seen:
                continue
            seen.add(info.cls)
            stack.extend(f.type for f in info.fields)
        elif isinstance(info, msgspec.inspect.DictType):
            if not isinstance(info.key_type, msgspec.inspect.StrType):
                return True  # a non-string key type: keys msgspec would write as strings
            stack.append(info.value_type)
        elif isinstance(info, msgspec.inspect.UnionType):
            stack.extend(info.types)
        elif hasattr(info, "item_type"):  # list, set, frozenset, variadic tuple
            stack.append(info.item_type)
        elif isinstance(info, msgspec.inspect.TupleType):
            stack.extend(info.item_types)
        elif isinstance(info, msgspec.inspect.Metadata):
            stack.append(info.type)
        elif isinstance(info, msgspec.inspect.CustomType):
            return True  # a host's own type: msgspec leaves its contents alone
    return False


def _plain(arguments: dict[str, Any]) -> bool:
    """True when every value is a number, None or an ASCII string, and no string key holds
    more than ASCII. A non-string top-level key is left to msgspec, which refuses it; but a
    key with a lone surrogate would fail msgspec's own error message (a UnicodeEncodeError).
    """
    for key, value in arguments.items():
        if type(key) is str and not key.isascii():
            return False
        kind = type(value)
        if kind is str:
            if not value.isascii():
                return False
        elif kind is int:
            if not -_INT_BOUND < value < _INT_BOUND:  # the encoder refuses a bigger one
                return False
        elif kind not in _SCALARS:
            return False
    return True


def _locate(value: Any, *, strings: bool) -> str | None:
    """The first value or key the encoder can't write faithfully, with its path.

    Iterative, so nesting as deep as the encoder allows can't exhaust the stack. With
    ``strings=False`` (everything is known to encode) only object keys are looked at.
    """
    stack: list[tuple[_Path, Any]] = [(None, value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if strings and _bad_string(node):
                return f"a string holds a lone surrogate (not valid Unicode) - at `{_fmt(path)}`"
        elif isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    return (
                        f"object keys must be strings, got {type(key).__name__} - at `{_fmt(path)}`"
                    )
                if strings and _bad_string(key):
                    return f"an object key holds a lone surrogate - at `{_fmt(path)}`"
                if strings or isinstance(item, _CONTAINERS):
                    stack.append(((path, key), item))
        elif isinstance(node, list | tuple):
            stack.extend(
                ((path, i), item)
                for i, item in enumerate(node)
                if strings or isinstance(item, _CONTAINERS)
            )
        elif strings and type(node) not in _SCALARS:
            try:
                _encode(node)
            except (*_ENCODE_ERRORS, RecursionError):
                return f"a value of type {type(node).__name__} cannot be encoded as JSON - at `{_fmt(path)}`"
    return None


def _bad_string(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _fmt(path: _Path) -> str:
    steps: list[str] = []
    while path is not None:
        path, step = path
        if isinstance(step, int):
            steps.append(f"[{step}]")
        else:
            shown = printable(step[:_MAX_SHOWN]) + ("…" if len(step) > _MAX_SHOWN else "")
            steps.append(f".{shown}")
    return "$" + "".join(reversed(steps))
