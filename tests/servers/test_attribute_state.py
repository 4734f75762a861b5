"""A host server with no `State`: under a store its public attributes are its state, saved
after each changing call and back after a restart; one that can't be saved is refused when
it is registered, naming the attribute."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mcp_support import SERVE, serve_env
from structlog.testing import capture_logs

from ctxactors import Runtime, Server, ServerDefinitionError, ToolContext, tool
from ctxactors.state import MemoryStore, SQLiteStore
from ctxactors.testing import context_args


class Note(msgspec.Struct):
    text: str
    tags: frozenset[str]


def notes_server() -> type[Server]:
    """A new class each time: `declare` derives a class's state once per process (and
    mutmut runs this module twice in one process), so a module-level class would be
    derived before the test runs."""

    class Notes(Server):
        """Notes per session, kept in plain attributes (no State, no snapshot)."""

        name = "notes"

        def __init__(self) -> None:
            self.notes: list[Note] = []  # the annotation decodes them as `Note`s again
            self.seen = set()  # type: ignore[var-annotated] # unannotated: decoded as a set
            self.last: str | None = None
            self._lock = threading.Lock()  # private: the instance's own, not state

        @tool
        def add(self, ctx: ToolContext, text: str, tags: list[str] = []) -> dict[str, Any]:  # noqa: B006
            with self._lock:
                self.notes.append(Note(text, frozenset(tags)))
                self.seen.update(tags)
                self.last = text
            return {"count": len(self.notes)}

        @tool(read_only=True)
        def read(self, ctx: ToolContext) -> dict[str, Any]:
            assert all(type(n) is Note for n in self.notes) and type(self.seen) is set
            return {
                "notes": [[n.text, sorted(n.tags)] for n in self.notes],
                "seen": sorted(self.seen),
                "last": self.last,
            }

    return Notes


def test_a_server_without_state_is_back_after_a_restart_on_the_same_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    store = SQLiteStore(path)
    Notes = notes_server()
    with Runtime([Notes], store=store) as rt:
        rt.call("add", context_args("s1", text="milk", tags=["shop"]))
        rt.call("add", context_args("s1", text="call mum", tags=["home", "today"]))
        rt.call("add", context_args("s2", text="only s2"))
    store.close()

    store = SQLiteStore(path)
    with Runtime([Notes], store=store) as rt:
        assert rt.stats()["actors"] == 0  # nothing live: what follows is read from the store
        assert rt.call("read", context_args("s1")).structured == {
            "notes": [["milk", ["shop"]], ["call mum", ["home", "today"]]],
            "seen": ["home", "shop", "today"],
            "last": "call mum",
        }
        assert rt.call("read", context_args("s2")).structured == {
            "notes": [["only s2", []]],
            "seen": [],
            "last": "only s2",
        }
        assert rt.call("read", context_args("s3")).structured == {
            "notes": [],
            "seen": [],
            "last": None,
        }
    store.close()


def locked_server() -> type[Server]:
    """A new class each time (see `notes_server`)."""

    class Locked(Server):
        name = "locked"

        def __init__(self) -> None:
            self.items: list[str] = []
            self.lock = threading.Lock()

        @tool
        def put(self, ctx: ToolContext, item: str) -> dict[str, Any]:
            with self.lock:
                self.items.append(item)
            return {"items": self.items}

    return Locked


Locked = locked_server()  # for `serve --server test_attribute_state:Locked`


def test_a_server_whose_attributes_cannot_be_saved_is_refused_under_a_store() -> None:
    with pytest.raises(ServerDefinitionError) as refused:
        Runtime([locked_server()], store=MemoryStore())
    assert str(refused.value) == (
        "Locked declares no State, so under a store its attributes are its state, but its "
        "attribute 'lock' holds a _thread.lock, which msgspec can't encode: declare a "
        "`State` (a msgspec type) with `snapshot()` and `restore(state)`, or make the "
        "attribute private (`self._lock`) if it is not state"
    )
    with Runtime([Locked]) as rt:  # without a store nothing is kept, so nothing to refuse
        assert rt.call("put", context_args("s1", item="x")).structured == {"items": ["x"]}


def test_an_attribute_that_would_not_come_back_equal_is_refused_too() -> None:
    class Mistyped(Server):
        name = "mistyped"

        def __init__(self) -> None:
            self.pairs = [(1, 2)]  # unannotated: its tuples would come back as lists

        @tool(read_only=True)
        def pairs_now(self, ctx: ToolContext) -> dict[str, Any]:
            return {"pairs": self.pairs}

    with pytest.raises(ServerDefinitionError, match=r"^Mistyped declares no State") as refused:
        Runtime([Mistyped], store=MemoryStore())
    assert "its attribute 'pairs' holds [(1, 2)], which comes back from the store as [[1, 2]]" in (
        str(refused.value)
    )


def test_a_value_set_later_that_cannot_be_saved_fails_its_call_and_changes_nothing() -> None:
    class Loose(Server):
        name = "loose"

        def __init__(self) -> None:
            self.value: Any = 0

        @tool
        def set_value(self, ctx: ToolContext, kind: str) -> dict[str, Any]:
            self.value = threading.Event() if kind == "event" else kind
            return {"set": kind}

        @tool(read_only=True)
        def get_value(self, ctx: ToolContext) -> dict[str, Any]:
            return {"value": self.value}

    with Runtime([Loose], store=MemoryStore()) as rt:
        assert rt.call("set_value", context_args("s1", kind="text")).structured == {"set": "text"}
        refused = rt.call("set_value", context_args("s1", kind="event"))
        assert refused.is_error
        assert refused.text == (
            "not saved: the state of Loose can't be encoded (Encoding objects of type "
            "Event is unsupported); nothing was changed"
        )
        assert rt.call("get_value", context_args("s1")).structured == {"value": "text"}


def late_server() -> type[Server]:
    """A new class each time: the warning is once per class and attribute in a process, and
    mutmut runs this module twice in one process."""

    class Late(Server):
        name = "late"

        def __init__(self) -> None:
            self.count = 0

        @tool
        def bump(self, ctx: ToolContext) -> dict[str, Any]:
            self.count += 1
            self.extra = self.count  # first set here: not part of the state
            return {"count": self.count}

    return Late


def test_an_attribute_first_set_after_init_is_not_kept_and_a_warning_says_so() -> None:
    store = MemoryStore()
    Late = late_server()
    with capture_logs() as logs:
        with Runtime([Late], store=store) as rt:
            for _ in range(3):
                rt.call("bump", context_args("s1"))
    warnings = [entry for entry in logs if entry["event"] == "attribute_not_kept"]
    assert warnings == [
        {
            "logger": "ctxactors.durable",
            "event": "attribute_not_kept",
            "log_level": "warning",
            "server": "Late",
            "attribute": "extra",
            "why": "first set after __init__: set it there (or declare a State) to keep it",
        }
    ]
    with Runtime([Late], store=store) as rt:
        assert rt.call("bump", context_args("s1")).structured == {"count": 4}


def test_serve_refuses_such_a_server_in_one_line() -> None:
    done = subprocess.run(
        [*SERVE[:-2], "--server", "test_attribute_state:Locked"],  # the default SQLite store
        env=serve_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        "ctxactors serve: Locked declares no State, so under a store its attributes are its "
        "state, but its attribute 'lock' holds a _thread.lock"
    )
    assert "Traceback" not in done.stderr


class Tagged:
    """A plain mixin (not a `Server`): its annotations are the server's too."""

    pinned: list[Note]

    def __init__(self) -> None:
        self.pinned = []


