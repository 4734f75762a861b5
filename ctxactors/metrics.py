"""Prometheus metrics of a runtime, and the live figures of ``ctxactors top``.

`register(runtime, registry)` adds one collector to a `prometheus_client` registry (the
host's own, or the server's for ``/metrics``) and one call wrapper to the runtime:

- what the runtime already counts (live actors and sessions, calls in flight, actors
  spawned, reaped, evicted and ended, the store's batches and saves, sandboxed processes
  running) is read when Prometheus scrapes, so it costs the calls nothing;
- what only a call can tell (its latency and outcome) is tallied by the wrapper: a bucket
  index and two additions under a lock. Not `prometheus_client.Histogram`: its ``observe``
  took 2.6 µs here (a lock per bucket, sum and count), over the 2 µs budget of the whole
  wrapper. The collector turns the tallies into histogram and counter families at scrape.

Labels are bounded: the tool (a registered name) and the outcome (``ok`` or ``error``), and
the principal only with ``principal_label=True``: one value per authenticated caller for the
first ``settings.metrics.max_principals`` callers, then ``other`` for every later one (as
OpenTelemetry's cardinality limit folds attribute sets into an overflow series), since JWT
subjects are as many as an issuer mints and each label set is a series kept for good.
Session ids never become label values; the calls per session (for ``top``) are kept apart,
only for sessions that are live.
"""

from __future__ import annotations

import collections
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from time import perf_counter
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ctxactors.context import ToolContext
from ctxactors.results import ToolResult
from ctxactors.state import StaleStateError
from ctxactors.tools import Server, ToolSpec

# Seconds: from a tool call's 20 µs to a sandboxed command's timeout.
BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
MAX_RECENT_ERRORS = 50
OTHER = "other"  # the principal label of the callers past the cap
_ERROR_TEXT = 200  # characters of an error result kept for `top`

Body = Callable[[Server], ToolResult]
# (tool, principal or None): its latency series, (ok, error).
SeriesKey = tuple[str, str | None]


class Tally:
    """Counts per bucket (the last one is +Inf) and the sum of one latency series."""

    __slots__ = ("counts", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)
        self.sum = 0.0

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for n in self.counts:
            total += n
            out.append(total)
        return out


class RecentError:
    __slots__ = ("time", "tool", "principal", "session_id", "message")

    def __init__(
        self, at: float, tool: str, principal: str | None, session_id: str, message: str
    ) -> None:
        self.time = at
        self.tool = tool
        self.principal = principal
        self.session_id = session_id
        self.message = message


