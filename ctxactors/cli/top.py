"""``ctxactors top``: a live terminal view of a running server.

Every second it reads ``GET /api/v1/stats/top`` (totals since the server started) and shows
the difference from the previous read: calls and errors per second, latency percentiles of
the calls in that second (from the histogram buckets, as Prometheus's
``histogram_quantile`` estimates them), live actors and sessions, the sessions with the
most calls, and the last errors. With authentication, the bearer token comes from
``CTXACTORS_TOKEN`` (never the command line, where other users could read it); an operator
(``serve --operator``) sees every session and the server-wide figures, anyone else only
their own sessions and errors.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from datetime import datetime

import httpx
import msgspec
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ctxactors.transports.observe import TopStats

TOKEN_ENV = "CTXACTORS_TOKEN"
PATH = "/api/v1/stats/top"
_decode = msgspec.json.Decoder(TopStats).decode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default="http://127.0.0.1:8765", help="the server's base URL (serve --port)"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    parser.add_argument(
        "--once", action="store_true", help="print one view (two reads apart) and exit"
    )


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float | None:
    """The `q` quantile of a histogram (bucket upper `bounds`, per-bucket `counts` with the
    +Inf bucket last), interpolated linearly inside its bucket; None without observations.
    A quantile in the +Inf bucket is reported as the highest finite bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for i, n in enumerate(counts):
        if below + n >= rank and n > 0:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - below) / n
        below += n
    return bounds[-1]


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1.0:
        return f"{value * 1000:.2f} ms"
    return f"{value:.2f} s"


class View:
    """Turns successive samples into the screen: rates need the previous sample."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.previous: TopStats | None = None

    def render(self, sample: TopStats | None, problem: str | None = None) -> RenderableType:
        title = Text.assemble(
            ("ctxactors top", "bold"), f"  {self.url}  ", datetime.now().strftime("%H:%M:%S")
        )
        if sample is None:
            return Group(title, Text(problem or "waiting for the server ...", style="red"))
        parts: list[RenderableType] = [title]
        if problem:
            parts.append(Text(problem, style="red"))
        if sample.scope == "all":
            parts += [self._rates(sample), self._runtime(sample)]
        else:  # the server withholds every tenant's figures from a non-operator
            note = f"server-wide figures: operators only (serve --operator)   scope {sample.scope}"
            parts.append(Text(note))
        parts += [self._sessions(sample), self._errors(sample)]
        self.previous = sample
        return Group(*parts)

    def _rates(self, sample: TopStats) -> Text:
        prev = self.previous
        if prev is None or sample.time <= prev.time:
            return Text(
                f"calls {sample.calls}  errors {sample.errors}  (rates after the next read)"
            )
        span = sample.time - prev.time
        window = [a - b for a, b in zip(sample.latency_counts, prev.latency_counts, strict=True)]
        p50, p90, p99 = (quantile(q, sample.latency_bounds, window) for q in (0.5, 0.9, 0.99))
        return Text(
            f"calls/s {(sample.calls - prev.calls) / span:.1f}   "
            f"errors/s {(sample.errors - prev.errors) / span:.1f}   "
            f"p50 {seconds_text(p50)}   p90 {seconds_text(p90)}   p99 {seconds_text(p99)}"
        )

    def _runtime(self, sample: TopStats) -> Text:
        r = sample.runtime
        return Text(
            f"actors {r.get('actors', 0)} (peak {r.get('peak_actors', 0)})   "
            f"sessions {r.get('sessions', 0)}   in flight {r.get('inflight', 0)}   "
            f"spawned {r.get('spawned', 0)}   reaped {r.get('reaped', 0)}   "
            f"evicted {r.get('evicted', 0)}   ended {r.get('ended', 0)}   "
            f"scope {sample.scope}"
        )

    def _sessions(self, sample: TopStats) -> Table:
        table = Table(title="top sessions by calls", title_justify="left", expand=True)
        table.add_column("principal")
        table.add_column("session")
        table.add_column("calls", justify="right")
        for s in sample.top_sessions:
            table.add_row(shown(s.principal or "-"), shown(s.session_id), str(s.calls))
        return table

    def _errors(self, sample: TopStats) -> Table:
        table = Table(title="recent errors (newest first)", title_justify="left", expand=True)
        table.add_column("time")
        table.add_column("tool")
        table.add_column("session")
        table.add_column("error", ratio=1, overflow="ellipsis", no_wrap=True)
        for e in reversed(sample.recent_errors[-10:]):
            at = datetime.fromtimestamp(e.time).strftime("%H:%M:%S")
            table.add_row(at, shown(e.tool), shown(e.session_id), shown(e.message))
        return table


def shown(text: str) -> Text:
    """A value any tenant chose (a session id, an error's message), drawn as the characters
    it is: never read as rich markup (a link, or a bad tag that ends the view), and with
    escape sequences and other unprintable characters written out, not sent to the terminal."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return Text(text)


def fetch(client: httpx.Client) -> tuple[TopStats | None, str | None]:
    """One sample, or None and what went wrong (the view shows it and keeps trying)."""
    try:
        response = client.get(PATH)
    except httpx.HTTPError as exc:
        return None, f"cannot reach the server: {exc}"
    if response.status_code in (401, 403):
        return None, f"refused ({response.status_code}): set {TOKEN_ENV} to a bearer token"
    if response.status_code != 200:
        return None, f"{PATH} answered {response.status_code}"
    try:
        return _decode(response.content), None
    except msgspec.DecodeError as exc:
        return None, f"{PATH} answered something else than stats: {exc}"


def run(args: argparse.Namespace) -> int:
    token = os.environ.get(TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    view = View(args.url)
    console = Console()
    with httpx.Client(base_url=args.url, headers=headers, timeout=5.0) as client:
        if args.once:
            first, _ = fetch(client)
            view.render(first)
            time.sleep(args.interval)
            console.print(view.render(*fetch(client)))
            return 0
        last: TopStats | None = None
        try:
            with Live(view.render(None), console=console, auto_refresh=False) as live:
                while True:
                    sample, problem = fetch(client)
                    last = sample or last
                    live.update(view.render(sample or last, problem), refresh=True)
                    time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0
