#!/usr/bin/env python3
"""MCP over streamable HTTP: ``ctxactors serve`` beside the SDK's own ``MCPServer``, same run.

The peer is what a user would write instead: the official SDK's `MCPServer` with ``async
def`` tools keeping a dict of sessions in its event loop (no isolation guarantees, no
durability). Both servers get the same load from the same client: `--sessions` MCP
sessions at once, each making `--calls` state-changing calls (create a goal) one after
another. Each server runs pinned to CPU 0 and the clients to the other CPUs, so the server's
own CPU time per call is comparable.

`--client`: who makes the calls. ``sdk`` is the official SDK `Client`, one per session.
``raw`` (the default in the stateless protocol, which it alone speaks) sends each call as
the very POST the SDK client sends for a ``tools/call`` at 2026-07-28 (same headers: the
protocol version, ``Mcp-Method``/``Mcp-Name``, ``Accept``; same JSON-RPC body with the same
``_meta`` protocol version, client info and capabilities), one keep-alive connection per
session, written and parsed by hand on asyncio sockets, and checks every answer: a JSON-RPC
result for that request's id, not an error, whose goal id is the next of that session
(``g1``, ``g2``, ...), so a server that drops state or fails can't look fast. Why it is the
fair measure: on 2 CPUs the SDK clients cost more CPU per call than either server, so with
``--client sdk`` the pinned server idles about half the time waiting for them and the run
measures the clients (both servers then show about the same calls/s). The raw client costs
a small fraction of a server's call, so the pinned server runs near 100% of its CPU: the
"server CPU %" column shows it (CPU time over wall time, 100% = the whole pinned CPU), and
"its CPU idle %" what was left idle on that CPU (about 0: saturated). On a shared machine
the rest of that CPU goes to neighbours, and the kernel shares it per thread: a server of
several threads (ctxactors' workers) wins more of it than one of a single thread (the peer),
so calls/s is a little in the threaded server's favour there; "CPU vs peer" is not, and its
inverse is each server's throughput with the CPU to itself. The raw client skips the SDK
client's ``server/discover`` and first ``tools/list``, which a stateless server needs for
nothing.

Both serve the same transport mode, `--protocol`: ``stateless``, the client speaks the
2026-07-28 protocol (one POST per call, no MCP session); ``stateful``, the SDK's default
before it (an initialize handshake, then every call in that ``Mcp-Session-Id``'s session).
The peer answers in the SDK's default SSE mode; ctxactors runs its session manager in the
SDK's JSON-response mode and turns an answer into an SSE stream only for a call that runs
past ``http.ping_interval`` (`ctxactors.transports.late_stream`): for calls as quick as
these, both send the same bytes in the stateless protocol. ctxactors runs with
``--store memory`` (the peer keeps nothing either) and, as its own row, with its default
SQLite store. `--unpinned` lets servers and clients run on any CPU (as deployed); the CPU
per call is still the server process's own.

The servers run in turn, `--rounds` times, and each figure is the median of its rounds (the
machine is shared: one round can be slowed by a neighbour). "switches/call" counts the
server's context switches (every thread): the peer answers in its event loop, ctxactors hands
each call of a sync tool to a worker of its scheduler and back.

`--profile DIR` runs each server under cProfile, timing CPU in every thread (its figures are
then the profiler's, not the servers'), from the end of the warm-up on, writes
``DIR/<server>.prof`` and prints the top functions by own time per call.

    python scripts/bench_mcp_http.py [--sessions 50] [--calls 40] [--rounds 3]
        [--protocol stateless|stateful] [--client raw|sdk] [--unpinned] [--no-sqlite]
        [--json PATH] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
from mcp import Client

ROOT = Path(__file__).resolve().parent.parent

# The peer, run as its own process: `python - PORT` with this on stdin.
PEER = """
import logging, sys, uvicorn
logging.disable(logging.INFO)  # as ctxactors runs: warnings only
from mcp.server.mcpserver import MCPServer

app = MCPServer("peer")
goals: dict[str, dict[str, str]] = {}

@app.tool()
async def create_goal(session: str, goal: str) -> dict:
    kept = goals.setdefault(session, {})
    goal_id = f"g{len(kept) + 1}"
    kept[goal_id] = goal
    return {"id": goal_id, "goal": goal}

uvicorn.run(app.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]),
            log_level="warning")