class CallMetrics:
    """The per-call figures of one runtime: latency tallies, calls per live session, the
    last errors. Thread-safe; the wrapper is its only writer on the call path."""

    def __init__(
        self, runtime: Any, *, principal_label: bool = False, max_principals: int = 100
    ) -> None:
        self.runtime = runtime
        self.principal_label = principal_label
        self.max_principals = max_principals
        self._labelled: set[str] = set()  # principals with a label value of their own
        self._lock = threading.Lock()
        self._series: dict[SeriesKey, tuple[Tally, Tally]] = {}
        self._sessions: dict[tuple[str | None, str], int] = {}
        self._prune_at = 1024
        self.errors: collections.deque[RecentError] = collections.deque(maxlen=MAX_RECENT_ERRORS)
        self.store_writes = Tally(len(STORE_BUCKETS))
        self.store_errors = {"stale": 0, "unavailable": 0}

    # -- the call path -------------------------------------------------------------------

    def __call__(self, body: Body, spec: ToolSpec, ctx: ToolContext) -> Body:
        """The call wrapper: this and `_timed` are the whole per-call cost of the metrics
        (`scripts/bench_observability.py`). A `partial`, not a closure: no cell per
        captured name, about a third of the cost."""
        return partial(self._timed, body, perf_counter(), spec.name, ctx)

    def _timed(
        self, body: Body, started: float, tool: str, ctx: ToolContext, server: Server
    ) -> ToolResult:
        result = body(server)
        seconds = perf_counter() - started
        index = bisect_left(BUCKETS, seconds)
        principal = ctx.principal if self.principal_label else None
        session = (ctx.principal, ctx.session_id)
        sessions = self._sessions
        with self._lock:
            if principal is not None and principal not in self._labelled:
                principal = self._admit(principal)
            key = (tool, principal)
            pair = self._series.get(key)
            if pair is None:
                pair = self._series[key] = (Tally(len(BUCKETS)), Tally(len(BUCKETS)))
            tally = pair[result.is_error]
            tally.counts[index] += 1
            tally.sum += seconds
            sessions[session] = sessions.get(session, 0) + 1
            crowded = len(sessions) > self._prune_at
        if crowded:
            self._prune()
        if result.is_error:
            self._error(tool, ctx, result)
        return result

    def _admit(self, principal: str) -> str:
        """`principal`'s label value: its own while there is room, else `OTHER`. Under the
        lock; first come, first labelled, so a series never changes its label."""
        if len(self._labelled) >= self.max_principals:
            return OTHER
        self._labelled.add(principal)
        return principal

    def _error(self, tool: str, ctx: ToolContext, result: ToolResult) -> None:
        text = result.text[:_ERROR_TEXT]
        self.errors.append(RecentError(time.time(), tool, ctx.principal, ctx.session_id, text))

    def _prune(self) -> None:
        """Forget the counts of sessions with no live actor; amortised O(1) per call (the
        table is only pruned once it has doubled)."""
        with self._lock:
            sessions = list(self._sessions)
        has = self.runtime._registry.has_session  # noqa: SLF001 - a (principal, session) key
        gone = [s for s in sessions if not has(s)]
        with self._lock:
            for s in gone:
                self._sessions.pop(s, None)
            self._prune_at = max(1024, 2 * len(self._sessions))

    # -- the store -----------------------------------------------------------------------

    def record_store_write(self, seconds: float, outcomes: Sequence[object]) -> None:
        index = bisect_left(STORE_BUCKETS, seconds)
        with self._lock:
            self.store_writes.counts[index] += 1
            self.store_writes.sum += seconds
            for outcome in outcomes:
                if isinstance(outcome, StaleStateError):
                    self.store_errors["stale"] += 1
                elif isinstance(outcome, BaseException):
                    self.store_errors["unavailable"] += 1

    # -- readers -------------------------------------------------------------------------

    def series(self) -> list[tuple[str, bool, str | None, list[int], float]]:
        """Each latency series with calls: tool, whether errors, principal (None unless
        labelled), cumulative bucket counts (+Inf last), sum of seconds."""
        with self._lock:
            return [
                (tool, bool(is_error), principal, tally.cumulative(), tally.sum)
                for (tool, principal), pair in self._series.items()
                for is_error, tally in enumerate(pair)
                if any(tally.counts)
            ]

    def latency(self) -> tuple[list[int], float]:
        """All calls' bucket counts (not cumulative, +Inf last) and the sum of seconds."""
        total = [0] * (len(BUCKETS) + 1)
        seconds = 0.0
        with self._lock:
            for pair in self._series.values():
                for tally in pair:
                    for i, n in enumerate(tally.counts):
                        total[i] += n
                    seconds += tally.sum
        return total, seconds

    def error_count(self) -> int:
        """Calls that gave an error result, every tool's."""
        with self._lock:
            return sum(sum(error.counts) for _, error in self._series.values())

    def top_sessions(self, n: int, principal: Any = ...) -> list[tuple[str | None, str, int]]:
        """The `n` live sessions with the most calls: ``(principal, session_id, calls)``;
        only `principal`'s when one is given (``...`` means every principal's)."""
        with self._lock:
            items = [
                (p, s, c)
                for (p, s), c in self._sessions.items()
                if principal is ... or p == principal
            ]
        has = self.runtime._registry.has_session  # noqa: SLF001 - a (principal, session) key
        items.sort(key=lambda item: -item[2])
        return [item for item in items if has((item[0], item[1]))][:n]

    def recent_errors(self, principal: Any = ...) -> list[RecentError]:
        return [e for e in list(self.errors) if principal is ... or e.principal == principal]


