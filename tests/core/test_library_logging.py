"""Library log lines follow the configuration made after import and never reach stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_HOST = """
import sys
import ctxactors.servers.history  # imported before anything configures logging
from ctxactors import Runtime, Scope, Server, ToolContext, tool
from ctxactors.logs import configure_logging

class Bad(Server):
    name = "bad"
    scope = Scope.SESSION

    @tool(extract=lambda args, result: 1 / 0)
    def poke(self, ctx: ToolContext) -> dict:
        return {"ok": True}

configure_logging(file=sys.argv[1])
with Runtime(servers=[Bad]) as rt:
    assert not rt.call("poke", {"__sessionId": "s1"}).is_error
    # The extractor runs when the history is read.
    assert rt.call("get_recent_context", {"__sessionId": "s1"}).structured["count"] == 1
"""


def test_a_failing_extractor_logs_to_the_configured_file_not_stdout(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _HOST, str(log)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    [failed] = [line for line in lines if line["event"] == "extract_failed"]
    assert failed["tool"] == "poke" and "ZeroDivisionError" in failed["exception"]


_STRUCTLOG_HOST = """
import logging, sys
import structlog

logging.getLogger("pykka").setLevel(logging.DEBUG)
root_handlers = list(logging.getLogger().handlers)


def untouched(config):
    assert structlog.get_config() == config, (structlog.get_config(), config)
    assert logging.getLogger("pykka").level == logging.DEBUG
    assert logging.getLogger().handlers == root_handlers


from ctxactors import Runtime, ToolContext, inject_context
from ctxactors.servers.planning import Planning

# Before the host configures structlog: importing and using the library configures nothing.
unconfigured = structlog.get_config()
inject_context({"goal": "g", "__sessionId": "forged"}, ToolContext("s1"))
with Runtime(servers=[Planning]) as rt:
    rt.call("create_goal", {"goal": "g", "__sessionId": "s1"})
assert not structlog.is_configured()
untouched(unconfigured)

# The host's own configuration: the library's lines go through it, and it stays as it was.
out = open(sys.argv[1], "w", buffering=1)


def mark(logger, method, event):
    event["host"] = "mine"
    return event


structlog.configure(
    processors=[mark, structlog.processors.JSONRenderer()],
    logger_factory=structlog.PrintLoggerFactory(out),
    cache_logger_on_first_use=False,
)
mine = structlog.get_config()
inject_context({"goal": "g", "__sessionId": "forged"}, ToolContext("s1"))
with Runtime(servers=[Planning]) as rt:
    rt.call("create_goal", {"goal": "g", "__sessionId": "s1"})
untouched(mine)
print("untouched")
"""


def test_a_hosts_structlog_configuration_is_untouched_and_carries_the_librarys_lines(
    tmp_path: Path,
) -> None:
    log = tmp_path / "host.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _STRUCTLOG_HOST, str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("untouched\n", "")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert {line["host"] for line in lines} == {"mine"}  # every line, through the host's
    events = [line["event"] for line in lines]
    assert events[0] == "spoofed_context_dropped"
    [call] = [line for line in lines if line["event"] == "tool_call"]
    assert (call["tool"], call["session_id"], call["outcome"]) == ("create_goal", "s1", "ok")


_LOGGING_HOST = """
import logging, sys
import structlog

logging.basicConfig(
    filename=sys.argv[1], level=logging.INFO, format="HOST %(name)s %(levelname)s %(message)s"
)
from ctxactors import Runtime, Scope, Server, ToolContext, tool

class BadClose(Server):
    name = "badclose"
    scope = Scope.SESSION

    @tool
    def touch(self, ctx: ToolContext) -> dict:
        return {}

    def close(self) -> None:
        raise RuntimeError("disk gone")

with Runtime(servers=[BadClose]) as rt:
    rt.call("touch", {"__sessionId": "s1"})
assert not structlog.is_configured()
"""


def test_without_structlog_the_librarys_lines_go_through_the_hosts_logging(
    tmp_path: Path,
) -> None:
    log = tmp_path / "host.log"
    done = subprocess.run(
        [sys.executable, "-c", _LOGGING_HOST, str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")
    text = log.read_text()
    lines = text.splitlines()
    [call] = [line for line in lines if " tool_call " in line]
    assert call.startswith("HOST ctxactors INFO tool_call principal=None session_id='s1' ")
    assert call.endswith(" outcome='ok'")
    # A failure is logged with its traceback, rendered by the host's formatter.
    start = lines.index("HOST ctxactors.actors ERROR server_close_failed")
    assert lines[start + 1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: disk gone"


_SILENT_HOST = """
import structlog
from ctxactors import Runtime, ToolContext, inject_context

inject_context({"__sessionId": "forged"}, ToolContext("s1"))  # a warning
with Runtime(servers=[]) as rt:
    rt.call("get_recent_context", {})  # no session: a warning too
assert not structlog.is_configured()
"""


def test_a_host_that_configured_nothing_gets_nothing_printed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SILENT_HOST], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
