"""Durable key state through the runtime: every durable built-in server's state survives a
reap, an eviction and a restart of the runtime, on a real SQLite file and a real
redis-server; end_session and retention remove it; a stale writer is refused; a store that
is down changes nothing and recovery is automatic."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from state_support import RedisServer, redis_server

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.servers import Content, Planning
from ctxactors.settings import HistorySettings, Settings
from ctxactors.state import MemoryStore, Outcome, RedisStore, SQLiteStore, StateStore, Write
from ctxactors.testing import ManualClock, wait_until
from ctxactors.testing import context_args as ctx_args

S = "s1"
A = "a1"


def call(rt: Runtime, tool_name: str, **args: Any) -> dict[str, Any]:
    result = rt.call(tool_name, ctx_args(S, A, **args))
    assert not result.is_error, result.text
    assert result.structured is not None
    return result.structured


# Each durable server: what to do, and what reading it back must show afterwards.
@dataclass(frozen=True)
class Case:
    name: str
    write: Callable[[Runtime], None]
    read: Callable[[Runtime], Any]
    expected: Any


def _planning_write(rt: Runtime) -> None:
    call(rt, "create_goal", goal="Learn Rust")
    call(rt, "add_todo", name="read the book", goal_id="g1")
    call(rt, "mark_todo", todo_id="t2")


def _playbooks_write(rt: Runtime) -> None:
    call(rt, "create_playbook", name="deploy", steps=["build", "ship"])
    call(rt, "select_playbook", id="pb1")


def _presets_write(rt: Runtime) -> None:
    ops = [{"tool": "create_goal", "arguments": {"goal": "{{g}}"}}]
    call(rt, "save_preset", name="plan", operations=ops, params=["g"])


def _content_write(rt: Runtime) -> None:
    call(rt, "add_content", filename="notes.md", content="리포트 작성 and parse_config")
    call(rt, "add_content", filename="gone.txt", content="temporary")
    call(rt, "delete_content", id="c2")


def _content_read(rt: Runtime) -> Any:
    found = call(rt, "search_content", query="parse_config")
    return (
        call(rt, "list_content"),
        [(r["id"], r["filename"]) for r in found["results"]],
        call(rt, "read_content", id="c1")["content"],
        call(rt, "add_content", filename="next", content="x")["id"],  # the counter survived
    )


def _history_read(rt: Runtime) -> Any:
    ops = call(rt, "get_recent_context", limit=10)["operations"]
    return [(op["tool"], op["arguments"], op["metadata"]) for op in ops]


CASES = [
    Case(
        "planning",
        _planning_write,
        lambda rt: (call(rt, "get_planning_state"), call(rt, "create_goal", goal="next")["id"]),
        (
            {
                "goals": [{"id": "g1", "goal": "Learn Rust"}],
                "todos": [{"id": "t2", "name": "read the book", "goal_id": "g1", "done": True}],
            },
            "g3",
        ),
    ),
    Case(
        "playbooks",
        _playbooks_write,
        lambda rt: (call(rt, "list_playbooks"), call(rt, "create_playbook", name="n")["id"]),
        (
            {
                "playbooks": [
                    {"id": "pb1", "name": "deploy", "agent_id": A, "steps": ["build", "ship"]}
                ]
            },
            "pb2",
        ),
    ),
    Case(
        "presets",
        _presets_write,
        lambda rt: call(rt, "list_presets"),
        {"presets": [{"name": "plan", "params": ["g"], "operations": 1}]},
    ),
    Case(
        "content",
        _content_write,
        _content_read,
        (
            {"items": [{"id": "c1", "filename": "notes.md", "size": 33}], "count": 1},
            [("c1", "notes.md")],
            "리포트 작성 and parse_config",
            "c3",
        ),
    ),
    Case(
        "history",
        _planning_write,
        _history_read,
        [
            ("mark_todo", {"todo_id": "t2"}, {"completed_todo": "t2"}),
            (
                "add_todo",
                {"name": "read the book", "goal_id": "g1"},
                {"created_todo": "t2", "goal_id": "g1"},
            ),
            ("create_goal", {"goal": "Learn Rust"}, {"created_goal": "g1"}),
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_state_survives_a_restart_of_the_runtime(
    case: Case, open_store: Callable[[], StateStore]
) -> None:
    with Runtime(store=open_store()) as rt:
        case.write(rt)
    with Runtime(store=open_store()) as rt:
        assert case.read(rt) == case.expected


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_state_survives_a_reap(
    case: Case, open_store: Callable[[], StateStore], clock: ManualClock
) -> None:
    with Runtime(store=open_store(), ttl=60, clock=clock) as rt:
        case.write(rt)
        clock.advance(61)
        assert rt.reap() >= 1
        assert rt.stats()["actors"] == 0
        assert case.read(rt) == case.expected


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_state_survives_an_eviction(case: Case, open_store: Callable[[], StateStore]) -> None:
    with Runtime(store=open_store(), max_actors=1) as rt:
        case.write(rt)
        rt.call("get_planning_state", ctx_args("someone-else"))  # evicts the session's actors
        assert not rt.has_session(S)
        assert rt.stats()["evicted"] >= 1
        assert case.read(rt) == case.expected


def _everything(rt: Runtime) -> Any:
    """Every durable server's state of the session, read without writing anything."""
    return (
        call(rt, "get_recent_context", limit=50)["operations"],  # first: reads are recorded
        call(rt, "get_planning_state"),
        call(rt, "list_playbooks"),
        call(rt, "list_presets"),
        call(rt, "list_content"),
    )


