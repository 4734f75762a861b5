"""TTL reaping, the LRU cap, calls racing passivation, and end_session, on a manual clock."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from structlog.testing import capture_logs

from ctxactors import CallTimeoutError, Runtime, Scope, Server, ToolContext, tool
from ctxactors._actors import Lifecycle
from ctxactors._registry import Registry, SessionState
from ctxactors.servers import BUILTIN
from ctxactors.servers.planning import Planning
from ctxactors.state import MemoryStore
from ctxactors.testing import ManualClock, wait_until
from ctxactors.testing import context_args as ctx_args


class Gate(Server):
    """A tool that blocks until the test opens its gate, to hold a call in flight."""

    name = "gate"
    scope = Scope.SESSION
    gates: dict[str, threading.Event] = {}
    entered: dict[str, threading.Event] = {}  # set when a wait_gate call is running
    threads: dict[str, threading.Thread] = {}  # the actor thread that ran it
    closed: list[str] = []

    def __init__(self) -> None:
        self.n = 0

    @tool
    def wait_gate(self, ctx: ToolContext, gate: str) -> dict[str, Any]:
        """Block until the gate opens."""
        Gate.threads[gate] = threading.current_thread()
        Gate.entered.setdefault(gate, threading.Event()).set()
        assert Gate.gates[gate].wait(10)
        self.n += 1
        return {"n": self.n}

    @tool
    def count(self, ctx: ToolContext) -> dict[str, Any]:
        """Count calls on this incarnation."""
        self.n += 1
        return {"n": self.n}


def make(clock: ManualClock, **kw: Any) -> Runtime:
    return Runtime([*BUILTIN, Gate], clock=clock, call_timeout=10, **kw)


def test_idle_actors_are_reaped_after_ttl_and_state_is_gone(clock: ManualClock) -> None:
    with make(clock, ttl=60) as rt:
        rt.call("create_goal", ctx_args("s1", goal="old"))
        clock.advance(30)
        rt.call("create_goal", ctx_args("s2", goal="fresh"))
        assert rt.reap() == 0
        clock.advance(31)  # s1 idle for 61 s, s2 for 31 s
        assert rt.reap() == 1
        assert rt.stats()["actors"] == 1 and rt.stats()["reaped"] == 1
        assert rt.call("get_planning_state", ctx_args("s1")).structured["goals"] == []
        assert [
            g["goal"] for g in rt.call("get_planning_state", ctx_args("s2")).structured["goals"]
        ] == ["fresh"]


def test_an_actor_with_a_call_in_flight_is_never_reaped(clock: ManualClock) -> None:
    Gate.gates["inflight"] = threading.Event()
    with make(clock, ttl=10) as rt:
        rt.call("count", ctx_args("busy"))
        t = threading.Thread(target=lambda: rt.call("wait_gate", ctx_args("busy", gate="inflight")))
        t.start()
        wait_until(lambda: rt.stats()["inflight"] > 0, 5)
        clock.advance(100)
        assert rt.reap() == 0
        Gate.gates["inflight"].set()
        t.join(5)
        # The call finished: it counted as a use, and the incarnation kept its state.
        assert rt.call("count", ctx_args("busy")).structured == {"n": 3}
        clock.advance(11)
        assert rt.reap() == 1


def test_lru_cap_passivates_the_least_recently_used_idle_actor(clock: ManualClock) -> None:
    with make(clock, ttl=3600, max_actors=3) as rt:
        for s in ("s1", "s2", "s3"):
            rt.call("count", ctx_args(s))
            clock.advance(1)
        rt.call("count", ctx_args("s1"))  # s2 is now the least recently used
        rt.call("count", ctx_args("s4"))
        stats = rt.stats()
        assert stats["actors"] == 3 and stats["evicted"] == 1
        assert {k[1][1] for k in rt._registry.keys()} == {"s1", "s3", "s4"}
        assert rt.call("count", ctx_args("s1")).structured == {"n": 3}
        assert rt.call("count", ctx_args("s2")).structured == {"n": 1}  # fresh incarnation


def test_cap_is_exceeded_rather_than_failing_when_every_actor_is_busy(clock: ManualClock) -> None:
    Gate.gates["cap"] = threading.Event()
    with make(clock, max_actors=2) as rt:
        threads = [
            threading.Thread(target=rt.call, args=("wait_gate", ctx_args(f"b{i}", gate="cap")))
            for i in range(2)
        ]
        for t in threads:
            t.start()
        wait_until(lambda: rt.stats()["inflight"] == 2, 5)
        assert rt.call("count", ctx_args("extra")).structured == {"n": 1}
        assert rt.stats()["actors"] == 3
        Gate.gates["cap"].set()
        for t in threads:
            t.join(5)


def test_calls_racing_reaps_and_evictions_are_all_answered() -> None:
    # A real clock, a tiny TTL, a tiny cap and a busy reaper: keys are passivated and
    # respawned constantly while 16 threads call them. Every call must get its answer.
    with Runtime(
        [*BUILTIN, Gate], ttl=0.002, scan_interval=0.001, max_actors=4, call_timeout=10
    ) as rt:
        errors: list[str] = []
        answered = [0]
        lock = threading.Lock()

        def worker(n: int) -> None:
            for i in range(150):
                result = rt.call("count", ctx_args(f"s{(n + i) % 8}"))
                if result.is_error or result.structured["n"] < 1:
                    errors.append(result.text)
                with lock:
                    answered[0] += 1

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert not errors and answered[0] == 16 * 150
        stats = rt.stats()
        assert stats["reaped"] + stats["evicted"] > 0, stats
        assert stats["spawned"] == stats["actors"] + stats["reaped"] + stats["evicted"]


def test_end_session_stops_exactly_that_sessions_actors(clock: ManualClock) -> None:
    with make(clock) as rt:
        for s in ("s1", "s2"):
            rt.call("create_goal", ctx_args(s, "a1", goal="g"))
            rt.call("create_goal", ctx_args(s, "a2", goal="g"))
            rt.call("create_playbook", ctx_args(s, "a1", name="p"))
        assert rt.stats()["actors"] == 6
        assert rt.end_session("s1") == 3
        assert rt.end_session("s1") == 0
        assert {k[1][1] for k in rt._registry.keys()} == {"s2"}
        assert rt.call("get_planning_state", ctx_args("s1", "a1")).structured["goals"] == []
        assert len(rt.call("get_planning_state", ctx_args("s2", "a1")).structured["goals"]) == 1


def test_end_session_lets_calls_in_flight_finish(clock: ManualClock) -> None:
    Gate.gates["end"] = threading.Event()
    Gate.entered["end"] = threading.Event()
    with make(clock) as rt:
        results: list[Any] = []
        t = threading.Thread(
            target=lambda: results.append(rt.call("wait_gate", ctx_args("s", gate="end")))
        )
        t.start()
        assert Gate.entered["end"].wait(10)
        actor = Gate.threads["end"]
        ended: list[int] = []
        ender = threading.Thread(target=lambda: ended.append(rt.end_session("s")))
        ender.start()
        wait_until(lambda: rt.stats()["ended"] > 0, 10)  # end_session has retired the key
        assert rt._registry.keys() == []
        # It waits for the call in flight, which holds the actor (a join that can only
        # return early if end_session does not wait).
        ender.join(0.5)
        assert ender.is_alive() and ended == [] and actor.is_alive()
        Gate.gates["end"].set()
        t.join(10)
        ender.join(10)
        assert results[0].structured == {"n": 1}
        assert ended == [1]
        # It returned because the actor stopped, not because its wait (call_timeout) ran out.
        assert not actor.is_alive()
        assert rt.stats()["actors"] == 0 and rt.stats()["inflight"] == 0
        assert rt.call("count", ctx_args("s")).structured == {"n": 1}  # a fresh incarnation


@pytest.mark.parametrize("ttl", [0, -1])
def test_bad_settings_are_refused(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl"):
        Runtime(ttl=ttl)


def test_session_state_lives_exactly_as_long_as_the_sessions_actors(clock: ManualClock) -> None:
    made: list[object] = []

    def new() -> object:
        made.append(object())
        return made[-1]

    with make(clock, ttl=60, max_actors=2) as rt:
        registry = rt._registry
        assert registry.session_state((None, "s1"), "x", new) is None  # no live actor: nothing kept
        rt.call("count", ctx_args("s1"))
        first = registry.session_state((None, "s1"), "x", new)
        assert first is not None and registry.session_state((None, "s1"), "x", new) is first
        rt.call("count", ctx_args("s2"))
        rt.call("count", ctx_args("s3"))  # over the cap: s1's only actor is evicted
        assert registry.session_state((None, "s1"), "x", new) is None
        rt.call("count", ctx_args("s1"))  # s2 evicted now
        assert registry.session_state((None, "s1"), "x", new) is not first  # a fresh one
        assert rt.end_session("s1") == 1
        assert registry.session_state((None, "s1"), "x", new) is None
        assert registry.session_state((None, "s3"), "x", new) is not None
        clock.advance(61)
        assert rt.reap() == 1
        assert registry.session_state((None, "s3"), "x", new) is None
        assert len(made) == 3


def test_wait_closed_reports_whether_cleanup_finished_and_the_thread_ended() -> None:
    life = Lifecycle()
    assert life.wait_closed(0.0) is False  # cleanup has not run
    life.closed.set()
    assert life.wait_closed(0.0) is True  # no thread to wait for (it never started)
    life.thread = threading.current_thread()
    assert life.wait_closed(0.0) is True  # cleanup ran in the caller's own thread
    done = threading.Thread(target=lambda: None)
    done.start()
    done.join()
    life.thread = done
    assert life.wait_closed(0.0) is True
    release = threading.Event()
    running = threading.Thread(target=release.wait, args=(10,))
    running.start()
    life.thread = running
    assert life.wait_closed(0.0) is False  # closed, but its thread has not ended yet
    release.set()
    assert life.wait_closed(10) is True


def test_has_session_is_per_principal_and_ends_with_the_session(clock: ManualClock) -> None:
    with make(clock) as rt:
        assert rt.has_session("s") is False
        rt.call("count", ctx_args("s"), principal="p1")
        assert rt.has_session("s", principal="p1") is True
        assert rt.has_session("s") is False and rt.has_session("s", principal="p2") is False
        assert rt.end_session("s", principal="p1") == 1
        assert rt.has_session("s", principal="p1") is False
        assert rt._registry.closed is False
    assert rt._registry.closed is True


PLANNING = ("planning", None, None)  # its store key: (server, assistant, thread)


def test_with_a_store_end_session_deletes_the_stored_state(clock: ManualClock) -> None:
    store = MemoryStore()
    with Runtime(clock=clock, store=store) as rt:
        for s in ("s1", "s2"):
            rt.call("create_goal", ctx_args(s, goal=f"goal of {s}"))
        assert rt.end_session("s1") == 1
        assert store.load((None, "s1"), PLANNING) is None
        assert store.load((None, "s2"), PLANNING) is not None
        state = rt.call("get_planning_state", ctx_args("s1")).structured
        assert state == {"goals": [], "todos": []}  # nothing to load back


def test_with_a_store_reap_forgets_the_sessions_past_retention_at_once(
    clock: ManualClock,
) -> None:
    now = [0.0]
    store = MemoryStore(retention=60, clock=lambda: now[0])
    with Runtime(clock=clock, store=store) as rt:
        rt.call("create_goal", ctx_args("s1", goal="g"))
        durable = rt.durability
        assert durable is not None
        durable.flush()  # the history's write lands now, not after the store's clock moves
        assert rt.reap() == 0
        assert store.purge() == 0  # not past retention yet
        now[0] = 61.0
        assert rt.reap() == 0  # the actors stay (their TTL is the runtime's)...
        assert store.purge() == 0  # ...but the session was already purged by that pass


class WatchedStore(MemoryStore):
    """A memory store that tells when a purge forgot something."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.purged = threading.Event()

    def purge(self) -> int:
        forgotten = super().purge()
        if forgotten:
            self.purged.set()
        return forgotten


