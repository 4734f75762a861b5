"""The Ray backend on a real multi-node Ray cluster (head + two workers) and a real Redis.

The core contract holds through it unchanged (isolation, spoofing, bad input refused in the
caller, reaping on the shard, metrics and tracing in the front end); two front ends share
the shards with no coordination but the hash; killing a worker node mid-load loses no
acknowledged call; adding or removing a shard under load moves only the sessions it must,
and loses nothing; `ctxactors loadtest` passes against served front ends while a shard is
added and removed, and while a worker node is killed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from ray_support import SHARD_OPTIONS, SHARD_RESOURCE, TESTS_ENV, CrashOnce, RayCluster

from ctxactors import Runtime
from ctxactors.errors import CallTimeoutError, InvalidArgumentsError, UnknownToolError
from ctxactors.ray import RayBackend, ShardUnavailableError, owner

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

FrontEnd = tuple[Runtime, RayBackend]


@pytest.fixture
def front_ends(cluster: RayCluster) -> Iterator[Callable[..., FrontEnd]]:
    """Make front ends on one fresh namespace (so fresh shards); kills the shards after."""
    namespace = cluster.namespace()
    made: list[FrontEnd] = []

    def make(shards: int = 2, servers: Any = None, **limits: Any) -> FrontEnd:
        backend = RayBackend(
            cluster.cluster.address,
            shards=shards,
            store=cluster.redis.url,
            namespace=namespace,
            shard_options={**SHARD_OPTIONS, "runtime_env": TESTS_ENV},
            **limits,
        )
        # A call_timeout among the limits is the runtime's too: the call waits that long.
        runtime = Runtime(servers, backend=backend, call_timeout=limits.get("call_timeout"))
        made.append((runtime, backend))
        return made[-1]

    yield make
    for runtime, _ in made:
        runtime.close()
    if made:
        made[0][1].kill_shards()


# The call timeout of a test whose call waits through a shard's death and restart: seconds
# alone, but it has taken over the default 30 s with the suite's other workers on the same
# two cores (Ray starts a new worker process). Only how long the call may wait changes.
THROUGH_A_RESTART = {"call_timeout": 120.0}


def sessions_on(shard: int, shards: int, count: int, prefix: str) -> list[str]:
    """`count` session ids (no principal) that `owner` places on `shard`."""
    found = []
    i = 0
    while len(found) < count:
        if owner((None, f"{prefix}{i}"), shards) == shard:
            found.append(f"{prefix}{i}")
        i += 1
    return found


def live_sessions_around_shard_2(front_end: Runtime, prefix: str) -> tuple[list[str], list[str]]:
    """Six sessions that shard 2 of 3 owns and twelve it does not, each with a live key
    through `front_end`: (the moving ones, all of them)."""
    moving = sessions_on(2, 3, 6, prefix)
    staying = [s for s in (f"{prefix}{i}" for i in range(40)) if owner((None, s), 3) != 2][:12]
    sessions = moving + staying
    for session in sessions:
        front_end.call("get_planning_state", {"__sessionId": session})
    return moving, sessions


def goals(runtime: Runtime, session: str, **kw: Any) -> list[str]:
    result = runtime.call("get_planning_state", {"__sessionId": session}, **kw)
    assert not result.is_error, result.text
    assert result.structured is not None
    return [g["goal"] for g in result.structured["goals"]]


def calls_served(backend: RayBackend) -> int:
    return sum(s["calls"] for s in backend.shard_stats())


# -- the core contract through the backend ---------------------------------------------------


def test_sessions_on_different_shards_and_principals_never_see_each_other(
    front_ends: Callable[..., FrontEnd],
) -> None:
    runtime, backend = front_ends()
    (a,) = sessions_on(0, 2, 1, "iso-")
    (b,) = sessions_on(1, 2, 1, "iso-")
    assert runtime.call("create_goal", {"goal": "A's", "__sessionId": a}).structured == {
        "id": "g1",
        "goal": "A's",
    }
    runtime.call("create_goal", {"goal": "B's", "__sessionId": b})
    runtime.call("create_goal", {"goal": "P's", "__sessionId": a}, principal="p")

    assert goals(runtime, a) == ["A's"]
    assert goals(runtime, b) == ["B's"]
    assert goals(runtime, a, principal="p") == ["P's"]
    assert goals(runtime, "iso-nobody") == []
    by_shard = {s["shard"]: s for s in backend.shard_stats()}
    # Each session's planning key was spawned on its owner shard and nowhere else.
    used = [(None, a), (None, b), ("p", a), (None, "iso-nobody")]
    for shard in (0, 1):
        assert by_shard[shard]["spawned"] == sum(owner(s, 2) == shard for s in used)
    assert by_shard[0]["node_id"] != by_shard[1]["node_id"]  # SPREAD: one shard per worker


def test_context_in_meta_wins_and_spoofed_arguments_are_dropped(
    front_ends: Callable[..., FrontEnd],
) -> None:
    runtime, _ = front_ends()
    meta = {"ctxactors/sessionId": "spoof-me", "ctxactors/assistantId": "asst"}
    created = runtime.call(
        "create_goal", {"goal": "mine", "__sessionId": "spoof-victim"}, meta=meta
    )
    assert created.structured == {"id": "g1", "goal": "mine"}
    assert goals(runtime, "spoof-victim") == []
    state = runtime.call("get_planning_state", {}, meta=meta)
    assert state.structured == {"goals": [{"id": "g1", "goal": "mine"}], "todos": []}


def test_bad_input_is_refused_in_the_caller_and_never_reaches_a_shard(
    front_ends: Callable[..., FrontEnd],
) -> None:
    runtime, backend = front_ends()
    runtime.call("get_planning_state", {"__sessionId": "bad-1"})
    before = calls_served(backend)
    with pytest.raises(InvalidArgumentsError, match="Expected `str`, got `int`"):
        runtime.call("create_goal", {"goal": 5, "__sessionId": "bad-1"})
    with pytest.raises(InvalidArgumentsError):
        runtime.call("create_goal", "[1, 2]")
    with pytest.raises(UnknownToolError, match="unknown tool 'no_such_tool'"):
        runtime.call("no_such_tool", {"__sessionId": "bad-1"})
    assert calls_served(backend) == before
    assert goals(runtime, "bad-1") == []


def test_idle_keys_are_reaped_on_their_shard_and_reload_from_redis(
    front_ends: Callable[..., FrontEnd],
) -> None:
    runtime, _ = front_ends(ttl=0.3)
    runtime.call("create_goal", {"goal": "kept", "__sessionId": "reap-1"})
    # Its key was made for the call (on a loaded machine it may be reaped before a look at
    # has_session: the TTL is short).
    assert runtime.stats()["spawned"] == 1
    deadline = time.monotonic() + 30
    while runtime.stats()["actors"] and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = runtime.stats()
    assert (stats["actors"], stats["reaped"], stats["spawned"]) == (0, 1, 1)
    assert not runtime.has_session("reap-1")
    assert goals(runtime, "reap-1") == ["kept"]  # the next call loads it from Redis
    assert runtime.stats()["spawned"] == 2


def test_end_session_through_the_backend_stops_its_actors_and_deletes_its_state(
    front_ends: Callable[..., FrontEnd],
) -> None:
    runtime, _ = front_ends()
    runtime.call("create_goal", {"goal": "gone", "__sessionId": "end-1"})
    runtime.call("create_goal", {"goal": "stays", "__sessionId": "end-2"})
    assert runtime.end_session("end-1") == 1
    assert not runtime.has_session("end-1")
    assert goals(runtime, "end-1") == []
    assert goals(runtime, "end-2") == ["stays"]


def test_a_batch_and_the_history_run_on_the_session_s_shard_with_the_caller_s_context(
    front_ends: Callable[..., FrontEnd],
) -> None:
    runtime, _ = front_ends()
    ops = [
        {"id": "g", "tool": "create_goal", "arguments": {"goal": "Learn Rust"}},
        {"id": "a", "tool": "add_todo", "arguments": {"name": "book", "goal_id": "${g.id}"}},
    ]
    done = runtime.call("batch", {"operations": ops, "__sessionId": "batch-1"})
    assert done.structured is not None, done.text
    assert done.structured["summary"]["successful"] == 2
    state = runtime.call("get_planning_state", {"__sessionId": "batch-1"}).structured
    assert state == {
        "goals": [{"id": "g1", "goal": "Learn Rust"}],
        "todos": [{"id": "t2", "name": "book", "goal_id": "g1", "done": False}],
    }
    history = runtime.call("get_recent_context", {"__sessionId": "batch-1"}).structured
    assert history is not None
    assert [op["tool"] for op in history["operations"]] == [
        "get_planning_state",
        "batch",
        "add_todo",
        "create_goal",
    ]
    assert goals(runtime, "batch-2") == []


def test_a_read_only_call_whose_shard_dies_is_retried_on_the_restarted_shard(
    front_ends: Callable[..., FrontEnd], tmp_path: Any
) -> None:
    from ctxactors.servers import BUILTIN

    runtime, backend = front_ends(servers=[*BUILTIN, CrashOnce], **THROUGH_A_RESTART)
    runtime.call("create_goal", {"goal": "before", "__sessionId": "crash-1"})
    pid = runtime.call("crash_reading", {"marker": str(tmp_path / "m0"), "__sessionId": "crash-1"})
    first_pid = pid.structured
    marker = str(tmp_path / "m1")
    result = runtime.call("crash_reading", {"marker": marker, "__sessionId": "crash-1"})
    assert backend.retries >= 1
    assert result.structured is not None and result.structured != first_pid  # a new process
    assert goals(runtime, "crash-1") == ["before"]  # loaded from Redis by the new incarnation


def test_a_changing_call_whose_shard_dies_fails_as_retryable_and_in_doubt(
    front_ends: Callable[..., FrontEnd], tmp_path: Any
) -> None:
    from ctxactors.servers import BUILTIN

    runtime, backend = front_ends(servers=[*BUILTIN, CrashOnce], **THROUGH_A_RESTART)
    runtime.call("create_goal", {"goal": "before", "__sessionId": "crash-2"})
    marker = str(tmp_path / "m")
    with pytest.raises(ShardUnavailableError, match="may or may not have been applied") as err:
        runtime.call("crash_writing", {"marker": marker, "__sessionId": "crash-2"})
    assert err.value.retryable and err.value.code == -32013
    assert backend.retries == 0
    # Retrying is the caller's choice; the restarted shard serves it and the state is there.
    assert not runtime.call("crash_writing", {"marker": marker, "__sessionId": "crash-2"}).is_error
    assert goals(runtime, "crash-2") == ["before"]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_changing_call_whose_shard_dies_reaches_an_mcp_client_in_doubt_and_runs_once(
    front_ends: Callable[..., FrontEnd], tmp_path: Any, mode: str
) -> None:
    """The official MCP client gets the in-doubt error and does not send the call again.

    Its code is ctxactors' own: the SDK client re-sends, once and silently, a call refused
    with -32020 (the spec's HEADER_MISMATCH), so a call applied by a dying shard was applied
    twice while the client saw one plain answer (seen as one extra item in a key under the
    served node-kill load test)."""
    import anyio
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from ctxactors.servers import BUILTIN
    from ctxactors.transports.mcp import McpFrontend

    runtime, backend = front_ends(servers=[*BUILTIN, CrashOnce], **THROUGH_A_RESTART)
    frontend = McpFrontend(runtime)
    args = {"marker": str(tmp_path / "m"), "__sessionId": f"crash-mcp-{mode}"}

    async def main() -> MCPError:
        async with Client(frontend.server, mode=mode) as client:
            with pytest.raises(MCPError) as err:
                await client.call_tool("crash_writing", args)
            return err.value

    err = anyio.run(main)
    assert err.code == ShardUnavailableError.code == -32013
    assert "may or may not have been applied" in err.message
    assert calls_served(backend) == 0  # the restarted shard was sent nothing


def test_a_changing_call_delivered_twice_to_a_shard_runs_once(
    front_ends: Callable[..., FrontEnd],
) -> None:
    import ray

    from ctxactors.ray._shard import Duplicate

    runtime, backend = front_ends()
    (session,) = sessions_on(0, 2, 1, "twice-")
    shard = ray.get_actor("ctxactors-shard-0", namespace=backend.namespace)
    call = (backend.layout, "create_goal", (None, session, None, None), {"goal": "once"}, 30.0)
    first = ray.get(shard.call.remote(*call, "id-1"))
    assert first.structured == {"id": "g1", "goal": "once"}
    assert ray.get(shard.call.remote(*call, "id-1")) == Duplicate()  # as a Ray retry would
    assert goals(runtime, session) == ["once"]
    assert ray.get(shard.call.remote(*call, "id-2")).structured == {"id": "g2", "goal": "once"}


def test_a_front_end_keeps_no_state_so_a_store_beside_a_backend_is_refused(
    cluster: RayCluster,
) -> None:
    from ctxactors.state import MemoryStore

    backend = RayBackend(cluster.cluster.address, store=cluster.redis.url, namespace="unused")
    with pytest.raises(ValueError, match="give the store to it"):
        Runtime(store=MemoryStore(), backend=backend)
    with pytest.raises(ValueError, match="store must be a redis:// URL, got 'sqlite'"):
        RayBackend(store="sqlite")
    backend.close()


def test_the_front_end_s_settings_are_the_shards_limits(
    front_ends: Callable[..., FrontEnd],
) -> None:
    from ctxactors.settings import Settings

    runtime, _ = front_ends(settings=Settings().replace(max_text_bytes=16))
    refused = runtime.call("create_goal", {"goal": "x" * 17, "__sessionId": "set-1"})
    assert (refused.is_error, refused.text) == (
        True,
        "the goal is 17 bytes of UTF-8: the limit is 16 (CTXACTORS_MAX_TEXT_BYTES)",
    )
    assert not runtime.call("create_goal", {"goal": "x" * 16, "__sessionId": "set-1"}).is_error


def test_a_front_end_counts_and_traces_its_calls_like_an_embedded_runtime(
    front_ends: Callable[..., FrontEnd],
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry

    from ctxactors import metrics, tracing

    runtime, _ = front_ends()
    registry = CollectorRegistry()
    metrics.register(runtime, registry)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(runtime, tracer_provider=provider)
    with provider.get_tracer("host").start_as_current_span("host turn"):
        runtime.call("create_goal", {"goal": "g", "__sessionId": "obs-1", "__assistantId": "a"})
    runtime.call("create_goal", {"goal": "h", "__sessionId": "obs-2"})
    refused = runtime.call("mark_todo", {"todo_id": "t9", "__sessionId": "obs-1"})
    assert refused.is_error

    def count(tool: str, outcome: str) -> float | None:
        labels = {"tool": tool, "outcome": outcome}
        return registry.get_sample_value("ctxactors_tool_calls_total", labels)

    assert (count("create_goal", "ok"), count("mark_todo", "error")) == (2, 1)
    assert count("create_goal", "error") is None
    assert registry.get_sample_value("ctxactors_actors") == 3  # read from the shards
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool ")]
    assert [s.name for s in spans] == [
        "execute_tool create_goal",
        "execute_tool create_goal",
        "execute_tool mark_todo",
    ]
    first = spans[0]
    (host,) = [s for s in exporter.get_finished_spans() if s.name == "host turn"]
    assert first.parent is not None and first.parent.span_id == host.context.span_id
    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "create_goal",
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": "obs-1",
        "ctxactors.session_id": "obs-1",
        "ctxactors.assistant_id": "a",
        "ctxactors.server": "planning",
    }
    # The span covers the round trip to the shard: it starts when the call was sent.
    assert first.start_time is not None and first.end_time is not None
    assert host.start_time is not None and host.start_time <= first.start_time < first.end_time
    assert spans[2].status.status_code.name == "ERROR"


def test_a_front_end_runs_no_reaper_thread_since_it_hosts_no_key(
    front_ends: Callable[..., FrontEnd],
) -> None:
    runtime, _ = front_ends(ttl=0.2)
    runtime.call("create_goal", {"goal": "g", "__sessionId": "noreap-1"})
    assert [t.name for t in threading.enumerate() if t.name == "ctxactors-reaper"] == []


# -- many sessions, two front ends, failures -------------------------------------------------


class Ledger:
    """What each session was told: acknowledged goals, and goals whose outcome is in doubt."""

    def __init__(self) -> None:
        self.acked: dict[str, list[str]] = {}
        self.doubt: dict[str, set[str]] = {}
        self.errors: list[str] = []
        self.acked_count = 0
        self.acked_after: dict[str, int] = {}  # acknowledged once the action was done

    async def run(
        self,
        runtimes: list[Runtime],
        session: str,
        count: int,
        acted: asyncio.Future[Any],
        every: Callable[[int], None],
        after: int,
    ) -> None:
        """`count` calls, then more until `after` were acknowledged once `acted` is done."""
        k = 0
        while k < count or self.acked_after.get(session, 0) < after:
            goal = f"{session}/{k}"
            k += 1
            done = acted.done()
            try:
                # Each call through the next front end: both serve every session.
                runtime = runtimes[k % len(runtimes)]
                result = await runtime.acall("create_goal", {"goal": goal, "__sessionId": session})
            except (ShardUnavailableError, CallTimeoutError):
                self.doubt.setdefault(session, set()).add(goal)
                continue
            if result.is_error:
                self.errors.append(result.text)
                continue
            self.acked.setdefault(session, []).append(goal)
            self.acked_count += 1
            if done:
                self.acked_after[session] = self.acked_after.get(session, 0) + 1
            every(self.acked_count)

    def check(self, runtime: Runtime, sessions: list[str]) -> None:
        """Every acknowledged goal is present, in order; nothing else but in-doubt ones."""
        for session in sessions:
            final = goals(runtime, session)
            acked = self.acked.get(session, [])
            assert [g for g in final if g in set(acked)] == acked, session
            assert set(final) - set(acked) <= self.doubt.get(session, set()), session


async def run_load(
    runtimes: list[Runtime],
    sessions: list[str],
    count: int,
    at: int,
    action: Callable[[], Any],
    after: int = 3,
) -> tuple[Ledger, Any]:
    """Every session creates `count` goals concurrently; `action` runs in a thread once
    `at` calls have been acknowledged, while the load goes on; each session goes on until
    `after` of its calls were acknowledged once the action was done."""
    ledger = Ledger()
    reached = asyncio.Event()
    loop = asyncio.get_running_loop()

    def every(n: int) -> None:
        if n == at:
            reached.set()

    async def act() -> Any:
        await reached.wait()
        return await loop.run_in_executor(None, action)

    acted = asyncio.ensure_future(act())
    await asyncio.gather(*(ledger.run(runtimes, s, count, acted, every, after) for s in sessions))
    return ledger, await acted


def test_two_front_ends_many_concurrent_sessions_exact_final_states(
    front_ends: Callable[..., FrontEnd],
) -> None:
    first, _ = front_ends()
    second, _ = front_ends()
    sessions = [f"many-{i}" for i in range(40)]
    ledger, _ = asyncio.run(run_load([first, second], sessions, 10, 1, lambda: None, after=0))
    assert ledger.errors == [] and ledger.doubt == {}
    for session in sessions:
        expected = [f"{session}/{k}" for k in range(10)]
        assert goals(first, session) == expected
        assert goals(second, session) == expected


def test_killing_a_worker_node_mid_load_loses_no_acknowledged_call(
    cluster: RayCluster, front_ends: Callable[..., FrontEnd]
) -> None:
    first, backend = front_ends()
    second, _ = front_ends()
    victim_shard = 0
    stats = {s["shard"]: s for s in backend.shard_stats()}
    node = cluster.worker(stats[victim_shard]["node_id"])
    on_victim = sessions_on(victim_shard, 2, 8, "kill-")
    elsewhere = sessions_on(1, 2, 8, "kill-")
    sessions = on_victim + elsewhere
    killed_at: list[int] = []

    def kill() -> None:
        cluster.cluster.remove_node(node, allow_graceful=False)  # SIGKILL, no drain
        killed_at.append(ledger_ref[0].acked_count if ledger_ref else -1)

    ledger_ref: list[Ledger] = []
    try:
        ledger, _ = asyncio.run(run_load([first, second], sessions, 25, 60, kill))
        # A read of a session on the restarted shard is served (retried if it must be).
        ledger.check(first, sessions)
        ledger.check(second, sessions)
        after = {s["shard"]: s for s in backend.shard_stats()}
        assert after[victim_shard]["node_id"] != stats[victim_shard]["node_id"]
        # Calls resumed on the restarted shard: every session got 3 calls acknowledged once
        # the node was gone (run_load goes on until they have).
        assert all(ledger.acked_after[s] >= 3 for s in on_victim)
        assert ledger.errors == []
        print(
            f"\nkill: in doubt {sum(map(len, ledger.doubt.values()))}, "
            f"acknowledged {ledger.acked_count}, read retries {backend.retries}"
        )
    finally:
        cluster.add_worker()


def test_adding_a_shard_under_load_moves_only_its_sessions_and_loses_nothing(
    front_ends: Callable[..., FrontEnd],
) -> None:
    first, backend = front_ends()
    second, other = front_ends()
    # Every session has a live key before the shard is added.
    moving, sessions = live_sessions_around_shard_2(first, "grow-")
    added: list[int] = []
    grown = threading.Event()

    def grow() -> None:
        added.append(backend.add_shards(1))
        grown.set()

    ledger, _ = asyncio.run(run_load([first, second], sessions, 15, 40, grow))
    assert added == [3] and grown.is_set()
    assert ledger.errors == [] and ledger.doubt == {}
    for session in sessions:
        assert goals(first, session) == [
            f"{session}/{k}" for k in range(len(ledger.acked[session]))
        ]
    assert other.count == 3  # the second front end learned the new count from a shard
    by_shard = {s["shard"]: s for s in backend.shard_stats()}
    # Only the moved sessions' keys were loaded again, on the new shard; no other key moved.
    assert by_shard[2]["spawned"] == len(moving)
    assert by_shard[0]["moved_away"] + by_shard[1]["moved_away"] == len(moving)
    assert by_shard[0]["spawned"] + by_shard[1]["spawned"] == len(sessions)


def test_removing_a_shard_under_load_moves_only_its_sessions_and_loses_nothing(
    front_ends: Callable[..., FrontEnd],
) -> None:
    import ray

    first, backend = front_ends(shards=3)
    second, other = front_ends(shards=3)
    # Every session has a live key before the shard is removed.
    _, sessions = live_sessions_around_shard_2(first, "shrink-")
    removed: list[int] = []

    def shrink() -> None:
        removed.append(backend.remove_shards(1))

    ledger, _ = asyncio.run(run_load([first, second], sessions, 15, 40, shrink))
    assert removed == [2]
    assert ledger.errors == [] and ledger.doubt == {}
    for session in sessions:
        assert goals(second, session) == [
            f"{session}/{k}" for k in range(len(ledger.acked[session]))
        ]
    assert (backend.count, other.count) == (2, 2)  # the second learned it from the shards
    with pytest.raises(ValueError):  # the removed shard is stopped
        ray.get_actor("ctxactors-shard-2", namespace=backend.namespace)
    by_shard = {s["shard"]: s for s in backend.shard_stats()}
    assert sorted(by_shard) == [0, 1]
    # The staying sessions stayed live where they were; only the moved ones loaded again.
    assert by_shard[0]["moved_away"] + by_shard[1]["moved_away"] == 0
    assert by_shard[0]["spawned"] + by_shard[1]["spawned"] == len(sessions)
    for shard in (0, 1):
        assert by_shard[shard]["spawned"] == sum(owner((None, s), 2) == shard for s in sessions)
    with pytest.raises(ValueError, match="cannot remove 2 of 2 shards: at least one must stay"):
        backend.remove_shards(2)


# -- the command line: `serve --backend ray` front ends under `ctxactors loadtest` -------------

CLI = [sys.executable, "-m", "ctxactors.cli"]


@contextmanager
def served_front_ends(cluster: RayCluster, tmp_path: Path) -> Iterator[tuple[list[str], list[str]]]:
    """Two ``ctxactors serve --backend ray`` front ends on a fresh namespace: their base
    URLs and the Ray flags of that namespace. Stops them and the shards after; no
    traceback may be in their logs."""
    from mcp_support import free_port, serve_env, wait_until
    from served_support import SERVE, _healthy, no_traceback

    namespace = cluster.namespace()
    # Shards on the worker nodes only (the node-kill test needs one it can kill); the
    # namespace last.
    ray_flags = ["--ray-address", cluster.cluster.address, "--shard-resource", SHARD_RESOURCE]
    ray_flags += ["--ray-namespace", namespace]
    bases, procs, logs = [], [], []
    try:
        for i in range(2):
            port = free_port()
            logs.append(tmp_path / f"serve{i}.err")
            procs.append(
                subprocess.Popen(
                    [*SERVE, "--transport", "http", "--port", str(port), "--backend", "ray"]
                    + [*ray_flags, "--shards", "2", "--store", cluster.redis.url],
                    stdin=subprocess.DEVNULL,
                    stderr=logs[-1].open("wb"),
                    env=serve_env(),
                )
            )
            bases.append(f"http://127.0.0.1:{port}")
        for base, proc, log in zip(bases, procs, logs, strict=True):
            assert wait_until(lambda b=base, p=proc: _healthy(b) or p.poll() is not None, 90)
            assert proc.poll() is None, log.read_text()
        yield bases, ray_flags
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        RayBackend(
            cluster.cluster.address, store=cluster.redis.url, namespace=namespace
        ).kill_shards()
    for log in logs:
        no_traceback(log.read_text())


def start_loads(
    bases: list[str], tmp_path: Path, sessions: int, calls: int
) -> list[subprocess.Popen[bytes]]:
    """One `ctxactors loadtest` per front end: MCP at the first, REST at the second."""
    from mcp_support import serve_env

    urls = [f"{bases[0]}/mcp", bases[1]]
    return [
        subprocess.Popen(
            [*CLI, "loadtest", "--url", url, "--sessions", str(sessions), "--calls", str(calls)]
            + ["--async", "--no-progress", "--json", str(tmp_path / f"load{i}.json")],
            stdout=(tmp_path / f"load{i}.out").open("wb"),
            stderr=subprocess.STDOUT,
            env=serve_env(),
        )
        for i, url in enumerate(urls)
    ]


def passed(loads: list[subprocess.Popen[bytes]], tmp_path: Path) -> list[dict[str, Any]]:
    """Each load test's report, once each passed with 0 violations."""
    reports = []
    for i, load in enumerate(loads):
        code = load.wait(300)
        assert (tmp_path / f"load{i}.json").exists(), (tmp_path / f"load{i}.out").read_text()
        report = json.loads((tmp_path / f"load{i}.json").read_text())
        # The whole report as text: a dict is cut to its first keys, and a failure under
        # the full suite's load must show its errors.
        assert (code, report["violations_count"], report["passed"]) == (0, 0, True), json.dumps(
            report, default=str
        )
        reports.append(report)
    return reports


def shards_command(ray_flags: list[str], store: str, *change: str) -> list[str]:
    """``ctxactors shards`` with `change`: its output lines (it must succeed)."""
    from mcp_support import serve_env

    done = subprocess.run(
        [*CLI, "shards", *change, *ray_flags, "--store", store],
        capture_output=True,
        text=True,
        env=serve_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.timeout(420)
def test_two_served_front_ends_pass_the_load_test_while_a_shard_is_added_and_removed(
    cluster: RayCluster, tmp_path: Path
) -> None:
    with served_front_ends(cluster, tmp_path) as (bases, ray_flags):
        loads = start_loads(bases, tmp_path, sessions=12, calls=40)
        grown = shards_command(ray_flags, cluster.redis.url, "--add", "1")
        assert grown[0] == "shards: 3"
        assert [json.loads(line)["shard"] for line in grown[1:]] == [0, 1, 2]
        shrunk = shards_command(ray_flags, cluster.redis.url, "--remove", "1")
        assert shrunk[0] == "shards: 2"
        assert [json.loads(line)["shard"] for line in shrunk[1:]] == [0, 1]
        reports = passed(loads, tmp_path)
        # Nothing was in doubt: a shard change refuses calls before they run, never after.
        assert [r["in_doubt_calls"] for r in reports] == [0, 0]


@pytest.mark.timeout(420)  # two load tests; minutes on a busy machine
def test_two_served_front_ends_pass_the_load_test_while_a_worker_node_is_killed(
    cluster: RayCluster, tmp_path: Path
) -> None:
    with served_front_ends(cluster, tmp_path) as (bases, ray_flags):
        namespace = ray_flags[-1]
        watcher = RayBackend(cluster.cluster.address, store=cluster.redis.url, namespace=namespace)
        watcher.connect()
        before = {s["shard"]: s for s in watcher.shard_stats()}
        workers = {node.node_id: node for node in cluster.cluster.worker_nodes}
        victim = 0  # every shard is on a worker node (--shard-resource)
        assert {s["node_id"] for s in before.values()} <= workers.keys()
        node = workers[before[victim]["node_id"]]
        loads = start_loads(bases, tmp_path, sessions=8, calls=60)
        try:
            # Kill once a quarter of the workload's calls were served (2 x 8 x 60 in all).
            while sum(s["calls"] for s in watcher.shard_stats()) < 240:
                assert all(load.poll() is None for load in loads), "the load ended first"
                time.sleep(0.05)
            killed = time.monotonic()
            cluster.cluster.remove_node(node, allow_graceful=False)  # SIGKILL, no drain
            assert all(load.poll() is None for load in loads), "the load ended before the kill"
            # The killed node's workers die a moment after its raylet: until the shard answers
            # from another node, it may still answer from the old one.
            while watcher.shard_stats()[victim]["node_id"] == before[victim]["node_id"]:
                assert time.monotonic() - killed < 60, "the shard was not restarted elsewhere"
                time.sleep(0.05)
            recovered_s = time.monotonic() - killed
            reports = passed(loads, tmp_path)
        finally:
            watcher.close()
            cluster.add_worker()
    doubt = [r["in_doubt_calls"] for r in reports]
    calls = [r["workload_calls"] for r in reports]
    print(
        f"\nnode kill under loadtest (MCP, REST): workload calls {calls}, in doubt {doubt}, "
        f"errors {[r['errors'] for r in reports]}, lost 0 (0 violations), "
        f"the shard answering on its new node {recovered_s:.1f} s after the kill"
    )


def test_serve_with_the_ray_backend_says_plainly_what_is_wrong_with_its_store() -> None:
    import subprocess

    from mcp_support import free_port, serve_env
    from served_support import SERVE

    for store, message in [
        (
            "sqlite",
            "--backend ray: the Ray backend keeps state in Redis: store must be a "
            "redis:// URL, got 'sqlite'",
        ),
        (
            f"redis://:unreachable-pw@127.0.0.1:{free_port()}/0",  # (no password: refused first)
            "--backend ray: the shard layout's Redis: Error 111 connecting to",
        ),
    ]:
        done = subprocess.run(
            [*SERVE, "--backend", "ray", "--store", store],
            capture_output=True,
            text=True,
            # Only the error: the warnings (a password on the command line, a Redis that
            # could not be checked) are not what this test reads.
            env={**serve_env(), "CTXACTORS_LOG_LEVEL": "error"},
            timeout=60,
        )
        assert done.returncode == 1
        assert done.stderr.startswith(message), done.stderr
        assert "Traceback" not in done.stderr
