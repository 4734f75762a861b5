"""``ctxactors logs``: filter, follow and summarise the JSON lines ctxactors writes.

Every call writes one ``tool_call`` line (`ctxactors._call.execute`) with ``session_id``,
``assistant_id``, ``thread_id``, ``tool``, ``duration_ms``, ``outcome``, ``level`` and an ISO
``timestamp``, and a failed call the start of its error message as ``error``; the registry adds ``actor_spawned``/``actor_reaped``/... lines. When something
looks wrong in production, the first questions are "what did this session do?" and "which
tool is slow or failing?": the filters answer the first, ``--summary`` the second.

Input is files (plain or ``.gz``) or standard input (``-``, the default). A line that is not
a JSON object is counted and reported at the end, never a crash: log files get truncated,
interleaved with tracebacks, or rotated mid-line.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import re
import sys
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

import msgspec
from rich.console import Console
from rich.table import Table

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ERROR_LEVELS = {"error", "critical", "exception"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", default=["-"], help="log files (.gz too); - is stdin")
    parser.add_argument("--session", action="append", help="only this session (repeatable)")
    parser.add_argument("--assistant", action="append", help="only this assistant (repeatable)")
    parser.add_argument("--thread", action="append", help="only this thread (repeatable)")
    parser.add_argument("--tool", action="append", help="only this tool (repeatable)")
    parser.add_argument("--event", action="append", help="only this event, e.g. tool_call")
    parser.add_argument("--errors", action="store_true", help="only failed calls and errors")
    parser.add_argument("--since", help="ISO time, or a duration ago: 30s, 15m, 2h, 1d")
    parser.add_argument("--until", help="ISO time, or a duration ago")
    parser.add_argument("-f", "--follow", action="store_true", help="keep reading a growing file")
    parser.add_argument(
        "--summary", action="store_true", help="per session and per tool: calls, errors, p50/p99"
    )
    parser.add_argument(
        "--top",
        type=_count,
        default=20,
        metavar="N",
        help="with --summary: the N sessions and tools with the most calls (default 20; 0: all)",
    )
    parser.add_argument("--json", action="store_true", help="JSON output (lines, or the summary)")


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all) or more, got {value}")
    return value


# -- reading -------------------------------------------------------------------------------


class Source:
    """Counts what was read from the inputs, so bad lines are reported, not raised."""

    def __init__(self) -> None:
        self.lines = 0
        self.invalid = 0
        self.first_invalid: str | None = None
        self.unreadable: list[str] = []  # "path: reason", for the files we could not open

    def parse(self, line: str, where: str) -> dict[str, Any] | None:
        line = line.strip()
        if not line:
            return None
        self.lines += 1
        try:
            record = _decode(line)
        except msgspec.DecodeError:
            record = None
        if not isinstance(record, dict):
            self.invalid += 1
            if self.first_invalid is None:
                self.first_invalid = where
            return None
        return record


def open_text(path: str, stdin: TextIO | None = None) -> TextIO:
    """A text stream for `path`: ``-`` is stdin; gzip is recognised by its magic bytes."""
    if path == "-":
        return stdin if stdin is not None else sys.stdin
    raw = open(path, "rb")  # noqa: SIM115 - returned to the caller, which closes it
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", errors="replace")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


def read_records(
    paths: Iterable[str], source: Source, stdin: TextIO | None = None
) -> Iterator[dict[str, Any]]:
    """The JSON objects of every input in turn; an unreadable file is noted and skipped."""
    for path in paths:
        try:
            stream = open_text(path, stdin)
        except OSError as exc:
            source.unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        try:
            for number, line in enumerate(stream, 1):
                record = source.parse(line, f"{path}:{number}")
                if record is not None:
                    yield record
        except (OSError, EOFError) as exc:  # a truncated gzip member, a bad disk
            source.unreadable.append(f"{path}: {exc}")
        finally:
            if path != "-":
                stream.close()


def follow_records(
    path: str, source: Source, stop: threading.Event, poll: float = 0.2
) -> Iterator[dict[str, Any]]:
    """Every line of `path`, then each line appended to it until `stop` is set.

    A partial last line waits for its newline; a truncated or replaced file (rotation) is
    read again from its start.
    """
    stream = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    number = 0
    pending = ""
    try:
        while True:
            chunk = stream.readline()
            if chunk:
                pending += chunk
                if not pending.endswith("\n"):
                    continue
                number += 1
                record = source.parse(pending, f"{path}:{number}")
                pending = ""
                if record is not None:
                    yield record
                continue
            if stop.wait(poll):
                return
            try:
                now = os.stat(path)
            except OSError:
                continue  # rotated away; wait for the new file
            replaced = now.st_ino != os.fstat(stream.fileno()).st_ino
            if replaced or now.st_size < stream.tell():
                stream.close()
                stream = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
                number, pending = 0, ""
    finally:
        stream.close()


# -- filtering -----------------------------------------------------------------------------


def parse_time(value: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 time (naive means UTC) or a duration ago (``15m``); ValueError otherwise."""
    match = _RELATIVE.match(value.strip())
    if match:
        now = now or datetime.now(UTC)
        return now - timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"not an ISO time or a duration like 15m: {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def record_time(record: dict[str, Any]) -> datetime | None:
    value = record.get("timestamp")
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Filter(msgspec.Struct):
    """Which records to keep; each given criterion must hold (an empty one keeps all)."""

    sessions: set[str] | None = None
    assistants: set[str] | None = None
    threads: set[str] | None = None
    tools: set[str] | None = None
    events: set[str] | None = None
    errors: bool = False
    since: datetime | None = None
    until: datetime | None = None

    def __call__(self, record: dict[str, Any]) -> bool:
        for wanted, field in (
            (self.sessions, "session_id"),
            (self.assistants, "assistant_id"),
            (self.threads, "thread_id"),
            (self.tools, "tool"),
            (self.events, "event"),
        ):
            if wanted is not None and record.get(field) not in wanted:
                return False
        if self.errors and not is_error(record):
            return False
        if self.since is not None or self.until is not None:
            moment = record_time(record)
            if moment is None:
                return False
            if self.since is not None and moment < self.since:
                return False
            if self.until is not None and moment > self.until:
                return False
        return True


