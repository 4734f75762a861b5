"""Prometheus metrics: in a host's own registry, and at ``/metrics`` of a served process."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_support import http_server, wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from workspace_support import start

from ctxactors import InvalidArgumentsError, Runtime, UnknownToolError, metrics
from ctxactors.settings import MetricsSettings, Settings
from ctxactors.state import MemoryStore, Outcome, StaleStateError, StoreUnavailableError, Write
from ctxactors.testing import context_args as ctx_args

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def measured() -> Iterator[tuple[Runtime, CollectorRegistry, metrics.CallMetrics]]:
    registry = CollectorRegistry()
    with Runtime(ttl=600) as rt:
        yield rt, registry, metrics.register(rt, registry)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_calls_are_counted_by_tool_and_outcome(measured: Any) -> None:
    rt, registry, _ = measured
    rt.call("create_goal", ctx_args("s1", goal="a"))
    rt.call("create_goal", ctx_args("s2", goal="b"))
    rt.call("read_content", ctx_args("s1", id="nope"))  # an error result
    calls = "ctxactors_tool_calls_total"
    assert value(registry, calls, tool="create_goal", outcome="ok") == 2
    assert value(registry, calls, tool="read_content", outcome="error") == 1
    assert value(registry, calls, tool="create_goal", outcome="error") is None
    duration = "ctxactors_tool_call_duration_seconds"
    assert value(registry, duration + "_count", tool="create_goal", outcome="ok") == 2
    inf = value(registry, duration + "_bucket", tool="create_goal", outcome="ok", le="+Inf")
    assert inf == 2
    assert (value(registry, duration + "_sum", tool="create_goal", outcome="ok") or 0) > 0


def test_runtime_counters_are_read_at_scrape_time(measured: Any) -> None:
    rt, registry, _ = measured
    for session in ("s1", "s2", "s3"):
        rt.call("create_goal", ctx_args(session, goal="g"))
    assert value(registry, "ctxactors_actors") == 3
    assert value(registry, "ctxactors_sessions") == 3
    assert value(registry, "ctxactors_calls_in_flight") == 0
    assert value(registry, "ctxactors_actors_spawned_total") == 3
    assert rt.end_session("s1") == 1
    assert value(registry, "ctxactors_actors") == 2
    assert value(registry, "ctxactors_actors_ended_total") == 1
    assert value(registry, "ctxactors_actors_reaped_total") == 0
    assert value(registry, "ctxactors_actors_evicted_total") == 0


def test_evictions_are_counted() -> None:
    registry = CollectorRegistry()
    with Runtime(ttl=600, max_actors=2) as rt:
        metrics.register(rt, registry)
        for session in ("s1", "s2", "s3", "s4"):
            rt.call("create_goal", ctx_args(session, goal="g"))
        assert value(registry, "ctxactors_actors_evicted_total") == 2
        assert value(registry, "ctxactors_actors") == 2


def test_no_session_id_ever_becomes_a_label_value(measured: Any) -> None:
    rt, registry, _ = measured
    sessions = [f"secret-session-{i}" for i in range(20)]
    for session in sessions:
        rt.call("create_goal", ctx_args(session, goal="g"))
        rt.call("read_content", ctx_args(session, id="nope"))
    text = generate_latest(registry).decode()
    assert "secret-session" not in text
    labels = {
        key
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        for key in sample.labels
    }
    assert labels == {"tool", "outcome", "le"}


def test_principals_are_labels_only_when_asked() -> None:
    for asked in (False, True):
        registry = CollectorRegistry()
        with Runtime(ttl=600) as rt:
            metrics.register(rt, registry, principal_label=asked)
            rt.call("create_goal", ctx_args("s1", goal="g"), principal="alice")
            rt.call("create_goal", ctx_args("s1", goal="g"))
            calls = "ctxactors_tool_calls_total"
            if asked:
                assert (
                    value(registry, calls, tool="create_goal", outcome="ok", principal="alice") == 1
                )
                assert value(registry, calls, tool="create_goal", outcome="ok", principal="") == 1
            else:
                assert value(registry, calls, tool="create_goal", outcome="ok") == 2


def principal_labels(registry: CollectorRegistry) -> dict[str, float]:
    """Calls per principal label value, from the scraped text."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name == "ctxactors_tool_calls_total":
                label = sample.labels["principal"]
                out[label] = out.get(label, 0) + sample.value
    return out