class RuntimeCollector(Collector):
    """Turns a runtime's counters and its `CallMetrics` into Prometheus families, at scrape."""

    def __init__(self, metrics: CallMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        stats = m.runtime.stats()
        yield _gauge("ctxactors_actors", "Key actors alive now.", stats["actors"])
        yield _gauge("ctxactors_sessions", "Sessions with a live actor now.", stats["sessions"])
        yield _gauge(
            "ctxactors_calls_in_flight", "Calls sent to an actor, not yet done.", stats["inflight"]
        )
        for name, what in (
            ("spawned", "Key actors started."),
            ("reaped", "Key actors stopped after their idle TTL."),
            ("evicted", "Key actors passivated by the max_actors caps."),
            ("ended", "Key actors stopped by end_session."),
        ):
            yield _counter(f"ctxactors_actors_{name}", what, stats[name])
        labels = ["tool", "outcome", *(["principal"] if m.principal_label else [])]
        hist = HistogramMetricFamily(
            "ctxactors_tool_call_duration_seconds",
            "Tool call latency, from hand-off to the actor to the result (store save included).",
            labels=labels,
        )
        calls = CounterMetricFamily(
            "ctxactors_tool_calls", "Tool calls that reached a server, by outcome.", labels=labels
        )
        bounds = [*(repr(b) for b in BUCKETS), "+Inf"]
        for tool, is_error, principal, cumulative, total in m.series():
            values = [
                tool,
                "error" if is_error else "ok",
                *([principal or ""] if m.principal_label else []),
            ]
            hist.add_metric(values, list(zip(bounds, cumulative, strict=True)), total)
            calls.add_metric(values, cumulative[-1])
        yield hist
        yield calls
        yield _gauge(
            "ctxactors_sandbox_processes",
            "Sandboxed commands running now (every session's).",
            _running_processes(),
        )
        yield from self._store()

    def _store(self) -> Iterator[Metric]:
        m = self.metrics
        if m.runtime.durability is None:
            return
        with m._lock:
            cumulative, total = m.store_writes.cumulative(), m.store_writes.sum
            errors = dict(m.store_errors)
        hist = HistogramMetricFamily(
            "ctxactors_store_write_duration_seconds",
            "One group-commit write to the state store (a transaction or pipeline).",
        )
        bounds = [*(repr(b) for b in STORE_BUCKETS), "+Inf"]
        hist.add_metric([], list(zip(bounds, cumulative, strict=True)), total)
        yield hist
        commit = m.runtime.durability.commit
        yield _counter("ctxactors_store_saves", "Key states saved to the store.", commit.saves)
        failed = CounterMetricFamily(
            "ctxactors_store_write_errors",
            "Saves the store refused: stale (another writer won) or unavailable.",
            labels=["kind"],
        )
        for kind, n in errors.items():
            failed.add_metric([kind], n)
        yield failed


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _running_processes() -> int:
    from ctxactors.servers.workspace import running_processes

    return running_processes()


def register(
    runtime: Any,
    registry: CollectorRegistry | None = None,
    *,
    principal_label: bool = False,
    max_principals: int | None = None,
) -> CallMetrics:
    """Record `runtime`'s calls and expose its metrics in `registry` (a host's own
    `CollectorRegistry`; default the global ``prometheus_client.REGISTRY``).

    Call it once per runtime (a second runtime needs its own registry: the names are the
    same). Returns the `CallMetrics`, which ``/api/v1/stats/top`` reads too.
    `max_principals` defaults to the runtime's ``settings.metrics.max_principals``.
    """
    from prometheus_client import REGISTRY

    if max_principals is None:
        max_principals = runtime.settings.metrics.max_principals
    metrics = CallMetrics(runtime, principal_label=principal_label, max_principals=max_principals)
    (registry if registry is not None else REGISTRY).register(RuntimeCollector(metrics))
    runtime.add_call_wrapper(metrics)
    durability = runtime.durability
    if durability is not None:
        durability.commit.on_write = metrics.record_store_write
    return metrics


def server_registry() -> CollectorRegistry:
    """A fresh registry with the process, platform and garbage-collector collectors (what a
    Python exporter usually serves), for one server's ``/metrics``."""
    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

    registry = CollectorRegistry(auto_describe=True)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry
