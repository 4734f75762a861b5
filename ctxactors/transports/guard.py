"""What a web page could send to the HTTP server, refused before anything else runs.

A page the operator visits can reach a server on loopback. `RequestGuard` stops it three
ways, on ``/mcp`` and REST alike: a foreign ``Host`` is a DNS-rebinding page (421); an
``Origin`` the operator did not allow is any cross-site page (403); a POST that is not
``application/json`` is a browser "simple request", which a page may send anywhere without
a CORS preflight (415), so no such request reaches a tool.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxactors.transports.auth import AuthConfigError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def is_loopback(host: str) -> bool:
    """True when binding `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def normalise_origin(origin: str) -> str:
    """``scheme://host[:port]`` as a browser sends it; anything else is a config error."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise AuthConfigError(f"--allow-origin {origin!r}: expected scheme://host[:port]")
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise AuthConfigError(f"--allow-origin {origin!r}: expected scheme://host[:port]")
    return f"{parts.scheme}://{parts.netloc}".lower()


def host_name(host: str) -> str | None:
    """The name part of a ``Host`` header (``[::1]:80`` -> ``[::1]``), or None if malformed."""
    name, port = host, ""
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return None
        name, port = host[: end + 1], host[end + 1 :]
    elif ":" in host:
        name, _, rest = host.partition(":")
        port = ":" + rest
    if port and not (port.startswith(":") and port[1:].isdigit()):
        return None
    return name.lower() or None


class RequestGuard:
    """Refuses, before anything else runs, the requests a web page could make.

    `allowed_hosts` are host names (any port); None turns the ``Host`` check off (a
    non-loopback bind, where the operator names the hosts with ``--allow-host`` if wanted).
    Origins must be listed exactly; a request without ``Origin`` is not from a browser page.
    """

    def __init__(
        self, app: ASGIApp, allowed_hosts: Sequence[str] | None, allowed_origins: Sequence[str]
    ) -> None:
        self.app = app
        self.hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)
        self.origins = frozenset(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope["method"], Headers(scope=scope))
            if refusal is not None:
                status, code, message = refusal
                body = {"error": {"code": code, "message": message}}
                await JSONResponse(body, status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, method: str, headers: Headers) -> tuple[int, str, str] | None:
        host = headers.get("host", "")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return (
                421,
                "host_not_allowed",
                f"Host {host[:200]!r} is not a name of this server (DNS-rebinding protection); "
                "an operator behind a proxy adds it with --allow-host",
            )
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self.origins:
            return (
                403,
                "origin_not_allowed",
                f"cross-origin requests from {origin[:200]!r} are refused; the operator allows "
                "an origin with --allow-origin",
            )
        media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if method == "POST" and media_type != "application/json":
            return (
                415,
                "unsupported_media_type",
                "a POST needs Content-Type: application/json",
            )
        return None
