"""Helpers for tests that talk to a served ``ctxactors serve`` in raw JSON-RPC and HTTP.

Raw on purpose: the fuzz tests send what no well-behaved client would (invalid UTF-8, lone
surrogates, NaN), and the isolation property drives `/mcp` synchronously from a hypothesis
state machine. `encode` writes JSON the way a careless host does; `served_http` runs the
HTTP server with its standard error kept, so a test can check it for tracebacks.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from mcp_support import free_port, serve_env

from ctxactors.testing import wait_until

SERVE = [sys.executable, "-m", "ctxactors.cli", "serve"]
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE_PARAMS = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "ctxactors-tests", "version": "0"},
}


class _Json(str):
    """Literal JSON text inside `encode`'s work stack."""


def encode(value: Any) -> bytes:
    """JSON bytes as a careless host writes them: lone surrogates pass as invalid UTF-8,
    NaN as ``NaN``, non-string keys as their text. Iterative: values nested 200,000 deep
    encode too."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Json):
            out.append(item)
        elif isinstance(item, dict | list):
            is_dict = isinstance(item, dict)
            parts: list[Any] = [_Json("{" if is_dict else "[")]
            for i, entry in enumerate(item.items() if is_dict else item):
                if i:
                    parts.append(_Json(","))
                if is_dict:
                    parts += [_Json(json.dumps(str(entry[0]), ensure_ascii=False) + ":"), entry[1]]
                else:
                    parts.append(entry)
            parts.append(_Json("}" if is_dict else "]"))
            stack.extend(reversed(parts))
        else:
            out.append(json.dumps(item, ensure_ascii=False, allow_nan=True, default=str))
    return "".join(out).encode("utf-8", "surrogatepass")


@contextlib.contextmanager
def served_http(env: dict[str, str] | None = None) -> Iterator[tuple[str, Path]]:
    """``ctxactors serve --transport http`` (built-in servers only) on a free port; yields
    its base URL and the file that collects its standard error."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "stderr"
        with serving_http({**serve_env(), **(env or {})}, log) as (base, _):
            yield base, log


@contextlib.contextmanager
def serving_http(
    env: dict[str, str], log: Path, *flags: str, start_timeout: float = 60
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``ctxactors serve --transport http FLAGS`` on a free port with exactly `env`, its
    standard error into `log`; yields its base URL and process once it answers."""
    port = free_port()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [*SERVE, "--transport", "http", "--port", str(port), *flags],
            stdin=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _healthy(base) or proc.poll() is not None, start_timeout)
        assert proc.poll() is None, log.read_text()
        yield base, proc
    finally:
        proc.terminate()
        proc.wait(60)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def no_traceback(stderr: str) -> None:
    """A served process never let an exception escape (the first one is shown)."""
    at = stderr.find("Traceback")
    assert at < 0, stderr[max(at - 500, 0) : at + 3000]


def rpc_messages(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of one ``/mcp`` answer (plain JSON or an SSE stream)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        # SSE lines end only at CR/LF; str.splitlines would also split at U+2028.
        lines = re.split(r"\r\n|\r|\n", response.text)
        return [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    if not response.content:
        return []
    body = response.json()
    return body if isinstance(body, list) else [body]


class McpHttpSession:
    """One stateful MCP session at ``/mcp``, spoken in raw JSON-RPC over httpx."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self._next = 0
        answer = client.post("/mcp", headers=MCP_HEADERS, content=self._request("initialize"))
        assert answer.status_code == 200, answer.text
        result = rpc_messages(answer)[0]["result"]
        self.headers = {
            **MCP_HEADERS,
            "Mcp-Session-Id": answer.headers["mcp-session-id"],
            "Mcp-Protocol-Version": result["protocolVersion"],
        }
        notified = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        client.post("/mcp", headers=self.headers, content=encode(notified))

    def _request(self, method: str, params: Any = None) -> bytes:
        self._next += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next, "method": method}
        message["params"] = INITIALIZE_PARAMS if method == "initialize" else params
        return encode({k: v for k, v in message.items() if v is not None})

    def post(self, body: bytes) -> httpx.Response:
        return self.client.post("/mcp", headers=self.headers, content=body)

    def rpc(self, method: str, params: Any = None) -> dict[str, Any]:
        """One request; its answer (a ``result`` or an ``error`` message)."""
        response = self.post(self._request(method, params))
        assert response.status_code == 200, (response.status_code, response.text)
        return rpc_messages(response)[-1]

    def close(self) -> None:
        self.client.delete("/mcp", headers=self.headers)