def test_class_level_mixin_and_class_local_annotations_decode_each_attribute_as_declared() -> None:
    def make() -> type[Server]:
        class Local(msgspec.Struct):  # local to this function: its annotation can't be read
            at: int

        class Journal(Tagged, Server):
            name = "journal"

            class Entry(msgspec.Struct):
                text: str

            entries: list[Entry]  # a name of the class's own body

            def __init__(self) -> None:
                super().__init__()
                self.scratch: Local | None = None  # unresolvable: its value's type (None)
                self.notes: list[Note] = []  # read after the unresolvable one
                self.entries = []
                self.last = None  # unannotated None: any JSON-like value later

            @tool
            def add(self, ctx: ToolContext, text: str) -> dict[str, Any]:
                self.notes.append(Note(text, frozenset()))
                self.pinned.append(Note(text.upper(), frozenset({"pin"})))
                self.entries.append(Journal.Entry(text))
                self.last = text
                return {"count": len(self.notes)}

            @tool(read_only=True)
            def read(self, ctx: ToolContext) -> dict[str, Any]:
                return {
                    "notes": [type(n).__name__ + ":" + n.text for n in self.notes],
                    "pinned": [type(n).__name__ + ":" + n.text for n in self.pinned],
                    "entries": [type(e).__name__ + ":" + e.text for e in self.entries],
                    "scratch": self.scratch,
                    "last": self.last,
                }

        return Journal

    store = MemoryStore()
    Journal = make()
    with Runtime([Journal], store=store) as rt:
        assert rt.call("add", context_args("s1", text="a")).structured == {"count": 1}
        assert rt.call("add", context_args("s1", text="b")).structured == {"count": 2}
    with Runtime([Journal], store=store) as rt:
        assert rt.stats()["actors"] == 0  # what follows is read back from the store
        assert rt.call("read", context_args("s1")).structured == {
            "notes": ["Note:a", "Note:b"],
            "pinned": ["Note:A", "Note:B"],
            "entries": ["Entry:a", "Entry:b"],
            "scratch": None,
            "last": "b",
        }