def test_the_background_reaper_forgets_sessions_past_retention() -> None:
    """With a 6 s retention the reaper purges every 0.6 s (a tenth of it). A session with a
    live actor is never purged, so the actor goes first (a short TTL)."""
    now = [0.0]
    store = WatchedStore(retention=6.0, clock=lambda: now[0])
    with Runtime(store=store, ttl=0.05, scan_interval=0.01, clock=lambda: now[0]) as rt:
        rt.call("create_goal", ctx_args("s1", goal="g"))
        durable = rt.durability
        assert durable is not None
        durable.flush()
        now[0] = 7.0
        assert store.purged.wait(8)
        assert store.purge() == 0


# -- the caps per principal and the global one, beside each other -------------------------


def test_per_principal_cap_passivates_only_that_principals_own_lru_keys(
    clock: ManualClock,
) -> None:
    with Runtime(clock=clock, max_actors=100, max_actors_per_principal=5) as rt:
        with capture_logs() as logs:
            for i in range(3):
                rt.call("list_content", ctx_args(f"b{i}"), principal="bob")
            for i in range(20):
                rt.call("list_content", ctx_args(f"a{i}"), principal="alice")
        evicted = [(e["session_id"], e["reason"]) for e in logs if e["event"] == "actor_evicted"]
        assert evicted == [(f"a{i}", "max_actors_per_principal") for i in range(15)]
        keys = rt._registry.keys()
        by_principal: dict[Any, list[str]] = {}
        for key in keys:
            by_principal.setdefault(key[1][0], []).append(key[1][1])
        assert by_principal == {
            "bob": ["b0", "b1", "b2"],
            "alice": ["a15", "a16", "a17", "a18", "a19"],
        }
        stats = rt.stats()
        assert (stats["actors"], stats["evicted"], stats["spawned"]) == (8, 15, 23)
        # Touching alice's oldest key makes it the most recent: the next eviction takes a16.
        rt.call("list_content", ctx_args("a15"), principal="alice")
        rt.call("list_content", ctx_args("a20"), principal="alice")
        alice = sorted(k[1][1] for k in rt._registry.keys() if k[1][0] == "alice")
        assert alice == ["a15", "a17", "a18", "a19", "a20"]
        # The unauthenticated namespace has a cap of its own too.
        for i in range(7):
            rt.call("list_content", ctx_args(f"n{i}"))
        assert sorted(k[1][1] for k in rt._registry.keys() if k[1][0] is None) == [
            "n2",
            "n3",
            "n4",
            "n5",
            "n6",
        ]
        assert sorted(k[1][1] for k in rt._registry.keys() if k[1][0] == "bob") == [
            "b0",
            "b1",
            "b2",
        ]


def test_the_global_cap_still_holds_beside_the_per_principal_one(clock: ManualClock) -> None:
    with (
        capture_logs() as logs,
        Runtime(clock=clock, max_actors=4, max_actors_per_principal=3) as rt,
    ):
        for i in range(3):
            rt.call("list_content", ctx_args(f"b{i}"), principal="bob")
        for i in range(2):
            rt.call("list_content", ctx_args(f"a{i}"), principal="alice")
        evicted = [(e["session_id"], e["reason"]) for e in logs if e["event"] == "actor_evicted"]
        assert evicted == [("b0", "max_actors")]
        # Global LRU: bob's oldest went when alice's second key came.
        assert [(k[1][0], k[1][1]) for k in rt._registry.keys()] == [
            ("bob", "b1"),
            ("bob", "b2"),
            ("alice", "a0"),
            ("alice", "a1"),
        ]


@pytest.mark.parametrize("bad", [0, -1])
def test_a_per_principal_cap_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError) as caught:
        Runtime(max_actors_per_principal=bad)
    assert str(caught.value) == "max_actors_per_principal must be at least 1"
    with Runtime(max_actors_per_principal=1) as rt:
        assert rt._registry.max_actors_per_principal == 1


def test_the_global_cap_passivates_the_flooding_principals_own_keys_first(
    clock: ManualClock,
) -> None:
    from ctxactors.servers import Content

    with Runtime(servers=[Content], clock=clock, max_actors=3) as rt:
        alice = rt.call(
            "add_content", ctx_args("s1", filename="n", content="alice's"), principal="alice"
        )
        assert not alice.is_error
        clock.advance(1)
        for i in range(6):  # bob floods: his own older keys make room, alice's stays
            rt.call("list_content", ctx_args(f"b{i}"), principal="bob")
            clock.advance(1)
        keys = rt._registry.keys()
        assert ("content", ("alice", "s1")) in keys
        assert sorted(k[1] for k in keys if k[1][0] == "bob") == [("bob", "b4"), ("bob", "b5")]
        listed = rt.call("list_content", ctx_args("s1"), principal="alice").structured
        assert listed is not None and listed["count"] == 1
        assert rt.stats()["evicted"] == 4