EMPTY = (
    [],
    {"goals": [], "todos": []},
    {"playbooks": []},
    {"presets": []},
    {"items": [], "count": 0},
)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_end_session_deletes_the_stored_state(
    case: Case, open_store: Callable[[], StateStore]
) -> None:
    with Runtime(store=open_store()) as rt:
        case.write(rt)
        rt.call("create_goal", ctx_args("s2", A, goal="kept"))
        assert rt.end_session(S) >= 1
    with Runtime(store=open_store()) as rt:
        assert _everything(rt) == EMPTY
        kept = rt.call("get_planning_state", ctx_args("s2", A)).structured
        assert kept == {"goals": [{"id": "g1", "goal": "kept"}], "todos": []}


# Three tenants of one store, each with documents of its own (a document is a part of the
# session's one content key, ``("content",)``): two sessions of no principal, and a
# principal's session of the same id as the first. Each has a different number of them,
# and words no other has, so a load that handed one tenant another's parts would show.
TENANTS: dict[tuple[str | None, str], list[tuple[str, str]]] = {
    (None, "s1"): [("s1-plan.md", "alpha apple"), ("s1-notes.md", "alpha apricot")],
    (None, "s2"): [
        ("s2-plan.md", "bravo banana"),
        ("s2-notes.md", "bravo blueberry"),
        ("s2-log.md", "bravo bilberry"),
    ],
    ("alice", "s1"): [
        ("alice-plan.md", "charlie cherry"),
        ("alice-notes.md", "charlie cranberry"),
        ("alice-log.md", "charlie currant"),
        ("alice-todo.md", "charlie citron"),
    ],
}
MARKERS = {(None, "s1"): "alpha", (None, "s2"): "bravo", ("alice", "s1"): "charlie"}


def tenant_call(rt: Runtime, tenant: tuple[str | None, str], tool_name: str, **args: Any) -> Any:
    principal, session = tenant
    return rt.call(tool_name, ctx_args(session, A, **args), principal=principal)


def test_sessions_reloaded_from_one_store_each_see_only_their_own_documents(
    open_store: Callable[[], StateStore],
) -> None:
    with Runtime(store=open_store()) as rt:
        for tenant, docs in TENANTS.items():
            for filename, content in docs:
                assert not tenant_call(
                    rt, tenant, "add_content", filename=filename, content=content
                ).is_error
    with Runtime(store=open_store()) as rt:  # a restart: every tenant is loaded from the store
        for tenant, docs in TENANTS.items():
            ids = [f"c{n}" for n in range(1, len(docs) + 1)]
            listed = tenant_call(rt, tenant, "list_content").structured
            assert listed == {
                "items": [
                    {"id": cid, "filename": name, "size": len(text)}
                    for cid, (name, text) in zip(ids, docs, strict=True)
                ],
                "count": len(docs),
            }
            for cid, (name, text) in zip(ids, docs, strict=True):
                read = tenant_call(rt, tenant, "read_content", id=cid).structured
                assert read == {"id": cid, "filename": name, "content": text}
            beyond = tenant_call(rt, tenant, "read_content", id=f"c{len(docs) + 1}")
            assert beyond.is_error, beyond.text
            for other, word in MARKERS.items():
                found = tenant_call(rt, tenant, "search_content", query=word).structured
                hits = sorted(r["id"] for r in found["results"])
                assert hits == (ids if other == tenant else []), (tenant, word)