# A plugin's source, run with `exec` (no `from __future__ import annotations`, so its
# annotations are types, and its module is not in `sys.modules`).
PLUGIN = """
class Tally(Server):
    name = "tally"
    notes: list[Note]
    count: int

    def __init__(self):
        self.notes = []
        self.count = 0

    @tool
    def add(self, ctx: ToolContext, text: str) -> dict:
        self.notes.append(Note(text, frozenset()))
        self.count += 1
        return {"count": self.count}

    @tool(read_only=True)
    def read(self, ctx: ToolContext) -> dict:
        return {"notes": [type(n).__name__ + ":" + n.text for n in self.notes]}
"""


def test_a_server_built_from_source_outside_any_module_keeps_its_typed_attributes() -> None:
    namespace: dict[str, Any] = {
        "__name__": "not_an_imported_module",
        **{"Server": Server, "ToolContext": ToolContext, "tool": tool, "Note": Note},
    }
    # Compiled on its own: `exec` would otherwise inherit this module's future import.
    exec(compile(PLUGIN, "<plugin>", "exec", dont_inherit=True), namespace)
    Tally = namespace["Tally"]
    store = MemoryStore()
    with Runtime([Tally], store=store) as rt:
        rt.call("add", context_args("s1", text="x"))
    with Runtime([Tally], store=store) as rt:
        assert rt.call("add", context_args("s1", text="y")).structured == {"count": 2}
        assert rt.call("read", context_args("s1")).structured == {"notes": ["Note:x", "Note:y"]}


def test_a_server_with_snapshot_or_restore_but_no_state_is_refused() -> None:
    class HalfDone(Server):
        name = "half"

        def snapshot(self) -> Any:
            return {}

        @tool
        def nothing(self, ctx: ToolContext) -> dict[str, Any]:
            return {}

    with pytest.raises(ServerDefinitionError) as refused:
        Runtime([HalfDone], store=MemoryStore())
    assert str(refused.value) == (
        "HalfDone defines snapshot/restore but no State: set `State` to the msgspec type "
        "its snapshot returns"
    )


def test_a_server_with_only_private_attributes_keeps_nothing_and_answers() -> None:
    class Counter(Server):
        name = "counter"

        def __init__(self) -> None:
            self._n = 0  # private: the instance's own, not state

        @tool
        def bump(self, ctx: ToolContext) -> dict[str, Any]:
            self._n += 1
            return {"n": self._n}

    store = MemoryStore()
    with Runtime([Counter], store=store) as rt:
        assert rt.call("bump", context_args("s1")).structured == {"n": 1}
        assert rt.call("bump", context_args("s1")).structured == {"n": 2}
    with Runtime([Counter], store=store) as rt:  # nothing was kept: a fresh count
        assert rt.call("bump", context_args("s1")).structured == {"n": 1}


def test_the_instance_made_at_registration_is_made_with_the_runtime() -> None:
    class Sized(Server):
        name = "sized"

        def __init__(self, limit: int) -> None:
            self.limit = limit

        @classmethod
        def create(cls, runtime: Any) -> Server:
            return cls(runtime.settings.max_actors)

        @tool(read_only=True)
        def size(self, ctx: ToolContext) -> dict[str, Any]:
            return {"limit": self.limit}

    with Runtime([Sized], store=MemoryStore(), max_actors=7) as rt:
        assert rt.call("size", context_args("s1")).structured == {"limit": 7}


class Widget:
    """A custom type: msgspec decodes it only with a hook, nor in a union with another type."""


def typed_servers() -> dict[str, type[Server]]:
    """Servers whose annotation their value or msgspec can't follow (new classes each time)."""

    class Optional(Server):
        def __init__(self) -> None:
            self.widget: Widget | int | None = None

    class Plain(Server):
        def __init__(self) -> None:
            self.other: Widget = None  # type: ignore[assignment]

    class Counted(Server):
        def __init__(self) -> None:
            self.limit: int = None  # type: ignore[assignment]

    return {"Optional": Optional, "Plain": Plain, "Counted": Counted}


@pytest.mark.parametrize(
    ("server", "attribute", "problem"),
    [
        (
            "Optional",
            "widget",
            f"is annotated {Widget | int | None!r}, a type msgspec can't decode",
        ),
        ("Plain", "other", "holds None, which is not a Widget (Expected `Widget`, got `NoneType`)"),
        ("Counted", "limit", "holds None, which is not a int (Expected `int`, got `None`)"),
    ],
)
def test_an_annotation_the_value_or_msgspec_cannot_follow_is_refused_by_name(
    server: str, attribute: str, problem: str
) -> None:
    with pytest.raises(ServerDefinitionError) as refused:
        Runtime([typed_servers()[server]], store=MemoryStore())
    assert str(refused.value) == (
        f"{server} declares no State, so under a store its attributes are its state, but its "
        f"attribute {attribute!r} {problem}: declare a `State` (a msgspec type) with "
        f"`snapshot()` and `restore(state)`, or make the attribute private "
        f"(`self._{attribute}`) if it is not state"
    )
