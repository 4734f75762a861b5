"""Structured logging: one JSON line per call, configured by environment variables.

- ``CTXACTORS_LOG_FORMAT``: ``json`` (default) or ``console``.
- ``CTXACTORS_LOG_LEVEL``: ``debug``, ``info`` (default), ``warning``, ``error``.
- ``CTXACTORS_LOG_FILE``: a path to append to; default standard error. Logs never go to
  standard output, which is the protocol channel of the MCP stdio transport.

The level filter is compiled into the logger class (structlog's filtering bound logger), so a
filtered-out line costs a no-op method call. Code that logs on a hot path binds its logger
once and keeps it: structlog's lazy proxy costs about 1.7 µs on every call.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any, TextIO

import msgspec
import structlog

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}
_lock = threading.Lock()
_configured_by_us = False
_json_encode = msgspec.json.Encoder().encode


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
    """Configure structlog for ctxactors, from arguments or else the environment.

    Leaves alone a structlog configuration the host app made itself, unless `force`.
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
            stream = open(target, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        else:
            stream = target
        renderer: Any
        if fmt == "console":
            renderer = structlog.dev.ConsoleRenderer(colors=False)
        elif fmt == "json":
            renderer = structlog.processors.JSONRenderer(serializer=_serialize)
        else:
            raise ValueError(f"CTXACTORS_LOG_FORMAT: unknown format {fmt!r}")
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
                renderer,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[lvl_name]),
            logger_factory=_Sink(stream).factory,
            cache_logger_on_first_use=False,
        )
        _configured_by_us = True
        # pykka logs through the standard library; keep its lines off stdout as well.
        logging.getLogger("pykka").setLevel(max(_LEVELS[lvl_name], logging.WARNING))


class _Sink:
    """Where rendered lines go: a stream, or standard error looked up per line.

    Looking ``sys.stderr`` up per line follows hosts and test runners that swap it; a write
    that fails (a closed stream, a full disk) is dropped, because a log line must never
    fail the call that wrote it.
    """

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def factory(self, *_: Any) -> _Sink:
        return self

    def msg(self, message: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            with self._lock:
                stream.write(message + "\n")
                stream.flush()
        except (ValueError, OSError):
            pass

    log = debug = info = warning = warn = error = err = critical = exception = msg


def get_logger(name: str = "ctxactors", **context: Any) -> Any:
    """A bound (not lazy) logger with `context`; configures logging on first use."""
    if not structlog.is_configured():
        configure_logging()
    return structlog.get_logger(name).bind(logger=name, **context)
