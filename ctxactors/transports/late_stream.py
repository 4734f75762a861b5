"""``/mcp`` answers as JSON, and turns into an SSE stream only for a call that runs long.

The SDK's session manager runs in its JSON-response mode: each POST gets its JSON-RPC answer
as one ``application/json`` body. Its SSE mode puts, around every request, a task group, a
second task watching for the client to leave and a stream for notifications; ctxactors
sends no notification or request during a call, so for a call that answers quickly that
machinery was a third of the SDK's CPU per call, for the same bytes (a 2026-07-28 POST that
answers within the ping interval is JSON in SSE mode too).

What SSE mode still gave is that bytes keep flowing while a call runs, so a proxy's
idle-read timeout doesn't cut a long call. `LateStreams` keeps that: a POST whose answer
has not started after ``http.ping_interval`` seconds becomes the stream SSE mode would have sent (the
SSE headers and a ping comment, another ping every interval, then the answer as one
``event: message``). A client that doesn't accept ``text/event-stream`` keeps waiting for
its JSON. Unlike SSE mode, a client that leaves doesn't cancel its call: the call was
handed to its key's actor and runs to its end (and its state is saved) either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from starlette.types import Message, Send

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]
_PING = {"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True}


def may_stream(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bool, bytes | None]:
    """Whether a POST with these raw headers may turn into a stream, and its
    ``Mcp-Session-Id``: the client accepts SSE, and the request is a 2026-07-28 one (which
    is not ``subscriptions/listen``, a stream the SDK makes itself) or one in an open MCP
    session (not the ``initialize`` that opens one: its answer carries the new id)."""
    named = dict(headers)  # one pass in C; a repeated header counts by its last copy
    if b"text/event-stream" not in named.get(b"accept", b"").lower():
        return False, None
    if named.get(b"mcp-method") == b"subscriptions/listen":
        return False, None
    session = named.get(b"mcp-session-id")
    return session is not None or named.get(b"mcp-protocol-version", b"") >= b"2026", session


class LateStreams:
    """The answers of one endpoint that have not started, looked at every quarter of
    `interval`: one that is `interval` old becomes a stream (so a stream starts between 1
    and 1.25 intervals into its call). A timer per request cost more than the check."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[LateStream, float] = {}  # when each is due
        self._sweep: asyncio.TimerHandle | None = None

    def start(self, send: Send, session: bytes | None) -> LateStream:
        """The `send` to give the SDK for one POST (`close` it when the request is over)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a server has one loop; a test may run one after another
            self._loop, self._waiting, self._sweep = loop, {}, None
        answer = LateStream(self, send, session, loop)
        self._waiting[answer] = loop.time() + self.interval
        if self._sweep is None:
            self._sweep = loop.call_later(self.interval / 4, self._check)
        return answer

    def settle(self, answer: LateStream) -> None:
        self._waiting.pop(answer, None)

    def _check(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        for answer in [a for a, due in self._waiting.items() if due <= now]:
            answer.commit()
        self._sweep = (
            self._loop.call_later(self.interval / 4, self._check) if self._waiting else None
        )


class LateStream:
    """The `send` of one POST: passes the SDK's answer through while it comes in time;
    past that, frames it as an SSE stream (see the module)."""

    def __init__(
        self,
        streams: LateStreams,
        send: Send,
        session: bytes | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._streams = streams
        self._send = send
        self._session = session
        self._loop = loop
        self._waiting = True  # in `streams`, not yet answered nor a stream
        self._pinger: asyncio.Task[None] | None = None
        # The rest only serves a stream (made at the commit: most answers never need it).
        self._lock: asyncio.Lock
        self._opened = False  # the SSE headers are sent
        self._raw = False  # the SDK streams SSE itself: pass its frames through
        self._answer: list[bytes] = []
        self._done = False

    async def send(self, message: Message) -> None:
        if self._pinger is None:
            if self._waiting:  # the answer started in time: no stream
                self._waiting = False
                self._streams.settle(self)
            await self._send(message)
            return
        async with self._lock:
            await self._sdk_message(message)

    def close(self) -> None:
        """The request is over: no more pings."""
        if self._waiting:
            self._waiting = False
            self._streams.settle(self)
        self._done = True
        if self._pinger is not None:  # sleeping or waiting for the lock: safe to stop
            self._pinger.cancel()

    def commit(self) -> None:
        """Become a stream: send the SSE headers and ping until the answer comes."""
        self._waiting = False
        self._streams.settle(self)
        self._lock = asyncio.Lock()  # the pings and the answer, in turn
        self._pinger = self._loop.create_task(self._ping())

    async def _open(self) -> None:
        if not self._opened:
            self._opened = True
            headers = list(_SSE_HEADERS)
            if self._session is not None:
                headers.append((b"mcp-session-id", self._session))
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def _ping(self) -> None:
        while True:
            async with self._lock:
                if self._done:
                    return
                await self._open()
                await self._send(_PING)
            await asyncio.sleep(self._streams.interval)

    async def _sdk_message(self, message: Message) -> None:
        if message["type"] == "http.response.start":  # the stream's headers are sent already
            headers = dict(message.get("headers", ()))
            self._raw = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            return
        if message["type"] != "http.response.body" or self._done:
            return
        await self._open()
        more = message.get("more_body", False)
        if self._raw:
            await self._send(message)
        else:
            self._answer.append(message.get("body", b""))
            if not more:  # compact JSON: one line, so one data field
                answer = b"".join(self._answer)
                event = b"event: message\r\ndata: " + answer + b"\r\n\r\n" if answer else b""
                await self._send({"type": "http.response.body", "body": event, "more_body": False})
        self._done = not more