def test_a_principal_over_its_cap_with_every_key_busy_keeps_them_and_the_newcomer(
    clock: ManualClock,
) -> None:
    Gate.gates["own"] = threading.Event()
    Gate.entered["own"] = threading.Event()
    with make(clock, max_actors_per_principal=1) as rt:
        held = threading.Thread(
            target=lambda: rt.call("wait_gate", ctx_args("s1", gate="own"), principal="p")
        )
        held.start()
        try:
            assert Gate.entered["own"].wait(10)
            # Over the cap, but the only other key is busy: nothing is evicted.
            assert rt.call("count", ctx_args("s2"), principal="p").structured == {"n": 1}
            assert rt.call("count", ctx_args("s2"), principal="p").structured == {"n": 2}
            assert rt.stats()["evicted"] == 0
        finally:
            Gate.gates["own"].set()
            held.join(10)


def test_both_caps_evicting_at_once_still_stop_the_principals_own_victim(
    clock: ManualClock,
) -> None:
    """The global cap is already exceeded (every other key busy) when a principal over its
    own cap gives up its least recently used key: that key is stopped all the same."""
    gates = ("both1", "both2")
    for gate in gates:
        Gate.gates[gate] = threading.Event()
        Gate.entered[gate] = threading.Event()
    with make(clock, max_actors=2, max_actors_per_principal=1) as rt:
        held = [
            threading.Thread(
                target=lambda s=s, g=g: rt.call("wait_gate", ctx_args(s, gate=g), principal="q")
            )
            for s, g in zip(("s1", "s2"), gates, strict=True)
        ]
        try:
            for t, gate in zip(held, gates, strict=True):
                t.start()
                assert Gate.entered[gate].wait(10)
            assert rt.call("count", ctx_args("s3"), principal="p").structured == {"n": 1}
            (victim,) = [e for k, e in rt._registry._entries.items() if k.session[1] == "s3"]
            assert rt.call("count", ctx_args("s4"), principal="p").structured == {"n": 1}
            stats = rt.stats()
            assert (stats["actors"], stats["evicted"]) == (3, 1)
            assert victim.closed.wait(5)  # its actor was stopped, not left running
        finally:
            for gate in gates:
                Gate.gates[gate].set()
            for t in held:
                t.join(10)


