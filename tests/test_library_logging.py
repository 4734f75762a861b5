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
