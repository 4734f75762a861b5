"""A server without a `State`: under a store, its public attributes are its state.

A host's server keeps its state in attributes (``self.notes: list[str] = []``); declaring a
``State`` with ``snapshot``/``restore`` should only be needed for state that isn't plain
attributes. So when a runtime with a store registers a server that declares no ``State``,
`declare` makes one instance (``create(runtime)``, then ``close()``), and its public
attributes (not ``_private`` ones, which are the instance's working parts: a lock, a
connection, the runtime) become the fields of a msgspec struct that the base class's
`snapshot`/`restore` fill from and write back to the attributes. `ctxactors.durable` then
saves and loads it like any declared ``State``.

Each field is decoded as its annotation, at class level (``notes: list[Note]``) or on
``self`` in ``__init__`` (``self.notes: list[Note] = []``); unannotated, as the type of
its value in the fresh instance, where a list, dict, string or number holds JSON-like
values (annotate one that holds structs, tuples, sets or dates). An attribute whose value
can't be encoded, or doesn't come back equal, is refused at registration with a
`ServerDefinitionError` naming it. Only the attributes a fresh instance has are kept: one
first set later by a handler is not (a warning says so, once).

Instantiating at registration is what makes the check reliable: an unannotated attribute
(``self.lock = threading.Lock()``) is only known from an instance, and annotations alone
can't say whether a value encodes.
"""

from __future__ import annotations

import ast
import inspect
import operator
import sys
import textwrap
import typing
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from ctxactors.errors import ServerDefinitionError
from ctxactors.logs import lazy_logger

if TYPE_CHECKING:
    from ctxactors.tools import Server

# Values msgspec decodes as themselves without a type; anything else keeps its own type.
_PLAIN = (type(None), bool, int, float, str, bytes, list, dict)
_encode = msgspec.msgpack.encode
_log = lazy_logger("ctxactors.durable")


class _Fields:
    """The state type derived for one server class, and how to read it off an instance."""

    __slots__ = ("state", "names", "read", "warned")

    def __init__(self, state: type[msgspec.Struct], names: tuple[str, ...]) -> None:
        self.state = state
        self.names = names
        getter = operator.attrgetter(*names)
        self.read: Callable[[Any], tuple[Any, ...]] = (
            getter if len(names) > 1 else lambda instance: (getter(instance),)
        )
        self.warned: set[str] = set()


# Per server class: its derived fields, or None when it has no public attribute (stateless).
_derived: weakref.WeakKeyDictionary[type, _Fields | None] = weakref.WeakKeyDictionary()


def declare(server: type[Server], runtime: Any) -> None:
    """With a store: derive the state of a server that declares no ``State``, or refuse it.

    Called by the runtime for each server it registers (so once per class and runtime;
    the first derivation is kept). Raises `ServerDefinitionError` naming the attribute that
    can't be state, and how to declare a ``State`` instead.
    """
    if server.State is not None or server in _derived:
        return
    from ctxactors.tools import Server

    if server.snapshot is not Server.snapshot or server.restore is not Server.restore:
        raise ServerDefinitionError(
            f"{server.__name__} defines snapshot/restore but no State: set `State` to the "
            "msgspec type its snapshot returns"
        )
    instance = server.create(runtime)
    try:
        attributes = dict(getattr(instance, "__dict__", {}))
    finally:
        instance.close()
    public = {name: value for name, value in attributes.items() if not name.startswith("_")}
    if not public:
        _derived[server] = None
        return
    declared = _declared_types(server)
    fields = []
    for name, value in public.items():
        kind = declared.get(name, Any if isinstance(value, _PLAIN) else type(value))
        problem = _problem(value, kind, annotated=name in declared)
        if problem is not None:
            raise ServerDefinitionError(
                f"{server.__name__} declares no State, so under a store its attributes are "
                f"its state, but its attribute {name!r} {problem}: declare a `State` (a "
                "msgspec type) with `snapshot()` and `restore(state)`, or make the attribute "
                f"private (`self._{name}`) if it is not state"
            )
        fields.append((name, kind))
    state = msgspec.defstruct(f"{server.__name__}State", fields, module=server.__module__)
    _derived[server] = _Fields(state, tuple(public))