def test_principal_label_values_are_capped_and_the_rest_counted_as_other() -> None:
    registry = CollectorRegistry()
    small = Settings(metrics=MetricsSettings(max_principals=3))
    with Runtime(ttl=600, settings=small) as rt:
        call_metrics = metrics.register(rt, registry, principal_label=True)
        for i in range(500):  # a tenant minting a token per call
            rt.call("create_goal", ctx_args("s", goal="g"), principal=f"minted-{i}")
        rt.call("create_goal", ctx_args("s", goal="g"), principal="minted-1")  # keeps its own
        rt.call("read_content", ctx_args("s", id="nope"), principal="minted-499")
        rt.call("create_goal", ctx_args("s", goal="g"))  # no principal: "" is never capped
        assert principal_labels(registry) == {
            "minted-0": 1,
            "minted-1": 2,
            "minted-2": 1,
            "other": 498,
            "": 1,
        }
        calls = "ctxactors_tool_calls_total"
        error = {"tool": "read_content", "outcome": "error", "principal": "other"}
        assert value(registry, calls, **error) == 1
        # The series kept: 2 tools x 2 outcomes at most per label value, whatever the callers.
        assert len(call_metrics.series()) == 6


def test_top_sessions_and_recent_errors_keep_only_live_sessions_and_the_last_errors(
    measured: Any,
) -> None:
    rt, _, call_metrics = measured
    for _ in range(3):
        rt.call("create_goal", ctx_args("busy", goal="g"))
    rt.call("create_goal", ctx_args("quiet", goal="g"))
    rt.call("create_goal", ctx_args("theirs", goal="g"), principal="bob")
    assert call_metrics.top_sessions(10) == [
        (None, "busy", 3),
        (None, "quiet", 1),
        ("bob", "theirs", 1),
    ]
    assert call_metrics.top_sessions(10, "bob") == [("bob", "theirs", 1)]
    rt.end_session("busy")
    assert call_metrics.top_sessions(1) == [(None, "quiet", 1)]
    for i in range(metrics.MAX_RECENT_ERRORS + 5):
        rt.call("read_content", ctx_args("quiet", id=f"c{i}"))
    errors = call_metrics.recent_errors()
    assert len(errors) == metrics.MAX_RECENT_ERRORS
    assert errors[-1].message == f"content 'c{metrics.MAX_RECENT_ERRORS + 4}' not found"
    assert (errors[-1].tool, errors[-1].session_id) == ("read_content", "quiet")
    assert call_metrics.recent_errors("bob") == []
    assert call_metrics.error_count() == metrics.MAX_RECENT_ERRORS + 5


def test_the_session_table_is_pruned_of_sessions_that_are_gone() -> None:
    with Runtime(ttl=600, max_actors=10) as rt:
        call_metrics = metrics.register(rt, CollectorRegistry())
        for i in range(3000):
            rt.call("create_goal", ctx_args(f"s{i}", goal="g"))
        # Evicted sessions are forgotten once the table doubles: it stays near the live ones.
        assert len(call_metrics._sessions) <= 1024 + 1  # noqa: SLF001 - the bound is the point
        assert len(call_metrics.top_sessions(100)) == 10


def call_and_end(rt: Runtime, session: str) -> None:
    """One call of `session`, which then ends: its count stays in the table until pruned."""
    assert not rt.call("create_goal", ctx_args(session, goal="g")).is_error
    assert rt.end_session(session) == 1