def test_retention_forgets_a_session_and_the_reaper_purges_it(
    tmp_path: Path, clock: ManualClock
) -> None:
    wall = ManualClock()
    store = SQLiteStore(tmp_path / "state.db", retention=3600, clock=wall)
    with Runtime(store=store, ttl=60, clock=clock) as rt:
        _planning_write(rt)
        rt.call("create_goal", ctx_args("s2", A, goal="fresh"))
        assert rt.durability is not None
        rt.durability.flush()  # the histories, written behind the calls, are in the store
        clock.advance(61)
        wall.advance(1800)
        rt.reap()
        rt.call("create_goal", ctx_args("s2", A, goal="again"))  # s2 touched at 1800 s
        wall.advance(1800)  # s1 last touched 3600 s ago: past retention
        clock.advance(61)
        rt.reap()  # reaps the actors and purges the store
        assert store.load((None, S), ("planning", A, None)) is None
        assert call(rt, "get_recent_context") == {"operations": [], "count": 0}
        assert call(rt, "get_planning_state") == {"goals": [], "todos": []}
        s2 = rt.call("get_planning_state", ctx_args("s2", A)).structured
        assert s2 is not None and [g["goal"] for g in s2["goals"]] == ["fresh", "again"]
    store.close()


def test_retention_counts_from_the_last_read_too(tmp_path: Path, clock: ManualClock) -> None:
    wall = ManualClock()
    store = SQLiteStore(tmp_path / "state.db", retention=3600, clock=wall)

    def advance(seconds: float) -> None:
        clock.advance(seconds)
        wall.advance(seconds)

    with Runtime(store=store, ttl=3000, clock=clock) as rt:
        assert rt.durability is not None
        call(rt, "create_goal", goal="read often")
        rt.durability.flush()  # the goal and its history record are stored at 0 s
        advance(2000)
        # A read from a live actor, at 2000 s (the one call the history never records, so
        # nothing but the touch reaches the store), written behind the call.
        assert len(call(rt, "get_recent_context")["operations"]) == 1
        rt.durability.flush()
        advance(3001)
        assert rt.reap() == 2  # at 5001 s: the planning and history actors, idle 3001 s
        # Last used 3001 s ago: within the hour, though last written 5001 s ago.
        assert call(rt, "get_planning_state")["goals"] == [{"id": "g1", "goal": "read often"}]
    store.close()


def test_a_session_with_a_live_actor_is_never_purged(tmp_path: Path, clock: ManualClock) -> None:
    wall = ManualClock()
    store = SQLiteStore(tmp_path / "state.db", retention=3600, clock=wall)
    with Runtime(store=store, ttl=7200, clock=clock) as rt:
        call(rt, "create_goal", goal="kept while live")
        clock.advance(4000)
        wall.advance(4000)
        assert rt.reap() == 0  # the actor stays (idle 4000 s < 7200 s)...
        record = store.load((None, S), ("planning", A, None))  # ...and so does its state
        assert record is not None and record.revision == 1
        assert call(rt, "create_goal", goal="and saved")["id"] == "g2"
    store.close()


def test_redis_retention_expires_the_session(redis: RedisServer) -> None:
    store = RedisStore(redis.url, prefix=f"t{os.urandom(4).hex()}", retention=0.5)
    try:
        with Runtime(store=store) as rt:
            _planning_write(rt)
        record = store.load((None, S), ("planning", A, None))
        assert record is not None  # (the load refreshed the 0.5 s retention)
        # Polled past the retention, so one load does not refresh it for the next.
        wait_until(lambda: store.load((None, S), ("planning", A, None)) is None, 10, 0.6)
    finally:
        store.close()


# -- one writer per key ------------------------------------------------------------------