"""

# A server under cProfile (CPU time) in every thread: `python -c PROFILED OUT peer PORT` (the peer's
# code on stdin) or `python -c PROFILED OUT ctxactors ARGS...`; OUT is written at exit.
# SIGUSR1 forgets what was recorded so far (start-up, imports, warm-up).
PROFILED = """
import cProfile, pstats, runpy, signal, sys, threading, time, atexit
out, kind, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
profiles = [cProfile.Profile(time.thread_time)]

def start(*_):
    sys.setprofile(None)
    profile = cProfile.Profile(time.thread_time)
    profiles.append(profile)
    profile.enable()

def dump():
    merged = None
    for profile in profiles:
        profile.disable()
        try:
            stats = pstats.Stats(profile)
        except TypeError:  # a thread that recorded nothing
            continue
        merged = stats if merged is None else merged.add(stats)
    merged.dump_stats(out)

atexit.register(dump)
signal.signal(signal.SIGUSR1, lambda *_: [profile.clear() for profile in profiles])
# uvicorn re-raises the SIGTERM it stopped on once it is done: exit cleanly (dump) then.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
threading.setprofile(start)
profiles[0].enable()
if kind == "peer":
    sys.argv = ["peer", *rest]
    exec(compile(sys.stdin.read(), "peer", "exec"), {"__name__": "__main__"})
