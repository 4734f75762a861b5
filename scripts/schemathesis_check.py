"""Fuzz the REST API against its own /openapi.json with schemathesis; exit non-zero on a
finding (a 5xx, a response that breaks the schema, an undocumented status or header).

Serves `create_app` on uvicorn at 127.0.0.1:<ephemeral> in this process and runs the
schemathesis CLI against it. The workspace server is left out: fuzzed commands must not run
on the machine. A stub model that always answers "ok" is configured, so /api/v1/query is
exercised too (without a model it is a documented 503). Usage: ``python scripts/schemathesis_check.py [--max-examples N]``.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import uvicorn

from ctxactors import Runtime
from ctxactors.conversation import Message
from ctxactors.logs import configure_logging
from ctxactors.servers import Content, Planning, Playbooks
from ctxactors.servers.history import History
from ctxactors.transports.http import create_app

CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    )
)


class StubModel:
    """A chat model that answers every prompt with "ok" (no tool calls)."""

    def complete(self, messages: Any, tools: Any) -> Message:
        return Message.assistant("ok")

    async def acomplete(self, messages: Any, tools: Any) -> Message:
        return Message.assistant("ok")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checks", default=CHECKS)
    parser.add_argument("--phases", default="examples,coverage,fuzzing,stateful")
    parser.add_argument("--report-dir", default=None, help="where schemathesis writes reports")
    args = parser.parse_args()

    configure_logging(format="json", level="error", force=True)
    with Runtime(servers=[Planning, Playbooks, Content, History], call_timeout=10.0) as runtime:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(
            uvicorn.Config(create_app(runtime, model=StubModel()), log_level="error")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/openapi.json"
        command = [
            *(sys.executable, "-m", "schemathesis.cli", "run", url),
            *("--checks", args.checks),
            *("--max-examples", str(args.max_examples)),
            *("--seed", str(args.seed)),
            *("--workers", "1"),
            *("--phases", args.phases),
            *("--generation-database", "none"),
            "--request-timeout=20",
            *(("--report-dir", args.report_dir) if args.report_dir else ()),
        ]
        try:
            # In a scratch directory: the CLI leaves a .schemathesis/ cache where it runs.
            with tempfile.TemporaryDirectory() as scratch:
                code = subprocess.run(command, timeout=600, cwd=scratch).returncode
        finally:
            server.should_exit = True
            thread.join(20)
    print(f"schemathesis exit code: {code}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