def test_a_stale_writer_is_refused_and_reloads(redis: RedisServer) -> None:
    prefix = f"t{os.urandom(4).hex()}"
    one, two = RedisStore(redis.url, prefix=prefix), RedisStore(redis.url, prefix=prefix)
    with Runtime(store=one) as first, Runtime(store=two) as second:
        assert call(first, "create_goal", goal="first")["id"] == "g1"  # revision 1
        assert call(second, "get_planning_state")["goals"] == [{"id": "g1", "goal": "first"}]
        assert call(second, "create_goal", goal="second")["id"] == "g2"  # revision 2
        stale = first.call("create_goal", ctx_args(S, A, goal="lost"))
        assert stale.is_error
        assert "not saved" in stale.text and "loaded revision 1, the store holds 2" in stale.text
        # The store kept the newer state; the stale incarnation reloaded it.
        newer = {"goals": [{"id": "g1", "goal": "first"}, {"id": "g2", "goal": "second"}]}
        assert call(first, "get_planning_state") == {**newer, "todos": []}
        assert call(first, "create_goal", goal="after")["id"] == "g3"  # and writes again
        assert [g["id"] for g in call(second, "get_planning_state")["goals"]] == ["g1", "g2"]
    one.close()
    two.close()


# -- a store that is down ----------------------------------------------------------------


def test_a_store_that_is_down_changes_nothing_and_recovery_is_automatic(
    tmp_path: Path,
) -> None:
    with redis_server(tmp_path) as server:
        store = RedisStore(server.url, timeout=2.0)
        with Runtime(store=store) as rt:
            call(rt, "create_goal", goal="kept")
            call(rt, "add_content", filename="a", content="alpha")
            server.stop(kill=True)
            for tool_name, args in (
                ("create_goal", {"goal": "lost"}),
                ("add_content", {"filename": "b", "content": "beta"}),
                ("delete_content", {"id": "c1"}),
            ):
                failed = rt.call(tool_name, ctx_args(S, A, **args))
                assert failed.is_error
                assert "state store is unavailable" in failed.text
                assert "nothing was changed" in failed.text
            # Reads of live keys keep working, and show nothing of the refused calls.
            assert call(rt, "get_planning_state")["goals"] == [{"id": "g1", "goal": "kept"}]
            assert call(rt, "list_content")["items"] == [{"id": "c1", "filename": "a", "size": 5}]
            assert call(rt, "search_content", query="beta")["count"] == 0
            # The refused delete put the document back whole: text and index.
            assert call(rt, "read_content", id="c1")["content"] == "alpha"
            assert [r["id"] for r in call(rt, "search_content", query="alpha")["results"]] == ["c1"]
            # A key whose first call comes while the store is down can't load: refused too.
            unloaded = rt.call("list_playbooks", ctx_args(S, A))
            assert unloaded.is_error and "state store is unavailable" in unloaded.text
            server.start()  # same port, same append-only file
            assert call(rt, "create_goal", goal="back")["id"] == "g2"
            assert call(rt, "list_playbooks") == {"playbooks": []}
        with Runtime(store=store) as rt:
            goals = call(rt, "get_planning_state")["goals"]
            assert goals == [{"id": "g1", "goal": "kept"}, {"id": "g2", "goal": "back"}]
            assert [i["id"] for i in call(rt, "list_content")["items"]] == ["c1"]
        store.close()