else:
    sys.argv = ["ctxactors", *rest]
    runpy.run_module("ctxactors", run_name="__main__")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pin(cpus: set[int]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []


@contextlib.contextmanager
def serving(
    kind: str, server_cpus: set[int], profile: Path | None = None
) -> Iterator[tuple[str, psutil.Process]]:
    port = free_port()
    env = {**os.environ, "CTXACTORS_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as data:
        if kind == "peer":
            command = ["peer", str(port)]
            stdin: Any = subprocess.PIPE
        else:
            store = ["--store", "memory"] if kind == "ctxactors" else ["--data-dir", data]
            command = ["ctxactors", "serve", "--transport", "http", "--port", str(port), *store]
            stdin = subprocess.DEVNULL
        if profile is not None:
            argv = [sys.executable, "-c", PROFILED, str(profile / f"{kind}.prof"), *command]
        elif kind == "peer":
            argv = [sys.executable, "-", *command[1:]]
        else:
            argv = [sys.executable, "-m", *command]
        proc = subprocess.Popen(pin(server_cpus) + argv, env=env, stdin=stdin)
        if kind == "peer":
            assert proc.stdin is not None
            proc.stdin.write(PEER.encode())
            proc.stdin.close()
        url = f"http://127.0.0.1:{port}/mcp"
        try:
            wait_listening(proc, url)
            # taskset execs the server in place, so the pid is the server's own.
            yield url, psutil.Process(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_listening(proc: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("server did not start listening")


# What the SDK client (mode "auto") sends for a tools/call at 2026-07-28, byte for byte
# but the User-Agent: see `raw_session`.
PROTOCOL = "2026-07-28"
CLIENT_META = {
    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
    "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0.1.0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def call_request(
    host: str, path: str, request_id: int, arguments: dict[str, Any], tool: str = "create_goal"
) -> bytes:
    """The POST of one `tools/call` of `tool`, headers and body as the SDK client writes them."""
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": CLIENT_META},
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: gzip, deflate\r\n"
        "Connection: keep-alive\r\nUser-Agent: bench_mcp_http\r\n"
        "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
        f"mcp-protocol-version: {PROTOCOL}\r\nmcp-method: tools/call\r\n"
        f"mcp-name: {tool}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body: status line, headers, body."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" not in headers:
        # A streamed (SSE or chunked) answer: only a call slower than ping_interval gets one.
        raise RuntimeError(f"answer without Content-Length: {head[0]} {headers}")
    return head[0], headers, await reader.readexactly(int(headers["content-length"]))


def check_answer(
    kind: str, status: str, headers: dict[str, str], body: bytes, rid: int, n: int
) -> None:
    """The call's JSON-RPC result, not an error, holding the session's (n+1)-th goal."""
    try:
        answer = json.loads(body)
        result = answer["result"]
        goal = json.loads(result["content"][0]["text"])
        ok = (
            status.split()[1] == "200"
            and headers.get("content-type", "").startswith("application/json")
            and answer["id"] == rid
            and result["isError"] is False
            and goal == {"id": f"g{n + 1}", "goal": f"goal {n}"}
        )
    except (ValueError, KeyError, IndexError, TypeError):
        ok = False
    if not ok:
        raise RuntimeError(f"{kind}: bad answer to call {n}: {status} {body[:500]!r}")


async def raw_session(url: str, kind: str, session: str, calls: int, out: list[float]) -> None:
    """`calls` tool calls of `session`, one after another, on one keep-alive connection."""
    parts = httpx.URL(url)
    host = f"{parts.host}:{parts.port}"
    reader, writer = await asyncio.open_connection(parts.host, parts.port)
    try:
        for n in range(calls):
            args: dict[str, Any] = {"goal": f"goal {n}"}
            args["session" if kind == "peer" else "__sessionId"] = session
            request = call_request(host, parts.path, n + 1, args)
            start = time.perf_counter()
            writer.write(request)
            status, headers, body = await read_answer(reader)
            out.append(time.perf_counter() - start)
            check_answer(kind, status, headers, body, n + 1, n)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def sdk_session(
    url: str, kind: str, session: str, calls: int, protocol: str, out: list[float]
) -> None:
    # "auto" finds the 2026-07-28 protocol on both servers; "legacy" is the handshake.
    async with Client(url, mode="legacy" if protocol == "stateful" else "auto") as client:
        for n in range(calls):
            args: dict[str, Any] = {"goal": f"goal {n}"}
            if kind == "peer":
                args["session"] = session
            else:
                args["__sessionId"] = session
            start = time.perf_counter()
            result = await client.call_tool("create_goal", args)
            out.append(time.perf_counter() - start)
            text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
            if result.is_error or json.loads(text) != {"id": f"g{n + 1}", "goal": f"goal {n}"}:
                raise RuntimeError(f"{kind}: bad answer to call {n}: {result.content}")


async def load(
    url: str, kind: str, tag: str, sessions: int, calls: int, args: argparse.Namespace
) -> tuple[float, float, list[float]]:
    """Wall and client CPU seconds of `sessions` x `calls` calls, and each call's latency."""
    latencies: list[float] = []
    names = [f"{tag}-{i}" for i in range(sessions)]  # fresh sessions: goal ids start at g1
    start, cpu = time.perf_counter(), time.process_time()
    if args.client == "raw":
        await asyncio.gather(*(raw_session(url, kind, s, calls, latencies) for s in names))
    else:
        await asyncio.gather(
            *(sdk_session(url, kind, s, calls, args.protocol, latencies) for s in names)
        )
    return time.perf_counter() - start, time.process_time() - cpu, latencies


def context_switches(pid: int) -> int:
    """Voluntary and involuntary switches of every thread of `pid` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def cpu_jiffies(cpus: set[int]) -> tuple[int, int]:
    """Idle (with iowait) and total clock ticks of `cpus` (every CPU if empty) so far."""
    idle = total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *ticks = line.split()
        if name.startswith("cpu") and name != "cpu" and (not cpus or int(name[3:]) in cpus):
            values = [int(t) for t in ticks[:8]]  # user nice system idle iowait irq softirq steal
            idle += values[3] + values[4]
            total += sum(values)
    return idle, total


def measure(kind: str, args: argparse.Namespace, server_cpus: set[int]) -> dict[str, Any]:
    with serving(kind, server_cpus, args.profile) as (url, server):
        asyncio.run(load(url, kind, "warm", 2, 5, args))  # warm up: imports, first sessions
        if args.profile is not None:
            server.send_signal(signal.SIGUSR1)  # the profile starts here
        before, switches = server.cpu_times(), context_switches(server.pid)
        idle, ticks = cpu_jiffies(server_cpus)
        elapsed, client_cpu, latencies = asyncio.run(
            load(url, kind, "bench", args.sessions, args.calls, args)
        )
        after, switches = server.cpu_times(), context_switches(server.pid) - switches
        idle_now, ticks_now = cpu_jiffies(server_cpus)
    calls = len(latencies)
    cpu = (after.user - before.user) + (after.system - before.system)
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "calls": calls,
        "calls_per_s": calls / elapsed,
        "p50_ms": quantiles[49] * 1e3,
        "p99_ms": quantiles[98] * 1e3,
        "server_cpu_us_per_call": cpu / calls * 1e6,
        "server_cpu_percent": cpu / elapsed * 100,
        # Left idle on the server's CPU(s): near 0 when pinned means saturated (the server
        # plus whatever else the shared machine runs there), so calls/s is the server's.
        "server_cpus_idle_percent": (idle_now - idle) / max(ticks_now - ticks, 1) * 100,
        "client_cpu_us_per_call": client_cpu / calls * 1e6,
        "switches_per_call": switches / calls,
    }


def print_profile(path: Path, name: str, calls: int, top: int = 30) -> None:
    """The functions where `path`'s server spent most of its own time, in µs per call."""
    stats = pstats.Stats(str(path))
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])  # type: ignore[attr-defined]
    total = sum(row[2] for _, row in rows)
    print(f"\n{name}: {total / calls * 1e6:,.0f} µs/call profiled; top by own time")
    print(f"{'own µs/call':>12} {'cum µs/call':>12} {'calls/call':>11}  function")
    for (file, line, function), (_, ncalls, own, cumulative, _) in rows[:top]:
        where = f"{Path(file).name}:{line}" if line else file
        print(
            f"{own / calls * 1e6:>12.1f} {cumulative / calls * 1e6:>12.1f} "
            f"{ncalls / calls:>11.2f}  {function} ({where})"
        )


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3, help="alternate the servers this often")
    parser.add_argument(
        "--no-sqlite", action="store_true", help="leave out the SQLite row (faster)"
    )
    parser.add_argument(
        "--protocol",
        choices=("stateless", "stateful"),
        default="stateless",
        help="2026-07-28 single POSTs, or the SDK's default handshake and MCP sessions",
    )
    parser.add_argument(
        "--client",
        choices=("raw", "sdk"),
        help="raw POSTs (stateless only; its default) or the SDK Client (stateful's default)",
    )
    parser.add_argument("--unpinned", action="store_true", help="servers and clients on any CPU")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="profile each server into DIR (1 round)"
    )
    args = parser.parse_args()
    if args.client is None:
        args.client = "raw" if args.protocol == "stateless" else "sdk"
    if args.client == "raw" and args.protocol != "stateless":
        parser.error("--client raw speaks only the stateless protocol: use --client sdk")
    if min(args.sessions, args.calls) < 1:
        parser.error("--sessions and --calls must be at least 1")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        args.rounds = 1  # one profile per server

    cpus = os.sched_getaffinity(0)
    server_cpus = {min(cpus)} if len(cpus) > 1 and not args.unpinned else set()
    client_cpus = cpus - server_cpus or cpus
    os.sched_setaffinity(0, client_cpus)

    kinds = ["peer", "ctxactors"] + ([] if args.no_sqlite else ["ctxactors-sqlite"])
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for _round in range(args.rounds):
        for kind in kinds:
            runs[kind].append(measure(kind, args, server_cpus))
    median = {kind: median_run(rs) for kind, rs in runs.items()}
    best = {kind: max(rs, key=lambda r: r["calls_per_s"]) for kind, rs in runs.items()}
    peer = median["peer"]

    print(
        f"MCP streamable HTTP ({args.protocol}, {args.client} client), "
        f"{args.sessions} sessions x {args.calls} calls, "
        f"median of {args.rounds} rounds; server pinned to CPU {sorted(server_cpus) or 'any'}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'server':<36} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU µs/call':>12}"
        f" {'server CPU %':>13} {'its CPU idle %':>15} {'client µs/call':>15} {'switches/call':>14}"
        f" {'throughput vs peer':>19} {'CPU vs peer':>12}"
    )
    names = {
        "peer": "SDK MCPServer, async tools (peer)",
        "ctxactors": "ctxactors serve --store memory",
        "ctxactors-sqlite": "ctxactors serve (SQLite, default)",
    }
    for kind in kinds:
        r = median[kind]
        print(
            f"{names[kind]:<36} {r['calls_per_s']:>9,.0f} {r['p50_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['server_cpu_us_per_call']:>12,.0f} "
            f"{r['server_cpu_percent']:>12.0f}% {r['server_cpus_idle_percent']:>14.0f}% "
            f"{r['client_cpu_us_per_call']:>15,.0f} "
            f"{r['switches_per_call']:>14.1f} "
            f"{r['calls_per_s'] / peer['calls_per_s']:>18.2f}x "
            f"{r['server_cpu_us_per_call'] / peer['server_cpu_us_per_call']:>11.2f}x"
        )
    if args.profile is not None:
        for kind in kinds:
            print_profile(args.profile / f"{kind}.prof", names[kind], median[kind]["calls"])
    if args.json:
        args.json.write_text(json.dumps({"median": median, "best": best, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
