#!/usr/bin/env python3
"""What metrics and tracing cost a routed call: off, metrics on, tracing on (sampled and
not), metrics and sampled tracing together; one process, interleaved rounds, one CPU.

Each variant is the router alone (`bench_router.py`'s echo tool, the history detached, log
lines filtered out) with only its instrument added, so the difference from "off" in the same
round is the instrument's cost; the median over rounds is shown. The routed call's own
noise on a shared machine is about a microsecond, so the wrapper alone (wrapped and run
around a trivial body, no actor hop) is measured too, in CPU time: that is its cost.
Sampled spans go through the SDK's `BatchSpanProcessor` to an exporter that drops them.

    python scripts/bench_observability.py [--calls 20000] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench_router import Echo, measure  # type: ignore[import-not-found]
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from prometheus_client import CollectorRegistry

from ctxactors import Runtime, ToolContext, ToolResult, metrics, tracing
from ctxactors.logs import configure_logging

METRICS_BUDGET_US = 2.0


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def provider(sampled: bool) -> TracerProvider:
    tp = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    tp.add_span_processor(BatchSpanProcessor(Discard()))
    return tp


def instrument(rt: Runtime, with_metrics: bool, sampled: bool | None) -> None:
    if with_metrics:
        metrics.register(rt, CollectorRegistry())
    if sampled is not None:
        tracing.instrument(rt, tracer_provider=provider(sampled))


VARIANTS: list[tuple[str, bool, bool | None]] = [
    ("off", False, None),
    ("metrics on", True, None),
    ("tracing on, sampled", False, True),
    ("tracing on, not sampled", False, False),
    ("metrics + tracing sampled", True, True),
]


def routed(rt: Runtime) -> Callable[[int], Any]:
    args = {"n": 0, "__sessionId": "s1", "__assistantId": "a1"}

    def call(i: int) -> Any:
        args["n"] = i
        return rt.call("echo", args)

    return call


def wrapper_alone(rt: Runtime, calls: int, trials: int = 15) -> float:
    """CPU µs per call of every wrapper of `rt`: wrapped in the caller and run around a
    trivial body, as `Runtime.submit` and the actor do, minus the same loop without
    wrappers. CPU time, the least of `trials`: a shared machine's preemption is not cost."""
    spec = rt.tool_spec("echo")
    ctx = ToolContext("s1", "a1")
    result = ToolResult.ok({"n": 1})

    def body(server: Any) -> ToolResult:
        return result

    def loop(wrappers: Sequence[Any]) -> int:
        started = time.process_time_ns()
        for _ in range(calls):
            b = body
            for wrap in wrappers:
                b = wrap(b, spec, ctx)
            b(None)
        return time.process_time_ns() - started

    wrappers = rt._host.wrappers  # noqa: SLF001 - measuring exactly what submit applies
    with_them = min(loop(wrappers) for _ in range(trials))
    without = min(loop(()) for _ in range(trials))
    return (with_them - without) / calls / 1000


def bench(calls: int, rounds: int) -> dict[str, Any]:
    configure_logging(level="warning", file=open(os.devnull, "w"), force=True)  # noqa: SIM115
    runtimes: dict[str, Runtime] = {}
    for name, with_metrics, sampled in VARIANTS:
        rt = Runtime([Echo])
        rt._early_observers.clear()  # noqa: SLF001 - the router alone, as bench_router
        instrument(rt, with_metrics, sampled)
        runtimes[name] = rt
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in runtimes}
    try:
        for _ in range(rounds):
            for name, rt in runtimes.items():
                runs[name].append(measure(name, routed(rt), calls))
        alone = {name: round(wrapper_alone(rt, calls), 2) for name, rt in runtimes.items()}
    finally:
        for rt in runtimes.values():
            rt.close()
    results = []
    for name in runtimes:
        pairs = list(zip(runs[name], runs["off"], strict=True))
        deltas = [r["mean_us"] - off["mean_us"] for r, off in pairs]
        p50_deltas = [r["p50_us"] - off["p50_us"] for r, off in pairs]
        means = [r["mean_us"] for r in runs[name]]
        results.append(
            {
                "name": name,
                "mean_us": round(statistics.median(means), 2),
                "p50_us": statistics.median(r["p50_us"] for r in runs[name]),
                "cost_us": round(statistics.median(deltas), 2),
                "cost_p50_us": round(statistics.median(p50_deltas), 2),
                "wrapper_alone_us": alone[name],
                "rounds_mean_us": means,
            }
        )
    return {
        "benchmark": "observability",
        "pinned_cpu": PINNED,
        "calls": calls,
        "rounds": rounds,
        "results": results,
    }


PINNED: int | None = None


def main() -> int:
    global PINNED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median shown)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--no-pin", action="store_true", help="don't pin to one CPU")
    args = parser.parse_args()
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        PINNED = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {PINNED})
    report = bench(args.calls, args.rounds)
    print(f"{args.calls} calls per variant, {args.rounds} interleaved rounds, pinned {PINNED}")
    print("cost: the median over rounds of (variant - off) in the same round, of the mean")
    print("and of the p50 call; wrapper: CPU time of the wrappers alone, no actor hop\n")
    head = ("mean µs", "p50 µs", "cost mean", "cost p50", "wrapper µs")
    print(f"{'':28}" + "".join(f"{h:>11}" for h in head))
    for r in report["results"]:
        cells = (r["mean_us"], r["p50_us"], r["cost_us"], r["cost_p50_us"], r["wrapper_alone_us"])
        print(f"{r['name']:28}" + "".join(f"{c:>11}" for c in cells))
    cost = next(r for r in report["results"] if r["name"] == "metrics on")
    verdict = "within" if cost["wrapper_alone_us"] <= METRICS_BUDGET_US else "OVER"
    print(
        f"\nmetrics on: {cost['cost_p50_us']} µs on the p50 routed call ({cost['cost_us']} on"
        f" the mean), {cost['wrapper_alone_us']} µs of wrapper CPU: {verdict} the"
        f" {METRICS_BUDGET_US:g} µs budget"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