def test_redis_killed_and_restarted_under_load_loses_no_acknowledged_call(
    tmp_path: Path,
) -> None:
    sessions = [f"load-{n}" for n in range(8)]
    acked: dict[str, list[str]] = {s: [] for s in sessions}
    in_doubt: dict[str, set[str]] = {s: set() for s in sessions}  # error results: either way
    errors: list[tuple[str, str]] = []  # (phase, text)
    phase = ["up"]
    progress = threading.Condition()
    stop = threading.Event()

    def worker(session: str) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            goal = f"{session}-{n}"
            result = rt.call("create_goal", ctx_args(session, A, goal=goal))
            with progress:
                if result.is_error:
                    in_doubt[session].add(goal)
                    errors.append((phase[0], result.text))
                else:
                    acked[session].append(goal)
                progress.notify_all()

    def wait_for(check: Callable[[], bool]) -> None:
        with progress:
            assert progress.wait_for(check, timeout=60)

    def acks() -> int:
        return min(len(a) for a in acked.values())

    with redis_server(tmp_path) as server:
        store = RedisStore(server.url, timeout=2.0)
        with Runtime(servers=[Planning], store=store) as rt:
            threads = [threading.Thread(target=worker, args=(s,)) for s in sessions]
            for t in threads:
                t.start()
            wait_for(lambda: acks() >= 5)
            server.stop(kill=True)  # SIGKILL, mid-run
            with progress:
                phase[0], before = "down", acks()
            wait_for(lambda: sum(p == "down" for p, _ in errors) >= 2 * len(sessions))
            with progress:
                phase[0] = "back"
            server.start()  # same port, same append-only file
            wait_for(lambda: acks() >= before + 5)  # calls succeed again, on every session
            stop.set()
            for t in threads:
                t.join(60)
        down = [text for p, text in errors if p == "down"]
        assert all("the state store is unavailable" in text for text in down), down[:3]
        assert all("nothing was changed" in text for text in down)
        later = [text for p, text in errors if p != "down"]
        assert all("state store is unavailable" in t or "not saved" in t for t in later)
        with Runtime(servers=[Planning], store=store) as rt:
            for session in sessions:
                state = rt.call("get_planning_state", ctx_args(session, A)).structured
                assert state is not None
                present = [g["goal"] for g in state["goals"]]
                assert set(acked[session]) <= set(present)  # nothing acknowledged is lost
                assert set(present) <= set(acked[session]) | in_doubt[session]
                assert len(present) == len(set(present))
        store.close()


# -- the contract for host servers -------------------------------------------------------


class Counter(Server):
    """A durable host server: its state is one typed struct."""

    name = "counter"
    scope = Scope.SESSION
    State = int
    saves: list[int] = []

    def __init__(self) -> None:
        self.n = 0

    def snapshot(self) -> int:
        return self.n

    def restore(self, state: int) -> None:
        self.n = state

    @tool
    def bump(self, ctx: ToolContext) -> dict[str, Any]:
        """Add one."""
        self.n += 1
        return {"n": self.n}

    @tool
    def same(self, ctx: ToolContext) -> dict[str, Any]:
        """Change nothing (not marked read-only)."""
        return {"n": self.n}

    @tool(read_only=True)
    def peek(self, ctx: ToolContext) -> dict[str, Any]:
        """Read."""
        return {"n": self.n}


def test_only_calls_that_change_the_snapshot_write() -> None:
    store = MemoryStore()
    with Runtime(servers=[Counter], store=store) as rt:
        durable = rt.durability
        assert durable is not None
        rt.call("bump", ctx_args(S))
        rt.call("same", ctx_args(S))
        rt.call("peek", ctx_args(S))
        rt.call("bump", ctx_args(S))
        record = store.load((None, S), ("counter",))
        assert record is not None and record.revision == 2
    with Runtime(servers=[Counter], store=store) as rt:
        assert rt.call("peek", ctx_args(S)).structured == {"n": 2}


def test_without_a_store_state_is_ephemeral(clock: ManualClock) -> None:
    with Runtime(servers=[Counter], ttl=60, clock=clock) as rt:
        assert rt.store is None and rt.durability is None
        rt.call("bump", ctx_args(S))
        clock.advance(61)
        rt.reap()
        assert rt.call("peek", ctx_args(S)).structured == {"n": 0}


def test_a_changing_call_replies_only_once_its_state_is_in_the_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    with Runtime(store=store) as rt:
        call(rt, "create_goal", goal="first")
        blocker = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # the store can't write until this ends
        replied = threading.Event()
        outcome: list[Any] = []

        def second() -> None:
            outcome.append(rt.call("create_goal", ctx_args(S, A, goal="second")))
            replied.set()

        caller = threading.Thread(target=second)
        caller.start()
        assert not replied.wait(0.5), "replied before its save could be written"
        blocker.execute("COMMIT")
        blocker.close()
        caller.join(30)
        assert replied.is_set() and outcome[0].structured == {"id": "g2", "goal": "second"}
        record = store.load((None, S), ("planning", A, None))
        assert record is not None and record.revision == 2
    store.close()


