"""TTL reaping, the LRU cap, calls racing passivation, and end_session, on a manual clock."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from structlog.testing import capture_logs

from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors._actors import Lifecycle
from ctxactors.servers import BUILTIN
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


def test_stores_are_given_the_call_timeout_to_save() -> None:
    with Runtime(store=MemoryStore(), call_timeout=7.0) as rt:
        assert rt.durability is not None and rt.durability.save_timeout == 7.0
