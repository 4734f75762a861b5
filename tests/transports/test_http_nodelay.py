"""The HTTP server's connections answer without waiting for Nagle: `serve` hands the guard a
listening socket whose protocol says TCP, so that asyncio sets ``TCP_NODELAY`` on every
connection it accepts (it does only for ``proto == IPPROTO_TCP``). Without it each response's
second write waited for the client's delayed ACK: 44 ms for any request, ``/healthz``
included, against 1 ms from uvicorn's own listener."""

from __future__ import annotations

import asyncio
import socket

from ctxactors.cli.serve import tcp_socket
from ctxactors.settings import HttpSettings
from ctxactors.transports.connections import Admission, GuardedListener


def nodelay_of_accepted(listener: socket.socket) -> int:
    """``TCP_NODELAY`` of a connection accepted by an asyncio server on `listener`, as
    uvicorn serves it."""

    async def accept_one() -> int:
        loop = asyncio.get_running_loop()
        made: asyncio.Future[int] = loop.create_future()

        class Note(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                made.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        server = await loop.create_server(Note, sock=listener)
        _reader, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            return await asyncio.wait_for(made, 20)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(accept_one())


def test_the_guarded_listener_accepts_connections_with_nodelay() -> None:
    bound = socket.socket(socket.AF_INET)  # as uvicorn's Config.bind_socket makes it: proto 0
    bound.bind(("127.0.0.1", 0))
    bound.listen()
    listener = GuardedListener(tcp_socket(bound), Admission(HttpSettings()))
    assert listener.proto == socket.IPPROTO_TCP
    assert nodelay_of_accepted(listener) == 1


def test_without_it_asyncio_leaves_nagle_on() -> None:
    """Why `tcp_socket` exists: the same listener on uvicorn's socket as it comes."""
    bound = socket.socket(socket.AF_INET)
    bound.bind(("127.0.0.1", 0))
    bound.listen()
    assert nodelay_of_accepted(GuardedListener(bound, Admission(HttpSettings()))) == 0


def test_a_socket_that_is_not_tcp_is_left_as_it_is() -> None:
    unix = socket.socket(socket.AF_UNIX)
    try:
        assert tcp_socket(unix) is unix
    finally:
        unix.close()
