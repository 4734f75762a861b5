"""Who may reach the tools over HTTP: browser-request checks and bearer authentication.

One ASGI stack sits in front of ``/mcp`` and ``/api/v1`` alike (`HttpSecurity.middleware`):

- `RequestGuard` refuses what a web page could send. A foreign ``Host`` is a DNS-rebinding
  page (421); an ``Origin`` the operator did not allow is any cross-site page (403); a POST
  that is not ``application/json`` (415) is a browser "simple request", which a page may
  send to any address without a CORS preflight, so this check is what keeps a page from
  firing a tool call at a loopback server.
- Bearer tokens, checked by an MCP SDK `TokenVerifier`: `StaticTokens` (a file of
  ``token principal`` lines) or `JwtVerifier` (PyJWT: a public key or a JWKS URL, with
  issuer and audience checks). The SDK's `BearerAuthBackend` turns a valid token into an
  `AuthenticatedUser` and its `RequireAuthMiddleware` answers 401 with ``WWW-Authenticate``,
  so ``/mcp`` and REST refuse the same way. `principal_of` reads the principal back; the
  transports pass it to the runtime, where it namespaces every key.

`PrincipalSessionManager` caps one principal's open MCP sessions.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    AuthorizationContext,
    BearerAuthBackend,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import AnyHttpUrl
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ctxactors.logs import get_logger

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
MAX_PRINCIPAL = 256
MIN_TOKEN = 16  # a shorter static token is guessable; refused when the file is read
JWT_LEEWAY_S = 30  # clock skew allowed between the token issuer and this server
# Paths anyone may read: a health probe, and the metadata that tells a client how to get a
# token (RFC 9728 §3.1 puts it under /.well-known/oauth-protected-resource).
_PUBLIC_PATHS = ("/healthz", "/.well-known/oauth-protected-resource")
_log = get_logger("ctxactors.auth")


class AuthConfigError(ValueError):
    """An authentication option or file that can't be used; the message says why."""


def is_loopback(host: str) -> bool:
    """True when binding `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- principals ------------------------------------------------------------------------------


def principal_of(scope: Scope | None) -> str | None:
    """The authenticated principal of an HTTP request's ASGI scope, or None without auth."""
    user = scope.get("user") if scope is not None else None
    if not isinstance(user, AuthenticatedUser):
        return None
    return user.access_token.subject


def _access_token(token: str, principal: str, **extra: Any) -> AccessToken:
    return AccessToken(token=token, client_id=principal, subject=principal, scopes=[], **extra)