def is_error(record: dict[str, Any]) -> bool:
    return record.get("outcome") == "error" or str(record.get("level")).lower() in _ERROR_LEVELS


def make_filter(args: argparse.Namespace, now: datetime | None = None) -> Filter:
    def chosen(values: list[str] | None) -> set[str] | None:
        return set(values) if values else None

    return Filter(
        sessions=chosen(args.session),
        assistants=chosen(args.assistant),
        threads=chosen(args.thread),
        tools=chosen(args.tool),
        events=chosen(args.event),
        errors=args.errors,
        since=parse_time(args.since, now) if args.since else None,
        until=parse_time(args.until, now) if args.until else None,
    )


# -- output --------------------------------------------------------------------------------


def format_line(record: dict[str, Any]) -> str:
    """One readable line: time, level, event, who, then what happened."""
    who = "/".join(str(record.get(k) or "-") for k in ("session_id", "assistant_id", "thread_id"))
    head = f"{record.get('timestamp', '-'):27} {str(record.get('level', '-')):7} "
    if record.get("event") == "tool_call":
        duration = record.get("duration_ms")
        took = f"{duration:.2f} ms" if isinstance(duration, int | float) else "-"
        line = f"{head}tool_call  {who:30} {record.get('tool', '-'):22} {took:>10}  {record.get('outcome', '-')}"
        error = record.get("error")
        return line if error is None else f"{line}  {error}"
    skip = {"timestamp", "level", "event", "session_id", "assistant_id", "thread_id", "logger"}
    rest = " ".join(f"{k}={v}" for k, v in record.items() if k not in skip)
    return f"{head}{record.get('event', '-')}  {who}  {rest}".rstrip()


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


