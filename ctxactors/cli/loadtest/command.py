"""``ctxactors loadtest``: many concurrent sessions, then proof that none saw another's state.

N sessions, each with K assistants (and optionally T threads per assistant), send M calls of
a configurable mix of planning and playbook tools, from a bounded pool of threads or from
asyncio tasks. The calls of all sessions interleave: a worker sends one call of a unit
(one planning key) and puts the unit back at the end of the queue, so every session is in
flight at once. Each reply is checked against the unit's own model as it arrives
(`ctxactors.cli.loadtest.workload`); at the end every planning key and every assistant's
playbook list is read back and must equal exactly what that session sent. Any difference is
a violation, printed with the session it happened to, and the command exits 1.

The target is the embedded runtime, or a running server with ``--url`` (REST, or MCP when
the URL ends in ``/mcp``; see `ctxactors.cli.loadtest.targets`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import httpx
import msgspec
import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ctxactors.cli import add_settings_argument
from ctxactors.cli.loadtest.chaos import RestartedServer
from ctxactors.cli.loadtest.host_tools import arguments_for, host_tools
from ctxactors.cli.loadtest.hostile import HostileTenant, alongside, hostile_admitted, print_hostile
from ctxactors.cli.loadtest.options import DEFAULT_TTL, LoadOptions
from ctxactors.cli.loadtest.targets import InDoubtError, Target, TransportError, make_target
from ctxactors.cli.loadtest.workload import DEFAULT_MIX, Outcome, PlannedCall, PlaybookBook, Unit
from ctxactors.context import ToolContext
from ctxactors.logs import configure_logging


class Owner(Protocol):
    def record(self, call: PlannedCall, outcome: Outcome | None, refused: bool = False) -> None: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=100, help="concurrent sessions (N)")
    parser.add_argument("--assistants", type=int, default=2, help="assistants per session (K)")
    parser.add_argument(
        "--threads", type=int, default=0, help="conversation threads per assistant (0: none)"
    )
    parser.add_argument("--calls", type=int, default=20, help="workload calls per session (M)")
    parser.add_argument(
        "--mix",
        help="tool weights, e.g. create_goal=3,add_todo=3,mark_todo=2,"
        "get_planning_state=1,create_playbook=1 (the default)",
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="MODULE:CLASS",
        help="a host tool server (repeatable): the embedded or restarted runtime serves it "
        "beside the built-in ones, and --mix may name its tools (their answers are checked "
        "for errors only)",
    )
    parser.add_argument("--workers", type=int, default=8, help="sender threads (sync mode)")
    parser.add_argument(
        "--async", dest="use_async", action="store_true", help="asyncio tasks instead of threads"
    )
    parser.add_argument(
        "--concurrency", type=int, default=512, help="calls in flight at most (--async)"
    )
    parser.add_argument("--url", help="a running server instead of the embedded runtime")
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="with --url: a file holding the bearer token for a server with authentication "
        "(default: the CTXACTORS_TOKEN variable; never the command line, which others can read)",
    )
    parser.add_argument(
        "--transport",
        choices=("auto", "rest", "mcp"),
        default="auto",
        help="with --url: REST (/api/v1/tools/NAME) or MCP; auto picks MCP for a /mcp URL",
    )
    parser.add_argument(
        "--ttl", type=float, help=f"embedded: actor idle TTL in seconds (default {DEFAULT_TTL:g})"
    )
    parser.add_argument(
        "--max-actors", type=int, help="embedded: live actor cap (default: enough for every key)"
    )
    parser.add_argument(
        "--expect-reaping",
        action="store_true",
        help="accept state reset by reaping (implied by --ttl/--max-actors; for --url servers)",
    )
    parser.add_argument(
        "--restart-every",
        type=float,
        metavar="SECONDS",
        help="start a `ctxactors serve --transport http` and SIGKILL and restart it every "
        "SECONDS during the workload; calls cut off are counted in doubt (present or absent), "
        "acknowledged ones must be present",
    )
    parser.add_argument(
        "--serve-store",
        default="sqlite",
        help="with --restart-every: the served store (sqlite, the default, or a redis:// URL)",
    )
    parser.add_argument(
        "--hostile",
        action="store_true",
        help="a hostile tenant beside the checked ones, against the server of --url or "
        "--restart-every: it tries to reach their state and to spend every budget, and its "
        "refusals are counted by kind; the checked tenants must still pass",
    )
    parser.add_argument(
        "--hostile-token-file",
        metavar="FILE",
        help="with --hostile and --url: the bearer token of the hostile tenant's own principal "
        "(--restart-every makes its own; without one it shares the checked tenants' principal "
        "and keeps to sessions of its own)",
    )
    parser.add_argument("--call-timeout", type=float, default=30.0, help="seconds per call")
    add_settings_argument(parser)
    parser.add_argument("--seed", type=int, default=1, help="workload random seed")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


class Metrics:
    """Latencies and failures; appended to from many threads (list.append is atomic)."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.failures: list[str] = []
        self.failed_calls = 0  # calls that raised (a tool error result is still an answer)
        self.peak_rss = psutil.Process().memory_info().rss
        self.peak_actors = 0
        self._lock = threading.Lock()

    @property
    def done(self) -> int:
        return len(self.latencies) + self.failed_calls

    def ok(self, seconds: float, call: PlannedCall, outcome: Outcome) -> None:
        self.latencies.append(seconds)
        if outcome.is_error and call.tool != "select_playbook":
            with self._lock:
                self.errors["tool error result"] += 1

    def failed(self, call: PlannedCall, exc: BaseException) -> None:
        kind = exc.kind if isinstance(exc, TransportError) else type(exc).__name__
        with self._lock:
            self.errors[kind] += 1
            self.failed_calls += 1
            if len(self.failures) < 20:
                self.failures.append(f"{call.ctx.session_id} {call.tool}: {exc}")

    def sample(self, target: Target) -> None:
        self.peak_rss = max(self.peak_rss, psutil.Process().memory_info().rss)
        stats = target.stats()
        if stats:
            self.peak_actors = max(self.peak_actors, int(stats.get("actors", 0)))