def _check_principal(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_PRINCIPAL:
        raise AuthConfigError(f"{where}: a principal must be a string of 1 to {MAX_PRINCIPAL}")
    return value


# -- static tokens ---------------------------------------------------------------------------


class StaticTokens:
    """Bearer tokens from a file of ``token principal`` lines (``#`` starts a comment).

    Only SHA-256 digests are kept, and a presented token's digest is compared with
    `hmac.compare_digest` against every entry, match or not: neither the time taken nor
    the token's length tells a caller which entry came close.
    """

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        self._entries: list[tuple[bytes, str]] = []
        for token, principal in entries:
            _check_principal(principal, "auth tokens")
            self._entries.append((_digest(token), principal))
        if not self._entries:
            raise AuthConfigError("auth tokens: no token given")
        if len({d for d, _ in self._entries}) != len(self._entries):
            raise AuthConfigError("auth tokens: a token is listed twice")

    @classmethod
    def from_file(cls, path: str | Path) -> StaticTokens:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthConfigError(f"--auth-tokens {path}: {exc}") from None
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            where = f"--auth-tokens {path} line {number}"  # never the token itself
            if len(fields) != 2:
                raise AuthConfigError(f"{where}: expected 'token principal'")
            if len(fields[0]) < MIN_TOKEN:
                raise AuthConfigError(f"{where}: a token needs at least {MIN_TOKEN} characters")
            entries.append((fields[0], _check_principal(fields[1], where)))
        if not entries:
            raise AuthConfigError(f"--auth-tokens {path}: no 'token principal' line")
        return cls(entries)

    async def verify_token(self, token: str) -> AccessToken | None:
        presented = _digest(token)
        found: str | None = None
        for digest, principal in self._entries:
            if hmac.compare_digest(digest, presented):
                found = principal
        return None if found is None else _access_token(token, found)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


# -- JWT -------------------------------------------------------------------------------------

# Asymmetric algorithms only, chosen by the key's type: a public key is never an HMAC secret
# (the classic "alg" confusion), and "none" is never accepted.
_ALGORITHMS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (rsa.RSAPublicKey, ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")),
    (ec.EllipticCurvePublicKey, ("ES256", "ES384", "ES512")),
    (ed25519.Ed25519PublicKey, ("EdDSA",)),
    (ed448.Ed448PublicKey, ("EdDSA",)),
)


@dataclass(frozen=True)
class JwtVerifier:
    """JWTs signed by the operator's identity provider, checked with PyJWT.

    The signature (a PEM public key, or the key a JWKS URL publishes under the token's
    ``kid``), ``exp`` (required), ``iss`` and ``aud`` are all checked; the principal is
    the `principal_claim` (default ``sub``). Any failure is a refusal, logged at debug
    (an attacker could otherwise fill the log).
    """

    issuer: str
    audience: str
    public_key: Any = None
    jwks: jwt.PyJWKClient | None = None
    principal_claim: str = "sub"

    @classmethod
    def from_options(
        cls,
        *,
        issuer: str | None,
        audience: str | None,
        public_key_file: str | None = None,
        jwks_url: str | None = None,
        principal_claim: str = "sub",
    ) -> JwtVerifier:
        if bool(public_key_file) == bool(jwks_url):
            raise AuthConfigError("give exactly one of --jwt-public-key and --jwt-jwks-url")
        if not issuer or not audience:
            raise AuthConfigError("JWT authentication needs --jwt-issuer and --jwt-audience")
        if public_key_file:
            return cls(issuer, audience, _load_public_key(public_key_file), None, principal_claim)
        assert jwks_url is not None
        if urlsplit(jwks_url).scheme not in ("https", "http"):
            raise AuthConfigError(f"--jwt-jwks-url {jwks_url!r}: expected an http(s) URL")
        # PyJWT caches the key set and refetches an unknown kid at most every 30 s.
        jwks = jwt.PyJWKClient(jwks_url, lifespan=300, timeout=10)
        return cls(issuer, audience, None, jwks, principal_claim)

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            if self.jwks is not None:  # may fetch the key set: off the event loop
                jwk = await anyio.to_thread.run_sync(self.jwks.get_signing_key_from_jwt, token)
                key, algorithms = jwk.key, [jwk.algorithm_name]
            else:
                key, algorithms = self.public_key, _algorithms_for(self.public_key)
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                issuer=self.issuer,
                audience=self.audience,
                leeway=JWT_LEEWAY_S,
                options={"require": ["exp", "iss", "aud", self.principal_claim]},
            )
            principal = _check_principal(claims[self.principal_claim], "token")
        except (jwt.PyJWTError, AuthConfigError) as exc:
            _log.debug("token_refused", reason=f"{type(exc).__name__}: {exc}")
            return None
        scopes = claims.get("scope")
        return AccessToken(
            token=token,
            client_id=principal,
            subject=principal,
            scopes=scopes.split() if isinstance(scopes, str) else [],
            expires_at=int(claims["exp"]),
            claims={"iss": claims["iss"]},
        )


def _load_public_key(path: str) -> Any:
    try:
        key = load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise AuthConfigError(f"--jwt-public-key {path}: not a PEM public key ({exc})") from None
    _algorithms_for(key)
    return key


def _algorithms_for(key: Any) -> list[str]:
    for kind, names in _ALGORITHMS:
        if isinstance(key, kind):
            return list(names)
    raise AuthConfigError(f"unsupported public key type {type(key).__name__}")


# -- browser checks --------------------------------------------------------------------------


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


class RequireAuth:
    """The SDK's `RequireAuthMiddleware` on every HTTP path but the public ones."""

    def __init__(self, app: ASGIApp, resource_metadata_url: AnyHttpUrl | None) -> None:
        self.app = app
        self.required = RequireAuthMiddleware(app, [], resource_metadata_url)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or scope["path"].startswith(_PUBLIC_PATHS):
            await self.app(scope, receive, send)
        else:
            await self.required(scope, receive, send)


# -- MCP sessions per principal --------------------------------------------------------------


class SessionLimitExceeded(Exception):
    """One principal already holds its cap of open MCP sessions."""


class PrincipalSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, with a cap on each principal's open sessions.

    The count is taken where the SDK admits a session, under its creation lock, from the
    owners it records for every session, so concurrent initializes can't overshoot and a
    session that ends (DELETE, idle timeout, crash) frees its place at once.
    """

    def __init__(self, *args: Any, max_sessions_per_principal: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_sessions_per_principal = max_sessions_per_principal

    def _admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        if requestor is not None:
            held = sum(owner == requestor for owner in self._session_owners.values())
            if held >= self.max_sessions_per_principal:
                raise SessionLimitExceeded(requestor["subject"])
        return super()._admit_session(requestor)


class SessionLimit:
    """Turns `SessionLimitExceeded` into a 429 that says what to do (no session was made)."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app = app
        self.cap = cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except SessionLimitExceeded as exc:
            message = (
                f"principal {exc.args[0]!r} already has {self.cap} open MCP sessions, the "
                "most allowed; end one (DELETE /mcp with its Mcp-Session-Id) or reuse it"
            )
            body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
            await JSONResponse(body, 429)(scope, receive, send)


# -- the whole configuration -----------------------------------------------------------------


@dataclass(frozen=True)
class HttpSecurity:
    """Everything that decides who reaches the HTTP server, built once by ``serve``.

    `verifier` None means no authentication (allowed on loopback binds only, unless the
    operator insists). `auth` (JWT with an issuer URL) publishes RFC 9728 metadata naming
    the identity provider; static tokens have no provider to name, so they publish none.
    """

    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS
    allowed_origins: tuple[str, ...] = ()
    verifier: TokenVerifier | None = None
    auth: AuthSettings | None = None
    max_sessions_per_principal: int | None = None
    cors_headers: tuple[str, ...] = field(
        default=(
            "Authorization",
            "Content-Type",
            "Mcp-Session-Id",
            "Mcp-Protocol-Version",
            "Last-Event-ID",
            "X-Session-Id",
            "X-Assistant-Id",
            "X-Thread-Id",
        )
    )

    @property
    def resource_metadata_url(self) -> AnyHttpUrl | None:
        if self.auth is None or self.auth.resource_server_url is None:
            return None
        return build_resource_metadata_url(self.auth.resource_server_url)

    def middleware(self) -> list[Middleware]:
        """Outermost first: browser checks, CORS for allowed origins, then authentication."""
        stack = [Middleware(RequestGuard, self.allowed_hosts, self.allowed_origins)]
        if self.allowed_origins:
            stack.append(
                Middleware(
                    CORSMiddleware,
                    allow_origins=list(self.allowed_origins),
                    allow_methods=["GET", "POST", "DELETE"],
                    allow_headers=list(self.cors_headers),
                    expose_headers=["Mcp-Session-Id", "X-Session-Id", "WWW-Authenticate"],
                )
            )
        if self.verifier is not None:
            stack.append(
                Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(self.verifier))
            )
            stack.append(Middleware(RequireAuth, self.resource_metadata_url))
        return stack

    def routes(self) -> list[Route]:
        """The protected-resource metadata document, when there is one to publish."""
        if self.auth is None or self.auth.resource_server_url is None:
            return []
        return create_protected_resource_routes(
            resource_url=self.auth.resource_server_url,
            authorization_servers=[self.auth.issuer_url],
            resource_name="ctxactors",
        )

    def transport_security(self) -> TransportSecuritySettings:
        """The same Host/Origin rules in the SDK's terms, for its own check at ``/mcp``."""
        hosts = self.allowed_hosts or ()
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=self.allowed_hosts is not None,
            allowed_hosts=[*hosts, *(f"{h}:*" for h in hosts)],
            allowed_origins=list(self.allowed_origins),
        )


def jwt_auth_settings(issuer: str, resource_url: str) -> AuthSettings | None:
    """`AuthSettings` for the metadata document, or None when the issuer is not a URL."""
    if urlsplit(issuer).scheme not in ("http", "https"):
        return None
    # Strings, so the model keeps a path-less URL as given (RFC 8414 compares issuers
    # exactly; a bare AnyHttpUrl would add a slash).
    return AuthSettings.model_validate(
        {
            "issuer_url": issuer,
            "resource_server_url": resource_url,
            "validate_token_resource": False,  # the verifier checks the audience itself
        }
    )


