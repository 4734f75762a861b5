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


def test_a_server_without_state_is_back_after_a_restart_on_the_same_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    store = SQLiteStore(path)
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


def test_a_server_whose_attributes_cannot_be_saved_is_refused_under_a_store() -> None:
    with pytest.raises(ServerDefinitionError) as refused:
        Runtime([Locked], store=MemoryStore())
    assert str(refused.value) == (
        "Locked declares no State, so under a store its attributes are its state, but its "
        "attribute 'lock' holds a _thread.lock, which msgspec can't encode: declare a "
        "`State` (a msgspec type) with `snapshot()` and `restore(state)`, or make the "
        "attribute private (`self._lock`) if it is not state"
    )
    with Runtime([Locked]) as rt:  # without a store nothing is kept, so nothing to refuse
        assert rt.call("put", context_args("s1", item="x")).structured == {"items": ["x"]}


class Mistyped(Server):
    name = "mistyped"

    def __init__(self) -> None:
        self.pairs = [(1, 2)]  # unannotated: its tuples would come back as lists

    @tool(read_only=True)
    def pairs_now(self, ctx: ToolContext) -> dict[str, Any]:
        return {"pairs": self.pairs}


def test_an_attribute_that_would_not_come_back_equal_is_refused_too() -> None:
    with pytest.raises(ServerDefinitionError, match=r"^Mistyped declares no State") as refused:
        Runtime([Mistyped], store=MemoryStore())
    assert "its attribute 'pairs' holds [(1, 2)], which comes back from the store as [[1, 2]]" in (
        str(refused.value)
    )


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


def test_a_value_set_later_that_cannot_be_saved_fails_its_call_and_changes_nothing() -> None:
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