def build_workload(options: LoadOptions) -> tuple[list[Unit], list[PlaybookBook]]:
    """The units (planning keys) and playbook books of every session, deterministic by seed."""
    allow_resets = options.allow_resets
    # A call cut off by a restart, or one a server says is in doubt (a Ray shard died).
    tolerate_doubt = options.restart_every is not None or options.url is not None
    # Fresh ids per run, so a long-lived server starts clean: 32 bits, since 16 gave two of
    # bench_tenants.py's hundred runs against one server the same ids (about 7% a bench).
    run_id = secrets.token_hex(4)
    hosts = {
        name: arguments_for(spec)
        for name, spec in host_tools(options.servers).items()
        if name in options.mix and name not in DEFAULT_MIX
    }
    assistants = [f"a{i}" for i in range(options.assistants)]
    threads: list[str | None] = [f"t{i}" for i in range(options.threads)] or [None]
    units: list[Unit] = []
    books: list[PlaybookBook] = []
    for s in range(options.sessions):
        session = f"lt{run_id}-s{s:05d}"
        book = PlaybookBook(session, assistants, allow_resets)
        books.append(book)
        keys = [(a, t) for a in assistants for t in threads]
        share, extra = divmod(options.calls, len(keys))
        for i, (assistant, thread) in enumerate(keys):
            ctx = ToolContext(session, assistant, thread)
            seed = options.seed * 1_000_003 + len(units)
            calls = share + (1 if i < extra else 0)
            units.append(
                Unit(ctx, calls, options.mix, seed, book, allow_resets, tolerate_doubt, hosts)
            )
    return units, books


def verification_calls(
    units: Iterable[Unit], books: Iterable[PlaybookBook]
) -> list[tuple[Owner, PlannedCall]]:
    out: list[tuple[Owner, PlannedCall]] = [(u, u.final_call()) for u in units]
    for book in books:
        out.extend((book, call) for call in book.final_calls())
    return out


# -- drivers -------------------------------------------------------------------------------


def _settle(owner: Owner, call: PlannedCall, metrics: Metrics, started: float, result: Any) -> None:
    """Count a finished call (an `Outcome`, or the exception it raised) and check it."""
    if isinstance(result, Outcome):
        metrics.ok(time.perf_counter() - started, call, result)
        owner.record(call, result)
    else:
        metrics.failed(call, result)
        # Refused before the request left (nothing listens: a server being restarted): the
        # call certainly did not run. Any other failure may have come after it ran.
        owner.record(call, None, refused=isinstance(result, httpx.ConnectError))


def _send(target: Target, owner: Owner, call: PlannedCall, metrics: Metrics) -> bool:
    """Send and check one call; False when it failed in transit."""
    started = time.perf_counter()
    try:
        result: Any = target.call(call.tool, call.args, call.ctx)
    except Exception as exc:  # noqa: BLE001 - every failure is counted by kind
        result = exc
    _settle(owner, call, metrics, started, result)
    return isinstance(result, Outcome)


