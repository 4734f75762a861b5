"""Requests a server has taken and not yet answered, so a shutdown can wait for the answers.

A request counts until its response has been written to the transport, not until its
handler returned: a drain that only waited for handlers closed the connection between a
handler's return and its reply being written ("Connection closed" on the call in flight).
Every transport counts its own requests into the one `InFlight` of its server: the stdio
transport by JSON-RPC id, the HTTP app by request (REST and ``/mcp`` alike).

Used from the event loop only (no lock): transports run there, and a signal handler hands
the shutdown to the loop before it drains.
"""

from __future__ import annotations

import anyio


class InFlight:
    """A count of unanswered requests, and the flag that refuses new ones once draining."""

    def __init__(self) -> None:
        self._count = 0
        self._idle: anyio.Event | None = None
        self.draining = False

    @property
    def count(self) -> int:
        return self._count

    def enter(self) -> None:
        self._count += 1

    def exit(self) -> None:
        self._count -= 1
        if self._count == 0 and self._idle is not None:
            self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Refuse new requests from now on; wait up to `timeout` s until every counted one
        has been answered. True when none is left."""
        self.draining = True
        with anyio.move_on_after(timeout):
            while self._count:
                self._idle = anyio.Event()
                await self._idle.wait()
        return self._count == 0
