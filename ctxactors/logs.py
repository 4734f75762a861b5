"""Structured logging: the library only logs; the application configures.

`get_logger` never configures anything. When the host configured structlog, the library's
lines go through that configuration; otherwise they go to the standard library's
``logging`` under ``ctxactors.*`` (with a `NullHandler` on ``ctxactors``, as pykka does), so
a host's own ``logging`` setup decides what is shown and nothing reaches standard output.
Importing ctxactors or making a `Runtime` changes no global configuration: not structlog's,
not the root logger's, not pykka's level.

`configure_logging` is for applications: the ``ctxactors`` command's entry points call it.
It reads

- ``CTXACTORS_LOG_FORMAT``: ``json`` (default) or ``console``;
- ``CTXACTORS_LOG_LEVEL``: ``debug``, ``info`` (default), ``warning``, ``error``;
- ``CTXACTORS_LOG_FILE``: a path to append to; default standard error. Logs never go to
  standard output, which is the protocol channel of the MCP stdio transport.

Lines are rendered and written by a background writer, many per write, within about 10 ms
of being logged: a line costs its caller an append (`flush_logs` writes what is pending
now; a reconfiguration and the process's exit do too). The runtime's line per call
(`call_logger`) is handed over as a tuple; the writer makes it into its line.

The level filter is compiled into the logger class (structlog's filtering bound logger), so a
filtered-out line costs a no-op method call. Code that logs on a hot path binds its logger
once and keeps it (a logger is bound to the configuration of its time: configure first);
a module-level logger is a `lazy_logger`, which binds on each use.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import msgspec
import structlog
import structlog.contextvars as _structlog_contextvars

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}
_METHOD_LEVELS = {**_LEVELS, "exception": 40, "fatal": 50}
_lock = threading.Lock()
_configured_by_us = False
_json_encode = msgspec.json.Encoder().encode
_json_encode_lines = msgspec.json.Encoder().encode_lines


def _serialize(event: dict[str, Any], **_: Any) -> str:
    try:
        return _json_encode(event).decode()
    except TypeError:
        return _json_encode({k: v if _plain(v) else repr(v) for k, v in event.items()}).decode()
    except UnicodeEncodeError:
        # A lone surrogate (a context id from a careless host, say) can't be UTF-8; a log
        # line must never fail the call that writes it, so escape it as JSON allows.
        return json.dumps(event, ensure_ascii=True, default=repr)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


def configure_logging(
    *,
    format: str | None = None,
    level: str | None = None,
    file: str | TextIO | None = None,
    force: bool = False,
) -> None:
    """Configure structlog (and pykka's log level) for an application, from the arguments
    or else the environment. The ``ctxactors`` command's entry points call it; the library
    never does.

    Leaves alone a structlog configuration made by someone else, unless `force`.
    """
    global _configured_by_us
    with _lock:
        if structlog.is_configured() and not (force or _configured_by_us):
            return
        fmt = (format or os.environ.get("CTXACTORS_LOG_FORMAT") or "json").lower()
        lvl_name = (level or os.environ.get("CTXACTORS_LOG_LEVEL") or "info").lower()
        if lvl_name not in _LEVELS:
            raise ValueError(f"CTXACTORS_LOG_LEVEL: unknown level {lvl_name!r}")
        target = file if file is not None else os.environ.get("CTXACTORS_LOG_FILE")
        stream: TextIO | None
        if target is None or target == "":
            stream = None  # whatever sys.stderr is at the time of each line
        elif isinstance(target, str):
            stream = open(target, "a", encoding="utf-8")  # noqa: SIM115 - flushed per batch
        else:
            stream = target
        renderer: Any
        if fmt == "console":
            renderer = structlog.dev.ConsoleRenderer(colors=False)
        elif fmt == "json":
            renderer = structlog.processors.JSONRenderer(serializer=_serialize)
        else:
            raise ValueError(f"CTXACTORS_LOG_FORMAT: unknown format {fmt!r}")
        global _writer
        if _writer is not None:
            _writer.close()  # its lines are written before the new configuration's
        _writer = _Writer(stream, renderer)
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                _stamp,
            ],
            wrapper_class=_direct_logger(_LEVELS[lvl_name]),
            logger_factory=_writer.factory,
            cache_logger_on_first_use=False,
        )
        _configured_by_us = True
        # pykka logs through the standard library; keep its lines off stdout as well.
        logging.getLogger("pykka").setLevel(max(_LEVELS[lvl_name], logging.WARNING))


def flush_logs() -> None:
    """Write every line logged so far (through `configure_logging`'s writer) now."""
    if _writer is not None:
        _writer.flush()


def _stamp(_: Any, __: str, event: MutableMapping[str, Any]) -> tuple[Any, ...]:
    """The last processor in the logging thread: what only it knows (the time, its
    exception, its standard error), then the event itself goes to the writer unrendered."""
    event["timestamp"] = time.time()
    if event.get("exc_info") is True:
        event["exc_info"] = sys.exc_info()
    return (event, sys.stderr), {}


def _direct_logger(level: int) -> type[Any]:
    """structlog's filtering logger, with the processor chain above done inline (a third
    of its generic cost: the per-call line is on every call's path). A chain changed since
    (structlog's `capture_logs`, say) takes the generic path."""
    base: type[Any] = structlog.make_filtering_bound_logger(level)

    def _proxy_to_logger(
        self: Any, method_name: str, event: str | None = None, **event_kw: Any
    ) -> Any:
        processors = self._processors
        if len(processors) != 3 or processors[2] is not _stamp:
            return base._proxy_to_logger(self, method_name, event, **event_kw)
        event_dict = self._context.copy()
        event_dict.update(event_kw)
        if event is not None:
            event_dict["event"] = event
        if _structlog_contextvars._CONTEXT_VARS:  # only once someone bound one
            structlog.contextvars.merge_contextvars(None, method_name, event_dict)
        event_dict["level"] = _LEVEL_NAMES.get(method_name, method_name)
        (line, stderr), _ = _stamp(None, method_name, event_dict)
        return self._logger.msg(line, stderr)

    return type(
        base.__name__, (base,), {"_proxy_to_logger": _proxy_to_logger, "_direct_to": _Writer}
    )


# What structlog's filtering logger has for a level it filters out.
_nop = structlog.make_filtering_bound_logger(logging.CRITICAL).debug
# `call_logger`'s function: (the call's context, tool, its `time.perf_counter` start, and
# None when it succeeded or else its error result's text).
CallLog = Callable[[Any, str, float, str | None], None]
# A failed call's line holds this much of its error message: enough to tell what failed.
_ERROR_CHARS = 300


def info_enabled(log: Any) -> bool:
    """Whether `log` (a logger from `get_logger`) writes info lines now. Asked before a line
    whose fields cost allocations to build: on a path taken for each of a million keys,
    those allocations are what sets off the garbage collector's full passes."""
    if getattr(getattr(log, "info", None), "__func__", None) is _nop:
        return False
    inner = getattr(log, "_logger", None)
    if isinstance(inner, logging.Logger):
        return inner.isEnabledFor(logging.INFO)
    return True


def call_logger(log: Any) -> CallLog | None:
    """What writes each call's ``tool_call`` line to `log` (a logger bound once, by the
    runtime), or None when its level filters that line out (a call then builds nothing).

    With `configure_logging`'s own chain the call hands the writer a tuple, an append, and
    the writer makes the line and renders it with many others in its thread. Any other
    configuration (a host's structlog, `structlog.testing.capture_logs`, bound context
    variables) gets the same line through its own processors.
    """
    if getattr(getattr(log, "info", None), "__func__", None) is _nop:
        return None
    perf_counter = time.perf_counter

    def generic(ctx: Any, tool: str, started: float, error: str | None) -> None:
        fields = {} if error is None else {"error": _clip(error)}
        log.info(
            "tool_call",
            principal=ctx.principal,
            session_id=ctx.session_id,
            assistant_id=ctx.assistant_id,
            thread_id=ctx.thread_id,
            tool=tool,
            duration_ms=_milliseconds(perf_counter() - started),
            outcome="ok" if error is None else "error",
            **fields,
        )

    writer = getattr(log, "_logger", None)
    if getattr(log, "_direct_to", None) is not _Writer or not isinstance(writer, _Writer):
        return generic
    processors, context, append = log._processors, log._context, writer.msg
    contextvars = _structlog_contextvars
    # The logger's name when it is all the bound context (the runtime's): the writer
    # then renders the line from a struct, without an event dict.
    name = context.get("logger") if len(context) == 1 else None
    name = name if type(name) is str else None

    def direct(ctx: Any, tool: str, started: float, error: str | None) -> None:
        if len(processors) != 3 or processors[2] is not _stamp or contextvars._CONTEXT_VARS:
            generic(ctx, tool, started, error)
        else:
            ended = perf_counter()
            append((name, context, ctx, tool, started, ended, error), sys.stderr)

    return direct


def _clip(error: str) -> str:
    return error if len(error) <= _ERROR_CHARS else f"{error[:_ERROR_CHARS]}..."


class _CallLine(msgspec.Struct, omit_defaults=True):
    """A ``tool_call`` line, its fields in the order the generic chain writes them (a
    failed call's `error` last)."""

    logger: str
    principal: str | None
    session_id: str
    assistant_id: str | None
    thread_id: str | None
    tool: str
    duration_ms: float
    outcome: str
    event: str
    level: str
    timestamp: str
    error: str | None = None


def _call_event(item: tuple[Any, ...], offset: float) -> dict[str, Any]:
    """A `call_logger` tuple as the event dict the generic chain makes (`offset` turns
    its `time.perf_counter` instants into `time.time` ones)."""
    _, context, ctx, tool, started, ended, error = item
    event = {
        **context,
        "principal": ctx.principal,
        "session_id": ctx.session_id,
        "assistant_id": ctx.assistant_id,
        "thread_id": ctx.thread_id,
        "tool": tool,
        "duration_ms": _milliseconds(ended - started),
        "outcome": "ok" if error is None else "error",
        "event": "tool_call",
        "level": "info",
        "timestamp": ended + offset,
    }
    if error is not None:
        event["error"] = _clip(error)
    return event


def _milliseconds(seconds: float) -> float:
    """`seconds` in milliseconds to the microsecond (`round(x, 3)` costs three times this)."""
    return int(seconds * 1e6 + 0.5) / 1000


# What `add_log_level` writes for each method name.
_LEVEL_NAMES = {"warn": "warning", "exception": "error"}
_writer: _Writer | None = None
# Lines waiting beyond this make the loggers wait for the writer (a stalled stream): no
# line is dropped, and memory stays bounded.
_MAX_PENDING = 10_000


class _Writer:
    """Renders and writes log lines in a thread of its own, many per write.

    A line costs its caller an append to a deque; the writer wakes when lines arrive, lets
    them gather for `interval` seconds, renders the batch and writes it with one write and
    one flush, so a line reaches the OS within about `interval` of being logged. `flush`
    writes what is pending from the calling thread (configure_logging and exit call it).
    A stream of None is standard error as it was when the line was logged (hosts and test
    runners swap it). A write that fails (a closed stream, a full disk) is dropped: a log
    line must never fail the call that logged it.
    """

    interval = 0.01
    linger = 0.5  # an idle writer's thread ends after this; the next line starts another

    def __init__(self, stream: TextIO | None, renderer: Any) -> None:
        self._stream = stream
        self._renderer = renderer
        self._json = isinstance(renderer, structlog.processors.JSONRenderer)
        # Event dicts, or `call_logger` tuples, with the standard error of their moment.
        self._lines: deque[tuple[dict[str, Any] | tuple[Any, ...], TextIO]] = deque()
        self._idle = True
        self._wake = threading.Event()
        self._write_lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def factory(self, *_: Any) -> _Writer:
        return self

    def msg(self, event: dict[str, Any] | tuple[Any, ...], stderr: TextIO) -> None:
        lines = self._lines
        lines.append((event, stderr))
        if self._idle:
            self._idle = False
            self._start()
        if self._closed or len(lines) > _MAX_PENDING:
            self._backlog()

    log = debug = info = warning = warn = error = err = critical = exception = fatal = msg

    def _start(self) -> None:
        """Wake the writer, starting its thread if it ended (idle) or never ran. Under the
        lock `_run` decides to end under, so a line is never left with no thread to write
        it."""
        with self._start_lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="ctxactors-log-writer", daemon=True
                )
                self._thread.start()
            self._wake.set()

    def _backlog(self) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive() or self._closed:
            self.flush()  # no writer (a logger bound before a reconfiguration): write here
            return
        while len(self._lines) > _MAX_PENDING // 2 and thread.is_alive():
            self._wake.set()
            time.sleep(self.interval)

    def _run(self) -> None:
        while not self._closed:
            if not self._wake.wait(self.linger):
                with self._start_lock:  # idle for a while: end the thread (no idle threads)
                    if not (self._wake.is_set() or self._lines):
                        self._thread = None
                        return
                continue
            self._wake.clear()
            while self._lines and not self._closed:
                time.sleep(self.interval)  # let lines gather: one write for many
                self.flush()
            self._idle = True
            if self._lines:  # appended after the last flush, before `_idle` was set
                self._idle = False
                self._wake.set()

    def flush(self) -> None:
        with self._write_lock:  # one drainer at a time keeps the lines in order
            lines = self._lines
            while lines:
                batch: list[str] = []
                calls: list[tuple[Any, ...]] = []  # JSON call lines, rendered as one run
                target = lines[0][1] if self._stream is None else self._stream
                taken = 0
                while lines and (self._stream is not None or lines[0][1] is target):
                    event, _ = lines.popleft()
                    if type(event) is tuple and event[0] is not None and self._json:
                        calls.append(event)
                    else:
                        if calls:
                            batch.append(self._render_calls(calls))
                            calls = []
                        batch.append(self._render(event))
                    taken += 1
                    if taken >= 4096:
                        break
                if calls:
                    batch.append(self._render_calls(calls))
                try:
                    target.write("".join(batch))
                    target.flush()
                except (ValueError, OSError):
                    pass

    def _render(self, event: dict[str, Any] | tuple[Any, ...]) -> str:
        try:
            if type(event) is tuple:  # a call line the JSON run does not take
                event = _call_event(event, time.time() - time.perf_counter())
            assert isinstance(event, dict)
            event["timestamp"] = _iso(event["timestamp"])
            if "exc_info" in event:
                structlog.processors.format_exc_info(None, "", event)
            if self._json:
                return f"{_serialize(event)}\n"
            return f"{self._renderer(None, event.get('level', 'info'), event)}\n"
        except Exception as exc:  # noqa: BLE001 - one bad line must not stop the writer
            return f"{_serialize({'event': 'log_line_failed', 'error': repr(exc)})}\n"

    def _render_calls(self, items: list[tuple[Any, ...]]) -> str:
        """JSON ``tool_call`` lines of the runtime's logger, the run in one encode; the
        date and time of their timestamps formatted once a second."""
        offset = time.time() - time.perf_counter()  # the lines' instants as wall-clock time
        made = []
        second, text = -1, ""
        for name, _, ctx, tool, started, ended, error in items:
            stamp = ended + offset
            whole = int(stamp)
            if whole != second:
                second, text = whole, _iso(whole)[:-8]
            made.append(
                _CallLine(
                    name,
                    ctx.principal,
                    ctx.session_id,
                    ctx.assistant_id,
                    ctx.thread_id,
                    tool,
                    int((ended - started) * 1e6 + 0.5) / 1000,  # `_milliseconds`, inline
                    "ok" if error is None else "error",
                    "tool_call",
                    "info",
                    f"{text}.{int((stamp - whole) * 1e6):06d}Z",  # as `_iso` writes it
                    None if error is None else _clip(error),
                )
            )
        try:
            return _json_encode_lines(made).decode()
        except UnicodeEncodeError:  # a lone surrogate: each line escaped as `_serialize` does
            return "".join(self._render(item) for item in items)

    def close(self) -> None:
        """Write what is pending and stop the thread (a reconfiguration, or exit)."""
        self._closed = True
        self._wake.set()  # the thread ends on its own; the write lock keeps the order
        self.flush()


_second: list[Any] = [None, ""]  # the last whole second formatted, and its text


def _iso(stamp: float) -> str:
    """`stamp` as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it (microseconds
    always shown); the date and time are formatted once per second."""
    second = int(stamp)
    if _second[0] != second:
        moment = datetime.datetime.fromtimestamp(second, datetime.UTC)
        _second[:] = [second, moment.strftime("%Y-%m-%dT%H:%M:%S")]
    return f"{_second[1]}.{int((stamp - second) * 1e6):06d}Z"


@atexit.register
def _flush_at_exit() -> None:
    if _writer is not None:
        _writer.close()


def get_logger(name: str = "ctxactors", **context: Any) -> Any:
    """A bound (not lazy) logger with `context`: through structlog when the host configured
    it, else through the standard library's ``logging``. Configures nothing."""
    if structlog.is_configured():
        return structlog.get_logger(name).bind(logger=name, **context)
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.contextvars.merge_contextvars, _to_stdlib],
        wrapper_class=_StdlibLogger,
        cache_logger_on_first_use=False,
    ).bind(**context)