# -- ``ctxactors serve`` options ---------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "HTTP access", "who may reach --transport http (README: Deploying on a network)"
    )
    add = group.add_argument
    add("--auth-tokens", metavar="FILE", help="bearer tokens, one 'token principal' a line")
    add("--jwt-public-key", metavar="FILE", help="accept JWTs signed by this PEM public key")
    add("--jwt-jwks-url", metavar="URL", help="accept JWTs signed by a key this JWKS serves")
    add("--jwt-issuer", metavar="ISS", help="the JWTs' required iss")
    add("--jwt-audience", metavar="AUD", help="the JWTs' required aud")
    add("--jwt-principal-claim", metavar="CLAIM", default="sub", help="default: sub")
    add(
        "--public-url",
        metavar="URL",
        help="this server's URL as clients reach it, for the protected-resource metadata "
        "(default http://HOST:PORT)",
    )
    add("--allow-origin", metavar="ORIGIN", action="append", default=[], help="repeatable")
    add(
        "--allow-host",
        metavar="NAME",
        action="append",
        default=[],
        help="a Host name clients use besides the bind address (a proxy's); repeatable",
    )
    add("--max-actors-per-principal", type=int, metavar="N", help="live actors of one principal")
    add("--max-sessions-per-principal", type=int, metavar="N", help="open MCP sessions of one")
    add(
        "--insecure-no-auth",
        action="store_true",
        help="serve a non-loopback address without authentication (anyone who can connect "
        "runs every tool)",
    )


_AUTH_OPTIONS = ("auth_tokens", "jwt_public_key", "jwt_jwks_url", "jwt_issuer", "jwt_audience")
_PRINCIPAL_LIMITS = ("max_actors_per_principal", "max_sessions_per_principal")


def security_from_args(args: argparse.Namespace) -> HttpSecurity:
    """The `HttpSecurity` the options ask for; `AuthConfigError` says what is wrong."""
    given = [name for name in _AUTH_OPTIONS if getattr(args, name)]
    if given and args.transport != "http":
        raise AuthConfigError("authentication options are for --transport http")
    for name in _PRINCIPAL_LIMITS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise AuthConfigError(f"--{name.replace('_', '-')} must be at least 1")
    verifier, auth = _verifier_from_args(args)
    if verifier is None:
        limits = [n for n in _PRINCIPAL_LIMITS if getattr(args, n) is not None]
        if limits:
            raise AuthConfigError(
                f"--{limits[0].replace('_', '-')} needs authentication (principals come "
                "from tokens): give --auth-tokens or the --jwt-* options"
            )
        if not is_loopback(args.host) and not args.insecure_no_auth:
            raise AuthConfigError(
                f"--host {args.host} is not a loopback address and no authentication is "
                "configured: anyone who can connect would run every tool, shell commands "
                "included. Give --auth-tokens FILE or the --jwt-* options (or, on a network "
                "you trust completely, --insecure-no-auth)"
            )
    elif args.insecure_no_auth:
        raise AuthConfigError("--insecure-no-auth contradicts the authentication options")
    return HttpSecurity(
        allowed_hosts=_allowed_hosts(args.host, args.allow_host),
        allowed_origins=tuple(normalise_origin(o) for o in args.allow_origin),
        verifier=verifier,
        auth=auth,
        max_sessions_per_principal=args.max_sessions_per_principal,
    )


def _verifier_from_args(
    args: argparse.Namespace,
) -> tuple[TokenVerifier | None, AuthSettings | None]:
    jwt_given = any(getattr(args, n) for n in _AUTH_OPTIONS[1:])
    if args.auth_tokens and jwt_given:
        raise AuthConfigError("give either --auth-tokens or the --jwt-* options, not both")
    if args.auth_tokens:
        return StaticTokens.from_file(args.auth_tokens), None
    if not jwt_given:
        return None, None
    verifier = JwtVerifier.from_options(
        issuer=args.jwt_issuer,
        audience=args.jwt_audience,
        public_key_file=args.jwt_public_key,
        jwks_url=args.jwt_jwks_url,
        principal_claim=args.jwt_principal_claim,
    )
    host = f"[{args.host}]" if ":" in args.host else args.host
    public_url = args.public_url or f"http://{host}:{args.port}"
    return verifier, jwt_auth_settings(verifier.issuer, public_url)


def _allowed_hosts(bind: str, extra: Sequence[str]) -> tuple[str, ...] | None:
    """Loopback binds accept loopback names (as the MCP SDK's own check does); other binds
    check Host only when the operator names the hosts."""
    names = [h.lower() for h in extra]
    if is_loopback(bind):
        return (*LOOPBACK_HOSTS, *names)
    if not names:
        return None
    if bind not in ("0.0.0.0", "::", ""):
        names.append(f"[{bind}]" if ":" in bind else bind)
    return tuple(names)


# What an app gets unless told otherwise: loopback Host names, no cross-origin request, JSON
# POSTs only, no authentication.
LOOPBACK_ONLY = HttpSecurity()