def test_the_stored_history_keeps_its_bounds(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    limits = Settings(history=HistorySettings(max_operations=3))
    with Runtime(store=store, settings=limits) as rt:
        for n in range(5):
            call(rt, "create_goal", goal=f"goal {n}")
    with Runtime(store=store, settings=limits) as rt:
        ops = call(rt, "get_recent_context", limit=50)["operations"]
        assert [op["arguments"]["goal"] for op in ops] == ["goal 4", "goal 3", "goal 2"]
        call(rt, "create_goal", goal="goal 5")
        ops = call(rt, "get_recent_context", limit=50)["operations"]
        assert [op["arguments"]["goal"] for op in ops] == ["goal 5", "goal 4", "goal 3"]
    store.close()


class RecordingStore(SQLiteStore):
    """A real SQLite store that also keeps every write it was given."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes: list[Write] = []

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        self.writes += writes
        return super().write(writes)


def test_content_saves_only_the_documents_a_call_changed(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path / "state.db")
    with Runtime(store=store) as rt:
        for n in range(3):
            call(rt, "add_content", filename=f"f{n}", content=f"document {n} " * 100)
        call(rt, "delete_content", id="c2")
        call(rt, "read_content", id="c1")
        saved = [(w.data, w.parts) for w in store.writes if w.key == ("content",)]
        doc = msgspec.msgpack.decode
        assert [(doc(data), [(n, p and doc(p)) for n, p in parts]) for data, parts in saved] == [
            ({"next": 1}, [("c1", [1, "f0", "document 0 " * 100])]),
            ({"next": 2}, [("c2", [2, "f1", "document 1 " * 100])]),
            ({"next": 3}, [("c3", [3, "f2", "document 2 " * 100])]),
            ({"next": 3}, [("c2", None)]),
        ]
    with Runtime(store=store) as rt:  # a restart rebuilds the index from the parts
        assert call(rt, "list_content")["items"] == [
            {"id": "c1", "filename": "f0", "size": 1100},
            {"id": "c3", "filename": "f2", "size": 1100},
        ]
        found = call(rt, "search_content", query="document 2")["results"]
        assert [r["id"] for r in found] == ["c3"]
    store.close()


def test_a_refused_transactional_batch_saves_no_document(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    with Runtime(store=store) as rt:
        call(rt, "add_content", filename="kept", content="kept text")
        ops = [
            {"tool": "add_content", "arguments": {"filename": "new", "content": "new text"}},
            {"tool": "delete_content", "arguments": {"id": "c1"}},
            {"tool": "read_content", "arguments": {"id": "missing"}},
        ]
        result = rt.call("batch", ctx_args(S, A, operations=ops, options={"transactional": True}))
        assert result.is_error
    with Runtime(store=store) as rt:
        assert call(rt, "list_content")["items"] == [{"id": "c1", "filename": "kept", "size": 9}]
        assert call(rt, "read_content", id="c1")["content"] == "kept text"
    store.close()


def test_a_reloaded_content_key_builds_its_index_on_its_first_search(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "state.db")
    with Runtime(store=store) as rt:
        for name in ("alpha", "beta", "delta"):
            call(rt, "add_content", filename=name, content=f"{name} needle")
    with Runtime(store=store) as rt:
        # The first call after the restart loads the documents, not the index.
        assert call(rt, "read_content", id="c2")["content"] == "beta needle"
        key = Content.scope.key("content", ToolContext(S, A))
        server = rt._registry._entries[key].server  # noqa: SLF001
        assert server._indexed is False  # noqa: SLF001
        # Changes before the first search, then a refused one (the store is down).
        call(rt, "delete_content", id="c2")
        call(rt, "add_content", filename="gamma", content="gamma needle")
        blocker = sqlite3.connect(tmp_path / "state.db", isolation_level=None, timeout=0)
        blocker.execute("BEGIN EXCLUSIVE")
        store._db.execute("PRAGMA busy_timeout=0")  # noqa: SLF001 - fail at once, not in 5 s
        refused = rt.call("delete_content", ctx_args(S, A, id="c3"))
        assert refused.is_error and "state store is unavailable" in refused.text
        blocker.execute("ROLLBACK")
        blocker.close()
        found = call(rt, "search_content", query="needle")["results"]
        assert sorted(r["filename"] for r in found) == ["alpha", "delta", "gamma"]
        assert server._indexed is True  # noqa: SLF001
        assert call(rt, "search_content", query="beta")["count"] == 0
        call(rt, "delete_content", id="c1")  # and the built index follows the changes
        found = call(rt, "search_content", query="needle")["results"]
        assert sorted(r["filename"] for r in found) == ["delta", "gamma"]
    store.close()