def state_type(server: type[Server]) -> type[Any] | None:
    """The type a server's state is saved as: its ``State``, or the one `declare` derived
    from its attributes; None for a server that keeps nothing."""
    if server.State is not None:
        return server.State
    fields = _derived.get(server)
    return None if fields is None else fields.state


def snapshot(instance: Server) -> msgspec.Struct:
    """The instance's attributes as its derived state."""
    fields = _fields(instance)
    for name in instance.__dict__:
        if name[0] != "_" and name not in fields.names and name not in fields.warned:
            fields.warned.add(name)  # once per class and attribute
            _log.warning(
                "attribute_not_kept",
                server=type(instance).__name__,
                attribute=name,
                why="first set after __init__: set it there (or declare a State) to keep it",
            )
    return fields.state(*fields.read(instance))


def restore(instance: Server, state: msgspec.Struct) -> None:
    """Write a derived state back to the instance's attributes."""
    for name in _fields(instance).names:
        setattr(instance, name, getattr(state, name))


def _fields(instance: Server) -> _Fields:
    fields = _derived.get(type(instance))
    if fields is None:
        raise NotImplementedError(f"{type(instance).__name__} is not durable")
    return fields


def _problem(value: Any, kind: Any, *, annotated: bool) -> str | None:
    """Why `value` can't be kept as `kind`, or None when it comes back from the store equal."""
    held = f"{type(value).__module__}.{type(value).__qualname__}"
    try:
        data = _encode(value)
    except TypeError:
        return f"holds a {held}, which msgspec can't encode"
    try:
        decoder = msgspec.msgpack.Decoder(kind)
    except TypeError:
        if annotated:
            return f"is annotated {_name(kind)}, a type msgspec can't decode"
        return f"holds a {held}, which msgspec can't decode"
    try:
        back = decoder.decode(data)
    except msgspec.ValidationError as exc:
        return f"holds {value!r}, which is not a {_name(kind)} ({exc})"
    if back != value:
        return f"holds {value!r}, which comes back from the store as {back!r}"
    return None


def _name(kind: Any) -> str:
    return kind.__name__ if isinstance(kind, type) else repr(kind)


def _declared_types(server: type[Server]) -> dict[str, Any]:
    """The annotations of the server's instance attributes: class-level ones and those on
    ``self`` in each ``__init__`` (of the server's classes and its mixins), evaluated in their module; one that can't be evaluated (a
    name local to a function) is left out, and its value's type is used instead."""
    from ctxactors.tools import Server

    found: dict[str, Any] = {}
    for klass in reversed(server.__mro__):
        # A plain mixin's annotations count too (`Server` and `object` have none of the
        # instance's): skipping them restored a mixin's `list[Note]` as dicts.
        if klass in Server.__mro__:
            continue
        written: dict[str, Any] = dict(klass.__dict__.get("__annotations__", {}))
        init = klass.__dict__.get("__init__")
        if init is not None:
            written.update(_self_annotations(init))
        module = sys.modules.get(klass.__module__)
        namespace = dict(vars(module)) if module is not None else {}
        for name, annotation in written.items():
            try:
                kind = (
                    eval(annotation, namespace, dict(vars(klass)))  # the class's own annotation
                    if isinstance(annotation, str)
                    else annotation
                )
            except Exception:  # noqa: BLE001 - unresolvable: the value's type is used instead
                continue
            if typing.get_origin(kind) is not typing.ClassVar:
                found[name] = kind
    return found


def _self_annotations(init: Callable[..., Any]) -> dict[str, str]:
    """``self.x: T = ...`` in `init`'s source, as ``{"x": "T"}`` (none without its source)."""
    try:
        source = textwrap.dedent(inspect.getsource(init))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return {}
    found = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Attribute)
            and isinstance(node.target.value, ast.Name)
            and node.target.value.id == "self"
        ):
            found[node.target.attr] = ast.unparse(node.annotation)
    return found
