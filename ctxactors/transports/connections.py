"""HTTP that holds against slow and many clients: what uvicorn gets to serve ``/mcp`` and REST.

A client that opens connections and sends half a request costs nothing to send and, under
plain uvicorn 0.54, holds a socket and a file descriptor forever: uvicorn has no deadline
for a request's headers or body and no cap on connections (its ``limit_concurrency`` answers
503 only once a request's headers are in, so half-sent requests still pile up), and the ASGI
app never sees a request until its headers are complete, so no middleware can help. 1,100
such connections exhausted a server's 1,024 descriptors and it answered no one.

So the guard sits below the app, on uvicorn's own hooks, and uvicorn stays: it is the server
whose shutdown our drain relies on (`serve._DrainingServer`), and the alternatives only
cover part of this (hypercorn has a read timeout, granian a header timeout; neither caps the
connections of one client address). Two pieces, with the limits of `HttpSettings`:

- `GuardedListener`, the listening socket uvicorn is given. asyncio's loop calls its
  ``accept()``, which counts each connection by client (`client_of`: an IPv6 client by
  its /64) and refuses one over
  ``http.max_connections`` (the server's) or ``http.max_connections_per_client`` on the spot:
  a short 503 and a close, inside ``accept``, so a refused connection never gets a protocol
  or a task and holds its descriptor for an instant.
- `GuardedH11Protocol`, uvicorn's h11 protocol with two deadlines: a request's headers must
  be complete within ``http.header_timeout`` of its first byte (or of the connection), its
  body within ``http.body_timeout`` of its headers; otherwise the connection is closed (after
  a 408 when no response was under way). It gives the connection's place back when it ends.

Authentication needs the headers, so it comes after them, but before anything else: the
app's first middleware refuses a request without a valid token (401) without reading its
body, and that 401 closes the connection (`auth.RequireAuth`), so a client without a token
holds a place for one request's headers at most. Behind a reverse proxy every client has
the proxy's address: raise ``http.max_connections_per_client`` to ``http.max_connections``
there and let the proxy cap its clients.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import resource
import socket
from collections import Counter
from typing import Any, ClassVar

import h11
import msgspec
from uvicorn.protocols.http.h11_impl import H11Protocol

from ctxactors.logs import lazy_logger
from ctxactors.settings import HttpSettings

# Descriptors kept for everything but connections: the store, logs, sandboxes' pipes.
_FD_RESERVE = 256
# Refusals in one ``accept`` call before the loop gets a turn (a flood can't starve it).
_REFUSALS_PER_ACCEPT = 64
_log = lazy_logger("ctxactors.connections")


def _response(status: int, reason: str, code: str, message: str, *extra: str) -> bytes:
    """A whole HTTP/1.1 error response that closes its connection, in the app's shape."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def client_of(host: str) -> str:
    """The client an address counts against: an IPv6 address's /64 (one host or site is
    handed a whole /64 and may pick any address in it, so counting addresses would let it
    open the per-client cap's connections 2**64 times over), an IPv4-mapped one's IPv4
    address; an IPv4 address, or anything else, as it is."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if address.is_loopback:
        return host
    return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))


class Admission:
    """The connections open now, per client address; the one place that counts them.

    Only the event loop's thread touches it (``accept`` and ``connection_lost`` both run
    there), so it needs no lock. Connections are known by descriptor: one that never reached
    a protocol (asyncio failed to make its transport) is forgotten when the kernel hands its
    descriptor to the next connection, so no place is lost for good.
    """

    def __init__(self, limits: HttpSettings) -> None:
        self.limits = limits
        self._host_of: dict[int, str] = {}
        self._held: Counter[str] = Counter()

    def admit(self, fd: int, host: str) -> bytes | None:
        """Count the connection on `fd` from `host`, or the response that refuses it."""
        self.release(fd)  # still counted: a connection that never reached a protocol
        host = client_of(host)
        cap = self.limits.max_connections
        if len(self._host_of) >= cap:
            return _too_many(f"the server holds {cap} connections, its most (http.max_connections)")
        per_client = self.limits.max_connections_per_client
        if self._held[host] >= per_client:
            return _too_many(
                f"{host} holds {per_client} connections to this server, the most one client "
                "address may (http.max_connections_per_client); reuse or close one"
            )
        self._host_of[fd] = host
        self._held[host] += 1
        return None

    def release(self, fd: int) -> None:
        host = self._host_of.pop(fd, None)
        if host is not None:
            self._held[host] -= 1
            if not self._held[host]:
                del self._held[host]

    @property
    def open(self) -> int:
        return len(self._host_of)


def _too_many(message: str) -> bytes:
    return _response(503, "Service Unavailable", "too_many_connections", message, "retry-after: 1")


class GuardedListener(socket.socket):
    """The server's listening socket: `accept` admits a connection or refuses it at once.

    asyncio's selector loop accepts through this object's ``accept`` (uvicorn hands the
    loop the sockets it is given); a refused connection is answered and closed here, and
    the loop never sees it.
    """

    def __init__(self, bound: socket.socket, admission: Admission) -> None:
        super().__init__(bound.family, bound.type, bound.proto, fileno=bound.detach())
        self.admission = admission

    def accept(self) -> tuple[socket.socket, Any]:
        for _ in range(_REFUSALS_PER_ACCEPT):
            conn, address = super().accept()  # BlockingIOError: none waiting (the loop's cue)
            host = address[0] if isinstance(address, tuple) else str(address)
            refusal = self.admission.admit(conn.fileno(), host)
            if refusal is None:
                return conn, address
            _log.debug("connection_refused", client=host, open=self.admission.open)
            _refuse(conn, refusal)
        raise BlockingIOError  # more may wait: the loop takes them on its next turn


def _refuse(conn: socket.socket, response: bytes) -> None:
    try:
        conn.setblocking(False)
        conn.send(response)  # a few hundred bytes: the socket's buffer takes them at once
    except OSError:
        pass  # the client is gone already
    finally:
        conn.close()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for a request's headers and one for its body.

    Made per server by `guarded_protocol`, which sets `admission`. The header deadline runs
    from a connection's start, then from the first byte of each later request (between
    requests, uvicorn's keep-alive timeout closes an idle connection); the body deadline
    from the end of the headers to the end of the body. A response is never timed: an
    event stream may be open for hours.
    """

    admission: ClassVar[Admission]
    _fd = -1
    _headers_due: asyncio.TimerHandle | None = None
    _body_due: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        self._headers_due = self.loop.call_later(
            self.admission.limits.header_timeout, self._headers_late
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop(self._headers_due)
        self._stop(self._body_due)
        self._headers_due = self._body_due = None
        self.admission.release(self._fd)  # before asyncio closes the descriptor
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._follow()

    def _follow(self) -> None:
        """Arm or stop the deadlines for where the client is in its request."""
        state = self.conn.their_state
        limits = self.admission.limits
        if state is h11.IDLE:  # between requests: a deadline once the next one has begun
            if self._headers_due is None and self.conn.trailing_data[0]:
                self._headers_due = self.loop.call_later(limits.header_timeout, self._headers_late)
            return
        self._stop(self._headers_due)
        self._headers_due = None
        if state is h11.SEND_BODY:
            if self._body_due is None:
                self._body_due = self.loop.call_later(limits.body_timeout, self._body_late)
        else:
            self._stop(self._body_due)
            self._body_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        timeout = self.admission.limits.header_timeout
        _log.debug("request_headers_late", client=self.client, timeout_s=timeout)
        if self.conn.our_state is h11.IDLE:  # no response under way: say why
            message = f"the request's headers did not arrive within {timeout:g} s"
            self.transport.write(
                _response(
                    408, "Request Timeout", "request_timeout", message + " (http.header_timeout)"
                )
            )
        self.transport.close()

    def _body_late(self) -> None:
        self._body_due = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        timeout = self.admission.limits.body_timeout
        _log.debug("request_body_late", client=self.client, timeout_s=timeout)
        self.transport.close()  # the app's next read of the body sees the client gone

    @staticmethod
    def _stop(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()


def guarded_protocol(admission: Admission) -> type[GuardedH11Protocol]:
    """The protocol class of one server (uvicorn makes one instance per connection)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"admission": admission})


def fit_to_open_files(limits: HttpSettings) -> HttpSettings:
    """`limits` made to fit this process's open-file limit, which is raised first (up to
    its hard limit) if the connections need it: a server out of descriptors accepts
    nobody. What can't be raised lowers ``max_connections`` instead (logged)."""
    needed = limits.max_connections + _FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return limits
    fitted = max(soft - _FD_RESERVE, soft // 2)
    _log.warning(
        "max_connections_lowered",
        configured=limits.max_connections,
        max_connections=fitted,
        open_files=soft,
        fix="raise the open-file limit (ulimit -n, LimitNOFILE=) above http.max_connections",
    )
    return msgspec.structs.replace(
        limits,
        max_connections=fitted,
        max_connections_per_client=min(limits.max_connections_per_client, fitted),
    )