class Summary:
    """Calls, errors and duration percentiles of ``tool_call`` records, by session and tool:
    the `top` rows of each with the most calls (0: every row), and how many were left out."""

    def __init__(self, top: int = 0) -> None:
        self.top = top
        self.by: dict[str, dict[str, list[Any]]] = {
            "session": defaultdict(lambda: [0, 0, []]),
            "tool": defaultdict(lambda: [0, 0, []]),
        }

    def add(self, record: dict[str, Any]) -> None:
        if record.get("event") != "tool_call":
            return
        duration = record.get("duration_ms")
        for kind, field in (("session", "session_id"), ("tool", "tool")):
            row = self.by[kind][str(record.get(field))]
            row[0] += 1
            row[1] += record.get("outcome") == "error"
            if isinstance(duration, int | float):
                row[2].append(float(duration))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        left_out: dict[str, int] = {}
        for kind, rows in self.by.items():
            table = {}
            ranked = sorted(rows.items(), key=lambda row: (-row[1][0], row[0]))
            kept = ranked[: self.top] if self.top else ranked
            left_out[kind] = len(ranked) - len(kept)
            for name, (calls, errors, durations) in kept:
                durations.sort()
                table[name] = {
                    "calls": calls,
                    "errors": errors,
                    "p50_ms": round(_percentile(durations, 0.50), 3),
                    "p99_ms": round(_percentile(durations, 0.99), 3),
                }
            out[f"by_{kind}"] = table
        out["left_out"] = left_out
        return out

    def render(self, console: Console) -> None:
        data = self.to_dict()
        left_out = data.pop("left_out")
        for kind, table_rows in data.items():
            table = Table(title=f"tool calls {kind.replace('_', ' ')}")
            table.add_column(kind.removeprefix("by_"))
            for column in ("calls", "errors", "p50 ms", "p99 ms"):
                table.add_column(column, justify="right")
            for name, row in table_rows.items():
                table.add_row(
                    name,
                    str(row["calls"]),
                    str(row["errors"]),
                    f"{row['p50_ms']:.2f}",
                    f"{row['p99_ms']:.2f}",
                )
            console.print(table)
            more = left_out[kind.removeprefix("by_")]
            if more:
                what = kind.removeprefix("by_")
                console.print(f"{more} more {what}s with fewer calls (--top 0 shows all)")


def run(
    args: argparse.Namespace,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stop: threading.Event | None = None,
) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        keep = make_filter(args)
    except ValueError as exc:
        print(f"ctxactors logs: {exc}", file=err)
        return 2
    if args.follow and (args.summary or len(args.paths) != 1 or args.paths[0] == "-"):
        print("ctxactors logs: --follow takes exactly one file and no --summary", file=err)
        return 2
    source = Source()
    summary = Summary(args.top)
    status = 0
    try:
        if args.follow:
            records = follow_records(args.paths[0], source, stop or threading.Event())
        else:
            records = read_records(args.paths, source, stdin)
        for record in records:
            if not keep(record):
                continue
            if args.summary:
                summary.add(record)
            elif args.json:
                out.write(_encode(record).decode() + "\n")
            else:
                out.write(format_line(record) + "\n")
            if args.follow:
                out.flush()
    except BrokenPipeError:  # the reader went away (``| head``): that's not an error
        _silence(out)
        return 0
    except OSError as exc:  # --follow: the file vanished before we opened it
        source.unreadable.append(f"{exc.filename}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        pass
    for problem in source.unreadable:
        print(f"ctxactors logs: cannot read {problem}", file=err)
        status = 2
    if args.summary:
        data = summary.to_dict()
        if args.json:
            data.update(lines=source.lines, invalid_lines=source.invalid)
            out.write(_encode(data).decode() + "\n")
        else:
            summary.render(Console(file=out, width=120))
    if source.invalid:
        print(
            f"ctxactors logs: {source.invalid} of {source.lines} lines were not JSON objects "
            f"(first at {source.first_invalid})",
            file=err,
        )
    return status


def _silence(stream: TextIO) -> None:
    """Point a broken stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        if stream is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
