"""MCP's stdio transport (JSON-RPC, one message a line), hardened against what a client sends.

It replaces the SDK's ``stdio_server`` because that one reads whole lines in a worker
thread, drops lines it can't parse without an answer, and counts nothing: here

- a line over `max_line` bytes is read and discarded in chunks (never held in memory) and
  answered with a JSON-RPC error, ``id: null``; the server keeps serving;
- a line that is not UTF-8 or not JSON (-32700), or JSON that is not a JSON-RPC message
  (-32600, with the request's id when it has a usable one) gets an error answer too;
- every request is counted in `InFlight` from the moment it is read until its response
  has been written to stdout, so a drain (SIGTERM, or the end of stdin) lets each call in
  flight answer before the connection closes;
- stdin is read by the event loop (a pipe) so a SIGTERM can stop the server while the
  client keeps stdin open; while serving, fd 0 reads the null device and fd 1 writes to
  stderr, so a tool or a child process can neither take a request nor corrupt the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, NamedTuple

import anyio
import mcp_types as types
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from ctxactors.logs import get_logger
from ctxactors.transports.inflight import InFlight

MAX_LINE = 4 * 1024 * 1024  # the HTTP body cap: one message is as large on either transport
_CHUNK = 64 * 1024


class Oversized(int):
    """A line longer than the cap, already discarded: only its length (bytes) is kept."""


async def read_lines(
    read_chunk: Callable[[], Awaitable[bytes]], max_line: int
) -> AsyncIterator[bytes | Oversized]:
    """The lines of a byte stream, without their newline; a line over `max_line` bytes is
    yielded as its `Oversized` length instead. Holds at most `max_line` plus one chunk."""
    line = bytearray()
    skipped = 0  # > 0 while discarding the rest of an oversized line
    while chunk := await read_chunk():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            size = skipped + len(line) + end - start
            if skipped or size > max_line:
                yield Oversized(size)
            else:
                line += chunk[start:end]
                if line and not line.isspace():  # a blank line is no message: skipped
                    yield bytes(line)
            line.clear()
            skipped, start = 0, end + 1
        rest = len(chunk) - start
        if skipped or len(line) + rest > max_line:
            skipped += len(line) + rest
            line.clear()
        else:
            line += chunk[start:]
    if skipped:
        yield Oversized(skipped)
    elif line and not line.isspace():
        yield bytes(line)


class _Id(msgspec.Struct):
    id: Any = None


class Refusal(NamedTuple):
    """The error answering a line that carries no message the server can take."""

    reply: types.JSONRPCError


def _error(request_id: types.RequestId | None, code: int, message: str) -> Refusal:
    data = types.ErrorData(code=code, message=message)
    return Refusal(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=data))


def _usable_id(line: bytes) -> types.RequestId | None:
    """The id of a JSON object that is not a valid message, when it is one JSON-RPC allows."""
    try:
        value = msgspec.json.decode(line, type=_Id).id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


def parse_line(line: bytes | Oversized, max_line: int) -> SessionMessage | Refusal:
    """The message a line carries, or the JSON-RPC error that answers it."""
    if isinstance(line, Oversized):
        return _error(
            None,
            types.INVALID_REQUEST,
            f"Invalid Request: a message of {int(line)} bytes is over this server's "
            f"{max_line}-byte limit on one line; it was discarded unread",
        )
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _error(
            None,
            types.PARSE_ERROR,
            f"Parse error: the line is not UTF-8 ({exc.reason} at byte {exc.start})",
        )
    try:
        message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            return _error(None, types.PARSE_ERROR, f"Parse error: {first['msg']}")
        return _error(
            _usable_id(line),
            types.INVALID_REQUEST,
            'Invalid Request: expected a JSON-RPC 2.0 object with "jsonrpc": "2.0" and a '
            '"method" (request or notification) or a "result" or "error" (response)',
        )
    if isinstance(message, types.JSONRPCNotification) and b'"id"' in line and _has_id(line):
        # An id that is neither a string nor an integer: the SDK would take it for a
        # notification and never answer the request the client is waiting on.
        return _error(
            None, types.INVALID_REQUEST, "Invalid Request: an id must be a string or an integer"
        )
    return SessionMessage(message)


def _has_id(line: bytes) -> bool:
    try:
        return "id" in msgspec.json.decode(line, type=dict[str, Any])
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False


class _Answers:
    """Which requests read from stdin still wait for their response on stdout."""

    def __init__(self, in_flight: InFlight) -> None:
        self._in_flight = in_flight
        self._waiting: dict[types.RequestId, int] = {}  # id -> requests (ids may repeat)

    def read(self, message: types.JSONRPCMessage) -> None:
        if isinstance(message, types.JSONRPCRequest):
            key = coerce_request_id(message.id)
            self._waiting[key] = self._waiting.get(key, 0) + 1
            self._in_flight.enter()
        elif (
            isinstance(message, types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
        ):
            # The SDK never answers a request the client cancelled (and if its answer was
            # already on the way, that answer finds nothing left to settle).
            request_id = (message.params or {}).get("requestId")
            if isinstance(request_id, str | int) and not isinstance(request_id, bool):
                self._settle(request_id)

    def written(self, message: types.JSONRPCMessage) -> None:
        if (
            isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
            and message.id is not None
        ):
            self._settle(message.id)

    def _settle(self, request_id: types.RequestId) -> None:
        key = coerce_request_id(request_id)
        waiting = self._waiting.pop(key, 0)
        if waiting:
            if waiting > 1:
                self._waiting[key] = waiting - 1
            self._in_flight.exit()


@contextlib.asynccontextmanager
async def stdio_transport(
    in_flight: InFlight,
    *,
    on_eof: Callable[[], Awaitable[Any]],
    max_line: int = MAX_LINE,
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """The (read, write) streams an SDK `Server.run` serves, over this process's stdio.

    At the end of stdin, `on_eof` runs (the drain) before the read stream closes, since the
    SDK cancels every handler still running once it does.
    """
    log = get_logger("ctxactors.stdio")
    answers = _Answers(in_flight)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    replies = write_send.clone()  # the reader's own answers to lines that carry no message

    with _claim_stdio() as (fd_in, fd_out):
        async with _chunk_reader(fd_in) as read_chunk:

            async def reader() -> None:
                async with read_send, replies:
                    async for line in read_lines(read_chunk, max_line):
                        item = parse_line(line, max_line)
                        if isinstance(item, Refusal):
                            log.warning("stdin_refused", error=item.reply.error.message)
                            await replies.send(SessionMessage(item.reply))
                            continue
                        answers.read(item.message)
                        await read_send.send(item)
                    log.info("end_of_stdin", in_flight=in_flight.count)
                    await on_eof()

            async def writer() -> None:
                broken = False
                async with write_recv:
                    async for item in write_recv:
                        if not broken:
                            data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                            try:
                                await anyio.to_thread.run_sync(
                                    _write_all, fd_out, data.encode() + b"\n"
                                )
                            except OSError as exc:  # the client is gone: nothing more can reach it
                                log.warning("stdout_closed", error=str(exc))
                                broken = True
                        answers.written(item.message)

            async with anyio.create_task_group() as tg:
                tg.start_soon(writer)
                reading = anyio.CancelScope()

                async def read_until_done() -> None:
                    with reading:
                        await reader()

                tg.start_soon(read_until_done)
                try:
                    yield read_recv, write_send
                finally:
                    reading.cancel()
                    write_send.close()


@contextlib.contextmanager
def _claim_stdio() -> Iterator[tuple[int, int]]:
    """Private copies of fds 0 and 1 for the protocol; meanwhile fd 0 reads the null device
    and fd 1 writes to stderr. Both are put back on exit."""
    sys.stdout.flush()
    fd_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    fd_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(devnull, 0)
        os.dup2(2, 1)
        yield fd_in, fd_out
    finally:
        os.close(devnull)
        os.dup2(fd_in, 0)
        os.dup2(fd_out, 1)
        os.close(fd_in)
        os.close(fd_out)


@contextlib.asynccontextmanager
async def _chunk_reader(fd: int) -> AsyncIterator[Callable[[], Awaitable[bytes]]]:
    """Reads of up to one chunk from `fd` (b"" at its end): by the event loop for a pipe, a
    socket or a terminal, so a cancel interrupts it; in a worker thread for anything epoll
    can't watch (a regular file, ``/dev/null``), which never blocks for long."""
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)):
        yield lambda: anyio.to_thread.run_sync(os.read, fd, _CHUNK)
        return
    reader = asyncio.StreamReader(limit=_CHUNK)
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(fd), "rb", buffering=0)
    )
    try:
        yield lambda: reader.read(_CHUNK)
    finally:
        transport.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # a terminal shared with stdin, which asyncio made non-blocking
            select.select([], [fd], [])
