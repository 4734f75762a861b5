"""What an operator reads from a server, in this process: ``/metrics`` with the process,
platform and garbage-collector figures beside the runtime's, and ``/api/v1/stats/top``'s
latency histogram, exact by bucket.

`test_metrics` checks the same endpoints against a real ``ctxactors serve`` subprocess;
mutation testing sees only code run in the test process, so here the server runs as
`serve` wires it in a thread (`in_process_support`). The latency clock is a `ManualClock`
that the tool itself moves, so each call takes exactly the time the test says.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from in_process_support import WAIT, serve_in_process
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from ctxactors import Runtime, Scope, Server, ToolContext, ToolError, metrics, tool
from ctxactors.testing import ManualClock

pytestmark = pytest.mark.timeout(90)

ALICE = "alice-" + secrets.token_urlsafe(24)
BOB = "bob-" + secrets.token_urlsafe(24)
CLOCK = ManualClock()  # the metrics' perf_counter while a test runs (`timed_calls`)


class Timed(Server):
    """A tool that takes exactly the seconds it is asked to, by the metrics' clock."""

    name = "timed"
    scope = Scope.SESSION

    @tool
    def take(self, ctx: ToolContext, seconds: float, fail: bool = False) -> dict[str, Any]:
        """Let `seconds` pass; fail if asked."""
        CLOCK.advance(seconds)
        if fail:
            raise ToolError("failed as asked")
        return {"took": seconds}


@pytest.fixture
def timed_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "perf_counter", CLOCK)


@pytest.fixture
def tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"{ALICE} alice\n{BOB} bob\n")
    return str(path)


def bearer(token: str, session: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **({"X-Session-Id": session} if session else {})}


# Calls and the bucket each lands in (upper bounds: metrics.BUCKETS; a bound is inclusive).
CALLS = [
    (0.00005, False, 0),  # <= 0.0001
    (0.003, False, 5),  # (0.0025, 0.005]
    (0.003, True, 5),  # an error of the same duration: another series, the same bucket
    (0.5, False, 11),  # exactly on the bound 0.5
    (100.0, True, 17),  # over the last bound (30 s): +Inf
]


def test_top_shows_every_calls_latency_in_its_bucket(tokens: str, timed_calls: None) -> None:
    flags = ("--auth-tokens", tokens, "--operator", "alice")
    flags += ("--server", "test_metrics_served:Timed")
    with (
        serve_in_process(*flags) as served,
        httpx.Client(base_url=served.url, timeout=WAIT) as http,
    ):
        for n, (seconds, fail, _) in enumerate(CALLS):
            who = ALICE if n % 2 else BOB
            answer = http.post(
                "/api/v1/tools/take",
                json={"seconds": seconds, "fail": fail},
                headers=bearer(who, f"s{n}"),
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["isError"] is fail
        expected = [0] * (len(metrics.BUCKETS) + 1)
        for _, _, bucket in CALLS:
            expected[bucket] += 1
        top = http.get("/api/v1/stats/top", headers=bearer(ALICE)).json()
        assert top["scope"] == "all"
        assert top["latency_counts"] == expected
        assert (top["calls"], top["errors"]) == (5, 2)
        assert top["latency_bounds"] == list(metrics.BUCKETS)
        # A tenant sees no server-wide latency.
        bob = http.get("/api/v1/stats/top", headers=bearer(BOB)).json()
        assert (bob["scope"], bob["latency_counts"], bob["calls"]) == (
            "principal",
            [0] * len(expected),
            0,
        )


def test_latency_is_the_sum_of_every_series(timed_calls: None) -> None:
    registry = CollectorRegistry()
    with Runtime([Timed]) as rt:
        measured = metrics.register(rt, registry)
        assert measured.latency() == ([0] * (len(metrics.BUCKETS) + 1), 0.0)
        for n, (seconds, fail, _) in enumerate(CALLS):
            rt.call("take", {"seconds": seconds, "fail": fail, "__sessionId": f"s{n}"})
        counts, seconds = measured.latency()
    assert counts == [1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert seconds == pytest.approx(sum(s for s, _, _ in CALLS), abs=1e-9)


@pytest.fixture
def served_metrics() -> Iterator[dict[str, Any]]:
    """The families a loopback server's ``/metrics`` serves after one call."""
    with serve_in_process() as served, httpx.Client(base_url=served.url, timeout=WAIT) as http:
        call = http.post(
            "/api/v1/tools/create_goal", json={"goal": "g"}, headers={"X-Session-Id": "s1"}
        )
        assert call.status_code == 200
        response = http.get("/metrics")
        assert response.status_code == 200
        yield {f.name: f for f in text_string_to_metric_families(response.text)}


def test_metrics_has_the_process_platform_and_gc_figures_beside_the_runtimes(
    served_metrics: dict[str, Any],
) -> None:
    families = served_metrics
    for name in (
        "process_cpu_seconds",  # the process collector
        "process_resident_memory_bytes",
        "python_info",  # the platform collector
        "python_gc_objects_collected",  # the garbage collector's
        "ctxactors_sessions",
        "ctxactors_tool_calls",
    ):
        assert name in families, name
    assert families["ctxactors_sessions"].samples[0].value == 1


def test_a_server_registry_refuses_a_second_collector_of_the_same_names() -> None:
    """The registry checks every collector's names when it is added, so a second runtime
    (or any collector) can't publish series under names already served."""
    registry = metrics.server_registry()
    with Runtime() as first, Runtime() as second:
        metrics.register(first, registry)
        with pytest.raises(ValueError, match="Duplicated timeseries"):
            metrics.register(second, registry)

    class Shadow:
        def collect(self) -> Iterator[CounterMetricFamily]:
            yield CounterMetricFamily("process_cpu_seconds", "a fake", value=0)

    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(Shadow())  # type: ignore[arg-type]
    # Each server has its own: the same names in another registry are no conflict.
    with Runtime() as third:
        metrics.register(third, metrics.server_registry())