def test_an_operation_its_batch_gave_up_on_before_it_started_never_runs(
    clock: ManualClock,
) -> None:
    """The batch's caller stops waiting while the operation is queued behind a busy call
    on its key: when the operation's turn comes, its actor refuses it instead of running
    it for nobody."""
    Gate.gates["queued"] = threading.Event()
    Gate.entered["queued"] = threading.Event()
    with make(clock) as rt:
        held = threading.Thread(target=lambda: rt.call("wait_gate", ctx_args("s1", gate="queued")))
        held.start()
        try:
            assert Gate.entered["queued"].wait(10)
            ops = [{"id": "c", "tool": "count", "arguments": {}}]
            try:
                rt.call("batch", ctx_args("s1", operations=ops), timeout=2.0)
            except CallTimeoutError:
                pass  # either way the batch has given up on the operation
        finally:
            Gate.gates["queued"].set()
            held.join(10)
        # wait_gate counted 1; the refused operation nothing.
        assert rt.call("count", ctx_args("s1")).structured == {"n": 2}
        recent = rt.call("get_recent_context", ctx_args("s1", limit=10)).structured
        assert recent is not None
        counts = [
            (op["is_error"], op["metadata"]) for op in recent["operations"] if op["tool"] == "count"
        ]
        refused = {"error": "not run: the batch gave up on it before it started"}
        assert counts == [(False, {}), (True, refused)]  # newest first


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"ttl": 0, "max_actors": 1}, "ttl must be positive"),
        ({"ttl": 1, "max_actors": 0}, "max_actors must be at least 1"),
        (
            {"ttl": 1, "max_actors": 1, "max_actors_per_principal": 0},
            "max_actors_per_principal must be at least 1 (or None)",
        ),
    ],
)
def test_a_registry_refuses_bad_limits_itself(limits: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Registry(**limits)
    assert str(caught.value) == message
    Registry(ttl=1e-9, max_actors=1, max_actors_per_principal=1).close()  # the least allowed


def test_the_background_reaper_without_a_store_passes_cleanly(clock: ManualClock) -> None:
    with capture_logs() as logs, make(clock, ttl=10, scan_interval=0.01) as rt:
        for n in (1, 2):  # the second pass begins after the first one's end
            rt.call("count", ctx_args(f"s{n}"))
            clock.advance(11)
            wait_until(lambda: rt.stats()["reaped"] >= n, 10)  # noqa: B023 - n is this pass's
            assert rt.stats()["reaped"] == n
    assert [e for e in logs if e["event"] == "reap_failed"] == []


@pytest.mark.parametrize("evicted", [False, True])
def test_a_sessions_stored_state_lives_while_it_has_a_live_actor_or_was_used_lately(
    clock: ManualClock, evicted: bool
) -> None:
    """Retention counts from a session's last use, a read included, and never ends while
    the session has a live actor."""
    now = [0.0]
    store = MemoryStore(retention=60, clock=lambda: now[0])
    with Runtime(clock=clock, store=store, ttl=3600, max_actors=1) as rt:
        durable = rt.durability
        assert durable is not None
        rt.call("create_goal", ctx_args("s1", goal="g"))
        durable.flush()
        now[0] = 50.0
        clock.advance(50)  # (uses are noted at most once per a hundredth of the retention)
        rt.call("get_planning_state", ctx_args("s1"))  # a read: no write, still a use
        if evicted:
            rt.call("get_planning_state", ctx_args("other"))  # s1's actor makes room
            assert not rt.has_session("s1")
        now[0] = 100.0  # 100 s since the write, 50 s since the read
        assert rt.reap() == 0
        assert store.load((None, "s1"), PLANNING) is not None
        if not evicted:
            now[0] = 200.0  # past retention from the read, but the actor is live
            assert rt.reap() == 0
            assert store.load((None, "s1"), PLANNING) is not None


def test_stores_are_given_the_call_timeout_to_save() -> None:
    with Runtime(store=MemoryStore(), call_timeout=7.0) as rt:
        assert rt.durability is not None and rt.durability.save_timeout == 7.0


# -- a call sent as its key is retired; the session's shared state after it ----------------


class PausingLock:
    """The registry's lock, pausing one thread right after that thread releases it."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.pause: threading.Thread | None = None
        self.paused = threading.Event()
        self.resume = threading.Event()

    def acquire(self) -> bool:
        taken: bool = self._lock.acquire()
        return taken

    def release(self) -> None:
        self._lock.release()
        if threading.current_thread() is self.pause:
            self.pause = None
            self.paused.set()
            assert self.resume.wait(10)

    def __enter__(self) -> PausingLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Sharer(Server):
    """Reads its session's shared state from its own actor (as the history does)."""

    name = "sharer"
    scope = Scope.SESSION
    made: list[object] = []

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @classmethod
    def create(cls, runtime: Any) -> Sharer:
        return cls(runtime)

    @tool
    def share(self, ctx: ToolContext, gate: str) -> dict[str, Any]:
        """Wait for the gate, then look up the session's shared object."""
        Gate.entered.setdefault(gate, threading.Event()).set()
        assert Gate.gates[gate].wait(10)

        def new() -> object:
            Sharer.made.append(object())
            return Sharer.made[-1]

        found = self.runtime._registry.session_state(ctx.session_key, "x", new)
        other = self.runtime._registry.session_state(ctx.session_key, "y", new)
        return {"shared": found is not None, "by_name": found is not other}


def test_a_call_counted_as_sent_before_its_key_is_retired_still_runs(clock: ManualClock) -> None:
    """`submit` counts a call as sent under the lock and sends it after: a session ended in
    between must wait for that call too (the actor drains it), not stop the actor when the
    call running then ends, before the other arrives, which would lose it."""
    Gate.gates["sent"] = threading.Event()
    Gate.entered["sent"] = threading.Event()
    with make(clock, ttl=60) as rt:
        assert rt.call("count", ctx_args("s1")).structured == {"n": 1}
        registry = rt._registry
        results: list[Any] = []

        def call(tool: str, **args: Any) -> None:
            try:
                results.append(rt.call(tool, ctx_args("s1", **args), timeout=5).structured)
            except Exception as exc:  # noqa: BLE001 - reported below
                results.append(exc)

        lock = PausingLock(registry._lock)
        try:
            running = threading.Thread(target=call, args=("wait_gate",), kwargs={"gate": "sent"})
            running.start()
            assert Gate.entered["sent"].wait(10)
            registry._lock = lock  # type: ignore[assignment]
            sending = threading.Thread(target=call, args=("count",))
            lock.pause = sending
            sending.start()
            assert lock.paused.wait(10)  # counted as sent, not sent yet
            assert registry.end_session((None, "s1")) == 1
            entry = next(iter(registry._draining))
            assert (entry.sent, entry.done) == (3, 1)
            # The actor's, for wait_closed (a pooled actor has no thread of its own).
            assert entry.thread is None or entry.thread is Gate.threads["sent"]
            assert rt.stats()["inflight"] == 2  # the retired actor's calls still count
            Gate.gates["sent"].set()
            running.join(10)
            assert results == [{"n": 2}]
            lock.resume.set()
            sending.join(10)
            assert results == [{"n": 2}, {"n": 3}]
            assert entry.closed.wait(10)  # it stopped itself after its last call
            assert registry._draining == set()  # and is no longer kept
            assert rt.stats()["inflight"] == 0
        finally:  # a failed check must not leave the call blocked
            Gate.gates["sent"].set()
            lock.resume.set()


def test_a_call_that_outlives_its_ended_session_adds_nothing_to_its_state(
    clock: ManualClock,
) -> None:
    Gate.gates["outlive"] = threading.Event()
    Gate.entered["outlive"] = threading.Event()
    Sharer.made.clear()
    with Runtime([*BUILTIN, Sharer], clock=clock, call_timeout=10) as rt:
        results: list[Any] = []
        t = threading.Thread(
            target=lambda: results.append(rt.call("share", ctx_args("s1", gate="outlive")))
        )
        t.start()
        assert Gate.entered["outlive"].wait(10)
        assert rt._registry.end_session((None, "s1")) == 1  # its only actor, busy
        Gate.gates["outlive"].set()
        t.join(10)
        assert results[0].structured == {"shared": False, "by_name": False}
        assert Sharer.made == []  # nothing made for a session that is gone
        Gate.gates["live"] = threading.Event()
        Gate.gates["live"].set()
        live = rt.call("share", ctx_args("s1", gate="live")).structured
        assert live == {"shared": True, "by_name": True}
        assert len(Sharer.made) == 2  # one object per name
        # Off the session's actors (under the registry's lock): the same objects, by name.
        assert [rt._registry.session_state((None, "s1"), n, object) for n in "xy"] == Sharer.made


class CountingStore(MemoryStore):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.purges = 0

    def purge(self) -> int:
        self.purges += 1
        return super().purge()


@pytest.mark.parametrize(
    ("retention", "below", "every"), [(5.0, 0.46875, 0.5), (1000.0, 59.5, 60.0)]
)
def test_the_reapers_store_pass_runs_every_tenth_of_the_retention_at_most_a_minute(
    clock: ManualClock, retention: float, below: float, every: float
) -> None:
    store = CountingStore(retention=retention)
    with Runtime(clock=clock, store=store) as rt:
        on_pass = rt._registry.on_pass  # what the background reaper runs after each pass
        assert on_pass is not None
        for n in (1, 2):
            clock.advance(below)
            on_pass()
            assert store.purges == n - 1
            clock.advance(every - below)
            on_pass()
            assert store.purges == n


class CountingPlanning(Planning):
    """The planning server, counting how often its state is encoded for a save."""

    snapshots = 0

    def snapshot(self) -> Any:
        CountingPlanning.snapshots += 1
        return super().snapshot()


def test_with_a_store_a_read_only_call_never_encodes_the_state(clock: ManualClock) -> None:
    with Runtime([CountingPlanning], clock=clock, store=MemoryStore()) as rt:
        assert rt.call("create_goal", ctx_args("s1", goal="a")).structured == {
            "id": "g1",
            "goal": "a",
        }
        before = CountingPlanning.snapshots
        state = rt.call("get_planning_state", ctx_args("s1")).structured
        assert state is not None and [g["id"] for g in state["goals"]] == ["g1"]
        assert CountingPlanning.snapshots == before
        rt.call("create_goal", ctx_args("s1", goal="b"))
        assert CountingPlanning.snapshots == before + 1


def test_with_a_store_a_server_that_is_not_durable_keeps_its_state_in_its_actor(
    clock: ManualClock,
) -> None:
    store = MemoryStore()
    with make(clock, store=store) as rt:
        assert [rt.call("count", ctx_args("s1")).structured for _ in range(2)] == [
            {"n": 1},
            {"n": 2},
        ]
        assert store.load((None, "s1"), ("gate", None, None)) is None


class WatchedValues(dict[str, Any]):
    """A session state's values, counting its lookups."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = threading.Semaphore(0)

    def get(self, name: str, default: Any = None) -> Any:
        found = super().get(name, default)
        self.lookups.release()
        return found


def test_two_actors_making_a_session_object_at_once_share_the_one_made_first() -> None:
    """The second looks again under the lock, so it never replaces the first one's object."""
    state = SessionState()
    values = WatchedValues()
    state._values = values
    making = threading.Event()
    release = threading.Event()
    made: list[object] = []

    def first() -> object:
        making.set()
        assert release.wait(10)
        made.append(object())
        return made[-1]

    def second() -> object:
        made.append(object())
        return made[-1]

    got: list[object] = []
    a = threading.Thread(target=lambda: got.append(state.get("x", first)))
    a.start()
    assert making.wait(10)  # a holds the lock, making it
    for _ in range(2):
        assert values.lookups.acquire(timeout=10)  # a's lookups: before and under the lock
    b = threading.Thread(target=lambda: got.append(state.get("x", second)))
    b.start()
    assert values.lookups.acquire(timeout=10)  # b found nothing, and waits for the lock
    release.set()
    a.join(10)
    b.join(10)
    assert len(made) == 1 and got == [made[0], made[0]]