def test_the_session_table_is_pruned_once_it_doubles_the_live_sessions() -> None:
    """The table of calls per session is pruned when it holds more than 1,024 sessions, or
    twice the live ones at the last pruning if more (each pruning then pays for as many
    calls as it scans); only sessions with no live actor go, and each live one keeps its
    count."""
    with Runtime(ttl=600) as rt:
        call_metrics = metrics.register(rt, CollectorRegistry())
        table = call_metrics._sessions  # noqa: SLF001 - its size is the point
        for i in range(1024):
            call_and_end(rt, f"gone-{i}")
        assert len(table) == 1024
        call_and_end(rt, "gone-1024")  # the 1,025th: pruned but for itself, live in its call
        assert list(table) == [(None, "gone-1024")]
        for i in range(600):
            assert not rt.call("create_goal", ctx_args(f"live-{i}", goal="g")).is_error
        assert not rt.call("create_goal", ctx_args("live-0", goal="g")).is_error
        for i in range(1025, 1025 + 423):
            call_and_end(rt, f"gone-{i}")
        assert len(table) == 1024
        call_and_end(rt, "gone-1448")  # 1,025 again: 600 live ones and itself are left
        assert len(table) == 601
        assert table[(None, "live-0")] == 2
        assert sorted(table.values()) == [1] * 600 + [2]
        # Next pruned above twice that, 1,202: 601 more sessions fill it to exactly 1,202.
        for i in range(1449, 1449 + 601):
            call_and_end(rt, f"gone-{i}")
        assert len(table) == 1202
        call_and_end(rt, "gone-2050")
        assert len(table) == 601
        assert call_metrics.top_sessions(1) == [(None, "live-0", 2)]


