"""The JSON log lines are written by a background writer: none lost, none out of order."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from ctxactors.logs import configure_logging, flush_logs, get_logger

_MANY = """
import sys, threading
from ctxactors.logs import configure_logging, get_logger

configure_logging(file=sys.argv[1])
log = get_logger("ctxactors.test")

def burst(thread):
    for n in range(5000):
        log.info("line", thread=thread, n=n)

threads = [threading.Thread(target=burst, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
# No flush: exit itself writes what is pending.
"""


def test_every_line_reaches_the_file_in_order_when_the_process_exits(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _MANY, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 20_000
    for thread in range(4):
        assert [r["n"] for r in lines if r["thread"] == thread] == list(range(5000))
    first = lines[0]
    assert first["event"] == "line" and first["level"] == "info"
    assert first["logger"] == "ctxactors.test"
    assert datetime.fromisoformat(first["timestamp"]).utcoffset() is not None
    assert first["timestamp"].endswith("Z")


def test_flush_logs_writes_what_is_pending_now() -> None:
    out = io.StringIO()
    configure_logging(file=out, force=True)
    get_logger("ctxactors.test").warning("pending", n=1)
    flush_logs()
    record = json.loads(out.getvalue())
    assert (record["event"], record["level"], record["n"]) == ("pending", "warning", 1)


def test_a_logger_bound_before_a_reconfiguration_still_writes_its_lines() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(file=first, force=True)
    old = get_logger("ctxactors.test")
    old.info("before")
    configure_logging(file=second, force=True)  # writes `first`'s pending lines
    assert [json.loads(x)["event"] for x in first.getvalue().splitlines()] == ["before"]
    old.info("after")  # its writer is closed: written at once, to its own stream
    assert [json.loads(x)["event"] for x in first.getvalue().splitlines()] == ["before", "after"]
    assert second.getvalue() == ""


def test_an_exception_is_rendered_from_the_thread_that_logged_it() -> None:
    out = io.StringIO()
    configure_logging(file=out, force=True)
    log = get_logger("ctxactors.test")
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        log.exception("boom")
    flush_logs()  # rendered in another thread, after the handler is gone
    record = json.loads(out.getvalue())
    assert record["level"] == "error" and "ZeroDivisionError" in record["exception"]


def test_standard_error_is_the_one_of_the_moment_a_line_was_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure_logging(force=True)
    then, now = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", then)
    get_logger("ctxactors.test").info("then")
    monkeypatch.setattr(sys, "stderr", now)
    flush_logs()
    assert json.loads(then.getvalue())["event"] == "then"
    assert now.getvalue() == ""


def _writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ctxactors-log-writer"]


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20.0
    while not check():
        assert time.monotonic() < deadline, "not within 20 s"
        time.sleep(0.02)


def test_an_idle_writer_leaves_no_thread_and_the_next_line_still_gets_written() -> None:
    out = io.StringIO()
    configure_logging(file=out, force=True)
    log = get_logger("ctxactors.test")
    log.info("first")
    _until(lambda: out.getvalue().count("\n") == 1)  # written by the writer, unflushed
    _until(lambda: not _writers())
    log.info("second")
    _until(lambda: out.getvalue().count("\n") == 2)
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == ["first", "second"]