async def _asend(target: Target, owner: Owner, call: PlannedCall, metrics: Metrics) -> None:
    started = time.perf_counter()
    try:
        result: Any = await target.acall(call.tool, call.args, call.ctx)
    except Exception as exc:  # noqa: BLE001 - every failure is counted by kind
        result = exc
    _settle(owner, call, metrics, started, result)


def run_threads(
    target: Target,
    units: list[Unit],
    books: list[PlaybookBook],
    workers: int,
    metrics: Metrics,
    *,
    between: Callable[[], None] | None = None,
    pause: float = 0.0,
) -> None:
    """Workload phase round-robin over the units, then the verification calls.

    `between` runs after the workload (the restarts stop there); a call that failed in
    transit makes its worker wait `pause` seconds (a server being restarted refuses fast).
    """
    pending: queue.SimpleQueue[Unit | None] = queue.SimpleQueue()
    for unit in units:
        pending.put(unit)
    remaining = [len(units)]
    lock = threading.Lock()

    def workload() -> None:
        while (unit := pending.get()) is not None:
            call = unit.next_call()
            if call is None:
                with lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        for _ in range(workers):
                            pending.put(None)
                continue
            if not _send(target, unit, call, metrics) and pause:
                time.sleep(pause)
            pending.put(unit)

    checks: list[tuple[Owner, PlannedCall]] = []

    def verify() -> None:
        while True:
            with lock:
                if not checks:
                    return
                owner, call = checks.pop()
            _send(target, owner, call, metrics)

    for phase in (workload, verify):
        if phase is verify:  # built only now: the probes depend on what the workload made
            if between is not None:
                between()
            checks.extend(reversed(verification_calls(units, books)))
        # Daemons: a caller interrupted while they wait (a test's timeout) must not leave
        # them sending a call to a server that is gone, again and again, at exit.
        pool = [
            threading.Thread(target=phase, name=f"loadtest-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in pool:
            t.start()
        for t in pool:
            t.join()


async def run_tasks(
    target: Target,
    units: list[Unit],
    books: list[PlaybookBook],
    concurrency: int,
    metrics: Metrics,
) -> None:
    """One task per unit (calls in order within it), at most `concurrency` calls in flight."""
    gate = asyncio.Semaphore(concurrency)

    async def drive(unit: Unit) -> None:
        while (call := unit.next_call()) is not None:
            async with gate:
                await _asend(target, unit, call, metrics)

    async def one(owner: Owner, call: PlannedCall) -> None:
        async with gate:
            await _asend(target, owner, call, metrics)

    await target.aopen()  # and aclose, in this same task: anyio's cancel scopes need it
    try:
        await asyncio.gather(*(drive(u) for u in units))
        await asyncio.gather(*(one(o, c) for o, c in verification_calls(units, books)))
    finally:
        await target.aclose()


# -- report --------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(int(q * (len(sorted_values) - 1) + 0.5), len(sorted_values) - 1)]


def build_report(
    options: LoadOptions,
    target: Target,
    units: list[Unit],
    books: list[PlaybookBook],
    metrics: Metrics,
    elapsed: float,
    stats: dict[str, int] | None,
) -> dict[str, Any]:
    violations = [v for u in units for v in u.violations]
    violations += [v for b in books for v in b.violations]
    unverified = [u.name for u in units if not u.verified and not u.uncertain]
    violations += [f"unit {name}: its final state was never read" for name in unverified]
    resets = sum(u.resets for u in units)
    if stats is not None:
        retired = stats.get("reaped", 0) + stats.get("evicted", 0) + stats.get("ended", 0)
        if resets > retired:
            violations.append(
                f"{resets} state resets seen but the runtime retired only {retired} actors"
            )
    lat = sorted(metrics.latencies)
    done = metrics.done
    stats = stats or {}
    return {
        "target": target.description,
        "mode": "async" if options.use_async else f"threads ({options.workers})",
        "sessions": options.sessions,
        "assistants": options.assistants,
        "threads": options.threads,
        "calls_per_session": options.calls,
        "planning_keys": len(units),
        "host_tools": sorted(options.mix.keys() - DEFAULT_MIX.keys()),
        "workload_calls": options.sessions * options.calls,
        "verification_calls": done - options.sessions * options.calls,
        "elapsed_s": round(elapsed, 3),
        "throughput_calls_per_s": round(done / elapsed, 1) if elapsed else 0.0,
        "latency_ms": {
            "p50": round(percentile(lat, 0.50) * 1000, 3),
            "p95": round(percentile(lat, 0.95) * 1000, 3),
            "p99": round(percentile(lat, 0.99) * 1000, 3),
            "max": round((lat[-1] if lat else 0.0) * 1000, 3),
        },
        "errors": dict(metrics.errors),
        "error_samples": metrics.failures,
        "actors": {
            "peak_live": max(metrics.peak_actors, int(stats.get("peak_actors", 0))),
            "spawned": stats.get("spawned"),
            "reaped": stats.get("reaped"),
            "evicted": stats.get("evicted"),
        },
        "expect_reaping": options.allow_resets,
        "state_resets_seen": resets,
        "in_doubt_calls": sum(u.in_doubt for u in units),
        "peak_rss_mb": round(metrics.peak_rss / 2**20, 1),
        "rss_of": "the load generator only" if options.url else "runtime and load generator",
        "violations_count": len(violations),
        "violations": violations[:100],
        # Final states read back and found exactly as their calls made them.
        "exact_final_states": {
            "planning_keys": sum(u.verified and not (u.uncertain or u.violations) for u in units),
            "playbook_lists": sum(b.verified for b in books),
        },
        # Tool error results are judged by the checker (a violation unless a reset explains
        # it); any other failure (timeout, transport) fails the run by itself.
        # A call in doubt is judged by the checker too (present whole or absent).
        "passed": not violations and all(k in _JUDGED for k in metrics.errors),
    }


_JUDGED = ("tool error result", InDoubtError.KIND)


def print_report(report: dict[str, Any], out: Any = print) -> None:
    lat = report["latency_ms"]
    actors = report["actors"]
    errors = ", ".join(f"{k}: {v}" for k, v in report["errors"].items()) or "none"
    actors_line = (
        f"peak live {actors['peak_live']}, spawned {actors['spawned']},"
        f" reaped {actors['reaped']}, evicted {actors['evicted']}"
        if actors["spawned"] is not None
        else "n/a (no /api/v1/stats for this caller: none served, or not an operator)"
    )
    out(
        f"ctxactors loadtest: {report['target']}, {report['mode']}\n"
        f"  workload     {report['sessions']} sessions x {report['assistants']} assistants"
        f" x {max(report['threads'], 1)} threads, {report['calls_per_session']} calls each"
        f" ({report['planning_keys']} planning keys)\n"
        f"  calls        {report['workload_calls']:,} workload + "
        f"{report['verification_calls']:,} verification in {report['elapsed_s']:.2f} s"
        f" = {report['throughput_calls_per_s']:,.0f} calls/s\n"
        f"  latency ms   p50 {lat['p50']:.2f}  p95 {lat['p95']:.2f}  p99 {lat['p99']:.2f}"
        f"  max {lat['max']:.2f}\n"
        f"  errors       {errors}\n"
        f"  actors       {actors_line}\n"
        f"  state resets {report['state_resets_seen']} seen"
        f" ({'accepted: reaping expected' if report['expect_reaping'] else 'none allowed'})\n"
        f"  peak RSS     {report['peak_rss_mb']:.1f} MB ({report['rss_of']})"
    )
    if "restarts" in report:
        out(
            f"  restarts     {report['restarts']} (SIGKILL); {report['in_doubt_calls']} calls in"
            " doubt (cut off: present or absent, each checked whole), "
            f"{report['refused_calls']} refusals while it was down (not run: sent again)"
        )
        if report["restart_failure"]:
            out(f"  RESTART FAILED {report['restart_failure']}")
    elif report["in_doubt_calls"]:
        out(
            f"  in doubt     {report['in_doubt_calls']} calls the server said may or may not"
            " have run (each checked whole: present or absent)"
        )
    if report["host_tools"]:
        out(
            f"  host tools   {', '.join(report['host_tools'])}: each answer checked to be no "
            "error (their state is the host's: not modelled)"
        )
    if "hostile" in report:
        print_hostile(report["hostile"], out)
    for sample in report["error_samples"][:5]:
        out(f"  error        {sample}")
    for violation in report["violations"][:20]:
        out(f"  VIOLATION    {violation}")
    if report["violations_count"] > 20:
        out(f"  ... and {report['violations_count'] - 20} more violations")
    verdict = "PASS" if report["passed"] else "FAIL"
    exact = report["exact_final_states"]
    checked = (
        "every key's final state checked against its calls since its last reset"
        if report["expect_reaping"]
        else f"every session's final state checked exactly: {exact['planning_keys']:,} of "
        f"{report['planning_keys']:,} planning keys and {exact['playbook_lists']:,} playbook "
        "lists read back as their calls made them"
    )
    out(f"  verdict      {verdict}: {report['violations_count']} violations ({checked})")


def run(args: argparse.Namespace) -> int:
    try:
        options = LoadOptions.from_args(args)
    except ValueError as exc:
        print(f"ctxactors loadtest: {exc}", file=sys.stderr)
        return 2
    chaos: RestartedServer | None = None
    if options.restart_every is not None:
        chaos = RestartedServer(
            options.restart_every,
            store=options.serve_store,
            servers=options.servers,
            settings=options.assignments,
            authenticate=options.hostile,
        )
        try:
            chaos.start()
        except RuntimeError as exc:
            chaos.close()
            print(f"ctxactors loadtest: {exc}", file=sys.stderr)
            return 2
        options = msgspec.structs.replace(options, url=chaos.url)
        if chaos.tokens is not None:
            checked, hostile = chaos.tokens
            options = msgspec.structs.replace(options, token=checked, hostile_token=hostile)
    try:
        return _run(options, chaos)
    finally:
        if chaos is not None:
            chaos.close()


def _run(options: LoadOptions, chaos: RestartedServer | None) -> int:
    if not os.environ.get("CTXACTORS_LOG_LEVEL"):
        configure_logging(level="warning")  # one JSON line per call would drown the figures
    try:
        units, books = build_workload(options)
        target = make_target(options)
        if options.hostile:
            assert options.url is not None
            hostile_admitted(options.url, options.hostile_token)
    except ValueError as exc:
        print(f"ctxactors loadtest: {exc}", file=sys.stderr)
        return 2
    if chaos is not None:
        chaos.restart_from_now()
    metrics = Metrics()
    report = _drive(options, target, units, books, metrics, chaos)
    if chaos is not None:
        report["restarts"] = chaos.restarts
        report["restart_failure"] = chaos.failure
        report["refused_calls"] = sum(u.refused for u in units)
        # Calls cut off by a restart are in doubt, not failures: the checker judged them.
        report["passed"] = report["violations_count"] == 0 and chaos.failure is None
    print_report(report)
    if options.json:
        with open(options.json, "wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode(report), indent=2))
    return 0 if report["passed"] else 1


def _drive(
    options: LoadOptions,
    target: Target,
    units: list[Unit],
    books: list[PlaybookBook],
    metrics: Metrics,
    chaos: RestartedServer | None = None,
) -> dict[str, Any]:
    """Send the workload and the verification calls with a progress bar; the report."""
    total = options.sessions * options.calls + len(units)
    total += options.sessions * (options.assistants + 1)
    stop = threading.Event()
    progress = Progress(
        TextColumn("loadtest"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("calls"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not options.progress,
        transient=True,
    )
    task = progress.add_task("calls", total=total)

    def monitor() -> None:
        while not stop.wait(0.2):
            metrics.sample(target)
            progress.update(task, completed=metrics.done)

    watcher = threading.Thread(target=monitor, name="loadtest-monitor", daemon=True)
    started = time.perf_counter()
    stats: dict[str, int] | None = None
    hostile: HostileTenant | None = None
    if options.hostile:
        assert options.url is not None
        hostile = HostileTenant(
            options.url, options.hostile_token, units, books, timeout=options.call_timeout
        )
    try:
        with progress, alongside(hostile) if hostile else contextlib.nullcontext():
            watcher.start()
            if options.use_async:
                asyncio.run(run_tasks(target, units, books, options.concurrency, metrics))
            else:
                run_threads(
                    target,
                    units,
                    books,
                    options.workers,
                    metrics,
                    between=None if chaos is None else chaos.stop_restarting,
                    pause=0.0 if chaos is None else 0.05,
                )
            elapsed = time.perf_counter() - started
            stop.set()
            watcher.join()
            metrics.sample(target)
            stats = target.stats()
    finally:
        stop.set()
        target.close()
    report = build_report(options, target, units, books, metrics, elapsed, stats)
    if hostile is not None:
        report["hostile"] = hostile.report()
        report["violations"] = [*hostile.violations, *report["violations"]][:100]
        report["violations_count"] += len(hostile.violations)
        report["passed"] = report["passed"] and not hostile.violations
    return report