def test_two_calls_pruning_the_session_table_at_once_both_succeed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two calls that both find the table crowded prune it together: the second to finish
    finds gone the sessions the first already dropped, and its call still succeeds."""
    with Runtime(ttl=600) as rt:
        call_metrics = metrics.register(rt, CollectorRegistry())
        for i in range(1024):
            call_and_end(rt, f"gone-{i}")
        has_session = rt._registry.has_session  # noqa: SLF001 - where the pruning asks
        first_asks, go_on = threading.Event(), threading.Event()
        held: list[bool] = []
        lock = threading.Lock()

        def held_once(session: tuple[str | None, str]) -> bool:
            with lock:
                first = not held
                held.append(True)
            if first:  # the first pruning waits here until the second is done
                first_asks.set()
                assert go_on.wait(30)
            return has_session(session)

        monkeypatch.setattr(rt._registry, "has_session", held_once)  # noqa: SLF001
        first: list[Any] = []
        thread = threading.Thread(
            target=lambda: first.append(rt.call("create_goal", ctx_args("first", goal="g")))
        )
        thread.start()
        assert first_asks.wait(30)
        assert not rt.call("create_goal", ctx_args("second", goal="g")).is_error
        assert call_metrics.top_sessions(5) == [(None, "first", 1), (None, "second", 1)]
        go_on.set()
        thread.join(30)
        assert len(first) == 1 and not first[0].is_error
        assert dict(call_metrics._sessions) == {(None, "first"): 1, (None, "second"): 1}  # noqa: SLF001


def test_store_writes_are_timed_and_stale_saves_counted() -> None:
    store = MemoryStore()
    registry = CollectorRegistry()
    with Runtime(ttl=600, store=store) as rt, Runtime(ttl=600, store=store) as other:
        metrics.register(rt, registry)
        rt.call("create_goal", ctx_args("s1", goal="a"))  # saves revision 1
        other.call("create_goal", ctx_args("s1", goal="b"))  # loads 1, saves 2
        stale = rt.call("create_goal", ctx_args("s1", goal="c"))  # still holds 1
        assert stale.is_error and "changed under this writer" in stale.text
        assert value(registry, "ctxactors_store_write_errors_total", kind="stale") == 1
        assert value(registry, "ctxactors_store_write_errors_total", kind="unavailable") == 0
        assert value(registry, "ctxactors_store_saves_total") == 2  # the stale one is not saved
        writes = value(registry, "ctxactors_store_write_duration_seconds_count") or 0
        assert writes >= 2


def test_the_store_figures_an_operator_reads_are_exact() -> None:
    """What ``/metrics`` says of the store's writes, line for line: each write's duration in
    its bucket (a bound is inclusive), their sum, and each refused save by kind. The
    durations are given to the hook the group commit calls after each write (its own clock
    can't be set), in seconds a float adds exactly."""
    registry = CollectorRegistry()
    with Runtime(ttl=600, store=MemoryStore()) as rt:
        call_metrics = metrics.register(rt, registry)
        assert rt.durability is not None
        hook = rt.durability.commit.on_write
        assert hook == call_metrics.record_store_write
        stale = StaleStateError(("planning", "a1", None), 1, 2)
        down = StoreUnavailableError("the disk is full")
        hook(0.125, [1])  # in (0.1, 0.25]
        hook(0.25, [stale, stale, 4])  # on the bound 0.25: two refused as stale in one write
        hook(0.5, [down, down])  # on the bound 0.5
        hook(8.0, [down])  # over the last bound (5 s): +Inf
        scraped = generate_latest(registry).decode().splitlines()
    buckets = [0, 0, 0, 0, 0, 0, 0, 0, 2, 3, 3, 3, 4]  # cumulative, by metrics.STORE_BUCKETS
    bounds = ["0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25"]
    bounds += ["0.5", "1.0", "5.0", "+Inf"]
    duration = "ctxactors_store_write_duration_seconds"
    assert [line for line in scraped if "ctxactors_store_" in line] == [
        f"# HELP {duration} One group-commit write to the state store (a transaction or pipeline).",
        f"# TYPE {duration} histogram",
        *(f'{duration}_bucket{{le="{b}"}} {n}.0' for b, n in zip(bounds, buckets, strict=True)),
        f"{duration}_count 4.0",
        f"{duration}_sum 8.875",
        "# HELP ctxactors_store_saves_total Key states saved to the store.",
        "# TYPE ctxactors_store_saves_total counter",
        "ctxactors_store_saves_total 0.0",  # the runtime saved nothing itself
        "# HELP ctxactors_store_write_errors_total Saves the store refused: stale (another "
        "writer won) or unavailable.",
        "# TYPE ctxactors_store_write_errors_total counter",
        'ctxactors_store_write_errors_total{kind="stale"} 2.0',
        'ctxactors_store_write_errors_total{kind="unavailable"} 3.0',
    ]


class Failing(MemoryStore):
    """A memory store that refuses every write while `down` is set, as a full disk would."""

    down = False

    def write(self, writes: Sequence[Write]) -> list[Outcome]:
        if self.down:
            raise StoreUnavailableError("the disk is full")
        return super().write(writes)


def test_saves_a_store_refuses_while_down_are_counted_as_unavailable() -> None:
    store = Failing()
    registry = CollectorRegistry()
    with Runtime(ttl=600, store=store) as rt:
        metrics.register(rt, registry)
        assert not rt.call("create_goal", ctx_args("s1", goal="a")).is_error
        store.down = True
        for goal in ("b", "c"):
            refused = rt.call("create_goal", ctx_args("s1", goal=goal))
            assert (refused.is_error, refused.text) == (
                True,
                "the state store is unavailable (the disk is full); nothing was changed, retry "
                "the call later",
            )
        errors = "ctxactors_store_write_errors_total"
        assert value(registry, errors, kind="unavailable") == 2
        assert value(registry, errors, kind="stale") == 0
        assert value(registry, "ctxactors_store_write_duration_seconds_count") == 3


def test_a_recent_error_says_whose_call_failed_and_when(measured: Any) -> None:
    """``ctxactors top`` shows each error's time, and a tenant only its own errors."""
    rt, _, call_metrics = measured
    before = time.time()
    rt.call("read_content", ctx_args("theirs", id="nope"), principal="bob")
    after = time.time()
    rt.call("read_content", ctx_args("mine", id="nope"), principal="alice")
    (error,) = call_metrics.recent_errors("bob")
    assert (error.principal, error.session_id, error.tool) == ("bob", "theirs", "read_content")
    assert before <= error.time <= after
    assert [e.principal for e in call_metrics.recent_errors()] == ["bob", "alice"]


def test_each_family_an_operator_reads_says_what_it_counts(measured: Any) -> None:
    """What ``/metrics`` says of a runtime, line for line, but for the durations (their
    buckets and sums are timing): each family's help and type, and its value."""
    rt, registry, _ = measured
    assert not rt.call("create_goal", ctx_args("s1", goal="g")).is_error
    assert rt.call("read_content", ctx_args("s1", id="nope")).is_error
    assert rt.end_session("s1") == 2
    scraped = generate_latest(registry).decode().splitlines()
    duration = "ctxactors_tool_call_duration_seconds"
    assert [line for line in scraped if "_bucket{" not in line and "_sum{" not in line] == [
        "# HELP ctxactors_actors Key actors alive now.",
        "# TYPE ctxactors_actors gauge",
        "ctxactors_actors 0.0",
        "# HELP ctxactors_sessions Sessions with a live actor now.",
        "# TYPE ctxactors_sessions gauge",
        "ctxactors_sessions 0.0",
        "# HELP ctxactors_calls_in_flight Calls sent to an actor, not yet done.",
        "# TYPE ctxactors_calls_in_flight gauge",
        "ctxactors_calls_in_flight 0.0",
        "# HELP ctxactors_actors_spawned_total Key actors started.",
        "# TYPE ctxactors_actors_spawned_total counter",
        "ctxactors_actors_spawned_total 2.0",
        "# HELP ctxactors_actors_reaped_total Key actors stopped after their idle TTL.",
        "# TYPE ctxactors_actors_reaped_total counter",
        "ctxactors_actors_reaped_total 0.0",
        "# HELP ctxactors_actors_evicted_total Key actors passivated by the max_actors caps.",
        "# TYPE ctxactors_actors_evicted_total counter",
        "ctxactors_actors_evicted_total 0.0",
        "# HELP ctxactors_actors_ended_total Key actors stopped by end_session.",
        "# TYPE ctxactors_actors_ended_total counter",
        "ctxactors_actors_ended_total 2.0",
        f"# HELP {duration} Tool call latency, from hand-off to the actor to the result (store "
        "save included).",
        f"# TYPE {duration} histogram",
        f'{duration}_count{{outcome="ok",tool="create_goal"}} 1.0',
        f'{duration}_count{{outcome="error",tool="read_content"}} 1.0',
        "# HELP ctxactors_tool_calls_total Tool calls that reached a server, by outcome.",
        "# TYPE ctxactors_tool_calls_total counter",
        'ctxactors_tool_calls_total{outcome="ok",tool="create_goal"} 1.0',
        'ctxactors_tool_calls_total{outcome="error",tool="read_content"} 1.0',
        "# HELP ctxactors_sandbox_processes Sandboxed commands running now (every session's).",
        "# TYPE ctxactors_sandbox_processes gauge",
        "ctxactors_sandbox_processes 0.0",
    ]
    # The last bucket (+Inf) counts every call of its series.
    assert value(registry, f"{duration}_bucket", tool="create_goal", outcome="ok", le="+Inf") == 1


def test_a_runtime_without_store_has_no_store_metrics(measured: Any) -> None:
    _, registry, _ = measured
    assert value(registry, "ctxactors_store_saves_total") is None


class TestSandboxProcesses:
    def test_running_sandboxed_processes_are_a_gauge(self, rt: Runtime) -> None:
        registry = CollectorRegistry()
        metrics.register(rt, registry)
        assert value(registry, "ctxactors_sandbox_processes") == 0
        first = start(rt, "s1", "sleep 30")
        start(rt, "s2", "sleep 30")
        assert value(registry, "ctxactors_sandbox_processes") == 2
        rt.call("kill_process", ctx_args("s1", processId=first))
        assert wait_until(lambda: value(registry, "ctxactors_sandbox_processes") == 1, 20)
        rt.end_session("s2")
        assert value(registry, "ctxactors_sandbox_processes") == 0


# -- over HTTP ---------------------------------------------------------------------------

ALICE = "alice-" + secrets.token_urlsafe(24)
BOB = "bob-" + secrets.token_urlsafe(24)


def test_metrics_endpoint_serves_the_prometheus_text_format() -> None:
    with http_server() as (url, _proc):
        base = url.removesuffix("/mcp")
        call = httpx.post(
            base + "/api/v1/tools/create_goal", json={"goal": "g"}, headers={"X-Session-Id": "s1"}
        )
        assert call.status_code == 200
        response = httpx.get(base + "/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(response.text)}
        (ok,) = [
            s
            for s in families["ctxactors_tool_calls"].samples
            if s.labels == {"tool": "create_goal", "outcome": "ok"}
        ]
        assert ok.value == 1
        assert families["ctxactors_sessions"].samples[0].value == 1
        assert "process_resident_memory_bytes" in families  # the process collector too
        assert "s1" not in {
            v for f in families.values() for s in f.samples for v in s.labels.values()
        }


def test_with_auth_only_operators_read_metrics_and_others_see_only_their_sessions(
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ALICE} alice\n{BOB} bob\n")
    with http_server("--auth-tokens", str(tokens), "--operator", "alice") as (url, _proc):
        base = url.removesuffix("/mcp")

        def get(path: str, token: str | None) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return httpx.get(base + path, headers=headers)

        for token, session in ((ALICE, "alices"), (BOB, "bobs"), (BOB, "bobs")):
            response = httpx.post(
                base + "/api/v1/tools/read_content",
                json={"id": "nope"},
                headers={"Authorization": f"Bearer {token}", "X-Session-Id": session},
            )
            assert response.status_code == 200
        assert get("/metrics", None).status_code == 401
        forbidden = get("/metrics", BOB)
        assert forbidden.status_code == 403
        assert forbidden.json() == {
            "error": {"code": "forbidden", "message": "'bob' is no operator"}
        }
        assert get("/metrics", ALICE).status_code == 200

        bob = get("/api/v1/stats/top", BOB).json()
        assert bob["scope"] == "principal"
        assert bob["top_sessions"] == [{"principal": "bob", "session_id": "bobs", "calls": 2}]
        assert [e["session_id"] for e in bob["recent_errors"]] == ["bobs", "bobs"]
        # Every tenant's activity is withheld from a tenant, here and at /api/v1/stats.
        assert (bob["calls"], bob["errors"], bob["runtime"]) == (0, 0, {})
        assert set(bob["latency_counts"]) == {0}
        stats = get("/api/v1/stats", BOB)
        assert (stats.status_code, stats.json()) == (
            403,
            {"error": {"code": "forbidden", "message": "'bob' is no operator"}},
        )
        assert get("/api/v1/stats", None).status_code == 401
        assert get("/api/v1/stats", ALICE).json()["calls"] == 3
        alice = get("/api/v1/stats/top", ALICE).json()
        assert alice["scope"] == "all"
        assert (alice["calls"], alice["errors"], alice["runtime"]["sessions"]) == (3, 3, 2)
        assert alice["top_sessions"] == [
            {"principal": "bob", "session_id": "bobs", "calls": 2},
            {"principal": "alice", "session_id": "alices", "calls": 1},
        ]
        assert [e["session_id"] for e in alice["recent_errors"]] == ["alices", "bobs", "bobs"]
        assert alice["recent_errors"][0]["message"] == "content 'nope' not found"


def test_refused_calls_make_no_label_value(measured: Any) -> None:
    """A made-up tool name (which a model or a client picks) never becomes a label value:
    only calls that reached a server are recorded, under their registered tool's name."""
    rt, registry, _ = measured
    with pytest.raises(UnknownToolError):
        rt.call("tool-" + "x" * 100, ctx_args("s1"))
    with pytest.raises(InvalidArgumentsError):
        rt.call("create_goal", ctx_args("s1", goal=3))
    text = generate_latest(registry).decode()
    assert "tool-x" not in text
    assert "ctxactors_tool_calls_total{" not in text


def test_a_served_process_caps_principal_labels_by_its_setting(tmp_path: Path) -> None:
    tokens = {f"p{i}": f"p{i}-" + secrets.token_urlsafe(24) for i in range(8)}
    path = tmp_path / "tokens"
    path.write_text("".join(f"{token} {name}\n" for name, token in tokens.items()))
    flags = ("--auth-tokens", str(path), "--operator", "p0", "--metrics-principal-label")
    env = {"CTXACTORS_METRICS_MAX_PRINCIPALS": "2"}
    with http_server(*flags, env=env) as (url, _proc):
        base = url.removesuffix("/mcp")
        for name, token in tokens.items():
            response = httpx.post(
                base + "/api/v1/tools/create_goal",
                json={"goal": name},
                headers={"Authorization": f"Bearer {token}", "X-Session-Id": "s"},
            )
            assert response.status_code == 200, response.text
        scraped = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {tokens['p0']}"})
        assert scraped.status_code == 200
        labels = {
            sample.labels["principal"]: sample.value
            for family in text_string_to_metric_families(scraped.text)
            for sample in family.samples
            if sample.name == "ctxactors_tool_calls_total"
        }
        assert labels == {"p0": 1, "p1": 1, "other": 6}