class _StdlibLogger(structlog.stdlib.BoundLogger):
    """Asks the standard library's (cached) level check before building anything: a line
    the host filters out costs about what a filtered structlog line does, not an event
    dict and a `DropEvent` (8x more, measured)."""

    def _proxy_to_logger(
        self, method_name: str, event: str | None = None, *event_args: str, **event_kw: Any
    ) -> Any:
        level = _METHOD_LEVELS.get(method_name, logging.ERROR)
        if not self._logger.isEnabledFor(level):
            return None
        return super()._proxy_to_logger(method_name, event, *event_args, **event_kw)


def _to_stdlib(
    _: Any, __: str, event: MutableMapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``event key=value ...`` as the record's message; the traceback (``exc_info``) is the
    record's, for the host's formatter to render."""
    exc_info = event.pop("exc_info", None)
    name = event.pop("event", "")
    fields = " ".join(f"{key}={value!r}" for key, value in event.items())
    return ((f"{name} {fields}" if fields else str(name)),), {"exc_info": exc_info}


class lazy_logger:  # noqa: N801 - used like the function it stands in for
    """A module-level logger: binds with `get_logger` on each use, so it follows whatever
    the application configures after the module was imported. Not for hot paths."""

    def __init__(self, name: str, **context: Any) -> None:
        self._name = name
        self._context = context

    def __getattr__(self, method: str) -> Any:
        return getattr(get_logger(self._name, **self._context), method)


# A library's loggers stay quiet in a host that set up no logging (as pykka's do): without
# it, Python's last-resort handler would print our warnings to standard error.
logging.getLogger("ctxactors").addHandler(logging.NullHandler())
